"""How a training run stops: signals, errors from other threads, the checkpoint on the way out.

The first SIGINT/SIGTERM asks the loop to finish its step, save ``checkpoints/final`` and stop;
a second one raises ``KeyboardInterrupt`` at once. A thread (the vLLM health watch) ends the run
with an error through :meth:`StopFlag.fail`, raised by the loop at its next check. An exception
that ends the run first saves the last finished step (:func:`save_on_exit`).
"""

from __future__ import annotations

import signal
from typing import Any


class StopFlag:
    """Whether a stop was requested; :meth:`restore` puts back the signal handlers it replaced."""

    requested = False
    #: the signal that requested the stop (None: none did)
    signum: int | None = None
    #: an error that ends the run (a dead vLLM, from the health watch); None: none
    failure: BaseException | None = None

    def __init__(self) -> None:
        self.previous: dict[int, Any] = {}

    def fail(self, error: BaseException) -> None:
        """End the run with ``error`` (raised by the loop at its next check; any thread).

        After a signal asked the run to stop, ``error`` is ignored: whoever sent it (e.g.
        atropos-launch on Ctrl-C) stops vLLM too, and the run ends as ``stop_requested``.
        """
        if self.signum is not None:
            first_line = (str(error).splitlines() or [type(error).__name__])[0]
            print(f"[grpo] not an error: the run was stopping on signal {self.signum} ({first_line})",
                  flush=True)
            return
        self.failure, self.requested = error, True

    def restore(self) -> None:
        """Reinstall the SIGINT/SIGTERM handlers that were in place before (no-op if none)."""
        for sig, handler in self.previous.items():
            # None: the handler was not set from Python; the default is the closest
            signal.signal(sig, signal.SIG_DFL if handler is None else handler)
        self.previous.clear()


def stop_requested(dist: Any, stop: StopFlag) -> bool:
    """Rank 0's stop decision, for every rank: True when a stop was requested.

    Raises:
        VLLMDiedError: on every rank, when the health watch found vLLM dead (its message).
    """
    from example_trainer.health import VLLMDiedError

    requested, failure = dist.from_main((stop.requested, str(stop.failure) if stop.failure else None))
    if failure is not None:
        raise stop.failure if stop.failure is not None else VLLMDiedError(failure)
    return requested


def save_on_exit(dist: Any, save_checkpoint: Any, step: int, error: BaseException) -> None:
    """Write ``checkpoints/step_<step>`` while the run ends with ``error``; never raises.

    A single process only: under FSDP saving gathers the weights from every rank, which a
    rank that failed alone would never join (the interval checkpoints are the resume points).
    """
    if dist.enabled:
        print(f"[grpo] no checkpoint on exit under FSDP (ranks cannot gather after {type(error).__name__}); "
              "resume from the last interval checkpoint", flush=True)
        return
    try:
        save_checkpoint(f"step_{step}")
        print(f"[grpo] {type(error).__name__} ended the run: saved checkpoints/step_{step} "
              "(resume with --resume RUN_DIR)", flush=True)
    except BaseException as exc:  # noqa: BLE001 - the original error is the one to raise
        print(f"[grpo] could not save a checkpoint on exit: {type(exc).__name__}: {exc}", flush=True)


def failed_part(error: BaseException | None) -> str | None:
    """Which part of the run ``error`` names: ``vllm``, ``run-api`` or ``trainer`` (None: no error)."""
    from atroposlib.errors import ApiError, InferenceError

    if error is None or isinstance(error, KeyboardInterrupt):
        return None
    if isinstance(error, InferenceError):
        return "vllm"
    if isinstance(error, ApiError):
        return "run-api"
    return "trainer"


def install_stop_handler() -> StopFlag:
    """First SIGINT/SIGTERM: finish the current step, save, evaluate. Second: exit at once."""
    flag = StopFlag()

    def handler(signum: int, frame: Any) -> None:
        if flag.requested:
            raise KeyboardInterrupt
        flag.requested, flag.signum = True, int(signum)
        print(f"[grpo] got signal {signum}: stopping after this step (again to abort)", flush=True)

    for sig in (signal.SIGINT, signal.SIGTERM):
        try:
            flag.previous[sig] = signal.signal(sig, handler)
        except ValueError:  # not the main thread (e.g. called from a test thread)
            pass
    return flag
