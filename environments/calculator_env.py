"""Run the bundled ``calculator_env`` environment from a checkout: ``python environments/calculator_env.py serve``.

The code is :mod:`atroposlib.environments.calculator_env`; installed, the same env runs as ``atropos-env``
with its registered name. This folder has no ``__init__.py`` on purpose: it never shadows a
user's own ``environments`` package.
"""

from atroposlib.environments.calculator_env import CalculatorEnv

if __name__ == "__main__":
    CalculatorEnv.cli()
