"""Run the bundled ``dataset_env`` environment from a checkout: ``python environments/dataset_env.py serve``.

The code is :mod:`atroposlib.environments.dataset_env`; installed, the same env runs as ``atropos-env``
with its registered name. This folder has no ``__init__.py`` on purpose: it never shadows a
user's own ``environments`` package.
"""

from atroposlib.environments.dataset_env import DatasetEnv

if __name__ == "__main__":
    DatasetEnv.cli()
