"""Run the bundled ``letter_counting_env`` environment from a checkout: ``python environments/letter_counting_env.py serve``.

The code is :mod:`atroposlib.environments.letter_counting_env`; installed, the same env runs as ``atropos-env``
with its registered name. This folder has no ``__init__.py`` on purpose: it never shadows a
user's own ``environments`` package.
"""

from atroposlib.environments.letter_counting_env import LetterCountingEnv

if __name__ == "__main__":
    LetterCountingEnv.cli()
