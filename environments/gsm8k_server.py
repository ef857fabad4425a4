"""Run the bundled ``gsm8k_server`` environment from a checkout: ``python environments/gsm8k_server.py serve``.

The code is :mod:`atroposlib.environments.gsm8k_server`; installed, the same env runs as ``atropos-env``
with its registered name. This folder has no ``__init__.py`` on purpose: it never shadows a
user's own ``environments`` package.
"""

from atroposlib.environments.gsm8k_server import GSM8kEnv

if __name__ == "__main__":
    GSM8kEnv.cli()
