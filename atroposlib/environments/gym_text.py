"""Base class for gymnasium games played by the policy through text, one turn per action."""

from __future__ import annotations

import re
from typing import Any

from pydantic import Field

from atroposlib.envs.multi_turn import MultiTurnEnv, MultiTurnEnvConfig


class GymTextConfig(MultiTurnEnvConfig):
    """Settings shared by the text-game environments."""

    max_tokens: int = Field(default=48, ge=1, description="Tokens per assistant turn.")
    invalid_action_penalty: float = Field(
        default=-0.2,
        le=0,
        description="Added to the episode return for each reply with no valid action (the "
        "model is then asked again).",
    )
    seed: int = Field(default=0, description="First episode seed; item k uses seed + k.")
    eval_episodes: int = Field(default=20, ge=1, description="Greedy episodes in evaluate.")


class GymTextEnv(MultiTurnEnv):
    """A gymnasium game as a multi-turn chat: observation -> action word -> next observation.

    One item is an episode seed; the group plays ``group_size`` episodes from the same seed
    (same initial state, so scores are comparable). Each episode is a ``managed_server``
    conversation whose final sequence trains every assistant turn. Score = episode return +
    ``invalid_action_penalty`` per unparseable reply; an episode cut off at ``max_turns``
    keeps the return so far. Metrics (``train/`` and ``eval/``): ``mean_return``,
    ``finished_rate``, ``invalid_action_rate`` (per turn), ``mean_turns``,
    ``out_of_context_rate``.

    Subclasses set ``gym_id`` / ``gym_kwargs``, ``actions`` (word -> action id) and
    implement :meth:`describe` and :meth:`intro`.
    """

    env_config_cls = GymTextConfig
    config_defaults = {"max_turns": 8}
    gym_id: str = ""
    gym_kwargs: dict[str, Any] = {}
    #: accepted action words -> gymnasium action ids (several words may map to one id).
    actions: dict[str, int] = {}

    # ------------------------------------------------------------------ game text
    def intro(self) -> str:
        """The system prompt: rules and reply format."""
        raise NotImplementedError

    def describe(self, game: Any, obs: Any) -> str:
        """The observation as text (the user message of a turn)."""
        raise NotImplementedError

    def action_help(self) -> str:
        """Reminder appended after an invalid reply."""
        words = sorted(set(self.actions))
        return "Reply with one of: " + ", ".join(words) + "."

    def parse_action(self, text: str) -> int | None:
        """The LAST action word in ``text`` (case-insensitive), as an action id, or None."""
        words = "|".join(sorted(map(re.escape, self.actions), key=len, reverse=True))
        found = re.findall(rf"\b({words})\b", text.lower())
        return self.actions[found[-1]] if found else None

    # ------------------------------------------------------------------ env contract
    def make_game(self) -> Any:
        """A fresh gymnasium environment."""
        import gymnasium

        return gymnasium.make(self.gym_id, **self.gym_kwargs)

    async def setup(self) -> None:
        self.eval_items = [{"seed": 10_000_000 + self.config.seed + k}
                           for k in range(self.config.eval_episodes)]

    def train_item(self, index: int) -> dict[str, int]:
        """Episode ``index`` starts from seed ``config.seed + index``."""
        return {"seed": self.config.seed + index}

    async def play_episode(self, item, *, temperature: float, split: str):
        return await self.play(item["seed"], temperature=temperature, split=split)

    async def play(self, seed: int, *, temperature: float, split: str = "train"):
        """Play one episode from ``seed``; return ``(Episode, score, stats)``."""
        game = self.make_game()
        obs, _ = game.reset(seed=seed)
        state = {"return": 0.0, "invalid": 0, "done": False}

        def on_reply(text: str, _turn: int):
            action = self.parse_action(text)
            if action is None:
                state["invalid"] += 1
                state["return"] += self.config.invalid_action_penalty
                return [{"role": "user", "content": "Invalid reply. " + self.action_help()}]
            obs, reward, terminated, truncated, _ = game.step(action)
            state["return"] += float(reward)
            if terminated or truncated:
                state["done"] = True
                return None
            return [{"role": "user", "content": self.describe(game, obs)}]

        messages = [{"role": "system", "content": self.intro()},
                    {"role": "user", "content": self.describe(game, obs)}]
        try:
            episode = await self.converse(messages, on_reply, temperature=temperature, split=split)
        finally:
            game.close()
        stats = {"return": state["return"], "invalid": float(state["invalid"]),
                 "finished": float(state["done"]), "turns": float(episode.turns),
                 "out_of_context": float(episode.out_of_context)}
        return episode, state["return"], stats

    def details_metrics(self, details, prefix):
        n = len(details)
        turns = sum(s["turns"] for s in details) or 1.0
        return {
            f"{prefix}/mean_return": sum(s["return"] for s in details) / n,
            f"{prefix}/finished_rate": sum(s["finished"] for s in details) / n,
            f"{prefix}/invalid_action_rate": sum(s["invalid"] for s in details) / turns,
            f"{prefix}/mean_turns": turns / n,
            f"{prefix}/out_of_context_rate": sum(s["out_of_context"] for s in details) / n,
        } if details else {}
