"""Shared by the runtime tests: the count_steps job, device-interval and output checks."""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

COUNT_STEPS = str(Path(__file__).resolve().parents[1] / "jobs" / "count_steps.py")


def count_steps_command(output: Path, *extra: str) -> list[str]:
    return [sys.executable, COUNT_STEPS, str(output), *extra]


def steps_written(output: Path) -> list[int]:
    return [int(x) for x in output.read_text().split()] if output.exists() else []


def elastic_launches(out: Path) -> list[dict[int, dict]]:
    """What ``tests/jobs/elastic_steps.py`` logged in ``out``, per launch in epoch order: rank -> what the rank
    wrote at its start, plus ``steps``, the steps it ran."""
    by_epoch: dict[int, dict[int, dict]] = {}
    for f in out.glob("launch-e*-r*.json"):
        doc = json.loads(f.read_text())
        steps = out / f"steps-e{doc['epoch']}-r{doc['rank']}.txt"
        doc["steps"] = [int(x) for x in steps.read_text().split()] if steps.exists() else []
        by_epoch.setdefault(doc["epoch"], {})[doc["rank"]] = doc
    return [by_epoch[e] for e in sorted(by_epoch)]


def assert_no_device_overlap(work_dir: Path) -> list[dict]:
    """Every device was held by at most one job at a time; returns the intervals."""
    intervals = [json.loads(line) for line in (work_dir / "devices.jsonl").read_text().splitlines()]
    by_gpu: dict[int, list[tuple[float, float, str]]] = {}
    for iv in intervals:
        assert iv["end"] >= iv["start"]
        for g in iv["gpu_ids"]:
            by_gpu.setdefault(g, []).append((iv["start"], iv["end"], iv["job"]))
    for g, ivs in by_gpu.items():
        ivs.sort()
        for (s1, e1, j1), (s2, e2, j2) in zip(ivs, ivs[1:]):
            assert e1 <= s2, f"device {g} held by {j1} until {e1} and by {j2} from {s2}"
    return intervals


JOBS_DIR = Path(__file__).resolve().parents[1] / "jobs"
REPO = str(Path(__file__).resolve().parents[2])


def marked_processes(mark: str) -> list[int]:
    """Live processes whose environment holds ``ALLOCOPT_TEST_MARK=<mark>`` (a test job's tree)."""
    needle, out = f"ALLOCOPT_TEST_MARK={mark}".encode(), []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == os.getpid():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                if f.read().rsplit(b")", 1)[1].split()[0] in (b"Z", b"X"):
                    continue
            with open(f"/proc/{name}/environ", "rb") as f:
                if needle in f.read().split(b"\0"):
                    out.append(int(name))
        except (OSError, IndexError):
            continue
    return out


def interruptible() -> None:
    """``preexec_fn`` of a child that a test stops with SIGINT: Ctrl-C's default disposition, as a
    terminal's foreground process has it. A runner that starts the tests in the background (SIGINT
    ignored, as a shell's ``&`` does) would otherwise pass the ignoring on."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def repo_env() -> dict[str, str]:
    """This environment with the repository first on PYTHONPATH (for `python -m allocopt` subprocesses)."""
    return {**os.environ, "PYTHONPATH": os.pathsep.join([REPO, os.environ.get("PYTHONPATH", "")])}
