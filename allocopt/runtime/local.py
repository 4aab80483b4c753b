"""The local executor: runs each round's leases as subprocesses on this machine's devices.

Per job and lease, the job's command runs once per rank (``scale_factor`` ranks,
torchrun-style variables) with ``CUDA_VISIBLE_DEVICES`` set to exactly the job's
GPUs (empty for ``cpu`` pseudo-devices; ``ALLOCOPT_DEVICES`` names them either
way), in its own session. The job talks to the executor through files in
``work_dir/jobs/<job>/`` (see :mod:`allocopt.runtime.client`): a lease file it
re-reads (so a lease is extended without a restart), a stop file, and one
JSON-lines progress file per rank, all named by the launch's lease epoch.

Exactly-once progress: each launch gets a new lease epoch
(:mod:`allocopt.runtime.fence`) and a stale copy's commits are refused; every
rank's whole process tree (:class:`allocopt.runtime.procs.ProcessTree`: its
session, its descendants, the holders of its launch token) is contained: the
executor is their subreaper, each rank dies with the executor (the death-signal
race closed), the executor's watchdog (:mod:`allocopt.runtime.watchdog`) kills
the trees recorded in each job's ``pids.json`` when the executor dies, and a
restarted executor kills whatever is left of them before it launches anything.

At a lease's end a job pauses; the next round either extends it (same process)
or stops it: stop file, then SIGTERM, then SIGKILL, all within ``grace_s``;
every process of the tree is confirmed gone before its devices are reused.
Device holding intervals are appended to ``work_dir/devices.jsonl``.

Bare ``python``/``python3`` in a job's command runs the executor's own
interpreter (``sys.executable``; its directory leads ``PATH`` for shell
commands); give a path to use another one. Ranks on ``cpu`` pseudo-devices get
``OMP_NUM_THREADS`` (and MKL, OpenBLAS, ``ALLOCOPT_NUM_THREADS``) set to their
share of this machine's cores, unless the job's ``env`` sets them.

Where a rank's process runs is the one thing other executors change: they
override :meth:`LocalExecutor._start_ranks` with their own
:class:`RankProcess` (see :mod:`allocopt.runtime.ray_executor`) and build the
environment with :func:`job_environment` and :func:`rank_environment`.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import re
import signal
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
from allocopt.runtime import client, watchdog
from allocopt.runtime.devices import CPU_TYPE, Device
from allocopt.runtime.executor import Executor, JobRoundResult, Lease, RoundOutcome, RoundPlan
from allocopt.runtime.fence import issue_epoch
from allocopt.runtime.procs import (LAUNCH_VAR, ProcessTree, become_subreaper, contain_child, process_table,
                                    reap_children, start_ticks)
from allocopt.throughput.online import ThroughputEstimator

log = logging.getLogger(__name__)

POLL_S = 0.01  # seconds between checks of a job's processes and progress
_REAP_S = 1.0  # seconds between sweeps for exited orphans of running jobs
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


@dataclass
class ExecutorStats:
    """Latencies (seconds) and counts the executor measured, for reports and benchmarks."""

    launch_to_start_s: list[float] = field(default_factory=list)  # Popen to the client's first record
    launch_to_first_step_s: list[float] = field(default_factory=list)  # Popen to the first completed step
    popen_s: list[float] = field(default_factory=list)  # time spent in the executor launching one rank
    stop_s: list[float] = field(default_factory=list)  # stop request to every process of the job gone
    leases: int = 0
    extended: int = 0
    launches: int = 0
    retries: int = 0

    @property
    def extension_fraction(self) -> float:
        """Fraction of leases served by extending a running process instead of (re)starting it."""
        return self.extended / self.leases if self.leases else 0.0


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


@dataclass
class Rank:
    """One rank of a running job: its process and what its progress file said so far."""

    proc: RankProcess
    progress: Path
    launched_t: float  # epoch s
    offset: int = 0
    buf: bytes = b""
    step: int | None = None
    samples: int | None = None
    ckpt: int | None = None
    paused_seq: int | None = None
    exit_reason: str | None = None
    started_t: float | None = None
    first_step: tuple[float, int] | None = None
    records: list[tuple[float, int, str]] = field(default_factory=list)  # (t, step, event) this round

    def read(self) -> None:
        """Consume new progress records."""
        try:
            with open(self.progress, "rb") as f:
                f.seek(self.offset)
                data = f.read()
        except FileNotFoundError:
            return
        self.offset += len(data)
        lines = (self.buf + data).split(b"\n")
        self.buf = lines.pop()
        for line in lines:
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            event, t = rec.get("event"), float(rec.get("t", 0.0))
            if "ckpt" in rec and rec["ckpt"] is not None:
                self.ckpt = int(rec["ckpt"])
            if rec.get("samples") is not None:
                self.samples = int(rec["samples"])
            if event == "metrics" or "step" not in rec:
                continue
            self.step = int(rec["step"])
            self.records.append((t, self.step, event))
            if event == "start" and self.started_t is None:
                self.started_t = t
            elif event == "step" and self.first_step is None:
                self.first_step = (t, self.step)
            elif event == "paused":
                self.paused_seq = int(rec.get("seq", 0))
            elif event == "resumed":
                self.paused_seq = None
            elif event == "exit":
                self.exit_reason = str(rec.get("reason"))

    def started_step(self) -> int | None:
        """The step this round's records start from (its first start or paused record), None before any."""
        return next((step for _, step, event in self.records if event in ("start", "paused")), None)


@dataclass
class _Job:
    """A job whose processes this executor started and has not yet confirmed gone."""

    job_id: Hashable
    gpu_type: str
    gpu_ids: tuple[int, ...]
    ranks: list[Rank]
    seq: int
    restarted: bool = True
    stopping: bool = False

    @property
    def step(self) -> int | None:
        steps = [r.step for r in self.ranks if r.step is not None]
        return min(steps) if len(steps) == len(self.ranks) else None

    def paused(self) -> bool:
        return all(r.paused_seq == self.seq for r in self.ranks)

    def exited(self) -> bool:
        return all(r.proc.poll() is not None for r in self.ranks)


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
    return {**threads, **{str(k): str(v) for k, v in spec.env.items()},
            "ALLOCOPT_JOB_ID": str(job_id), "ALLOCOPT_TOTAL_STEPS": str(spec.total_steps),
            "ALLOCOPT_LEASE_END": repr(t0 + lease.max_seconds),
            "ALLOCOPT_LEASE_FILE": str(job_dir / f"lease-e{epoch}.json"),
            "ALLOCOPT_STOP_FILE": str(job_dir / "stop"), "ALLOCOPT_CHECKPOINT_DIR": str(job_dir / "checkpoints"),
            "ALLOCOPT_RENEW_WAIT_S": repr(renew_wait_s), "ALLOCOPT_GPU_TYPE": lease.gpu_type,
            "ALLOCOPT_SYNC_FILE": str(job_dir / f"sync-e{epoch}.json") if world > 1 else None,
            "ALLOCOPT_MAX_STEPS": None if lease.max_steps is None else str(lease.max_steps),
            "ALLOCOPT_EPOCH": str(epoch), "ALLOCOPT_FENCE_DIR": str(job_dir),
            "WORLD_SIZE": str(world), "PYTHONUNBUFFERED": "1"}


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


class LocalExecutor(Executor):
    """Runs round plans as local subprocesses.

    Parameters
    ----------
    jobs : mapping of job id to JobSpec
        Jobs may be added later with :meth:`add_job`.
    devices : sequence of Device
        The device behind each cluster-wide GPU id (``devices[g]`` for id ``g``);
        see :func:`allocopt.runtime.devices.devices_for_cluster`.
    work_dir : path
        Lease, stop, progress, log and checkpoint files. Held exclusively until
        :meth:`close` (StateError naming the holder's PID otherwise). Processes
        left over by an earlier executor on the same ``work_dir`` (a scheduler
        that was killed) are stopped when this one starts.
    grace_s : float, default 2.0
        Seconds from a stop request to SIGKILL: half waits for a cooperative
        stop, half after SIGTERM; also how long a job may overrun its lease end.
    max_retries : int, default 2
        Restarts of a job that crashes before it is marked failed for good.
    retry_backoff_s : float, default 0.5
        Delay before the k-th restart: ``retry_backoff_s * 2 ** (k - 1)`` seconds.
    estimator : ThroughputEstimator, optional
        Fed every measured throughput of a job it knows.
    renew_wait_s : float, default 30.0
        How long a paused job waits for the next round before exiting on its own.
    """

    def __init__(self, jobs: Mapping[Hashable, JobSpec], devices: Sequence[Device], work_dir: str | os.PathLike, *,
                 grace_s: float = 2.0, max_retries: int = 2, retry_backoff_s: float = 0.5,
                 estimator: ThroughputEstimator | None = None, renew_wait_s: float = 30.0):
        self.jobs: dict[Hashable, JobSpec] = dict(jobs)
        self.devices = list(devices)
        self.work_dir = Path(work_dir)
        self.work_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        # (waiting briefly: the watchdog of an executor that just died may hold it while it cleans up)
        self._lock_fd: int | None = exclusive_lock(self.work_dir / watchdog.LOCK_FILE,
                                                   f"the work directory {self.work_dir}", "use another one", 5.0)
        self.grace_s = float(grace_s)
        self.max_retries = int(max_retries)
        self.retry_backoff_s = float(retry_backoff_s)
        self.estimator = estimator
        self.renew_wait_s = float(renew_wait_s)
        self.stats = ExecutorStats()
        self._t0 = time.time()
        self._running: dict[Hashable, _Job] = {}
        self._failures: dict[Hashable, int] = {}
        self._retry_at: dict[Hashable, float] = {}
        self._failed_for_good: dict[Hashable, str] = {}
        self._released: dict[Hashable, _Job] = {}  # jobs whose processes ended during the current round
        self._counted: dict[Hashable, int] = {}  # each job's step as of its last result
        self._epochs: dict[Hashable, int] = {}  # lease epoch of each job's current launch
        self._start_error: dict[Hashable, str] = {}  # launches whose command could not be started
        self._ckpt_cache: dict[Hashable, tuple[tuple[str, int, int], int]] = {}
        self._last_reap = time.monotonic()
        become_subreaper()
        self._reap_orphans()
        self._watchdog = _start_watchdog(self.work_dir)

    # ----- public helpers ------------------------------------------------------------
    def add_job(self, job_id: Hashable, spec: JobSpec) -> None:
        """Register (or replace the spec of) a job.

        Raises
        ------
        InvalidProblemError
            When the job's directory name is unusable or another job's (names equal after
            replacing characters other than letters, digits, ``_.-`` by ``_``).
        """
        name = job_directory_name(job_id)
        for other in self.jobs:
            if other != job_id and sanitized_job_name(other) == name:
                raise InvalidProblemError(f"jobs {str(other)!r} and {str(job_id)!r} would share the job directory "
                                          f"{name!r}; rename one of them", field="name", job=job_id)
        self.jobs[job_id] = spec

    def now(self) -> float:
        """Wall-clock seconds since the executor started."""
        return time.time() - self._t0

    def job_dir(self, job_id: Hashable) -> Path:
        """The job's directory: lease, stop and progress files, logs, and ``checkpoints/``."""
        return self.work_dir / "jobs" / sanitized_job_name(job_id)

    def checkpoint_dir(self, job_id: Hashable) -> Path:
        """The directory a job's checkpoints live in (under the job's work directory)."""
        return self.job_dir(job_id) / "checkpoints"

    def log_file(self, job_id: Hashable, rank: int) -> Path:
        """Standard output and error of a rank."""
        return self.job_dir(job_id) / f"rank{rank}.log"

    def progress_file(self, job_id: Hashable, rank: int, epoch: int | None = None) -> Path:
        """The JSON-lines progress of a rank in the launch of lease ``epoch`` (default: the latest launch)."""
        epoch = self._epochs.get(job_id, 0) if epoch is None else epoch
        return self.job_dir(job_id) / f"progress-e{epoch}-rank{rank}.jsonl"

    def checkpointed_steps(self, job_id: Hashable) -> int:
        """Steps recorded by the job's newest intact checkpoint (0 when none)."""
        for path in client._checkpoint_files(str(self.checkpoint_dir(job_id))):
            try:
                st = os.stat(path)
            except FileNotFoundError:
                continue
            key = (path, st.st_size, st.st_mtime_ns)
            cached = self._ckpt_cache.get(job_id)
            if cached is not None and cached[0] == key:
                return cached[1]
            if client.read_checkpoint(path) is not None:
                self._ckpt_cache[job_id] = (key, client.checkpoint_step(path))
                return client.checkpoint_step(path)
        return 0

    def failed(self, job_id: Hashable) -> str | None:
        """Why the job failed for good (retries exhausted), or None."""
        return self._failed_for_good.get(job_id)

    @property
    def held_jobs(self) -> tuple[Hashable, ...]:
        """Jobs with live (running or paused) processes."""
        return tuple(self._running)

    # ----- the round -----------------------------------------------------------------
    def run_round(self, plan: RoundPlan) -> list[JobRoundResult]:
        self._validate(plan)
        self._released.clear()
        t0 = time.time()
        keep = {l.job_id: l for l in plan.leases if self._extendable(l)}
        self._stop([j for j in self._running if j not in keep])
        results: dict[Hashable, JobRoundResult] = {}
        for lease in plan.leases:
            self.stats.leases += 1
            reason = self._failed_for_good.get(lease.job_id)
            if reason is not None:
                results[lease.job_id] = JobRoundResult(lease.job_id, RoundOutcome.FAILED, 0, 0.0, message=reason)
            elif lease.job_id in keep:
                self.stats.extended += 1
                self._extend(self._running[lease.job_id], lease, t0)
            elif t0 >= self._retry_at.get(lease.job_id, 0.0):
                self._launch(lease, t0)
        pending = {l.job_id: l for l in plan.leases if l.job_id not in results}
        messages: dict[Hashable, str] = {}
        deadline = {j: t0 + l.max_seconds for j, l in pending.items()}
        end = max(deadline.values(), default=t0)
        done_t: dict[Hashable, float] = {}
        outcomes: dict[Hashable, RoundOutcome] = {}
        while True:
            now = time.time()
            for job_id, lease in pending.items():
                if job_id in outcomes:
                    continue
                job = self._running.get(job_id)
                if job is None:  # waiting out a retry backoff
                    if now >= self._retry_at.get(job_id, 0.0) and now < deadline[job_id]:
                        self._launch(lease, t0, restarted=True)
                    continue
                for rank in job.ranks:
                    rank.read()
                outcome = self._check(job, messages)
                if outcome is RoundOutcome.FAILED and self._failed_for_good.get(job_id) is None:
                    continue  # will be retried
                if outcome is not None:
                    outcomes[job_id], done_t[job_id] = outcome, now
                elif job.paused():
                    outcomes[job_id], done_t[job_id] = RoundOutcome.PREEMPTED, now
            if len(outcomes) == len(pending) or now >= end + self.grace_s:
                break
            if now >= end and all(j in outcomes or j not in self._running for j in pending):
                break
            self._reap_exited_orphans()
            time.sleep(POLL_S)
        overrun = [j for j in pending if j not in outcomes and j in self._running]
        if overrun:  # did not pause at its lease end within grace_s: preempt it
            self._stop(overrun)
            for j in overrun:
                outcomes[j], done_t[j] = RoundOutcome.PREEMPTED, time.time()
        for job_id, lease in pending.items():
            results[job_id] = self._result(job_id, lease, outcomes.get(job_id, RoundOutcome.PREEMPTED),
                                           t0, done_t.get(job_id, time.time()), messages.get(job_id, ""))
        return [results[l.job_id] for l in plan.leases]

    def close(self) -> None:
        """Stop every job this executor still holds, end the watchdog and release the work directory."""
        self._stop(list(self._running))
        if self._watchdog is not None:
            proc, pipe = self._watchdog
            try:
                os.write(pipe, watchdog.CLOSING)  # the watchdog wakes up and exits
            except OSError:
                pass  # it is gone already
            os.close(pipe)
            try:
                proc.wait(timeout=10.0)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            self._watchdog = None
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    # ----- internals -----------------------------------------------------------------
    def _validate(self, plan: RoundPlan) -> None:
        seen: dict[int, Hashable] = {}
        for lease in plan.leases:
            if lease.job_id not in self.jobs:
                raise InvalidProblemError(f"lease for unknown job {lease.job_id!r}; add_job it first",
                                          field="leases", job=lease.job_id)
            for g in lease.gpu_ids:
                if not 0 <= g < len(self.devices):
                    raise InvalidProblemError(f"GPU id {g} of job {lease.job_id!r} is outside "
                                              f"0..{len(self.devices) - 1}", field="gpu_ids", job=lease.job_id)
                if self.devices[g].gpu_type != lease.gpu_type:
                    raise InvalidProblemError(f"GPU {g} is a {self.devices[g].gpu_type}, lease of job "
                                              f"{lease.job_id!r} says {lease.gpu_type}", field="gpu_ids",
                                              job=lease.job_id)
                if g in seen:
                    raise InvalidProblemError(f"GPU {g} is leased to both {seen[g]!r} and {lease.job_id!r}",
                                              field="gpu_ids", job=lease.job_id)
                seen[g] = lease.job_id

    def _extendable(self, lease: Lease) -> bool:
        job = self._running.get(lease.job_id)
        return (lease.extended and job is not None and not job.stopping and job.gpu_ids == tuple(lease.gpu_ids)
                and job.gpu_type == lease.gpu_type and not job.exited())

    def _lease_doc(self, seq: int, lease: Lease, t0: float) -> dict[str, Any]:
        return {"seq": seq, "lease_end": t0 + lease.max_seconds, "max_steps": lease.max_steps}

    def _extend(self, job: _Job, lease: Lease, t0: float) -> None:
        for rank in job.ranks:
            rank.read()
            rank.records = [rec for rec in rank.records if rec[2] == "paused"][-1:]
        job.seq += 1
        job.restarted = False
        _write_json_atomic(self.job_dir(lease.job_id) / f"lease-e{self._epochs[lease.job_id]}.json",
                           self._lease_doc(job.seq, lease, t0))

    def _launch(self, lease: Lease, t0: float, restarted: bool = True) -> None:
        spec = self.jobs[lease.job_id]
        jdir = self.job_dir(lease.job_id)
        (jdir / "checkpoints").mkdir(parents=True, exist_ok=True)
        epoch = self._epochs[lease.job_id] = issue_epoch(str(jdir))  # every earlier launch is fenced off
        (jdir / "stop").unlink(missing_ok=True)
        for pattern in ("lease-e*.json", "sync-e*.json", "progress-e*-rank*.jsonl"):
            for old in jdir.glob(pattern):
                old.unlink(missing_ok=True)
        seq = 1
        _write_json_atomic(jdir / f"lease-e{epoch}.json", self._lease_doc(seq, lease, t0))
        progress = [self.progress_file(lease.job_id, r, epoch) for r in range(len(lease.gpu_ids))]
        for path in progress:
            path.write_bytes(b"")
        cpu = all(self.devices[g].gpu_type == CPU_TYPE for g in lease.gpu_ids)
        threads = cpu_threads(sum(d.gpu_type == CPU_TYPE for d in self.devices)) if cpu else None
        env = job_environment(lease.job_id, spec, lease, jdir, t0, self.renew_wait_s, epoch, threads)
        self.stats.launches += 1
        try:
            ranks = self._start_ranks(lease, spec, env, progress)
        except OSError as err:  # the command cannot be started (not found, not executable...)
            ranks = []
            self._start_error[lease.job_id] = f"cannot start {spec.command!r}: {err.strerror or err}"
        self._running[lease.job_id] = _Job(lease.job_id, lease.gpu_type, tuple(lease.gpu_ids), ranks, seq,
                                           restarted=restarted)

    def _start_ranks(self, lease: Lease, spec: JobSpec, env: Mapping[str, str | None],
                     progress: Sequence[Path]) -> list[Rank]:
        """Start the lease's ranks, ``env`` (from :func:`job_environment`) plus each rank's variables;
        what other executors override."""
        devices = [self.devices[g] for g in lease.gpu_ids]
        gpu = not all(d.gpu_type == CPU_TYPE for d in devices)
        ids, port = [str(d.index) for d in devices], free_port()
        ranks: list[Rank] = []
        pids: list[dict[str, Any]] = []
        try:
            for r in range(len(devices)):
                # CUDA numbers devices like NVML and nvidia-smi
                order = {"CUDA_DEVICE_ORDER": "PCI_BUS_ID"} if gpu else {}
                rank_env = merge_environment(os.environ, env, rank_environment(r, r, len(devices), "127.0.0.1", port,
                                                                               ids, gpu, progress[r]), order)
                launched, token = time.time(), new_token()
                # the journal of what to kill should this executor die, written before the fork: a process
                # of the launch not yet recorded by pid is found by its token
                pids.append({"pid": None, "ticks": None, "token": token, "gpu_ids": list(lease.gpu_ids),
                             "launched": launched})
                _write_json_atomic(self.job_dir(lease.job_id) / "pids.json", pids)
                proc, _ = start_process(spec.command, rank_env, spec.cwd, self.log_file(lease.job_id, r), token)
                self.stats.popen_s.append(time.time() - launched)
                local = _LocalProcess(proc, token)
                ranks.append(Rank(local, progress[r], launched))
                pids[-1].update(pid=proc.pid, ticks=local.tree.ticks)
            _write_json_atomic(self.job_dir(lease.job_id) / "pids.json", pids)
        except OSError:
            for rank in ranks:
                rank.proc.signal_group(signal.SIGKILL)
            for rank in ranks:
                rank.proc.reap()
            (self.job_dir(lease.job_id) / "pids.json").unlink(missing_ok=True)
            raise
        return ranks

    def _check(self, job: _Job, messages: dict[Hashable, str]) -> RoundOutcome | None:
        """The job's outcome once its processes ended (reaping them); None while any rank runs.

        A launch counts as a failure (retried with backoff, failed for good after ``max_retries``)
        when its command cannot start, a rank exits with an error, or the job exits on its own
        before its total steps without a stop request or a lease end (a job that stops early, or
        does not run its steps through the client).
        """
        error = self._start_error.pop(job.job_id, None)
        if error is not None:
            self._release(job)
            return self._crashed(job, error, messages)
        codes = [r.proc.poll() for r in job.ranks]
        if all(c is None for c in codes):
            return None
        if any(c not in (None, 0) for c in codes) and not job.stopping:
            self._stop([job.job_id])
            for rank in job.ranks:
                rank.read()
            log = self.log_file(job.job_id, 0)
            tail = log.read_text(errors="replace").strip().splitlines()[-3:] if log.exists() else []
            return self._crashed(job, f"exit status {[c for c in codes if c]}" + (f": {' | '.join(tail)}" if tail
                                                                                    else ""), messages)
        if any(c is None for c in codes):
            return None
        for rank in job.ranks:
            rank.read()
        self._release(job)
        total = self.jobs[job.job_id].total_steps
        if (job.step is not None and job.step >= total) or all(r.exit_reason == "done" for r in job.ranks):
            self._failures.pop(job.job_id, None)
            return RoundOutcome.COMPLETED
        if job.stopping or all(r.exit_reason in ("lease", "stop") for r in job.ranks):
            return RoundOutcome.PREEMPTED
        if not any(r.records for r in job.ranks):
            problem = ("exited with status 0 without reporting any progress: run the steps through "
                       "allocopt.runtime.client.steps() (see examples/pytorch_mlp.py); log "
                       f"{self.log_file(job.job_id, 0)}")
        else:
            problem = (f"exited with status 0 at step {job.step} of {total}, before its lease ended and without "
                       f"a stop request; a job runs until client.steps() ends")
        return self._crashed(job, problem, messages)

    def _crashed(self, job: _Job, text: str, messages: dict[Hashable, str]) -> RoundOutcome:
        n = self._failures.get(job.job_id, 0) + 1
        self._failures[job.job_id] = n
        if n > self.max_retries:
            self._failed_for_good[job.job_id] = f"failed {n} times, last {text}"
            messages[job.job_id] = self._failed_for_good[job.job_id]
        else:
            self.stats.retries += 1
            self._retry_at[job.job_id] = time.time() + self.retry_backoff_s * 2 ** (n - 1)
            messages[job.job_id] = f"crashed ({text}); restart {n} of {self.max_retries}"
        return RoundOutcome.FAILED

    def _stop(self, job_ids: Sequence[Hashable]) -> None:
        """Stop jobs: stop file, SIGTERM after grace_s / 2, SIGKILL after grace_s; wait until all are gone."""
        jobs = [self._running[j] for j in job_ids if j in self._running]
        if not jobs:
            return
        t_req = time.time()
        for job in jobs:
            job.stopping = True
            (self.job_dir(job.job_id) / "stop").touch()
        for sig, wait in ((None, self.grace_s / 2), (signal.SIGTERM, self.grace_s / 2), (signal.SIGKILL, None)):
            live = [j for j in jobs if not j.exited()]
            if not live:
                break
            if sig is not None:
                for job in live:
                    for rank in job.ranks:
                        rank.proc.signal_group(sig)
            limit = time.time() + (wait if wait is not None else 10.0)
            while time.time() < limit and not all(j.exited() for j in live):
                time.sleep(POLL_S)
        for job in jobs:
            for rank in job.ranks:
                rank.read()
            self._release(job)
            self.stats.stop_s.append(time.time() - t_req)

    def _release(self, job: _Job) -> None:
        """Kill what is left of the job's process trees, confirm they are gone, fence the launch off
        (a new lease epoch), log the device interval."""
        for rank in job.ranks:
            rank.proc.signal_group(signal.SIGKILL)
        limit = time.time() + 10.0
        while any(r.proc.group_alive() for r in job.ranks) and time.time() < limit:
            time.sleep(POLL_S)
            for rank in job.ranks:
                rank.proc.signal_group(signal.SIGKILL)  # what was forked meanwhile
        for rank in job.ranks:
            if rank.proc.group_alive():
                raise StateError(f"processes of job {job.job_id!r} (launched as pid {rank.proc.pid}) survived SIGKILL "
                                 "for 10 s: its devices cannot be confirmed free; see ps for their state")
        for rank in job.ranks:
            rank.proc.reap()
        jdir = self.job_dir(job.job_id)
        issue_epoch(str(jdir))
        if job.ranks:
            self._log_interval(job.job_id, job.gpu_ids, [r.proc.pid for r in job.ranks],
                               min(r.launched_t for r in job.ranks))
        (jdir / "pids.json").unlink(missing_ok=True)
        (jdir / "stop").unlink(missing_ok=True)
        self._running.pop(job.job_id, None)
        self._released[job.job_id] = job

    def _reap_exited_orphans(self) -> None:
        """Every ``_REAP_S``: collect the exit status of processes of running jobs re-parented to this
        executor (their parent exited), so that they do not linger as zombies."""
        now = time.monotonic()
        if now - self._last_reap < _REAP_S:
            return
        self._last_reap = now
        local = [r.proc for j in self._running.values() for r in j.ranks if isinstance(r.proc, _LocalProcess)]
        if local:
            table = process_table()
            keep = frozenset(p.pid for p in local)
            for proc in local:
                reap_children([m for m in proc.tree.members(table, tokens=False) if m.zombie], keep)

    def _log_interval(self, job_id: Hashable, gpu_ids: Sequence[int], pids: Sequence[int], start: float) -> None:
        with open(self.work_dir / "devices.jsonl", "a", encoding="utf-8") as f:
            f.write(json.dumps({"job": str(job_id), "gpu_ids": list(gpu_ids), "pids": list(pids), "start": start,
                                "end": time.time()}) + "\n")

    def _result(self, job_id: Hashable, lease: Lease, outcome: RoundOutcome, t0: float, t_end: float,
                message: str) -> JobRoundResult:
        job = self._running.get(job_id) or self._released.get(job_id)
        ranks = job.ranks if job is not None else []
        restarted = job.restarted if job is not None else False
        rank0 = ranks[0] if ranks else None
        steps_now = min((r.step for r in ranks if r.step is not None), default=None)
        # progress since the job's last result, whatever launches made it: a launch that crashed after a
        # checkpoint its progress file did not yet show, or one that started after its round's end, counts
        # in the next result; steps redone from an older checkpoint count once
        counted = self._counted.get(job_id)
        if counted is None and rank0 is not None:
            counted = rank0.started_step()
        steps = max(0, steps_now - counted) if steps_now is not None and counted is not None else 0
        if steps_now is not None:
            self._counted[job_id] = steps_now if counted is None else max(counted, steps_now)
        sps = self._throughput(rank0) if rank0 is not None else None
        if sps is not None and self.estimator is not None and job_id in self.estimator:
            self.estimator.observe(job_id, lease.gpu_type, sps)
        if rank0 is not None and restarted:
            if rank0.started_t is not None:
                self.stats.launch_to_start_s.append(rank0.started_t - rank0.launched_t)
            if rank0.first_step is not None:
                self.stats.launch_to_first_step_s.append(rank0.first_step[0] - rank0.launched_t)
        if job is not None:
            for r in job.ranks:
                r.records = r.records[-1:]
                r.first_step, r.started_t = None, None
            job.restarted = False
        return JobRoundResult(job_id, outcome, steps, max(0.0, t_end - t0), sps, restarted, message)

    @staticmethod
    def _throughput(rank: Rank) -> float | None:
        """Steady-state steps/s of this round: from the first step (or resume) record to the last record."""
        recs = [(t, s) for t, s, e in rank.records if e in ("step", "resumed", "paused", "exit")]
        first = next(((t, s) for t, s, e in rank.records if e in ("step", "resumed")), None)
        if first is None or not recs:
            return None
        t_last, s_last = recs[-1]
        if t_last - first[0] <= 0.02 or s_last <= first[1]:
            return None
        return (s_last - first[1]) / (t_last - first[0])

    def _reap_orphans(self) -> None:
        """Kill the process trees an earlier executor on this work_dir launched and never confirmed
        gone (found through each job's ``pids.json``: session, descendants, launch token), and fence
        them off with a new lease epoch."""
        for pid_file in sorted((self.work_dir / "jobs").glob("*/pids.json")):
            try:
                entries = watchdog.stop_recorded(pid_file)
            except RuntimeError as err:
                raise StateError(f"processes an earlier scheduler left in {pid_file.parent} cannot be stopped: {err}; "
                                 "see ps for their state") from None
            if entries is None:
                continue
            if entries:
                self._log_interval(pid_file.parent.name, entries[0]["gpu_ids"], [e.get("pid") for e in entries],
                                   min(e["launched"] for e in entries))
            (pid_file.parent / "stop").unlink(missing_ok=True)
            pid_file.unlink()


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


__all__ = ["POLL_S", "ExecutorStats", "JobSpec", "LocalExecutor", "Rank", "RankProcess", "cpu_threads",
           "exclusive_lock", "free_port", "job_directory_name", "job_environment", "merge_environment", "new_token",
           "rank_environment", "sanitized_job_name", "start_process"]
