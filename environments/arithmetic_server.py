"""Run the bundled ``arithmetic_server`` environment from a checkout: ``python environments/arithmetic_server.py serve``.

The code is :mod:`atroposlib.environments.arithmetic_server`; installed, the same env runs as ``atropos-env``
with its registered name. This folder has no ``__init__.py`` on purpose: it never shadows a
user's own ``environments`` package.
"""

from atroposlib.environments.arithmetic_server import ArithmeticEnv

if __name__ == "__main__":
    ArithmeticEnv.cli()
