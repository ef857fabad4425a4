"""How a run stops: a vLLM that dies after a stop signal is the stop's doing, not an error."""

import os
import signal

from example_trainer.health import VLLMDiedError
from example_trainer.stopping import install_stop_handler


def test_a_dead_vllm_ends_the_run_with_an_error_unless_a_signal_stopped_it_first(capsys):
    flag = install_stop_handler()
    try:
        died = VLLMDiedError("vLLM died: vLLM (pid 1, port 2) exited with code 1")
        flag.fail(died)
        assert flag.failure is died and flag.requested
    finally:
        flag.restore()
    flag = install_stop_handler()
    try:
        os.kill(os.getpid(), signal.SIGTERM)  # what atropos-launch sends the trainer on Ctrl-C
        assert flag.requested and flag.signum == signal.SIGTERM
        # ... and then it stops the trainer's vLLM, which exits cleanly
        flag.fail(VLLMDiedError("vLLM died: vLLM (pid 1, port 2) exited with code 0; last lines:\nbye"))
        assert flag.failure is None and flag.requested
    finally:
        flag.restore()
    out = capsys.readouterr().out
    assert "not an error: the run was stopping on signal 15 (vLLM died: vLLM (pid 1, port 2) exited with code 0" in out
