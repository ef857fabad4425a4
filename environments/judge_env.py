"""Run the bundled ``judge_env`` environment from a checkout: ``python environments/judge_env.py serve``.

The code is :mod:`atroposlib.environments.judge_env`; installed, the same env runs as ``atropos-env``
with its registered name. This folder has no ``__init__.py`` on purpose: it never shadows a
user's own ``environments`` package.
"""

from atroposlib.environments.judge_env import JudgeEnv

if __name__ == "__main__":
    JudgeEnv.cli()
