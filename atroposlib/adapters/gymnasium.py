"""Gymnasium environments played by the policy through text, one turn per action.

:class:`GymTextEnv` is the machinery (a game as a multi-turn chat: observation -> action
word -> next observation, scored by the episode return); the bundled ``taxi`` and
``blackjack`` envs subclass it with hand-written descriptions. :class:`GymEnv` runs ANY
registered Gymnasium environment with a discrete (or text) action space by id, with generic
text: ``atropos-env gym:FrozenLake-v1 serve`` (:func:`gym_env_class`). Its observation is
the environment's ``ansi`` rendering when it has one (ANSI colours removed) and the
observation value itself; actions are numbers, or the names given by ``--env.action_names``.
"""

from __future__ import annotations

import re
from typing import Any

from pydantic import Field

from atroposlib.adapters.common import spec_env_class
from atroposlib.envs.multi_turn import MultiTurnEnv, MultiTurnEnvConfig
from atroposlib.errors import ConfigError


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
        """The held-out episode seeds (far from the training seeds)."""
        self.eval_items = [{"seed": 10_000_000 + self.config.seed + k}
                           for k in range(self.config.eval_episodes)]

    def train_item(self, index: int) -> dict[str, int]:
        """Episode ``index`` starts from seed ``config.seed + index``."""
        return {"seed": self.config.seed + index}

    async def play_episode(self, item, *, temperature: float, split: str):
        """One episode from ``item["seed"]`` (see :meth:`play`)."""
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
        """Return, finish rate, invalid-action rate, turns and context overflows."""
        n = len(details)
        turns = sum(s["turns"] for s in details) or 1.0
        return {
            f"{prefix}/mean_return": sum(s["return"] for s in details) / n,
            f"{prefix}/finished_rate": sum(s["finished"] for s in details) / n,
            f"{prefix}/invalid_action_rate": sum(s["invalid"] for s in details) / turns,
            f"{prefix}/mean_turns": turns / n,
            f"{prefix}/out_of_context_rate": sum(s["out_of_context"] for s in details) / n,
        } if details else {}


_ANSI = re.compile(r"\x1b\[[0-9;]*m")


class GymEnvConfig(GymTextConfig):
    """Settings of a Gymnasium environment run by id (``gym:ID``)."""

    gym_kwargs: dict[str, Any] = Field(
        default_factory=dict,
        description='Keyword arguments of gymnasium.make, e.g. {"is_slippery": false}.',
    )
    action_names: list[str] | None = Field(
        default=None,
        description="Words for the discrete actions, in action-id order (default: the numbers).",
    )
    instructions: str | None = Field(
        default=None,
        description="The system prompt (default: a generic one naming the env and its actions).",
    )


class GymEnv(GymTextEnv):
    """Any Gymnasium environment with a ``Discrete`` or ``Text`` action space, played in text.

    Built by :func:`gym_env_class`; the score is the episode return (plus the invalid-reply
    penalty), exactly as for the hand-written games.
    """

    env_config_cls = GymEnvConfig

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        import gymnasium

        self.gym_kwargs = dict(self.config.gym_kwargs)
        self._probe = gymnasium.make(self.gym_id, **self.gym_kwargs)
        if "ansi" in self._probe.metadata.get("render_modes", []):
            self.gym_kwargs.setdefault("render_mode", "ansi")
        space = self._probe.action_space
        self._text_actions = type(space).__name__ == "Text"
        if not self._text_actions:
            start, n = int(getattr(space, "start", 0)), int(space.n)
            names = self.config.action_names or [str(start + i) for i in range(n)]
            if len(names) != n:
                raise ConfigError(f"--env.action_names has {len(names)} names; {self.gym_id} "
                                  f"has {n} actions")
            self.actions = {name.lower(): start + i for i, name in enumerate(names)}
        self._probe.close()

    def parse_action(self, text: str) -> int | str | None:
        """Text action spaces take the reply; discrete ones the last action word in it."""
        if self._text_actions:
            return text.strip() or None
        return super().parse_action(text)

    def intro(self) -> str:
        """``--env.instructions``, else a generic prompt naming the env and its actions."""
        if self.config.instructions:
            return self.config.instructions
        what = ("reply with your action as text" if self._text_actions else
                "end your reply with exactly one action: " + ", ".join(self.actions))
        return (f"You are playing the Gymnasium environment {self.gym_id}. Each turn you see "
                f"the observation; {what}. Aim for the highest total reward.")

    def describe(self, game: Any, obs: Any) -> str:
        """The ``ansi`` frame (when rendered), the observation value and the action reminder."""
        parts = []
        frame = game.render() if getattr(game, "render_mode", None) == "ansi" else None
        if frame:
            parts.append(_ANSI.sub("", str(frame)).rstrip())
        parts.append(f"Observation: {obs}")
        parts.append("Your action?" if self._text_actions else self.action_help())
        return "\n".join(parts)


def gym_env_class(gym_id: str) -> type[GymEnv]:
    """The env class playing the registered Gymnasium environment ``gym_id`` in text.

    Raises:
        ConfigError: ``gym_id`` is not registered (with the closest ids), or its action space
            is neither ``Discrete`` nor ``Text``.
    """
    import difflib

    import gymnasium

    try:
        gymnasium.spec(gym_id)
    except gymnasium.error.Error as exc:
        close = difflib.get_close_matches(gym_id, list(gymnasium.registry), n=3, cutoff=0.5)
        hint = f"; did you mean {' or '.join(close)}?" if close else ""
        raise ConfigError(f"gym:{gym_id}: not a registered Gymnasium environment{hint}") from exc
    probe = gymnasium.make(gym_id)
    kind = type(probe.action_space).__name__
    probe.close()
    if kind not in ("Discrete", "Text"):
        raise ConfigError(f"gym:{gym_id}: its action space is {kind}; the text adapter plays "
                          "Discrete or Text action spaces")
    short = re.sub(r"[^a-z0-9]+", "_", gym_id.lower()).strip("_")
    return spec_env_class(GymEnv, gym_id, f"gym-{short}",
                          f"The Gymnasium environment {gym_id} played in text.", gym_id=gym_id)


__all__ = ["GymEnv", "GymEnvConfig", "GymTextConfig", "GymTextEnv", "gym_env_class"]
