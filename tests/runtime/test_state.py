"""Durable state: the journal's lock, permissions, loss and corruption; checkpoint headers; env values."""

from __future__ import annotations

import json
import os
import pickle
import signal
import sqlite3
import struct
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from allocopt.errors import DataFileError, StateError
from allocopt.runtime import client
from allocopt.runtime.devices import cpu_devices
from allocopt.runtime.local import LocalExecutor
from allocopt.runtime.loop import StateStore
from tests.runtime.helpers import count_steps_command, interruptible, marked_processes, repo_env, steps_written


def _jobs(tmp_path: Path, mark: str, total: int = 100_000, **env: str) -> Path:
    path = tmp_path / "jobs.json"
    path.write_text(json.dumps({"jobs": [{"name": n, "command": count_steps_command(tmp_path / f"{n}.txt"),
                                          "total_steps": total, "env": {"ALLOCOPT_TEST_MARK": mark, **env}}
                                         for n in ("a", "b")]}))
    return path


def _start(tmp_path: Path, jobs_file: Path, *extra: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "allocopt", "run", str(jobs_file), "--cluster", "cpu=2",
                             "--round-seconds", "1", "--grace-s", "1", "--state", str(tmp_path / "s.db"), *extra],
                            env=repo_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=interruptible)


def _rounds(db: Path) -> int:
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as con:
        return con.execute("SELECT COUNT(*) FROM rounds").fetchone()[0]


def _wait_rounds(db: Path, n: int, proc: subprocess.Popen) -> None:
    limit = time.time() + 30
    while time.time() < limit and proc.poll() is None:
        try:
            if _rounds(db) >= n:
                return
        except sqlite3.Error:
            pass
        time.sleep(0.05)
    pytest.fail(f"no round {n} journaled: {proc.poll()} {proc.stderr.read() if proc.poll() is not None else ''}")


def test_second_scheduler_on_the_same_state_is_refused_naming_the_holder(tmp_path: Path) -> None:
    mark = uuid.uuid4().hex
    jobs_file = _jobs(tmp_path, mark)
    first = _start(tmp_path, jobs_file)
    try:
        _wait_rounds(tmp_path / "s.db", 1, first)
        second = subprocess.run([sys.executable, "-m", "allocopt", "run", str(jobs_file), "--cluster", "cpu=2",
                                 "--state", str(tmp_path / "s.db")], env=repo_env(), capture_output=True, text=True,
                                timeout=30)
        assert second.returncode == 1 and f"in use by another scheduler (pid {first.pid})" in second.stderr
        assert "Traceback" not in second.stderr
        other_state = subprocess.run([sys.executable, "-m", "allocopt", "run", str(jobs_file), "--cluster", "cpu=2",
                                      "--state", str(tmp_path / "t.db"), "--work-dir", str(tmp_path / "s.db.d")],
                                     env=repo_env(), capture_output=True, text=True, timeout=30)
        assert other_state.returncode == 1 and f"(pid {first.pid})" in other_state.stderr  # its work directory
        # the first scheduler's jobs were not touched: they keep running, each step once
        before = {n: len(steps_written(tmp_path / f"{n}.txt")) for n in ("a", "b")}
        _wait_rounds(tmp_path / "s.db", _rounds(tmp_path / "s.db") + 2, first)  # two more rounds from here
        first.send_signal(signal.SIGINT)
        out, err = first.communicate(timeout=30)
        assert first.returncode == 130 and "Traceback" not in err, err
        for n in ("a", "b"):
            written = steps_written(tmp_path / f"{n}.txt")
            assert written == list(range(len(written)))
        assert sum(len(steps_written(tmp_path / f"{n}.txt")) for n in ("a", "b")) > sum(before.values())
        assert marked_processes(mark) == []
    finally:
        first.kill()


@pytest.mark.parametrize("suffixes", [("",), ("", "-wal", "-shm")])
def test_journal_deleted_while_running_is_an_error_naming_it(tmp_path: Path, suffixes: tuple[str, ...]) -> None:
    mark = uuid.uuid4().hex
    run = _start(tmp_path, _jobs(tmp_path, mark))
    try:
        _wait_rounds(tmp_path / "s.db", 1, run)
        for suffix in suffixes:
            os.unlink(f"{tmp_path / 's.db'}{suffix}")
        out, err = run.communicate(timeout=30)
        assert run.returncode == 1 and "s.db was deleted or replaced" in err and "Traceback" not in err, err
        assert marked_processes(mark) == []
    finally:
        run.kill()
    again = subprocess.run([sys.executable, "-m", "allocopt", "run", str(tmp_path / "jobs.json"), "--cluster", "cpu=2",
                            "--state", str(tmp_path / "s.db")], env=repo_env(), capture_output=True, text=True,
                           timeout=30)
    assert again.returncode == 1 and "s.db is missing" in again.stderr and "Traceback" not in again.stderr
    last = again.stderr.strip().splitlines()[-1]
    assert ("s.db-wal" in last) == (suffixes == ("",))  # the -wal and -shm left behind, or the work directory


def test_corrupted_journal_is_named(tmp_path: Path) -> None:
    (tmp_path / "s.db").write_bytes(b"this is not a database" * 100)
    with pytest.raises(DataFileError, match="s.db: not a readable allocopt journal"):
        StateStore(tmp_path / "s.db")
    run = subprocess.run([sys.executable, "-m", "allocopt", "run", str(_jobs(tmp_path, "x")), "--cluster", "cpu=2",
                          "--state", str(tmp_path / "s.db")], env=repo_env(), capture_output=True, text=True,
                         timeout=30)
    assert run.returncode == 2 and "s.db" in run.stderr and "Traceback" not in run.stderr


def test_state_files_are_private_and_env_values_are_not_journaled(tmp_path: Path) -> None:
    mark, envs = uuid.uuid4().hex, tmp_path / "env"
    jobs_file = _jobs(tmp_path, mark, total=150, API_TOKEN="s3cret-value")
    doc = json.loads(jobs_file.read_text())
    for job in doc["jobs"]:
        # 150 steps of 20 ms outlast the first round, so the killed scheduler leaves both jobs unfinished
        job["command"] += ["--env-out", f"{envs}-{job['name']}", "--sleep-s", "0.02"]
    jobs_file.write_text(json.dumps(doc))
    run = _start(tmp_path, jobs_file)
    _wait_rounds(tmp_path / "s.db", 1, run)
    for suffix in ("", "-wal", "-shm", ".lock"):
        assert os.stat(f"{tmp_path / 's.db'}{suffix}").st_mode & 0o777 == 0o600, suffix
    assert os.stat(tmp_path / "s.db.d").st_mode & 0o777 == 0o700
    run.send_signal(signal.SIGKILL)
    run.wait()
    journal = b"".join(Path(f"{tmp_path / 's.db'}{s}").read_bytes() for s in ("", "-wal") if
                       Path(f"{tmp_path / 's.db'}{s}").exists())
    assert b"s3cret-value" not in journal and b"API_TOKEN" in journal
    for path in tmp_path.glob("env-*"):
        path.unlink()
    done = subprocess.run([sys.executable, "-m", "allocopt", "run", str(jobs_file), "--cluster", "cpu=2",
                           "--round-seconds", "1", "--state", str(tmp_path / "s.db")],
                          env=repo_env(), capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    for n in ("a", "b"):
        assert steps_written(tmp_path / f"{n}.txt") == list(range(150))
        if Path(f"{envs}-{n}.0").exists():  # relaunched after the restart: the value came from the job file
            assert json.loads(Path(f"{envs}-{n}.0").read_text())["env"]["API_TOKEN"] == "s3cret-value"
    assert any(Path(f"{envs}-{n}.0").exists() for n in ("a", "b"))
    with sqlite3.connect(tmp_path / "s.db") as con:
        env = json.loads(con.execute("SELECT config FROM jobs WHERE name = 'a'").fetchone()[0])["env"]
    assert env == {"ALLOCOPT_TEST_MARK": None, "API_TOKEN": None}


def _header(step: int, payload: bytes, length: int | None = None) -> bytes:
    import hashlib
    return struct.pack("<8sQQ32s", b"ALLOCKP1", step, len(payload) if length is None else length,
                       hashlib.sha256(payload).digest()) + payload


@pytest.mark.parametrize("garbage", ["bogus_length", "pickled_list", "dict_without_step", "wrong_step", "flipped",
                                     "old_plain_pickle", "empty"])
def test_garbage_newest_checkpoint_falls_back_to_the_newest_valid_one(monkeypatch: pytest.MonkeyPatch,
                                                                      tmp_path: Path, garbage: str) -> None:
    monkeypatch.setenv("ALLOCOPT_CHECKPOINT_DIR", str(tmp_path))
    monkeypatch.delenv("RANK", raising=False)
    client.save_checkpoint({"step": 5, "w": 1})
    good = (tmp_path / "ckpt-000000000005.ckpt").read_bytes()
    payloads = {"bogus_length": _header(9, b"x", length=2 ** 62),
                "pickled_list": _header(9, pickle.dumps([1, 2, 3])),
                "dict_without_step": _header(9, pickle.dumps({"state": 1})),
                "wrong_step": _header(9, pickle.dumps({"step": 8, "state": 1})),
                "flipped": good[:-1] + bytes([good[-1] ^ 1]),
                "old_plain_pickle": pickle.dumps({"step": 9, "state": 1}), "empty": b""}
    (tmp_path / "ckpt-000000000009.ckpt").write_bytes(payloads[garbage])
    assert client.load_checkpoint() == {"step": 5, "w": 1}
    ex = LocalExecutor({}, cpu_devices(1), tmp_path / "rt")
    (ex.checkpoint_dir("j")).mkdir(parents=True)
    for name in ("ckpt-000000000005.ckpt", "ckpt-000000000009.ckpt"):
        (ex.checkpoint_dir("j") / name).write_bytes((tmp_path / name).read_bytes())
    assert ex.checkpointed_steps("j") == 5


def test_a_second_state_store_in_one_process_is_refused(tmp_path: Path) -> None:
    first = StateStore(tmp_path / "s.db")
    with pytest.raises(StateError, match=f"pid {os.getpid()}"):
        StateStore(tmp_path / "s.db")
    first.close()
    StateStore(tmp_path / "s.db").close()
