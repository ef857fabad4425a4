"""A variant of a sibling top-level env (imported as environments.parity_server) that also
collects teacher log-probs: TeacherDistillationEnv mixed in, with a default teacher."""

from typing import Tuple

from environments.parity_server import ParityEnv

from atroposlib.envs.base import APIServerConfig
from atroposlib.envs.teacher_distillation_env import (
    TeacherDistillationConfig,
    TeacherDistillationEnv,
)


class ParityTeacherDistillEnv(ParityEnv, TeacherDistillationEnv):
    name = "parity_teacher_distill"
    env_config_cls = TeacherDistillationConfig

    @classmethod
    def config_init(cls) -> Tuple[TeacherDistillationConfig, APIServerConfig]:
        env_config = TeacherDistillationConfig(tokenizer_name="unused", group_size=4,
                                               use_wandb=False, total_steps=10, batch_size=8,
                                               max_token_length=512, teacher_enabled=True,
                                               teacher_top_k=2)
        return env_config, APIServerConfig(model_name="m", base_url="http://localhost:9001/v1",
                                           api_key="x")

    @classmethod
    def teacher_config_init(cls) -> APIServerConfig:
        return APIServerConfig(base_url="http://localhost:9003/v1", model_name="teacher",
                               api_key="", server_type="vllm", tokenizer_name="unused")


if __name__ == "__main__":
    ParityTeacherDistillEnv.cli()
