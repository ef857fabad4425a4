"""word-env: a tiny OpenEnv environment written with openenv-core 0.3's server API.

Each episode asks for up to two words, one per step; a step earns 1.0 when the message
contains the requested word. Served with ``uvicorn tests.adapters.openenv_word.server:app``.
"""

from uuid import uuid4

from openenv.core.env_server.http_server import create_app
from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import Action, Observation, State
from pydantic import Field

WORDS = ["apple", "river", "stone", "cloud"]


class WordAction(Action):
    message: str = Field(..., description="Your reply")


class WordObservation(Observation):
    prompt: str = Field(default="", description="What to say next")


class WordEnvironment(Environment):
    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self):
        super().__init__()
        self._state = State(episode_id=str(uuid4()), step_count=0)
        self._words: list[str] = []

    def reset(self, seed: int | None = None, episode_id: str | None = None, **kwargs) -> WordObservation:
        start = (seed or 0) % len(WORDS)
        self._words = [WORDS[start], WORDS[(start + 1) % len(WORDS)]]
        self._state = State(episode_id=episode_id or str(uuid4()), step_count=0)
        return WordObservation(prompt=f"Say the word {self._words[0]}", done=False, reward=0.0)

    def step(self, action: WordAction, **kwargs) -> WordObservation:  # type: ignore[override]
        word = self._words[self._state.step_count]
        self._state.step_count += 1
        reward = float(word in action.message.lower())
        done = self._state.step_count >= len(self._words)
        prompt = "" if done else f"Say the word {self._words[self._state.step_count]}"
        return WordObservation(prompt=prompt, done=done, reward=reward)

    @property
    def state(self) -> State:
        return self._state


app = create_app(WordEnvironment, WordAction, WordObservation, env_name="word_env",
                 max_concurrent_envs=64)
