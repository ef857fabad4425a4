"""Run the bundled ``blackjack_env`` environment from a checkout: ``python environments/blackjack_env.py serve``.

The code is :mod:`atroposlib.environments.blackjack_env`; installed, the same env runs as ``atropos-env``
with its registered name. This folder has no ``__init__.py`` on purpose: it never shadows a
user's own ``environments`` package.
"""

from atroposlib.environments.blackjack_env import BlackjackEnv

if __name__ == "__main__":
    BlackjackEnv.cli()
