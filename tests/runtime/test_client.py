"""The job-side client, in-process and in real subprocesses driven by hand (no executor)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from allocopt.runtime import client
from tests.runtime.helpers import count_steps_command, steps_written


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    return {**os.environ, "ALLOCOPT_CHECKPOINT_DIR": str(tmp_path / "ckpt"),
            "ALLOCOPT_PROGRESS_FILE": str(tmp_path / "progress.jsonl"),
            "ALLOCOPT_STOP_FILE": str(tmp_path / "stop"), **extra}


def _records(tmp_path: Path) -> list[dict]:
    path = tmp_path / "progress.jsonl"
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


def _wait_for(predicate, timeout_s: float = 10.0) -> None:
    """Poll ``predicate``; a hang guard, not a speed check."""
    limit = time.time() + timeout_s
    while not predicate():
        if time.time() >= limit:
            pytest.fail(f"the condition did not hold within {timeout_s} s: the job side seems stuck")
        time.sleep(0.01)


def test_lease_from_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for k, v in {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "MASTER_PORT": "1234", "ALLOCOPT_MAX_STEPS": "7",
                 "ALLOCOPT_TOTAL_STEPS": "100", "ALLOCOPT_LEASE_END": "123.5", "ALLOCOPT_DEVICES": "0,1",
                 "ALLOCOPT_JOB_ID": "j", "ALLOCOPT_CHECKPOINT_DIR": str(tmp_path)}.items():
        monkeypatch.setenv(k, v)
    lease = client.lease()
    assert (lease.rank, lease.world_size, lease.local_rank, lease.master_port) == (1, 2, 1, 1234)
    assert (lease.max_steps, lease.total_steps, lease.lease_end) == (7, 100, 123.5)
    assert lease.devices == ("0", "1") and lease.job_id == "j" and lease.checkpoint_dir == str(tmp_path)


def test_checkpoints_are_atomic_and_the_newest_good_one_loads(monkeypatch: pytest.MonkeyPatch,
                                                              tmp_path: Path) -> None:
    monkeypatch.setenv("ALLOCOPT_CHECKPOINT_DIR", str(tmp_path))
    monkeypatch.delenv("RANK", raising=False)
    assert client.load_checkpoint() is None
    for step in (1, 2, 3):
        client.save_checkpoint({"step": step, "w": [step] * 3})
    files = sorted(p.name for p in tmp_path.iterdir())
    assert files == ["ckpt-000000000002.ckpt", "ckpt-000000000003.ckpt"]  # the newest two, no temp files
    assert client.load_checkpoint() == {"step": 3, "w": [3, 3, 3]}
    (tmp_path / "ckpt-000000000004.ckpt").write_bytes(b"\x80\x05truncated")  # a torn write, as after a crash
    assert client.load_checkpoint()["step"] == 3
    with pytest.raises(ValueError, match="step"):
        client.save_checkpoint([1, 2])


def test_standalone_run_reaches_total_steps(tmp_path: Path) -> None:
    out = tmp_path / "out.txt"
    subprocess.run(count_steps_command(out), env=_env(tmp_path, ALLOCOPT_TOTAL_STEPS="20"), check=True, timeout=20)
    assert steps_written(out) == list(range(20))
    events = [r["event"] for r in _records(tmp_path)]
    assert events[0] == "start" and events[-1] == "exit" and _records(tmp_path)[-1]["reason"] == "done"
    # a second run resumes from the checkpoint at the end: nothing to do, nothing repeated
    subprocess.run(count_steps_command(out), env=_env(tmp_path, ALLOCOPT_TOTAL_STEPS="20"), check=True, timeout=20)
    assert steps_written(out) == list(range(20))


@pytest.mark.parametrize("how", ["stop_file", "sigterm"])
def test_stop_request_ends_the_loop_after_the_current_step(tmp_path: Path, how: str) -> None:
    out = tmp_path / "out.txt"
    proc = subprocess.Popen(count_steps_command(out, "--sleep-s", "0.02"),
                            env=_env(tmp_path, ALLOCOPT_TOTAL_STEPS="100000"))
    _wait_for(lambda: len(steps_written(out)) >= 5)
    if how == "stop_file":
        (tmp_path / "stop").touch()
    else:
        proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=10) == 0
    last = _records(tmp_path)[-1]
    assert last["event"] == "exit" and last["reason"] == "stop"
    assert steps_written(out) == list(range(last["step"])) and last["ckpt"] == last["step"]


def test_lease_end_pauses_until_the_lease_file_extends_it(tmp_path: Path) -> None:
    out, lease_file = tmp_path / "out.txt", tmp_path / "lease.json"
    lease_file.write_text(json.dumps({"seq": 1, "lease_end": time.time() + 0.3, "max_steps": None}))
    proc = subprocess.Popen(count_steps_command(out), env=_env(tmp_path, ALLOCOPT_TOTAL_STEPS="100000",
                                                             ALLOCOPT_LEASE_FILE=str(lease_file)))
    _wait_for(lambda: any(r["event"] == "paused" for r in _records(tmp_path)))
    paused_at = len(steps_written(out))
    time.sleep(0.2)
    assert len(steps_written(out)) == paused_at and proc.poll() is None  # paused, alive
    lease_file.write_text(json.dumps({"seq": 2, "lease_end": None, "max_steps": 10}))  # 10 more steps
    _wait_for(lambda: sum(r["event"] == "paused" for r in _records(tmp_path)) == 2)
    assert len(steps_written(out)) == paused_at + 10
    (tmp_path / "stop").touch()
    assert proc.wait(timeout=10) == 0
    assert steps_written(out) == list(range(paused_at + 10))
    assert {r["pid"] for r in _records(tmp_path) if r["event"] == "start"} == {proc.pid}


def test_report_adds_metrics_records(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("ALLOCOPT_PROGRESS_FILE", str(tmp_path / "progress.jsonl"))
    client.report(loss=0.5, epoch=2)
    rec = _records(tmp_path)[0]
    assert rec["event"] == "metrics" and rec["loss"] == 0.5 and rec["epoch"] == 2
