r"""Reusable reward functions and the registry that builds them by name.

Example::

    from atroposlib.rewards import registry
    reward = registry.create({"type": "combined", "rewards": ["format", "accuracy"]})
    scores = reward(["<think>..</think><answer>\\boxed{4}</answer>"], solution="4")
"""

from atroposlib.rewards.combined_reward import CombinedReward
from atroposlib.rewards.registry import RewardRegistry, registry
from atroposlib.rewards.reward_function import Completion, RewardFunction, get_content

__all__ = ["CombinedReward", "Completion", "RewardFunction", "RewardRegistry", "get_content", "registry"]
