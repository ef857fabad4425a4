"""``python -m atroposlib.proxy``: run the ManagedServer proxy."""

from atroposlib.proxy.run_proxy import main

if __name__ == "__main__":
    main()
