"""The benchmarks' process-tree sampler: the total's peak, its breakdown, and what it calls ``other``."""

from __future__ import annotations

import sys
import time

import pytest

pytest.importorskip("psutil")


def test_the_peak_sample_is_kept_with_its_parts_and_other_processes_are_named(tmp_path):
    from benchmarks.process_tree import Tree

    # a parent whose command line names no part, holding ~64 MiB, with a `sleep` child
    script = ("import subprocess, time; ballast = b'x' * (64 << 20); "
              "child = subprocess.Popen(['sleep', '30']); time.sleep(30)")
    with Tree([sys.executable, "-c", script], tmp_path / "log.txt", interval=0.1) as tree:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and not any(k.startswith("sleep") for k in tree.other_cmdlines):
            time.sleep(0.1)
        tree.sample()
    assert tree.rss_by_part_at_peak and sum(tree.rss_by_part_at_peak.values()) == tree.peak_rss
    assert set(tree.rss_by_part_at_peak) == {"other"}
    assert tree.other_cmdlines.get("sleep 30", 0) > 0
    (parent,) = [k for k in tree.other_cmdlines if k.startswith(sys.executable)]
    assert tree.other_cmdlines[parent] > 64 << 20  # the ballast is resident
