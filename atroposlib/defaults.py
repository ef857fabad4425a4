"""Default addresses of a local development setup, defined once for the whole project.

The library, the command-line tools, the example trainer and the bundled environments all take
these as their defaults, so a run started with no flags finds its parts:

* ``run-api`` listens on ``DEFAULT_API_HOST:DEFAULT_API_PORT`` and everything that talks to it
  defaults to ``DEFAULT_API_URL``;
* environments and inference tools default to the development vLLM at ``DEFAULT_INFERENCE_URL``
  serving the bundled model under the name ``DEFAULT_INFERENCE_MODEL``
  (``python -m atroposlib.inference.vllm_process`` starts it there).

Also the one bounded default of a rollout's duration, ``DEFAULT_ROLLOUT_TIMEOUT_S``.

The bundled model's directory is :func:`atroposlib.inference.bundled.bundled_model_dir`. This
module imports nothing.
"""

#: Interface ``run-api`` binds by default (local only).
DEFAULT_API_HOST = "127.0.0.1"
#: TCP port ``run-api`` listens on by default.
DEFAULT_API_PORT = 8000
#: Base URL of the trajectory API (``run-api``) that clients, envs and the trainer default to.
DEFAULT_API_URL = f"http://{DEFAULT_API_HOST}:{DEFAULT_API_PORT}"

#: TCP port of the development inference server (``python -m atroposlib.inference.vllm_process``).
DEFAULT_INFERENCE_PORT = 9100
#: OpenAI base URL of the development inference server (vLLM) the environments default to.
DEFAULT_INFERENCE_URL = f"http://127.0.0.1:{DEFAULT_INFERENCE_PORT}/v1"
#: Model name that development server serves the bundled model under.
DEFAULT_INFERENCE_MODEL = "smollm2"

#: Interface a process's own Prometheus metrics endpoint binds by default (local only; see
#: :func:`atroposlib.utils.prometheus.serve_metrics`).
DEFAULT_METRICS_HOST = "127.0.0.1"

#: Seconds one rollout (one member of a group: its inference calls and its scoring) may take by
#: default before it fails with kind ``timeout`` (``BaseEnvConfig.rollout_timeout``). Below the
#: default ``worker_timeout`` (600 s) of a whole group, so a slow member fails alone and its
#: group can still be sent without it.
DEFAULT_ROLLOUT_TIMEOUT_S = 480.0

__all__ = [
    "DEFAULT_API_HOST",
    "DEFAULT_API_PORT",
    "DEFAULT_API_URL",
    "DEFAULT_INFERENCE_MODEL",
    "DEFAULT_INFERENCE_PORT",
    "DEFAULT_INFERENCE_URL",
    "DEFAULT_METRICS_HOST",
    "DEFAULT_ROLLOUT_TIMEOUT_S",
]
