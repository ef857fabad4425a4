r"""Reusable reward functions and the registry that builds them by name.

Example::

    from atroposlib.envs.reward_fns import registry
    reward = registry.create({"type": "combined", "rewards": ["format", "accuracy"]})
    scores = reward(["<think>..</think><answer>\\boxed{4}</answer>"], solution="4")
"""

from atroposlib.envs.reward_fns.combined_reward import CombinedReward
from atroposlib.envs.reward_fns.registry import RewardRegistry, registry
from atroposlib.envs.reward_fns.reward_function import Completion, RewardFunction, get_content

__all__ = ["CombinedReward", "Completion", "RewardFunction", "RewardRegistry", "get_content", "registry"]
