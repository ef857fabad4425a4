"""Base class of the bundled text games (taxi, blackjack): lives in ``atroposlib.adapters.gymnasium``.

Kept here so ``from atroposlib.environments.gym_text import GymTextEnv`` keeps working.
"""

from atroposlib.adapters.gymnasium import GymTextConfig, GymTextEnv

__all__ = ["GymTextConfig", "GymTextEnv"]
