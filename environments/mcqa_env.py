"""Run the bundled ``mcqa_env`` environment from a checkout: ``python environments/mcqa_env.py serve``.

The code is :mod:`atroposlib.environments.mcqa_env`; installed, the same env runs as ``atropos-env``
with its registered name. This folder has no ``__init__.py`` on purpose: it never shadows a
user's own ``environments`` package.
"""

from atroposlib.environments.mcqa_env import MCQAEnv

if __name__ == "__main__":
    MCQAEnv.cli()
