"""Run directories: concurrent runs of one second get their own, a run never lands in another's."""

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from atroposlib.errors import ConfigError
from atroposlib.utils.run_dirs import claim_run_dir, new_run_dir

REPO = Path(__file__).resolve().parents[2]

# Each child waits for a common start time, takes a run dir named after the same second, and
# writes a summary there the way a run does (and reads it back after the others wrote theirs).
CHILD = """
import json, os, sys, time
from atroposlib.utils.run_dirs import new_run_dir
root, start, second, me = sys.argv[1], float(sys.argv[2]), float(sys.argv[3]), sys.argv[4]
while time.time() < start:
    time.sleep(0.001)
run_dir = new_run_dir(root, now=second)
(run_dir / "summary.json").write_text(json.dumps({"writer": me, "pid": os.getpid(), "steps": 3}))
print(run_dir)
"""


def test_processes_racing_in_one_second_each_get_their_own_run_dir(tmp_path):
    second = time.time()
    start = time.time() + 3.0  # every child is up and waiting by then
    children = [subprocess.Popen([sys.executable, "-c", CHILD, str(tmp_path / "runs"), str(start),
                                  str(second), f"run{i}"], stdout=subprocess.PIPE, text=True,
                                 cwd=REPO) for i in range(6)]
    outputs = [child.communicate(timeout=120)[0].strip() for child in children]
    assert [child.returncode for child in children] == [0] * 6
    dirs = [Path(out) for out in outputs]
    assert len(set(dirs)) == 6
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime(second))
    assert sorted(d.name for d in dirs) == sorted([stamp, *(f"{stamp}-{n}" for n in range(2, 7))])
    for i, run_dir in enumerate(dirs):  # each summary is the one its own writer wrote, whole
        assert json.loads((run_dir / "summary.json").read_text())["writer"] == f"run{i}"


def test_new_run_dir_is_named_by_utc_time_and_skips_taken_names(tmp_path):
    now = 1_800_000_000.0  # 2027-01-15 08:00:00 UTC
    first = new_run_dir(tmp_path / "runs", now=now)
    assert first == tmp_path / "runs" / "20270115-080000" and first.is_dir()
    (tmp_path / "runs" / "20270115-080000-2").mkdir()  # e.g. another host's run
    assert new_run_dir(tmp_path / "runs", now=now).name == "20270115-080000-3"


def test_a_named_run_dir_that_holds_a_run_is_refused_with_the_fix(tmp_path):
    fresh = claim_run_dir(tmp_path / "mine")
    assert (fresh / "logs").is_dir()
    with pytest.raises(ConfigError, match=r"holds a run already \(logs\).*--run-dir.*leave run_dir unset"):
        claim_run_dir(tmp_path / "mine")
    done = tmp_path / "done"
    done.mkdir()
    (done / "summary.json").write_text("{}")
    with pytest.raises(ConfigError, match=r"holds a run already \(summary.json\)"):
        claim_run_dir(done)
    (tmp_path / "notes").mkdir()  # a directory with unrelated files is fine
    (tmp_path / "notes" / "README").write_text("my run")
    assert claim_run_dir(tmp_path / "notes") == tmp_path / "notes"
    (tmp_path / "file").write_text("x")
    with pytest.raises(ConfigError, match="is a file"):
        claim_run_dir(tmp_path / "file")
