"""Run the bundled ``taxi_env`` environment from a checkout: ``python environments/taxi_env.py serve``.

The code is :mod:`atroposlib.environments.taxi_env`; installed, the same env runs as ``atropos-env``
with its registered name. This folder has no ``__init__.py`` on purpose: it never shadows a
user's own ``environments`` package.
"""

from atroposlib.environments.taxi_env import TaxiEnv

if __name__ == "__main__":
    TaxiEnv.cli()
