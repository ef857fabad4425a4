"""Run the bundled ``tool_calling_env`` environment from a checkout: ``python environments/tool_calling_env.py serve``.

The code is :mod:`atroposlib.environments.tool_calling_env`; installed, the same env runs as ``atropos-env``
with its registered name. This folder has no ``__init__.py`` on purpose: it never shadows a
user's own ``environments`` package.
"""

from atroposlib.environments.tool_calling_env import ToolCallingEnv

if __name__ == "__main__":
    ToolCallingEnv.cli()
