"""The examples run as real subprocesses; the job file of `allocopt run` loads and names existing scripts."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

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


def test_jobs_file_loads_and_its_scripts_exist():
    pytest.importorskip("yaml", reason="PyYAML not installed: pip install -e '.[runtime]'")
    from allocopt.runtime.loop import load_jobs

    jobs = load_jobs(EXAMPLES / "jobs.yaml")
    assert len(jobs) >= 2 and len({job.name for job in jobs}) == len(jobs)
    for job in jobs:
        words = job.command if isinstance(job.command, list) else job.command.split()
        scripts = [w for w in words if w.endswith(".py")]
        assert scripts and all((EXAMPLES.parent / s).is_file() for s in scripts), (job.name, words)
        assert 1 <= job.scale_factor <= 2 and job.total_steps > 0  # runs on the documented --cluster cpu=2


def test_pytorch_job_runs_stand_alone(tmp_path):
    pytest.importorskip("torch", reason="the PyTorch example needs torch")
    env = {**os.environ, "ALLOCOPT_TOTAL_STEPS": "20", "ALLOCOPT_CHECKPOINT_DIR": str(tmp_path / "ckpt"),
           "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, str(EXAMPLES / "pytorch_mlp.py"), "--hidden", "32"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert any((tmp_path / "ckpt").iterdir()), "the job checkpoints"


def test_every_example_is_run_by_a_test():
    tests = "\n".join(p.read_text(encoding="utf-8") for p in Path(__file__).parent.rglob("test_*.py"))
    for example in sorted(EXAMPLES.glob("*.py")):
        assert example.name in tests or example.stem in tests, f"no test runs examples/{example.name}"
