"""The vLLM log filter: warnings that need no action here become one note; the rest pass."""

from __future__ import annotations

import inspect
import json
import logging
import logging.config
import subprocess
import sys

from atroposlib.inference.vllm_log import (
    EXPECTED_STARTUP,
    LAYER_NOT_RELOADED,
    LOGGING_CONFIG,
    PARTIAL_RELOAD_NOTE,
    STARTUP_NOTE,
    TENSORS_NOT_RELOADED,
    QuietVLLMFilter,
    logging_environment,
)
from atroposlib.inference.vllm_process import VLLMProcess


def _record(msg: str, *args: object, level: int = logging.WARNING) -> logging.LogRecord:
    return logging.LogRecord("vllm.x", level, __file__, 1, msg, args, None)


def _passed(quiet: QuietVLLMFilter, records: list[logging.LogRecord]) -> list[tuple[str, str]]:
    return [(r.levelname, r.getMessage()) for r in records if quiet.filter(r)]


def test_partial_reload_warnings_become_one_note_and_other_records_pass():
    quiet = QuietVLLMFilter()
    records = []
    for _reload in range(2):
        records += [_record(LAYER_NOT_RELOADED, n) for n in ("LlamaDecoderLayer", "RMSNorm")]
        records.append(_record(TENSORS_NOT_RELOADED, {"a.weight", "b.weight", "c.weight"}))
    records.append(_record("%s: something else", "RMSNorm"))
    assert _passed(quiet, records) == [("INFO", PARTIAL_RELOAD_NOTE % 3),
                                       ("WARNING", "RMSNorm: something else")]
    assert quiet.dropped == 5


def test_expected_startup_warnings_become_one_note_and_actionable_ones_pass():
    quiet = QuietVLLMFilter()
    records = [_record(EXPECTED_STARTUP[0] + ", CUDAGraphs ..."), _record(EXPECTED_STARTUP[2]),
               _record(EXPECTED_STARTUP[5] + " ...", 0),
               _record("Found ulimit of %s and failed to automatically increase", 20000),
               _record(EXPECTED_STARTUP[2], level=logging.ERROR)]
    assert _passed(quiet, records) == [
        ("INFO", STARTUP_NOTE),
        ("WARNING", "Found ulimit of 20000 and failed to automatically increase"),
        ("ERROR", EXPECTED_STARTUP[2])]  # only warnings are hidden


def test_the_hidden_messages_are_the_ones_this_vllm_logs():
    from vllm.config import vllm as vllm_config
    from vllm.engine import arg_utils
    from vllm.model_executor.model_loader.reload import inplace, layerwise
    from vllm.platforms import cpu

    sources = "".join(inspect.getsource(m) for m in (vllm_config, arg_utils, cpu))
    assert f'"{LAYER_NOT_RELOADED}"' in inspect.getsource(layerwise)
    assert f'"{TENSORS_NOT_RELOADED}"' in inspect.getsource(inplace)
    for start in EXPECTED_STARTUP:  # each may be split over string literals in the source
        assert start.split(" ")[0] in sources and start.split(" ")[-1].strip(".") in sources


def test_vllm_gets_the_config_unless_the_user_configures_its_logging(tmp_path, monkeypatch):
    for key in ("VLLM_LOGGING_CONFIG_PATH", "VLLM_LOGGING_LEVEL", "VLLM_CONFIGURE_LOGGING"):
        monkeypatch.delenv(key, raising=False)
    assert VLLMProcess(tmp_path, port=1).environment()["VLLM_LOGGING_CONFIG_PATH"] == str(LOGGING_CONFIG)
    own = VLLMProcess(tmp_path, port=1, env={"VLLM_LOGGING_CONFIG_PATH": "/mine.json"})
    assert own.environment()["VLLM_LOGGING_CONFIG_PATH"] == "/mine.json"
    assert logging_environment({"VLLM_LOGGING_LEVEL": "DEBUG"}) == {}
    assert logging_environment({"VLLM_CONFIGURE_LOGGING": "0"}) == {}


def test_the_config_is_vllms_default_plus_the_filter():
    from vllm.logger import DEFAULT_LOGGING_CONFIG

    ours = json.loads(LOGGING_CONFIG.read_text())
    theirs = DEFAULT_LOGGING_CONFIG
    assert ours["formatters"]["vllm"]["format"] == theirs["formatters"]["vllm"]["format"]
    assert ours["formatters"]["vllm"]["()"] == theirs["formatters"]["vllm"]["()"]
    assert ours["loggers"] == theirs["loggers"]
    assert ours["handlers"]["vllm"]["filters"] == ["atroposlib_quiet"]


def test_vllm_applies_the_config_in_a_fresh_process():
    """A fresh interpreter that vLLM configures from the file logs through the filter."""
    code = ("import logging\nfrom vllm.config.logging import LoggingConfig\n"
            "from vllm.logger import configure_logging\nconfigure_logging(LoggingConfig())\n"
            "log = logging.getLogger('vllm.atropos_test')\n"
            f"log.warning({EXPECTED_STARTUP[2]!r})\nlog.warning({EXPECTED_STARTUP[0]!r})\n"
            "log.warning('Found ulimit of 1')\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env={**logging_environment({}), "PATH": "/usr/bin:/bin",
                               "HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = proc.stdout
    assert out.count(STARTUP_NOTE) == 1 and "Found ulimit of 1" in out, out
    assert EXPECTED_STARTUP[2] not in out and EXPECTED_STARTUP[0] not in out, out
    assert " INFO " in next(line for line in out.splitlines() if STARTUP_NOTE in line)
