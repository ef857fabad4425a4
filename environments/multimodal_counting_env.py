"""Run the bundled ``multimodal_counting_env`` environment from a checkout: ``python environments/multimodal_counting_env.py serve``.

The code is :mod:`atroposlib.environments.multimodal_counting_env`; installed, the same env runs as ``atropos-env``
with its registered name. This folder has no ``__init__.py`` on purpose: it never shadows a
user's own ``environments`` package.
"""

from atroposlib.environments.multimodal_counting_env import MultimodalCountingEnv

if __name__ == "__main__":
    MultimodalCountingEnv.cli()
