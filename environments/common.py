"""Compatibility re-export: the helpers now live in :mod:`atroposlib.envs.helpers`."""

from atroposlib.envs.helpers import *  # noqa: F403
from atroposlib.envs.helpers import __all__  # noqa: F401
