"""verifiers (``verifiers.v1``) environments served as Atropos environments, unmodified.

``atropos-env verifiers:SPEC serve|process|evaluate`` runs a verifiers environment:

* ``SPEC`` is what verifiers itself loads: a taskset (or environment) id such as
  ``reverse-text``, ``owner/name@1.0`` or a dotted module ``my_pkg.my_taskset`` (a package
  exporting its ``Taskset`` subclass, and optionally an ``Env`` subclass, in ``__all__``), or
  ``module:Object`` naming a ``Taskset`` or ``Env`` subclass directly.
* The taskset's tasks are the items; a group is ``group_size`` episodes of one task, run by
  verifiers' own machinery (``Env.run_slot``: harness program, interception server, tools,
  stop conditions, user turns) with its model calls going to a per-rollout session of a
  token-tracking endpoint backed by the env's inference servers
  (:class:`~atroposlib.adapters.common.TrackedEndpoint`).
* The task's rubric (``@vf.reward`` functions, weighted) scores each rollout
  (``trace.reward``); each tracked sequence of a rollout carries the exact sampled token ids,
  the sampler's log-probs and a mask over the model's tokens of every turn.
* verifiers' own config knobs are flags: ``--env.taskset.<field>``,
  ``--env.agent.harness.id``, ``--env.agent.runtime.type``, ``--env.timeout.episode`` ...
  (one flag per scalar field of the environment's config), and ``--env.vf_config '{...}'``
  (JSON, deep-merged last) for anything else.

Defaults that differ from verifiers' own CLI: the agent runs in the local ``subprocess``
runtime (verifiers defaults to a hosted sandbox) with the tool-less ``null`` chat harness
unless the taskset ships its own harness (verifiers defaults to ``bash``, which hands the
model a shell); both are flags. Every plain taskset and every ``Env`` subclass runs:
single-agent ones (scripted-user multi-turn envs) and ones with several trainable agents
(self-play seats), where each agent's rollouts of a task form their own group.
"""

from __future__ import annotations

import asyncio
import importlib
import logging
import re
import sys
import types
from typing import Annotated, Any, ClassVar, Union, get_args, get_origin

from pydantic import BaseModel, Field, create_model

from atroposlib.adapters.common import (
    TrackedEndpoint,
    model_name_of,
    require_token_logprobs,
    rollout_sequences,
    spec_env_class,
    tracked_sessions,
)
from atroposlib.envs.base import BaseEnv, BaseEnvConfig, ScoredDataGroup
from atroposlib.envs.config import default_server
from atroposlib.errors import ConfigError, RolloutError
from atroposlib.inference.clients.config import APIServerConfig
from atroposlib.type_definitions import Item
from atroposlib.utils.flags import merge_dicts

logger = logging.getLogger(__name__)

#: Deepest nesting of verifiers config fields turned into ``--env.a.b.c`` flags.
MAX_KNOB_DEPTH = 4
_ALIAS_PREFIX = "atroposlib_vf_alias_"


class VerifiersEnvConfig(BaseEnvConfig):
    """Settings of a verifiers environment run by Atropos (plus one flag per verifiers knob)."""

    vf_config: dict[str, Any] = Field(
        default_factory=dict,
        description="verifiers EnvConfig overrides as JSON, deep-merged after the per-knob "
        'flags, e.g. {"taskset": {"split": "test"}, "agent": {"runtime": {"type": "docker"}}}.',
    )
    eval_vf_config: dict[str, Any] = Field(
        default_factory=dict,
        description="Further verifiers EnvConfig overrides for evaluate only (e.g. the test "
        "split); empty = evaluate on the training configuration.",
    )
    temperature: float = Field(default=1.0, ge=0.0, description="Sampling temperature of rollouts.")
    eval_temperature: float = Field(default=0.0, ge=0.0, description="Sampling temperature in evaluate.")
    max_tokens: int = Field(default=1024, ge=1, description="Tokens per model turn at most.")
    eval_limit: int = Field(default=32, ge=1, description="Tasks (one episode each) in evaluate.")
    tool_parser: str | None = Field(
        default="hermes",
        description="How <tool_call> blocks become OpenAI tool_calls for tool environments "
        "(hermes); null = completions stay text.",
    )
    harness_python: str = Field(
        default="local",
        description="local: run verifiers' harness programs with this Python when their "
        "dependencies are installed (no uv, no package index); uv: let verifiers provision them.",
    )


def _nest(dotted: dict[str, Any]) -> dict[str, Any]:
    """``{"a.b": 1}`` -> ``{"a": {"b": 1}}``."""
    out: dict[str, Any] = {}
    for key, value in dotted.items():
        node = out
        *parents, leaf = key.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return out


# ------------------------------------------------------------------ spec resolution
def _alias_module(module: types.ModuleType, obj: type) -> str:
    """Register a module exporting ``obj`` (and its module's matching partner) for verifiers.

    verifiers loads tasksets and envs by importable id, taking the ``Taskset``/``Env``
    subclass a module exports in ``__all__``. ``module:Object`` specs get such a module.
    """
    import verifiers.v1 as vf

    partner_base = vf.Env if issubclass(obj, vf.Taskset) else vf.Taskset
    partners = [getattr(module, n, None) for n in getattr(module, "__all__", [])]
    partners = [p for p in partners if isinstance(p, type) and issubclass(p, partner_base)
                and p not in (vf.Env, vf.Taskset)]
    exported = [obj, *partners[:1]]
    if partner_base is vf.Taskset and not partners:
        raise ConfigError(
            f"{module.__name__}:{obj.__name__} is an Env; its module must also export its "
            "Taskset in __all__ (or name the Taskset instead and set the env with "
            "--env.vf_config '{\"id\": ...}')"
        )
    name = f"{_ALIAS_PREFIX}{module.__name__.replace('.', '_')}_{obj.__name__}".lower()
    alias = types.ModuleType(name, f"verifiers alias of {module.__name__}:{obj.__name__}")
    for item in exported:
        setattr(alias, item.__name__, item)
    alias.__all__ = [item.__name__ for item in exported]
    sys.modules[name] = alias
    return name


def resolve_spec(spec: str) -> str:
    """The verifiers taskset id for ``spec`` (an id, a dotted module or ``module:Object``).

    A plain id (``reverse-text``, ``owner/name@1.0``) is verifiers' own. A dotted module or
    ``module:Object`` is imported here and given a top-level alias module, because verifiers
    imports tasksets by a top-level name.

    Raises:
        ConfigError: the module or object cannot be imported or is not a Taskset/Env.
    """
    module_name, _, attr = spec.partition(":")
    if not attr and "." not in module_name:
        return spec
    import verifiers.v1 as vf

    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(f"verifiers:{spec}: cannot import {module_name!r}: {exc}") from exc
    if attr:
        obj = getattr(module, attr, None)
    else:
        exported = [getattr(module, n, None) for n in getattr(module, "__all__", [])]
        tasksets = [o for o in exported if isinstance(o, type) and issubclass(o, vf.Taskset)]
        if len(tasksets) != 1:
            raise ConfigError(
                f"verifiers:{spec}: the module must export exactly one Taskset subclass in "
                f"__all__ (found {len(tasksets)}); or name it: verifiers:{spec}:MyTaskset"
            )
        obj = tasksets[0]
    if not (isinstance(obj, type) and issubclass(obj, (vf.Taskset, vf.Env))):
        raise ConfigError(
            f"verifiers:{spec}: {attr!r} in {module_name} is {type(obj).__name__}, not a "
            "verifiers Taskset or Env subclass; name the class (module:MyTaskset)"
        )
    return _alias_module(module, obj)


# ------------------------------------------------------------------ knobs as flags
def _is_model(annotation: Any) -> bool:
    return isinstance(annotation, type) and issubclass(annotation, BaseModel)


def _unwrap(annotation: Any) -> Any:
    """``Annotated[X, ...]`` -> X and ``X | None`` -> X (repeatedly)."""
    while True:
        if get_origin(annotation) is Annotated:
            annotation = get_args(annotation)[0]
            continue
        args = get_args(annotation)
        if get_origin(annotation) in (Union, types.UnionType) and type(None) in args:
            rest = [a for a in args if a is not type(None)]
            if len(rest) == 1:
                annotation = rest[0]
                continue
        return annotation


def _mentions_model(annotation: Any) -> bool:
    return _is_model(annotation) or any(_mentions_model(a) for a in get_args(annotation))


def knob_fields(model: type[BaseModel], prefix: str = "", depth: int = 0) -> dict[str, tuple[Any, Any]]:
    """Flag fields for every scalar field of a verifiers config model, by dotted path.

    Nested models recurse (``taskset.task.tolerance``); a union of models (a runtime or
    client choice) contributes its ``type``/``id`` selector only; lists and maps of models
    (``taskset.task.rewards``) take JSON. Every flag defaults to None (= the environment's
    own default).
    """
    out: dict[str, tuple[Any, Any]] = {}
    if depth > MAX_KNOB_DEPTH:
        return out
    for name, info in model.model_fields.items():
        path = f"{prefix}{name}"
        annotation = _unwrap(info.annotation)
        doc = (info.description or "").strip().split("\n")[0] or f"verifiers {path}"
        if _is_model(annotation):
            out.update(knob_fields(annotation, f"{path}.", depth + 1))
            continue
        members = [_unwrap(a) for a in get_args(annotation)]
        if get_origin(annotation) in (Union, types.UnionType) and all(map(_is_model, members)):
            for selector in ("type", "id"):
                if all(selector in m.model_fields for m in members):
                    out[f"{path}.{selector}"] = (str | None, Field(default=None, description=doc))
            continue
        leaf = Any if _mentions_model(annotation) else annotation | None
        out[path] = (leaf, Field(default=None, description=doc))
    return out


def _env_knobs(taskset_id: str) -> dict[str, tuple[Any, Any]]:
    """The knob flags of a verifiers environment (its env config, with its taskset's config).

    The agents' ``model``, ``client`` and ``sampling`` are left out: the adapter owns them
    (every model call must reach the tracked endpoint; ``--env.temperature`` and
    ``--env.max_tokens`` set the sampling).
    """
    import verifiers.v1 as vf

    config_type = vf.env_config_type(taskset_id)
    fields = {k: v for k, v in knob_fields(config_type).items() if not k.startswith("taskset.")}
    fields.update(knob_fields(vf.taskset_config_type(taskset_id), "taskset."))
    roles = [n for n, info in config_type.model_fields.items()
             if isinstance(info.default, vf.AgentConfig)]
    owned = tuple(f"{role}.{part}" for role in roles for part in ("model", "client", "sampling"))
    reserved = {"id", "taskset.id", *VerifiersEnvConfig.model_fields}
    return {k: v for k, v in fields.items()
            if k not in reserved and not k.startswith(owned)}


# ------------------------------------------------------------------ the env
class VerifiersEnv(BaseEnv):
    """A verifiers environment as an Atropos env (see :mod:`atroposlib.adapters.verifiers`).

    Build one with :func:`verifiers_env_class` (``atropos-env verifiers:SPEC`` does).
    """

    name = "verifiers"
    env_config_cls = VerifiersEnvConfig
    #: the verifiers taskset id this class runs (set by :func:`verifiers_env_class`).
    taskset_id: ClassVar[str] = ""
    #: flag names of the verifiers knobs on ``env_config_cls``.
    knob_names: ClassVar[tuple[str, ...]] = ()

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self._vf_env: Any = None
        self._eval_env: Any = None
        self._tasks: Any = None

    @classmethod
    def config_init(cls) -> tuple[BaseEnvConfig, list[APIServerConfig]]:
        """Defaults: ``env_config_cls()`` and the project's development vLLM.

        The server is the one every other env defaults to (the bundled model at
        ``DEFAULT_INFERENCE_URL``, ``server_type="vllm"``, which returns the token log-probs
        the adapter trains on); ``--openai.*`` flags override its fields.
        """
        return cls.env_config_cls(), [default_server()]

    # ------------------------------------------------------------------ verifiers config
    def vf_env_config(self, extra: dict[str, Any] | None = None) -> Any:
        """The verifiers ``EnvConfig`` this env runs: defaults < knob flags < ``vf_config``.

        Raises:
            ConfigError: verifiers rejects the configuration (the message says which field).
        """
        import verifiers.v1 as vf
        from pydantic import ValidationError

        if not self.taskset_id:
            raise ConfigError("VerifiersEnv needs a taskset: use verifiers_env_class(SPEC)")
        data: dict[str, Any] = {"taskset": {"id": self.taskset_id}}
        harness = vf.default_harness_id(self.taskset_id)
        config_type = vf.env_config_type(self.taskset_id)
        for role, info in config_type.model_fields.items():
            if isinstance(info.default, vf.AgentConfig):
                role_defaults: dict[str, Any] = {"runtime": {"type": "subprocess"}}
                if info.default.harness is None and harness == "bash":
                    role_defaults["harness"] = {"id": "null"}
                data[role] = role_defaults
        values = self.config.model_dump()
        knobs = {k: values[k] for k in self.knob_names if values.get(k) is not None}
        data = merge_dicts(data, _nest(knobs), self.config.vf_config, extra or {})
        try:
            return vf.resolve_env_config(data)
        except (ValidationError, ValueError, TypeError) as exc:
            raise ConfigError(f"verifiers rejected the environment config: {exc}") from exc

    def _load(self, extra: dict[str, Any] | None = None) -> Any:
        import verifiers.v1 as vf

        if self.config.harness_python == "local":
            from atroposlib.adapters.vf_runtime import use_local_python

            use_local_python()
        elif self.config.harness_python != "uv":
            raise ConfigError(f"--env.harness_python must be local or uv, got "
                              f"{self.config.harness_python!r}")
        return vf.load_environment(self.vf_env_config(extra))

    async def setup(self) -> None:
        """Load the verifiers environment (its taskset's data) and start the task stream.

        Raises:
            ConfigError: an inference server cannot return token log-probs (the message says
                which ``--openai.server_type`` to pass), or verifiers rejects the config.
        """
        require_token_logprobs(self.server)
        self._vf_env = await asyncio.to_thread(self._load)
        self._tasks = self._task_stream()

    def _task_stream(self) -> Any:
        taskset = self._vf_env.taskset
        while True:
            count = 0
            for task in taskset:
                count += 1
                yield task
            if count == 0:
                raise ConfigError(f"verifiers taskset {self.taskset_id!r} yielded no tasks")

    async def get_next_item(self) -> Item:
        """The next task of the taskset (the taskset restarts when exhausted)."""
        return next(self._tasks)

    # ------------------------------------------------------------------ rollouts
    def _context(self, base_url: str, temperature: float) -> Any:
        import verifiers.v1 as vf

        return vf.ModelContext(
            model=model_name_of(self.server),
            client=vf.EvalClientConfig(base_url=base_url, api_key_var="ATROPOS_VF_API_KEY"),
            sampling=vf.SamplingConfig(temperature=temperature, max_tokens=self.config.max_tokens),
        )

    async def run_episodes(self, vf_env: Any, task: Any, count: int,
                           temperature: float) -> list[tuple[Any, dict[str, Any]]]:
        """Run ``count`` independent episodes of ``task``; each with its tracked session state.

        Returns:
            ``[(episode, session_state), ...]``: the verifiers ``Episode`` and the proxy
            session's ``{"nodes": [...]}``.
        """
        from verifiers.v1.env import RunSlot

        endpoint = TrackedEndpoint(self.server, self.tokenizer, model_name_of(self.server),
                                   tool_parser=self.config.tool_parser)
        async with endpoint, tracked_sessions(endpoint, count) as sessions, vf_env.serving():
            episodes = await asyncio.gather(*(
                vf_env.run_slot(RunSlot(task), self._context(s.base_url, temperature))
                for s in sessions
            ))
            states = [await s.fetch_state() for s in sessions]
        return list(zip(episodes, states, strict=True))

    def _scored(self, episode: Any, state: dict[str, Any]) -> list[tuple[str, list[Any], float, Any]]:
        """``[(agent name, sequences, reward, trace), ...]``: one per trainable agent that played.

        With several trainable agents (self-play: every seat is the run's model), each
        tracked sequence goes to the agent whose conversation it is (the one whose
        messages it holds).

        Raises:
            RolloutError: the episode failed, has no trainable trace, its model calls were
                not tracked, or a sequence cannot be told apart between agents.
        """
        if not episode.ok:
            errors = [*episode.errors, *(e for t in episode.traces for e in t.errors)]
            detail = "; ".join(f"{e.type}: {e.message}" for e in errors) or (
                f"not ok, no error recorded (stop: {[t.stop_condition for t in episode.traces]})")
            raise RolloutError(f"verifiers episode failed: {detail}")
        trainable = [t for t in episode.traces if t.agent.trainable]
        if not trainable:
            raise RolloutError("verifiers episode has no trainable trace")
        sequences = rollout_sequences(state)
        if not sequences:
            raise RolloutError("verifiers episode made no tracked model call")
        owned = self._split_by_agent(sequences, trainable)
        return [(t.agent.name, seqs, float(t.reward), t)
                for t, seqs in zip(trainable, owned, strict=True) if seqs]

    def _split_by_agent(self, sequences: list[Any], traces: list[Any]) -> list[list[Any]]:
        """Each trace's tracked sequences (a single trace owns them all).

        A sequence belongs to the trace most of whose message text it holds.

        Raises:
            RolloutError: a sequence matches two traces equally, or a trace that has model
                replies gets none.
        """
        if len(traces) == 1:
            return [sequences]
        texts = [[c.strip() for m in trace_messages(t) if (c := m.get("content"))
                  and isinstance(c, str) and c.strip()] for t in traces]
        owned: list[list[Any]] = [[] for _ in traces]
        for seq in sequences:
            decoded = self.tokenizer.decode(seq.tokens)
            found = [sum(len(c) for c in parts if c in decoded) for parts in texts]
            best = max(found)
            if best == 0 or found.count(best) > 1:
                raise RolloutError("a tracked model call cannot be told apart between the "
                                   f"agents {[t.agent.name for t in traces]}")
            owned[found.index(best)].append(seq)
        # An agent that never got a turn (its opponent forfeited first) has nothing to train.
        lost = [t.agent.name for t, seqs in zip(traces, owned, strict=True)
                if not seqs and t.assistant_messages]
        if lost:
            raise RolloutError(f"no tracked model call of the trainable agents {lost}")
        return owned

    async def collect_trajectories(
        self, item: Item
    ) -> tuple[ScoredDataGroup | list[ScoredDataGroup] | None, list[Item]]:
        """Play ``group_size`` episodes of the task; score each with the task's rubric.

        With several trainable agents (self-play), each agent gets its own group: its
        ``group_size`` rollouts of this task (a per-seat baseline).
        """
        runs = await self.run_episodes(self._vf_env, item, self.config.group_size,
                                       self.config.temperature)
        by_agent: dict[str, dict[str, list[Any]]] = {}
        for episode, state in runs:
            try:
                scored = self._scored(episode, state)
            except RolloutError as exc:
                self.stats["verifiers_failed_episodes"] += 1
                logger.warning("dropping the group of task %s: %s", getattr(item, "key", "?"), exc)
                return None, []
            for agent, sequences, reward, trace in scored:
                lists = by_agent.setdefault(agent, {k: [] for k in
                                                    ("tokens", "masks", "scores", "logprobs",
                                                     "messages")})
                for seq in sequences:
                    lists["tokens"].append(seq.tokens)
                    lists["masks"].append(seq.masks)
                    lists["logprobs"].append(seq.logprobs)
                    lists["scores"].append(reward)
                    lists["messages"].append(trace_messages(trace))
        groups = []
        for lists in by_agent.values():
            group = ScoredDataGroup(tokens=lists["tokens"], masks=lists["masks"],
                                    scores=lists["scores"], inference_logprobs=lists["logprobs"],
                                    messages=lists["messages"])
            if len(lists["tokens"]) != self.config.group_size:
                group["group_overrides"] = {"group_size": len(lists["tokens"])}
            groups.append(group)
        return (groups[0] if len(groups) == 1 else groups), []

    # ------------------------------------------------------------------ evaluation
    async def evaluate(self, *args: Any, **kwargs: Any) -> dict[str, float]:
        """One episode per task for the first ``eval_limit`` tasks at ``eval_temperature``.

        Metrics: ``eval/mean_reward``, ``eval/failed_fraction`` and the mean of every
        ``@vf.metric`` (``eval/metric/<name>``).
        """
        if self.config.eval_vf_config and self._eval_env is None:
            self._eval_env = await asyncio.to_thread(self._load, self.config.eval_vf_config)
        vf_env = self._eval_env or self._vf_env
        tasks = list(vf_env.taskset.take(self.config.eval_limit))
        runs = await asyncio.gather(*(
            self.run_episodes(vf_env, task, 1, self.config.eval_temperature) for task in tasks
        ))
        rewards, failed, metric_values = [], 0, {}
        samples = []
        for (episode, state), in runs:
            try:
                scored = self._scored(episode, state)
            except RolloutError as exc:
                failed += 1
                logger.warning("evaluation episode failed: %s", exc)
                continue
            for _, _, reward, trace in scored:
                rewards.append(reward)
                for name, value in trace.metrics.items():
                    if value is not None:
                        metric_values.setdefault(name, []).append(float(value))
                samples.append({"messages": trace_messages(trace), "score": reward})
        metrics = {
            "eval/mean_reward": sum(rewards) / len(rewards) if rewards else 0.0,
            "eval/failed_fraction": failed / max(1, len(tasks)),
            "eval/num_tasks": float(len(tasks)),
        }
        for name, values in metric_values.items():
            metrics[f"eval/metric/{name}"] = sum(values) / len(values)
        self.evaluate_log(metrics, samples=samples)
        return metrics


def trace_messages(trace: Any) -> list[dict[str, Any]]:
    """The last branch of a verifiers trace as OpenAI-style message dicts (text content)."""
    branches = trace.branches
    if not branches:
        return []
    out = []
    for message in branches[-1].messages:
        data = message.model_dump(exclude_none=True, mode="json")
        content = data.get("content")
        if isinstance(content, list):
            data["content"] = "\n".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
        out.append(data)
    return out


def verifiers_env_class(spec: str) -> type[VerifiersEnv]:
    """The Atropos env class of the verifiers environment ``spec`` (see module docstring).

    Its ``env_config_cls`` has one ``--env.<dotted.path>`` flag per scalar knob of the
    environment's verifiers config.

    Raises:
        ConfigError: verifiers is not installed, or ``spec`` cannot be loaded.
    """
    try:
        import verifiers.v1 as vf
    except ImportError as exc:
        raise ConfigError(
            "verifiers environments need the verifiers package: pip install 'atroposlib[verifiers]'"
        ) from exc
    taskset_id = resolve_spec(spec)
    try:
        knobs = _env_knobs(taskset_id)
        vf.env_config_type(taskset_id)
    except (ImportError, TypeError, ValueError, AttributeError) as exc:
        raise ConfigError(f"verifiers:{spec}: cannot load it: {exc}") from exc
    short = re.split(r"[/.:]", spec.split("@", 1)[0])[-1]
    config_cls = create_model(f"VerifiersEnvConfig_{abs(hash(spec)):x}",
                              __base__=VerifiersEnvConfig, **knobs)
    return spec_env_class(VerifiersEnv, spec, f"verifiers-{short}",
                          f"The verifiers environment {spec!r} run by Atropos.",
                          env_config_cls=config_cls, taskset_id=taskset_id, knob_names=tuple(knobs))


__all__ = ["VerifiersEnv", "VerifiersEnvConfig", "knob_fields", "resolve_spec",
           "trace_messages", "verifiers_env_class"]
