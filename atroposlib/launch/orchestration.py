"""The order of an ``atropos-launch`` run: run-api, the GRPO trainer (which owns vLLM) and the envs, as one run.

Order: ``run-api`` (waits for ``GET /info``) -> trainer (launches vLLM, evaluates the starting
policy, registers) -> once the API reports the trainer's registration, every environment in
``serve`` mode -> wait for the trainer to finish -> stop everything.

Every process runs in its own process group; its output goes to
``<run_dir>/logs/<name>.log`` and to the console prefixed with ``[name]``. On Ctrl-C, SIGTERM,
the trainer finishing, or any part dying early, every process (and anything it spawned, e.g.
vLLM) gets SIGTERM, then SIGKILL after ``stop_timeout`` seconds. Nothing else is touched.

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

import os
import shlex
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any, TextIO

from atroposlib.defaults import DEFAULT_INFERENCE_MODEL
from atroposlib.launch.commands import flags, free_port, trainer_command, trainer_flags
from atroposlib.launch.config import LaunchConfig
from atroposlib.launch.supervision import LaunchError, Part
from atroposlib.launch.trainers import load_trainer
from atroposlib.utils.offline import OFFLINE_ENV


class Launcher:
    """Runs the parts of one training run and always stops them all (see module docstring)."""

    def __init__(self, config: LaunchConfig, console: TextIO | None = None):
        """Resolve the trainer and prepare the run directory; nothing starts until :meth:`run`.

        Raises:
            ConfigError: ``config.trainer_name`` names no registered trainer.
        """
        self.config = config
        self.trainer_module = load_trainer(config.trainer_name).run_module
        self.run_dir = Path(config.run_dir or Path("runs") / time.strftime("%Y%m%d-%H%M%S", time.gmtime()))
        self.log_dir = self.run_dir / "logs"
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.console = console or sys.stdout
        self.lock = threading.Lock()
        self.parts: list[Part] = []
        self.env = {**OFFLINE_ENV, **os.environ}
        self._stop_signal: int | None = None

    def say(self, message: str) -> None:
        """Print a ``[launch]`` line."""
        with self.lock:
            self.console.write(f"[launch] {message}\n")
            self.console.flush()

    def start(self, name: str, argv: list[str]) -> Part:
        """Start one part and remember it for shutdown."""
        part = Part(name, argv, self.log_dir, self.env, self.console, self.lock)
        self.parts.append(part)
        self.say(f"started {name} (pid {part.proc.pid}): {shlex.join(argv)}")
        return part

    def _fail(self, part: Part, why: str) -> LaunchError:
        return LaunchError(f"{part.name} {why}; last lines of {part.log_path}:\n{part.tail()}")

    def _wait_until(self, what: str, check: Any, timeout: float, watch: list[Part]) -> None:
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
        import httpx

        cfg = self.config
        previous = {sig: signal.signal(sig, self._on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            # 1. run-api
            api_port = cfg.api.port or free_port()
            api_url = f"http://127.0.0.1:{api_port}"
            api = self.start("api", [sys.executable, "-m", "atroposlib.cli.run_api", "--host",
                                     "127.0.0.1", "--port", str(api_port), *cfg.api.extra_args])

            def info() -> dict[str, Any] | None:
                try:
                    response = httpx.get(f"{api_url}/info", timeout=2.0, trust_env=False)
                    return response.json() if response.status_code == 200 else None
                except (httpx.HTTPError, ValueError):
                    return None

            self._wait_until("GET /info answers", lambda: info() is not None,
                             cfg.api.start_timeout, [api])
            self.say(f"run-api ready at {api_url}")

            # 2. trainer (launches vLLM itself, evaluates, then registers)
            trainer_values = dict(cfg.trainer)
            nproc = trainer_values.pop("nproc_per_node", 1)
            port_flags: list[str] = []
            if trainer_values.get("vllm_url"):  # an already-running vLLM (e.g. in tests)
                base_url = str(trainer_values["vllm_url"]).rstrip("/")
            else:  # the trainer launches vLLM on a port chosen here, so the envs know it
                vllm_port = free_port()
                base_url = f"http://127.0.0.1:{vllm_port}/v1"
                port_flags = ["--vllm-port", str(vllm_port)]
            model_name = trainer_values.get("served_model_name", DEFAULT_INFERENCE_MODEL)
            eval_env = next((e for e in cfg.envs if e.name == cfg.eval_env), None)
            if eval_env is not None and "eval_command" not in trainer_values:
                eval_args = {**eval_env.args, **cfg.eval_args}
                eval_args = {k: v for k, v in eval_args.items()
                             if k not in ("env.rollout_server_url", "env.data_dir_to_save_evals")}
                if trainer_values.get("model") and "env.tokenizer_name" not in eval_args:
                    eval_args["env.tokenizer_name"] = trainer_values["model"]
                trainer_values["eval_command"] = " ".join([
                    shlex.quote(sys.executable), shlex.quote(eval_env.script), "evaluate",
                    *map(shlex.quote, flags(eval_args)),
                    "--openai.server_type", shlex.quote(eval_env.server_type),
                    "--openai.base_url", "{base_url}", "--openai.model_name", "{model_name}",
                    "--env.data_dir_to_save_evals", "{out_dir}",
                ])
            trainer = self.start("trainer", [
                *trainer_command(self.trainer_module, nproc), *trainer_flags(trainer_values),
                "--api-url", api_url, "--run-dir", str(self.run_dir), *port_flags])
            self._wait_until("trainer registered with run-api",
                             lambda: (info() or {}).get("batch_size", -1) > 0,
                             cfg.register_timeout, [api, trainer])
            trainer.remember_descendants()
            self.say("trainer registered; starting environments")

            # 3. environments
            envs = []
            model_dir = trainer_values.get("model")
            for env in cfg.envs:
                extra = {"env.rollout_server_url": api_url, "openai.base_url": base_url,
                         "openai.model_name": model_name, "openai.server_type": env.server_type}
                if model_dir and "env.tokenizer_name" not in env.args:
                    extra["env.tokenizer_name"] = model_dir
                envs.append(self.start(env.name, [sys.executable, env.script, "serve",
                                                  *flags({**env.args, **extra})]))

            # 4. wait for the trainer
            while trainer.poll() is None:
                if self._stop_signal is not None:
                    raise KeyboardInterrupt
                for part in [api, *envs]:
                    if part.poll() is not None:
                        raise self._fail(part, f"exited early with code {part.poll()}")
                trainer.remember_descendants()
                time.sleep(1.0)
            code = trainer.poll()
            if code != 0:
                raise self._fail(trainer, f"exited with code {code}")
            self.say(f"trainer finished; results in {self.run_dir} (summary.json, plot.png)")
            return 0
        except KeyboardInterrupt:
            self.say("interrupted: stopping every part")
            return 130
        except LaunchError as exc:
            self.say(f"FAILED: {exc}")
            return 1
        finally:
            self.shutdown()
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def _on_signal(self, signum: int, frame: Any) -> None:
        if self._stop_signal is not None:
            raise KeyboardInterrupt
        self._stop_signal = signum

    def shutdown(self) -> None:
        """Stop every part, newest first (envs, trainer + vLLM, api)."""
        for part in reversed(self.parts):
            code = part.stop(self.config.stop_timeout)
            self.say(f"stopped {part.name} (exit code {code})")
