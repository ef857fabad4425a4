"""``python -m atroposlib.envs.server_handling.proxy``: run the ManagedServer proxy."""

from atroposlib.envs.server_handling.proxy.cli import main

if __name__ == "__main__":
    main()
