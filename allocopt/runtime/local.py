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
:class:`~allocopt.runtime.launch.RankProcess` (see :mod:`allocopt.runtime.ray_executor`)
and build the environment with :func:`~allocopt.runtime.launch.job_environment` and
:func:`~allocopt.runtime.launch.rank_environment`. How a rank is started and contained lives in
:mod:`allocopt.runtime.launch`; what its progress file says and what a round counts of it, in
:mod:`allocopt.runtime.progress`.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import time
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from allocopt.errors import InvalidProblemError, StateError
from allocopt.runtime import client, watchdog
from allocopt.runtime.devices import CPU_TYPE, Device
from allocopt.runtime.executor import BatchSettings, Executor, JobRoundResult, Lease, RoundOutcome, RoundPlan
from allocopt.runtime.fence import issue_epoch
from allocopt.runtime.launch import (DeviceLostError, JobSpec, RankProcess, _LocalProcess, _start_watchdog, _write_json_atomic,
                                     cpu_threads, exclusive_lock, free_port, job_directory_name, job_environment,
                                     merge_environment, new_token, rank_environment, sanitized_job_name, start_process)
from allocopt.runtime.progress import ExecutorStats, Rank, StepLedger, steady_steps_per_s
from allocopt.runtime.procs import (become_subreaper, process_table,
                                    reap_children)
from allocopt.throughput.online import ThroughputEstimator

log = logging.getLogger(__name__)

POLL_S = 0.01  # seconds between checks of a job's processes and progress
_REAP_S = 1.0  # seconds between sweeps for exited orphans of running jobs


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
    batch: BatchSettings | None = None

    @property
    def step(self) -> int | None:
        steps = [r.step for r in self.ranks if r.step is not None]
        return min(steps) if len(steps) == len(self.ranks) else None

    def paused(self) -> bool:
        return all(r.paused_seq == self.seq for r in self.ranks)

    def exited(self) -> bool:
        return all(r.proc.poll() is not None for r in self.ranks)


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
        self._ledger = StepLedger()  # each job's step as of its last result
        self._epochs: dict[Hashable, int] = {}  # lease epoch of each job's current launch
        self._start_error: dict[Hashable, str] = {}  # launches whose command could not be started
        self._start_lost: dict[Hashable, str] = {}  # launches whose devices were gone
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

    def available_devices(self) -> list[int]:
        """The GPU ids whose devices can run ranks now (every one for local devices)."""
        return list(range(len(self.devices)))

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
                and job.gpu_type == lease.gpu_type and job.batch == lease.batch and not job.exited())

    def _lease_doc(self, seq: int, lease: Lease, t0: float) -> dict[str, Any]:
        doc = {"seq": seq, "lease_end": t0 + lease.max_seconds, "max_steps": lease.max_steps}
        if lease.batch is not None:
            doc.update(batch_size=lease.batch.batch_size, local_bsz=lease.batch.local_bsz,
                       accum_steps=lease.batch.accum_steps, lr_scale=lease.batch.lr_scale)
        return doc

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
        except DeviceLostError as err:
            ranks = []
            self._start_lost[lease.job_id] = str(err)
        self._running[lease.job_id] = _Job(lease.job_id, lease.gpu_type, tuple(lease.gpu_ids), ranks, seq,
                                           restarted=restarted, batch=lease.batch)

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
        does not run its steps through the client). A launch that lost a rank's device (see
        :meth:`RankProcess.lost`), or could not start on a device that is gone, is no failure of the
        job: its other ranks are stopped and it is preempted, to resume from its checkpoint next round.
        """
        error = self._start_error.pop(job.job_id, None)
        if error is not None:
            self._release(job)
            return self._crashed(job, error, messages)
        gone = self._start_lost.pop(job.job_id, None)
        if gone is not None:
            self._release(job)
            messages[job.job_id] = f"not started, {gone}; resumes from its checkpoint in a later round"
            return RoundOutcome.PREEMPTED
        codes = [r.proc.poll() for r in job.ranks]
        if all(c is None for c in codes):
            return None
        lost = [r for r, rank in enumerate(job.ranks) if codes[r] is not None and rank.proc.lost()]
        if lost and not job.stopping:
            self._stop([job.job_id])
            log.warning("job %s lost the device of rank(s) %s: stopped, to resume from its checkpoint",
                        job.job_id, lost)
            messages[job.job_id] = (f"rank(s) {lost} lost their device (GPU id(s) "
                                    f"{[job.gpu_ids[r] for r in lost]}); resumes from its checkpoint next round")
            return RoundOutcome.PREEMPTED
        if any(c not in (None, 0) for c in codes) and not job.stopping:
            self._stop([job.job_id])
            for rank in job.ranks:
                rank.read()
            rank0_log = self.log_file(job.job_id, 0)
            tail = rank0_log.read_text(errors="replace").strip().splitlines()[-3:] if rank0_log.exists() else []
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
        steps = self._ledger.count(job_id, ranks)
        sps = steady_steps_per_s(rank0) if rank0 is not None else None
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
        metrics = dict(rank0.metrics) if rank0 is not None else {}
        return JobRoundResult(job_id, outcome, steps, max(0.0, t_end - t0), sps, restarted, message, metrics)

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


__all__ = ["POLL_S", "ExecutorStats", "JobSpec", "LocalExecutor", "Rank", "RankProcess", "cpu_threads",
           "exclusive_lock", "free_port", "job_directory_name", "job_environment", "merge_environment", "new_token",
           "rank_environment", "sanitized_job_name", "start_process"]
