"""The order of an ``atropos-launch`` run: run-api, the GRPO trainer (which owns vLLM) and the envs, as one run.

Order: ``run-api`` (waits for ``GET /info``) -> trainer (launches vLLM, evaluates the starting
policy, registers) -> once the API reports the trainer's registration, every environment in
``serve`` mode -> wait for the trainer to finish -> stop everything.

Every process runs in its own process group; its output goes to
``<run_dir>/logs/<name>.log`` and to the console prefixed with ``[name]``. On Ctrl-C, SIGTERM,
the trainer finishing, or any part dying early, every process (and anything it spawned, e.g.
vLLM) gets SIGTERM, then SIGKILL after ``stop_timeout`` seconds. Nothing else is touched.

Where the parts run is the backend's business (:mod:`atroposlib.launch.supervision`): child
processes of this one by default, or Ray actors on the nodes their ``placement`` picks with
``--ray`` (:mod:`atroposlib.launch.ray_cluster`). On a cluster each part writes on its own node;
the trainer's run files (``summary.json``, ``metrics.jsonl``, ``plot.png``, the final
checkpoint) are copied back into ``run_dir`` here when it ends.

Example config (``configs/quickstart-cpu.yaml`` is the full one)::

    trainer:                  # any atropos-grpo flag, snake_case
      training_steps: 20
      batch_size: 32
      lr: 2.0e-5
    envs:
      - name: arithmetic
        script: environments/arithmetic_server.py
        args: {env.group_size: 8, env.difficulty: 2}
    eval_env: arithmetic       # evaluate before/after training with this env's `evaluate`
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any, TextIO

from atroposlib.launch.commands import trainer_command, trainer_flags
from atroposlib.launch.config import LaunchConfig
from atroposlib.launch.describe import unused_placements
from atroposlib.launch.readiness import answers_health, api_info
from atroposlib.launch.supervision import Backend, LaunchError, LocalBackend, PartHandle, Site
from atroposlib.launch.trainers import load_trainer
from atroposlib.launch.wiring import env_serve_flags, env_servers, eval_command, served_model_name
from atroposlib.utils.offline import OFFLINE_ENV
from atroposlib.utils.run_dirs import claim_run_dir, new_run_dir

#: What comes back from the trainer's node to ``run_dir`` on the launching host.
RUN_FILES = ["summary.json", "metrics.jsonl", "plot.png", "trainer_config.json", "evals",
             "logs/eval.log", "checkpoints/final"]


class Launcher:
    """Runs the parts of one training run and always stops them all (see module docstring)."""

    def __init__(self, config: LaunchConfig, console: TextIO | None = None):
        """Resolve the trainer and take the run directory; nothing starts until :meth:`run`.

        The run directory is ``config.run_dir``, which must hold no run yet, or else a new
        ``runs/<UTC timestamp>[-N]`` (see :mod:`atroposlib.utils.run_dirs`); either way no
        other run writes in it.

        Raises:
            ConfigError: ``config.trainer_name`` names no registered trainer, or
                ``config.run_dir`` holds a run already (the message says how to start elsewhere).
        """
        self.config = config
        self.trainer_module = load_trainer(config.trainer_name).run_module
        self.run_dir = claim_run_dir(config.run_dir) if config.run_dir else new_run_dir()
        self.log_dir = self.run_dir / "logs"
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.console = console or sys.stdout
        self.lock = threading.Lock()
        self.parts: list[PartHandle] = []
        self.sites: dict[str, Site] = {}
        self.env = {**OFFLINE_ENV, **os.environ}
        self.backend: Backend | None = None
        self._main_site: Site | None = None  # the trainer's rank-0 node, once placed
        self._stop_signal: int | None = None

    def say(self, message: str) -> None:
        """Print a ``[launch]`` line."""
        with self.lock:
            self.console.write(f"[launch] {message}\n")
            self.console.flush()

    def _make_backend(self) -> Backend:
        if self.config.ray is None:
            if placed := unused_placements(self.config):
                self.say(f"placement of {', '.join(placed)} is for Ray (--ray); every part runs on this host")
            return LocalBackend(self.run_dir, self.env, self.console, self.lock)
        from atroposlib.launch.ray_cluster import RayBackend

        backend = RayBackend(self.config.ray, self.run_dir, self.console, self.lock)
        self.say(f"connected to the Ray cluster at {self.config.ray.address}: "
                 f"{backend.describe_cluster()}")
        return backend

    def place(self, name: str, placement: Any, count: int = 1) -> list[Site]:
        """Sites for part ``name`` from the backend, recorded in ``<run_dir>/placement.json``."""
        assert self.backend is not None
        sites = self.backend.place(name, placement, count)
        for i, site in enumerate(sites):
            key = name if i == 0 else f"{name}.{i}"
            self.sites[key] = site
            if site.node_id != "local":
                self.say(f"{key} placed on {site.node} (run dir there: {site.run_dir})")
        (self.run_dir / "placement.json").write_text(json.dumps(
            {k: {"node_id": s.node_id, "host": s.host, "node": s.node, "run_dir": s.run_dir}
             for k, s in self.sites.items()}, indent=2))
        return sites

    def start(self, site: Site, argv: list[str], name: str | None = None,
              files: dict[str, str] | None = None) -> PartHandle:
        """Start one part on ``site`` (after writing ``files`` there) and remember it for shutdown."""
        part = site.start(argv, name, files)
        self.parts.append(part)
        self.say(f"started {part.name}: {shlex.join(argv)}")
        return part

    def _fail(self, part: PartHandle, why: str) -> LaunchError:
        return LaunchError(f"{part.name} {why}; last lines of {part.log_path}:\n{part.tail()}",
                           part=part.name, reason=why)

    def _wait_until(self, what: str, check: Any, timeout: float, watch: list[PartHandle]) -> None:
        deadline = time.monotonic() + timeout
        while True:
            if self._stop_signal is not None:
                raise KeyboardInterrupt
            for part in watch:
                if part.poll() is not None:
                    raise self._fail(part, f"exited with code {part.poll()} while waiting for {what}")
            if check():
                return
            if time.monotonic() > deadline:
                raise self._fail(watch[-1], f"did not reach '{what}' within {timeout:.0f}s")
            time.sleep(0.5)

    def run(self) -> int:
        """Run everything; return the trainer's exit code (130 on Ctrl-C, 1 on failure)."""
        previous = {sig: signal.signal(sig, self._on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
        failure: LaunchError | None = None
        interrupted = False
        try:
            self.backend = self._make_backend()
            return self._run()
        except KeyboardInterrupt:
            self.say("interrupted: stopping every part")
            interrupted = True
            return 130
        except LaunchError as exc:
            self.say(f"FAILED: {exc}")
            failure = exc
            return 1
        finally:
            self.shutdown()
            if failure is not None:
                record_failure(self.run_dir / "summary.json", failure.part, failure.reason)
            elif interrupted:
                record_interrupt(self.run_dir / "summary.json", self._stop_signal or signal.SIGINT)
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def _run(self) -> int:
        cfg = self.config
        api, api_url, info = self._start_api()
        nodes, node_urls = self._start_inference()
        trainers, base_url = self._start_trainer(api_url, node_urls)
        self._wait_until("trainer registered with run-api",
                         lambda: (info() or {}).get("batch_size", -1) > 0,
                         cfg.register_timeout, [api, *nodes, *trainers])
        trainer = trainers[0]
        trainer.remember_descendants()
        self.say("trainer registered; starting environments")
        envs = self._start_envs(api_url, base_url, node_urls)

        # wait for the trainer
        while True:
            if self._stop_signal is not None:
                raise KeyboardInterrupt
            # the others first: a trainer that failed because run-api died names run-api
            for part in [api, *nodes, *envs]:
                if part.poll() is not None:
                    raise self._fail(part, f"exited early with code {part.poll()}")
            for part in trainers[1:]:  # the other trainer nodes may finish just before rank 0's
                if part.poll() not in (None, 0):
                    raise self._fail(part, f"exited with code {part.poll()}")
            if trainer.poll() is not None:
                break
            trainer.remember_descendants()
            time.sleep(1.0)
        code = trainer.poll()
        if code != 0:
            raise self._fail(trainer, f"exited with code {code}")
        self.say(f"trainer finished; results in {self.run_dir} (summary.json, plot.png)")
        return 0

    def _start_api(self) -> tuple[PartHandle, str, Any]:
        """Start run-api and wait for ``GET /info``; its handle, URL and an ``/info`` getter."""
        cfg = self.config
        (site,) = self.place("api", cfg.api.placement)
        port = cfg.api.port or site.free_port()
        url = f"http://{site.host}:{port}"
        api = self.start(site, [site.python, "-m", "atroposlib.cli.run_api", "--host", site.host,
                                "--port", str(port), *cfg.api.extra_args])
        self._wait_until("GET /info answers", lambda: api_info(url) is not None, cfg.api.start_timeout, [api])
        self.say(f"run-api ready at {url}")
        return api, url, lambda: api_info(url)

    def _start_inference(self) -> tuple[list[PartHandle], list[str]]:
        """Start every inference node (``inference:``) and wait for its ``GET /health``.

        Returns:
            The nodes' handles and their OpenAI base URLs (``http://HOST:PORT/v1``).
        """
        cfg = self.config
        model = cfg.trainer.get("model")
        model_name = served_model_name(cfg)
        nodes, urls = [], []
        for section in cfg.inference:
            for name in section.names:
                (site,) = self.place(name, section.placement)
                port = site.free_port()
                node_model = section.model or model
                nodes.append(self.start(site, [
                    site.python, "-m", "atroposlib.cli.inference_node", "--host", site.host,
                    "--port", str(port), "--served-model-name", model_name,
                    *(["--model", node_model] if node_model else []), *trainer_flags(section.args),
                    "--", *section.vllm_args]))
                urls.append(f"http://{site.host}:{port}/v1")
        for section in cfg.inference:
            for name in section.names:
                part = next(p for p in nodes if p.name == name)
                url = urls[nodes.index(part)]
                self._wait_until(f"GET /health of {url}", lambda root=url.removesuffix("/v1"): answers_health(root),
                                 section.start_timeout, [part])
        if urls:
            self.say(f"inference nodes ready: {', '.join(urls)}")
        return nodes, urls

    def _start_trainer(self, api_url: str, node_urls: list[str]) -> tuple[list[PartHandle], str]:
        """Start the trainer (one part per trainer node); its handles and the envs' base URL.

        Without inference nodes or ``trainer.vllm_url`` the trainer launches its own vLLM, on a
        port chosen here so the envs know it.
        """
        cfg = self.config
        trainer_values = cfg.trainer_settings
        if node_urls:
            trainer_values["vllm_url"] = ",".join(node_urls)
        nproc = cfg.trainer.get("nproc_per_node", 1)
        nnodes = cfg.trainer.get("nnodes", 1)
        sites = self.place("trainer", cfg.trainer_placement, nnodes)
        main_site = sites[0]
        self._main_site = main_site
        port_flags: list[str] = []
        if trainer_values.get("vllm_url"):  # nodes started above, or running servers (tests)
            base_url = str(trainer_values["vllm_url"]).split(",")[0].strip().rstrip("/")
        else:
            vllm_port = main_site.free_port()
            # it listens on 127.0.0.1 of the trainer's node only (its reload routes are open)
            base_url = f"http://127.0.0.1:{vllm_port}/v1"
            port_flags = ["--vllm-port", str(vllm_port)]
        files: dict[str, str] = {}
        eval_env = next((e for e in cfg.envs if e.name == cfg.eval_env), None)
        if eval_env is not None and "eval_command" not in trainer_values:
            trainer_values["eval_command"], files = eval_command(
                cfg, eval_env, trainer_values, main_site.python, main_site.run_dir, node_urls)
        master = (main_site.host, main_site.free_port()) if nnodes > 1 else None
        trainers = []
        for rank, site in enumerate(sites):
            argv = trainer_command(self.trainer_module, nproc, python=site.python, nnodes=nnodes,
                                   node_rank=rank, master=master)
            trainers.append(self.start(site, [
                *argv, *trainer_flags(trainer_values), "--api-url", api_url, "--run-dir",
                site.run_dir, *port_flags], name="trainer" if rank == 0 else f"trainer.{rank}",
                files=files if rank == 0 else None))
        return trainers, base_url

    def _start_envs(self, api_url: str, base_url: str, node_urls: list[str]) -> list[PartHandle]:
        """Start every environment in ``serve`` mode, on its own site.

        Raises:
            LaunchError: an env lands on another host than the trainer's own vLLM, which
                listens on that host's loopback only.
        """
        cfg = self.config
        own_vllm = not node_urls and not cfg.trainer.get("vllm_url")
        servers = env_servers(cfg, node_urls)
        envs = []
        for env in cfg.envs:
            (site,) = self.place(env.name, env.placement)
            assert self._main_site is not None
            if own_vllm and site.host != self._main_site.host:
                raise LaunchError(
                    f"env {env.name} runs on {site.node}, but the trainer's own vLLM listens on "
                    f"127.0.0.1 of {self._main_site.node}: place the env on the trainer's node "
                    "(its placement), or serve the policy from inference nodes (inference:; "
                    "docs: Train on a cluster)", part=env.name, reason="cannot reach the trainer's vLLM")
            env_flags, files = env_serve_flags(cfg, env, api_url, base_url, servers, site.run_dir)
            envs.append(self.start(site, [site.python, env.script, "serve", *env_flags], files=files))
        return envs

    def _on_signal(self, signum: int, frame: Any) -> None:
        if self._stop_signal is not None or self.backend is None:  # or still connecting to Ray
            raise KeyboardInterrupt
        self._stop_signal = signum

    def shutdown(self) -> None:
        """Stop every part, newest first (envs, trainer + vLLM, api); then fetch the run files.

        On a cluster the trainer's run files come back from its node after it stopped (it
        writes ``summary.json`` on its way out), then the backend lets go of its nodes.
        """
        for part in reversed(self.parts):
            code = part.stop(self.config.stop_timeout)
            self.say(f"stopped {part.name} (exit code {code})")
        if self.backend is None:
            return
        try:
            trainer_site = self.sites.get("trainer")
            if trainer_site is not None and trainer_site.node_id != "local":
                got = self.backend.collect(trainer_site, self.run_dir, RUN_FILES)
                if got:
                    self.say(f"copied {', '.join(got)} from {trainer_site.node} into {self.run_dir}")
                _localise_summary(self.run_dir / "summary.json", trainer_site.run_dir, self.run_dir, got)
        finally:
            self.backend.close()


def _localise_summary(path: Path, node_dir: str, local_dir: Path, copied: list[str]) -> None:
    """Point the summary's paths at the copies on this host (those that were copied back)."""
    try:
        summary = json.loads(path.read_text())
    except (OSError, ValueError):
        return
    if not isinstance(summary, dict):
        return
    prefixes = [f"{node_dir.rstrip('/')}/{rel}" for rel in copied]
    for key, value in summary.items():
        if isinstance(value, str) and any(value == p or value.startswith(p + "/") for p in prefixes):
            summary[key] = str(local_dir) + value[len(node_dir.rstrip("/")):]
    summary["node_run_dir"] = node_dir
    path.write_text(json.dumps(summary, indent=2))


def record_failure(summary_path: Path, part: str | None, reason: str) -> None:
    """Make ``summary.json`` say that the run ended in error because ``part`` failed.

    The trainer writes the summary; when atropos-launch stops it because another part (run-api,
    an env) died, the trainer only sees a stop request and writes ``stopped: stop_requested``.
    This rewrites it to ``stopped: error``, ``error: "<part> <reason>"`` and ``failed_part`` (the
    part's name as in the logs: ``api``, ``trainer``, an env's name), keeping the trainer's own
    error (if it had one) as ``trainer_error``. When the trainer itself failed, its own
    ``error`` and ``failed_part`` (``vllm``, ``run-api`` or ``trainer``) stay. Without a summary (the
    trainer never got far enough to write one) a minimal one with these three keys is written.

    Args:
        summary_path: ``<run_dir>/summary.json`` on the launching host.
        part: the name of the part that failed (``api``, ``trainer``, an env's name).
        reason: what happened to it (``exited early with code 3``).
    """
    summary = _read_summary(summary_path)
    if part == "trainer" and summary.get("stopped") == "error":
        # its own error says more than an exit code, and its failed_part may name vLLM or run-api
        summary["failed_part"] = summary.get("failed_part") or "trainer"
    else:
        if summary.get("error"):
            summary["trainer_error"] = summary["error"]
        summary.update(stopped="error", error=f"{part} {reason}".strip(), failed_part=part)
    summary_path.parent.mkdir(parents=True, exist_ok=True)
    summary_path.write_text(json.dumps(summary, indent=2))


def _read_summary(summary_path: Path) -> dict:
    """The run's ``summary.json`` as a dict; ``{}`` when it is missing, unreadable or not an object."""
    try:
        summary = json.loads(summary_path.read_text())
    except (OSError, ValueError):
        return {}
    return summary if isinstance(summary, dict) else {}


def record_interrupt(summary_path: Path, signum: int) -> None:
    """Make ``summary.json`` say that the run was interrupted (Ctrl-C or SIGTERM to atropos-launch).

    atropos-launch stops every part on the way out, so the trainer sees a stop request
    (``stopped: stop_requested``) or, when its vLLM went first, an error such as "vLLM died ...
    exited with code 0". Neither is what happened to the run: this sets ``stopped:
    interrupted`` and ``stop_signal``, clears ``error`` and ``failed_part``, and keeps what the
    trainer saw as ``trainer_stopped`` (and ``trainer_error``). Without a summary (the trainer
    never wrote one) a minimal one is written.

    Args:
        summary_path: ``<run_dir>/summary.json`` on the launching host.
        signum: the signal atropos-launch got (2 for Ctrl-C, 15 for SIGTERM).
    """
    summary = _read_summary(summary_path)
    if summary.get("stopped") not in (None, "interrupted"):
        summary["trainer_stopped"] = summary["stopped"]
    if summary.get("error"):
        summary["trainer_error"] = summary["error"]
    summary.update(stopped="interrupted", stop_signal=int(signum), error=None, failed_part=None)
    summary_path.parent.mkdir(parents=True, exist_ok=True)
    summary_path.write_text(json.dumps(summary, indent=2))
