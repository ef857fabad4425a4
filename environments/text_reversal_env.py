"""Run the bundled ``text_reversal_env`` environment from a checkout: ``python environments/text_reversal_env.py serve``.

The code is :mod:`atroposlib.environments.text_reversal_env`; installed, the same env runs as ``atropos-env``
with its registered name. This folder has no ``__init__.py`` on purpose: it never shadows a
user's own ``environments`` package.
"""

from atroposlib.environments.text_reversal_env import TextReversalEnv

if __name__ == "__main__":
    TextReversalEnv.cli()
