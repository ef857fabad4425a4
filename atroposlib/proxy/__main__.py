"""``python -m atroposlib.proxy``: run the ManagedServer proxy."""

from atroposlib.proxy.cli import main

if __name__ == "__main__":
    main()
