"""The scripted inference backend for tests: ``FakeServer`` and its OpenAI-compatible app.

They are defined in :mod:`atroposlib.envs.server_handling.fake_server` (the ``--testing`` mode
and ``check_env`` use them too); this module keeps the test-facing import path.
"""

from atroposlib.envs.server_handling.fake_server import (
    DEFAULT_RESPONSES,
    FAKE_VOCAB,
    FakeOpenAIServer,
    FakeRequest,
    FakeServer,
    fake_logprob,
    fake_openai_app,
    fake_prompt_logprobs,
)

__all__ = [
    "DEFAULT_RESPONSES",
    "FAKE_VOCAB",
    "FakeOpenAIServer",
    "FakeRequest",
    "FakeServer",
    "fake_logprob",
    "fake_openai_app",
    "fake_prompt_logprobs",
]
