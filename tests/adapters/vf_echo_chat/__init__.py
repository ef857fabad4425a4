from tests.adapters.vf_echo_chat.taskset import EchoChatEnv, EchoChatTaskset

__all__ = ["EchoChatEnv", "EchoChatTaskset"]
