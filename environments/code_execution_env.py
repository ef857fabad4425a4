"""Run the bundled ``code_execution_env`` environment from a checkout: ``python environments/code_execution_env.py serve``.

The code is :mod:`atroposlib.environments.code_execution_env`; installed, the same env runs as ``atropos-env``
with its registered name. This folder has no ``__init__.py`` on purpose: it never shadows a
user's own ``environments`` package.
"""

from atroposlib.environments.code_execution_env import CodeExecutionEnv

if __name__ == "__main__":
    CodeExecutionEnv.cli()
