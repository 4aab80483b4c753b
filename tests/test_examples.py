"""The adapter examples run as real subprocesses."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def run_example(name: str) -> str:
    return subprocess.run([sys.executable, str(EXAMPLES / name)], capture_output=True, text=True, timeout=120,
                          check=True).stdout


def test_gavel_drop_in():
    out = run_example("gavel_drop_in.py")
    for name in ("max_min_fairness:", "max_min_fairness_perf:", "max_sum_throughput_perf:"):
        assert name in out
    assert out.count("steps/s") == 12


def test_sia_rounds():
    out = run_example("sia_rounds.py")
    assert [line for line in out.splitlines() if line.startswith("round")] == [f"round {k}:" for k in range(5)]
    assert "keeps its GPUs" in out and "restore" in out
