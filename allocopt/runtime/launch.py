"""Starting a job's ranks on this machine: the environment each rank gets (torchrun-style variables, the
job's files, its devices), each rank's process in its own session and contained with its whole tree
(:mod:`allocopt.runtime.procs`), job directory names and the work directory's lock and watchdog.

The :class:`~allocopt.runtime.local.LocalExecutor` decides when ranks start and stop; executors that run
ranks elsewhere (:mod:`allocopt.runtime.ray_executor`) build the same environment with
:func:`job_environment` and :func:`rank_environment` and implement their own :class:`RankProcess`.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import re
import socket
import subprocess
import sys
import time
import uuid
from abc import ABC, abstractmethod
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from allocopt.errors import InvalidProblemError, StateError
from allocopt.runtime.executor import Lease
from allocopt.runtime.procs import (LAUNCH_VAR, ProcessTree, contain_child, reap_children, start_ticks)

log = logging.getLogger(__name__)

_THREAD_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "NUMEXPR_NUM_THREADS",
                "VECLIB_MAXIMUM_THREADS", "ALLOCOPT_NUM_THREADS")


@dataclass(frozen=True)
class JobSpec:
    """What to run for a job.

    Attributes
    ----------
    name : str
    command : sequence of str or str
        Argument list, or a shell command line.
    total_steps : int
        Steps of the whole job (``ALLOCOPT_TOTAL_STEPS``).
    env : mapping of str to str
        Extra environment on top of the inherited one.
    cwd : str or None
    """

    name: str
    command: Sequence[str] | str
    total_steps: int
    env: Mapping[str, str] = field(default_factory=dict)
    cwd: str | None = None


class RankProcess(ABC):
    """One rank's process, leader of its own session, and the process tree it started, wherever it runs.

    ``pid`` is its process id (on its node).
    """

    pid: int

    @abstractmethod
    def poll(self) -> int | None:
        """Exit status, or None while the process runs."""

    @abstractmethod
    def signal_group(self, sig: int) -> None:
        """Send ``sig`` to every process of the tree (no error when they are gone)."""

    @abstractmethod
    def group_alive(self) -> bool:
        """Whether any process of the tree is still alive (exited ones waiting to be reaped are not)."""

    @abstractmethod
    def reap(self) -> None:
        """Once the tree is gone: collect the exit statuses and free what the processes held."""

    def lost(self) -> bool:
        """Whether the rank ended because its device went away under it (the Ray actor holding it died, or
        its node was lost) rather than by its own exit."""
        return False


class DeviceLostError(Exception):
    """A rank could not be started because its device is gone (its Ray actor died and is not back)."""


class _LocalProcess(RankProcess):
    """A rank started with :class:`subprocess.Popen` on this machine, and its process tree."""

    def __init__(self, popen: subprocess.Popen, token: str):
        self.popen, self.pid = popen, popen.pid
        self.tree = ProcessTree(popen.pid, start_ticks(popen.pid), token)

    def poll(self) -> int | None:
        return self.popen.poll()

    def signal_group(self, sig: int) -> None:
        self.tree.signal(sig)

    def group_alive(self) -> bool:
        return self.tree.alive()

    def reap(self) -> None:
        self.popen.wait()
        reap_children(self.tree.members())


def sanitized_job_name(job_id: Hashable) -> str:
    """``job_id`` with every character but letters, digits and ``_.-`` replaced by ``_``."""
    return re.sub(r"[^A-Za-z0-9_.-]", "_", str(job_id)) or "job"


def job_directory_name(job_id: Hashable) -> str:
    """The name of the job's directory under ``work_dir/jobs``.

    Raises
    ------
    InvalidProblemError
        For names that would not be a directory of their own (``"."``, ``".."``).
    """
    name = sanitized_job_name(job_id)
    if name in (".", ".."):
        raise InvalidProblemError(f"job name {str(job_id)!r} cannot name a job directory; rename the job",
                                  field="name", job=job_id)
    return name


def free_port() -> int:
    """A TCP port free on this machine now (for ``MASTER_PORT``)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def exclusive_lock(path: Path, what: str, hint: str, wait_s: float = 0.0) -> int:
    """Take the exclusive lock ``path`` (``flock``; the file holds the holder's PID) for ``what``,
    waiting up to ``wait_s`` seconds for it; return its fd (closing it, or exiting, releases the lock).

    Raises
    ------
    StateError
        When another process holds it (its PID named, then ``hint``), or the file cannot be created.
    """
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    except OSError as err:
        raise StateError(f"cannot create the lock file {path}: {err.strerror or err}") from None
    limit = time.monotonic() + wait_s
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            break
        except BlockingIOError:
            if time.monotonic() < limit:
                time.sleep(0.02)
                continue
            holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise StateError(f"{what} is in use by another scheduler (pid {holder}); stop it first, or {hint}") \
                from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd


def _write_json_atomic(path: Path, data: Any) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(data), encoding="utf-8")
    os.replace(tmp, path)


def job_environment(job_id: Hashable, spec: JobSpec, lease: Lease, job_dir: Path, t0: float,
                    renew_wait_s: float, epoch: int, num_threads: int | None = None) -> dict[str, str | None]:
    """The variables every rank of a lease gets (see :mod:`allocopt.runtime.client`); None: unset.

    ``epoch`` is the launch's lease epoch (it names the launch's files); ``num_threads``, when given,
    sets the thread-pool variables the job's own ``env`` does not set.
    """
    world = len(lease.gpu_ids)
    threads = {} if num_threads is None else {k: str(num_threads) for k in _THREAD_VARS}
    return {**threads, **{str(k): str(v) for k, v in spec.env.items()}, **batch_environment(lease),
            "ALLOCOPT_JOB_ID": str(job_id), "ALLOCOPT_TOTAL_STEPS": str(spec.total_steps),
            "ALLOCOPT_LEASE_END": repr(t0 + lease.max_seconds),
            "ALLOCOPT_LEASE_FILE": str(job_dir / f"lease-e{epoch}.json"),
            "ALLOCOPT_STOP_FILE": str(job_dir / "stop"), "ALLOCOPT_CHECKPOINT_DIR": str(job_dir / "checkpoints"),
            "ALLOCOPT_RENEW_WAIT_S": repr(renew_wait_s), "ALLOCOPT_GPU_TYPE": lease.gpu_type,
            "ALLOCOPT_SYNC_FILE": str(job_dir / f"sync-e{epoch}.json") if world > 1 else None,
            "ALLOCOPT_MAX_STEPS": None if lease.max_steps is None else str(lease.max_steps),
            "ALLOCOPT_EPOCH": str(epoch), "ALLOCOPT_FENCE_DIR": str(job_dir),
            "WORLD_SIZE": str(world), "PYTHONUNBUFFERED": "1"}


def batch_environment(lease: Lease) -> dict[str, str | None]:
    """An elastic job's batch variables (``ALLOCOPT_BATCH_SIZE``, ``ALLOCOPT_LOCAL_BSZ``,
    ``ALLOCOPT_ACCUM_STEPS``, ``ALLOCOPT_LR_SCALE``); unset for a rigid job's lease."""
    b = lease.batch
    return {"ALLOCOPT_BATCH_SIZE": None if b is None else str(b.batch_size),
            "ALLOCOPT_LOCAL_BSZ": None if b is None else str(b.local_bsz),
            "ALLOCOPT_ACCUM_STEPS": None if b is None else str(b.accum_steps),
            "ALLOCOPT_LR_SCALE": None if b is None else repr(float(b.lr_scale))}


def rank_environment(rank: int, local_rank: int, local_world_size: int, master_addr: str, master_port: int,
                     devices: Sequence[str], gpu: bool, progress_file: Path) -> dict[str, str]:
    """The variables of one rank: torchrun-style ones, its devices (``CUDA_VISIBLE_DEVICES`` is empty
    for ``cpu`` pseudo-devices) and its progress file."""
    return {"RANK": str(rank), "LOCAL_RANK": str(local_rank), "LOCAL_WORLD_SIZE": str(local_world_size),
            "MASTER_ADDR": master_addr, "MASTER_PORT": str(master_port), "ALLOCOPT_DEVICES": ",".join(devices),
            "CUDA_VISIBLE_DEVICES": ",".join(devices) if gpu else "", "ALLOCOPT_PROGRESS_FILE": str(progress_file)}


def merge_environment(inherited: Mapping[str, str], *parts: Mapping[str, str | None]) -> dict[str, str]:
    """``inherited`` updated by ``parts`` in order; a None value removes the variable."""
    env = dict(inherited)
    for part in parts:
        for key, value in part.items():
            if value is None:
                env.pop(key, None)
            else:
                env[key] = value
    return env


def start_process(command: Sequence[str] | str, env: Mapping[str, str], cwd: str | None,
                  log_file: Path, token: str | None = None) -> tuple[subprocess.Popen, str]:
    """Start a rank in its own session, output appended to ``log_file``; return it and its launch
    token (``token`` or a new one; in its environment as ``ALLOCOPT_LAUNCH``, see :class:`ProcessTree`).

    On Linux the rank is killed when the starting process dies, and never outlives it: the
    parent is checked again after the death signal is armed. Bare ``python``/``python3`` runs this
    process's interpreter. Raises OSError when the command cannot be started.
    """
    parent, token = os.getpid(), token or new_token()
    env = {**env, LAUNCH_VAR: token, "ALLOCOPT_SCHEDULER_PID": str(parent),
           "ALLOCOPT_SCHEDULER_TICKS": str(start_ticks(parent) or "")}
    if isinstance(command, str):
        env["PATH"] = os.pathsep.join([os.path.dirname(sys.executable), env.get("PATH", os.defpath)])
    elif command and command[0] in ("python", "python3"):
        command = [sys.executable, *command[1:]]
    with open(log_file, "ab") as log:
        popen = subprocess.Popen(command, shell=isinstance(command, str), env=env, cwd=cwd,
                                 stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                 start_new_session=True, preexec_fn=lambda: contain_child(parent))
    return popen, token


def new_token() -> str:
    """A fresh launch token."""
    return uuid.uuid4().hex


def cpu_threads(devices: int) -> int:
    """Threads per ``cpu`` pseudo-device: this process's cores shared among ``devices`` of them."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:
        cores = os.cpu_count() or 1
    return max(1, cores // max(1, devices))


def _start_watchdog(work_dir: Path) -> tuple[subprocess.Popen, int] | None:
    """Start the work directory's watchdog (Linux; see :mod:`allocopt.runtime.watchdog`): the process
    and the write end of its pipe, or None where it cannot run."""
    if not sys.platform.startswith("linux"):
        return None
    import allocopt

    read, write = os.pipe()  # neither end is inherited by the jobs (O_CLOEXEC)
    env = {k: v for k, v in os.environ.items() if k != LAUNCH_VAR}
    env["PYTHONPATH"] = os.pathsep.join([str(Path(allocopt.__file__).resolve().parents[1]),
                                         *filter(None, [env.get("PYTHONPATH")])])
    try:
        proc = subprocess.Popen([sys.executable, "-m", "allocopt.runtime.watchdog", str(work_dir)], stdin=read,
                                stdout=subprocess.DEVNULL, env=env, start_new_session=True)
    except OSError as err:
        log.warning("no watchdog for %s (%s): jobs outlive a killed scheduler until it restarts", work_dir, err)
        os.close(write)
        return None
    finally:
        os.close(read)
    return proc, write


__all__ = ["JobSpec", "RankProcess", "batch_environment", "cpu_threads", "exclusive_lock", "free_port", "job_directory_name",
           "job_environment", "merge_environment", "new_token", "rank_environment", "sanitized_job_name",
           "start_process"]
