from tests.adapters.vf_duel.taskset import DuelEnv, DuelTaskset

__all__ = ["DuelEnv", "DuelTaskset"]
