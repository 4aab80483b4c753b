"""The job-side client: what a training script imports to run under an allocopt executor.

Standard library only. A script written against it::

    from allocopt.runtime import client
    lease = client.lease()              # .rank, .world_size, .local_rank, .max_steps, .checkpoint_dir, ...
    state = client.load_checkpoint()    # None on first start
    start = state["step"] if state else 0
    for step in client.steps(start):    # ends at the job's total steps, the lease's end, or a stop request
        ...                             # one training step
        client.save_checkpoint({"step": step + 1})  # atomic; jobs choose how often

Environment set by the executor (all optional: without them the script runs
stand-alone, to its total steps):

==========================  ==========================================================
``ALLOCOPT_JOB_ID``          the job's id
``ALLOCOPT_TOTAL_STEPS``     steps of the whole job; :func:`steps` ends there
``ALLOCOPT_MAX_STEPS``       steps this lease may run (absent: no step limit)
``ALLOCOPT_LEASE_END``       end of the lease, epoch seconds
``ALLOCOPT_LEASE_FILE``      JSON ``{"seq", "lease_end", "max_steps"}`` re-read every step:
                             the executor extends a lease by rewriting it
``ALLOCOPT_STOP_FILE``       when this file exists the job stops after its current step
``ALLOCOPT_PROGRESS_FILE``   JSON-lines progress of this rank, appended by :func:`steps`
``ALLOCOPT_CHECKPOINT_DIR``  where :func:`save_checkpoint` writes
``ALLOCOPT_RENEW_WAIT_S``    seconds to wait at a lease end for an extension (default 30)
``ALLOCOPT_DEVICES``         the executor's device ids of this job (also for ``cpu`` devices)
``ALLOCOPT_GPU_TYPE``        type of those devices
``ALLOCOPT_SYNC_FILE``       with several ranks: the other ranks check in beside it (so rank 0 starts
                             stepping once all loaded the same checkpoint), rank 0 publishes which steps may run there, and
                             the other ranks follow it, so all ranks stop at the same step
``ALLOCOPT_EPOCH``           this launch's lease epoch: commits (checkpoints, :func:`fenced` blocks)
                             are refused once the executor issued a newer one
``ALLOCOPT_FENCE_DIR``       where the job's epoch file and epoch lock live
``ALLOCOPT_SCHEDULER_PID``   the process that started this one (and ``..._TICKS``, its start time):
                             when it is gone the job stops as on a stop request
``ALLOCOPT_NUM_THREADS``     CPU threads this rank's device share allows (also in ``OMP_NUM_THREADS``...)
``ALLOCOPT_BATCH_SIZE``      elastic jobs: the global batch size (samples per step, all ranks) of this
                             allocation; ``ALLOCOPT_LOCAL_BSZ`` (micro-batch per rank) and
                             ``ALLOCOPT_ACCUM_STEPS`` (accumulation steps per step) split it, and
                             ``ALLOCOPT_LR_SCALE`` is the learning-rate multiplier that goes with it.
                             A new batch size comes with a restart (see docs/how-to/elastic-jobs.md)
``RANK`` ``WORLD_SIZE`` ``LOCAL_RANK`` ``MASTER_ADDR`` ``MASTER_PORT`` ``CUDA_VISIBLE_DEVICES``
==========================================================================================

At a lease's end the job pauses (no step runs) until the executor either
extends the lease (the process keeps going, no restart) or asks it to stop
(stop file or SIGTERM); :func:`steps` then returns. Progress records carry
``event`` (``start``, ``step``, ``paused``, ``resumed``, ``metrics``, ``exit``),
``t`` (epoch seconds), ``step`` (steps completed), ``samples``, ``ckpt`` (step of
the last checkpoint saved) and ``seq`` (lease number). Elastic jobs report the statistics their
goodput model needs with :func:`report`: ``grad_sqr`` and ``grad_var`` (gradient statistics
normalized to the initial batch size, as AdaptDL measures them) and, optionally, ``sync_time``
(seconds per step spent synchronizing gradients); step times are measured from the step records.

Exactly-once progress: a copy of the job whose lease was taken away (its
scheduler died and a new one relaunched the job) is refused at its next commit
with :class:`StaleLeaseError` and ends quietly; :func:`steps` raises it as soon
as it notices. Side effects other than checkpoints that must happen exactly
once (appending to a log, writing results) belong in a ``with client.fenced():``
block together with the checkpoint that records them.

Checkpoint files carry a header (magic, step, payload length, SHA-256); a
torn, truncated or garbage file is skipped and the newest valid one loads.
Stand-alone (no ``ALLOCOPT_CHECKPOINT_DIR``) nothing is saved or loaded.
"""

from __future__ import annotations

import contextlib
import glob
import hashlib
import json
import logging
import os
import pickle
import signal
import struct
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from allocopt.runtime.fence import StaleLeaseError, read_epoch
from allocopt.runtime.fence import fenced as _fenced

_PROGRESS_INTERVAL_S = 0.05  # step records are written at most this often (pauses and exits always)
_POLL_S = 0.01  # how often a paused job looks for an extension or a stop request
_KEEP_CHECKPOINTS = 2
_WATCH_S = 0.1  # how often a running job checks its epoch and that the process that started it lives
_RANK_WAIT_S = 10.0  # how long rank 0 waits for the other ranks to enter steps() before it starts without them


@dataclass(frozen=True)
class Lease:
    """This process's lease, from the environment (see the module docstring).

    ``max_steps``/``total_steps``/``lease_end`` are None when unlimited;
    ``lease_end`` is in epoch seconds; ``checkpoint_dir`` is None stand-alone (no checkpoints);
    ``epoch`` is None without an executor (no fence); ``num_threads`` is None when the executor
    sets no limit. Elastic jobs: ``batch_size`` (global, samples per step), ``local_bsz`` (per rank),
    ``accum_steps`` and ``lr_scale`` of this allocation; ``batch_size`` and ``local_bsz`` are None for a rigid job.
    """

    job_id: str
    rank: int
    world_size: int
    local_rank: int
    master_addr: str
    master_port: int
    max_steps: int | None
    total_steps: int | None
    lease_end: float | None
    checkpoint_dir: str | None
    devices: tuple[str, ...]
    gpu_type: str | None
    epoch: int | None = None
    num_threads: int | None = None
    batch_size: int | None = None
    local_bsz: int | None = None
    accum_steps: int = 0
    lr_scale: float = 1.0

    @property
    def seconds_left(self) -> float | None:
        """Seconds until the lease ends (None: no time limit)."""
        return None if self.lease_end is None else self.lease_end - time.time()


def _int(name: str, default: int | None = None) -> int | None:
    value = os.environ.get(name, "")
    return int(value) if value.strip() else default


def lease() -> Lease:
    """The lease given by the executor through the environment; defaults describe a stand-alone run."""
    end = os.environ.get("ALLOCOPT_LEASE_END", "")
    devices = os.environ.get("ALLOCOPT_DEVICES", "")
    return Lease(job_id=os.environ.get("ALLOCOPT_JOB_ID", "local"), rank=_int("RANK", 0) or 0,
                 world_size=_int("WORLD_SIZE", 1) or 1, local_rank=_int("LOCAL_RANK", 0) or 0,
                 master_addr=os.environ.get("MASTER_ADDR", "127.0.0.1"), master_port=_int("MASTER_PORT", 29500) or 0,
                 max_steps=_int("ALLOCOPT_MAX_STEPS"), total_steps=_int("ALLOCOPT_TOTAL_STEPS"),
                 lease_end=float(end) if end.strip() else None,
                 checkpoint_dir=os.environ.get("ALLOCOPT_CHECKPOINT_DIR") or None,
                 devices=tuple(d for d in devices.split(",") if d), gpu_type=os.environ.get("ALLOCOPT_GPU_TYPE"),
                 epoch=_int("ALLOCOPT_EPOCH"), num_threads=_int("ALLOCOPT_NUM_THREADS"),
                 batch_size=_int("ALLOCOPT_BATCH_SIZE"), local_bsz=_int("ALLOCOPT_LOCAL_BSZ"),
                 accum_steps=_int("ALLOCOPT_ACCUM_STEPS", 0) or 0,
                 lr_scale=float(os.environ.get("ALLOCOPT_LR_SCALE", "").strip() or 1.0))


# ----- stop requests and the fence ------------------------------------------------------
_signalled = False
_last_ckpt: int | None = None
_watch = {"t": 0.0, "orphaned": False}


def _on_sigterm(signum: int, frame: Any) -> None:
    global _signalled
    _signalled = True


def _starter_gone() -> bool:
    """Whether the process that started this one (the executor) is gone; checked every ``_WATCH_S``."""
    pid = _int("ALLOCOPT_SCHEDULER_PID")
    if pid is None or _watch["orphaned"]:
        return bool(_watch["orphaned"])
    now = time.monotonic()
    if now - _watch["t"] < _WATCH_S:
        return False
    _watch["t"] = now
    ticks = os.environ.get("ALLOCOPT_SCHEDULER_TICKS", "")
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        gone = fields[0] in ("Z", "X") or bool(ticks and fields[19] != ticks)
    except OSError:  # no /proc (or not this pid's): ask the kernel
        try:
            os.kill(pid, 0)
            gone = False
        except ProcessLookupError:
            gone = True
        except PermissionError:
            gone = False
    except IndexError:
        gone = False
    _watch["orphaned"] = gone
    return gone


def stop_requested() -> bool:
    """True once the executor asked this job to stop (SIGTERM or the stop file), or is gone."""
    stop_file = os.environ.get("ALLOCOPT_STOP_FILE")
    return _signalled or bool(stop_file and os.path.exists(stop_file)) or _starter_gone()


def fenced() -> contextlib.AbstractContextManager[None]:
    """A block that commits as this launch: it runs holding the job's epoch lock, and raises
    :class:`StaleLeaseError` instead when another launch holds the lease. Re-entrant;
    :func:`save_checkpoint` runs inside one. Without an executor it just runs the block."""
    return _fenced(os.environ.get("ALLOCOPT_FENCE_DIR") or None, _int("ALLOCOPT_EPOCH"))


def check_lease() -> None:
    """Raise :class:`StaleLeaseError` when this launch's epoch is no longer current."""
    directory, epoch = os.environ.get("ALLOCOPT_FENCE_DIR"), _int("ALLOCOPT_EPOCH")
    if directory and epoch is not None:
        current = read_epoch(directory)
        if current != epoch:
            raise StaleLeaseError(epoch, current)


# ----- progress -----------------------------------------------------------------------
def _emit(record: dict[str, Any]) -> None:
    path = os.environ.get("ALLOCOPT_PROGRESS_FILE")
    if not path:
        return
    record = {"t": time.time(), **record}
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(record, default=str) + "\n")


def report(**metrics: Any) -> None:
    """Report extra metrics (loss, accuracy...) to the executor; values must be JSON-serializable.

    Elastic jobs report ``grad_sqr`` and ``grad_var`` (and optionally ``sync_time``, seconds per step)
    here: the executor hands the latest numeric values to the goodput model."""
    _emit({"event": "metrics", **metrics})


class _LeaseFile:
    """The lease file, re-read when it changes: sequence number, end (epoch s), max steps."""

    def __init__(self) -> None:
        self.path = os.environ.get("ALLOCOPT_LEASE_FILE")
        self.seq = 0
        self.end = lease().lease_end
        self.max_steps = lease().max_steps
        self._mtime = None
        self.refresh()

    def refresh(self) -> bool:
        """Re-read the file if it changed; True when a new lease (higher seq) arrived."""
        if not self.path:
            return False
        try:
            mtime = os.stat(self.path).st_mtime_ns
            if mtime == self._mtime:
                return False
            with open(self.path, encoding="utf-8") as f:
                data = json.load(f)
        except (OSError, ValueError):
            return False
        self._mtime = mtime
        seq = int(data.get("seq", 0))
        if seq <= self.seq and self.seq:
            return False
        new = seq > self.seq
        self.seq, self.end, self.max_steps = seq, data.get("lease_end"), data.get("max_steps")
        return new


def steps(start: int = 0, *, samples_per_step: int | None = None, total: int | None = None) -> Iterator[int]:
    """Yield step numbers from ``start`` until the job's total steps, a stop request, or a lease end
    that is not extended; report progress as it goes.

    Installs a SIGTERM handler that only sets a flag: the loop ends after the
    current step. ``samples_per_step`` (e.g. the global batch size) adds a
    ``samples`` count to progress records. ``total``: the total steps of a
    stand-alone run (``ALLOCOPT_TOTAL_STEPS``, set by the executor, wins).
    Raises :class:`StaleLeaseError` when another launch took over the lease.
    """
    global _signalled
    _signalled = False
    signal.signal(signal.SIGTERM, _on_sigterm)
    info = lease()
    total = info.total_steps if info.total_steps is not None else total
    sync = os.environ.get("ALLOCOPT_SYNC_FILE") if info.world_size > 1 else None
    if sync and info.rank != 0:
        yield from _follow(start, sync, samples_per_step)
        return
    renew_wait_s = float(os.environ.get("ALLOCOPT_RENEW_WAIT_S", "30"))
    leases = _LeaseFile()
    limit = None if leases.max_steps is None else start + int(leases.max_steps)
    step, last_emit, last_check = start, 0.0, time.monotonic()
    check_lease()
    _emit({"event": "start", "step": step, "pid": os.getpid(), "seq": leases.seq, "ckpt": _last_ckpt})
    reason = "done"
    if sync and not _await_ranks(sync, info.world_size, start):
        reason = "stop"
    while reason == "done":
        if total is not None and step >= total:
            break
        if time.monotonic() - last_check >= _WATCH_S:
            check_lease()
            last_check = time.monotonic()
        if stop_requested():
            reason = "stop"
            break
        if leases.refresh():
            limit = None if leases.max_steps is None else step + int(leases.max_steps)
        if (limit is not None and step >= limit) or (leases.end is not None and time.time() >= leases.end):
            if not _await_extension(leases, step, samples_per_step, renew_wait_s, sync):
                reason = "stop" if stop_requested() else "lease"
                break
            limit = None if leases.max_steps is None else step + int(leases.max_steps)
            continue
        _publish(sync, step + 1, "run", leases.seq)
        yield step
        step += 1
        now = time.time()
        if now - last_emit >= _PROGRESS_INTERVAL_S:
            _emit({"event": "step", "t": now, "step": step, "samples": _samples(step, samples_per_step),
                   "seq": leases.seq, "ckpt": _last_ckpt})
            last_emit = now
    _publish(sync, step, reason, leases.seq)
    _emit({"event": "exit", "reason": reason, "step": step, "samples": _samples(step, samples_per_step),
           "seq": leases.seq, "ckpt": _last_ckpt})


def _publish(path: str | None, upto: int, state: str, seq: int) -> None:
    """Rank 0: steps below ``upto`` may run; ``state`` is run, paused, or the reason the loop ended."""
    if path:
        tmp = f"{path}.tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(json.dumps({"upto": upto, "state": state, "seq": seq}))
        os.replace(tmp, path)


def _ready_file(sync: str, rank: int) -> str:
    return f"{sync[:-len('.json')] if sync.endswith('.json') else sync}-ready-r{rank}.json"


def _await_ranks(sync: str, world_size: int, start: int) -> bool:
    """Rank 0: wait until every other rank entered :func:`steps` (so all loaded the same checkpoint:
    rank 0 saves none before), at most ``_RANK_WAIT_S`` seconds (then it starts, with a logged
    warning); False on a stop request. Raises RuntimeError when a rank starts from another step."""
    waiting = set(range(1, world_size))
    deadline = time.monotonic() + _RANK_WAIT_S
    while waiting:
        if time.monotonic() >= deadline:
            logging.getLogger(__name__).warning(
                "rank(s) %s did not enter client.steps() within %g s; rank 0 starts without them (they may resume "
                "from a later checkpoint)", sorted(waiting), _RANK_WAIT_S)
            return True
        for rank in sorted(waiting):
            try:
                with open(_ready_file(sync, rank), encoding="utf-8") as f:
                    other = int(json.load(f)["start"])
            except (OSError, ValueError, KeyError):
                continue
            if other != start:
                raise RuntimeError(f"rank {rank} starts at step {other} and rank 0 at step {start}: every rank "
                                   "must resume from the same checkpoint")
            waiting.discard(rank)
        if waiting:
            if stop_requested():
                return False
            check_lease()
            time.sleep(_POLL_S)
    return True


def _follow(start: int, path: str, samples_per_step: int | None) -> Iterator[int]:
    """Ranks > 0: run exactly the steps rank 0 runs, pause and stop with it."""
    step, last_emit, paused, last_check = start, 0.0, False, time.monotonic()
    check_lease()
    ready = _ready_file(path, lease().rank)
    with open(f"{ready}.tmp", "w", encoding="utf-8") as f:
        f.write(json.dumps({"start": start}))
    os.replace(f"{ready}.tmp", ready)
    _emit({"event": "start", "step": step, "pid": os.getpid(), "seq": 0, "ckpt": _last_ckpt})
    while True:
        if time.monotonic() - last_check >= _WATCH_S:
            check_lease()
            last_check = time.monotonic()
        try:
            with open(path, encoding="utf-8") as f:
                doc = json.load(f)
        except (OSError, ValueError):
            doc = None
        if doc is not None and doc["upto"] > step:
            if paused:
                _emit({"event": "resumed", "step": step, "seq": doc["seq"], "ckpt": _last_ckpt})
                paused = False
            yield step
            step += 1
            now = time.time()
            if now - last_emit >= _PROGRESS_INTERVAL_S:
                _emit({"event": "step", "t": now, "step": step, "samples": _samples(step, samples_per_step),
                       "seq": doc["seq"], "ckpt": _last_ckpt})
                last_emit = now
            continue
        if doc is not None and doc["state"] not in ("run", "paused"):
            reason = doc["state"]
            break
        if _starter_gone():  # rank 0 will not publish anything any more
            reason = "stop"
            break
        if doc is not None and doc["state"] == "paused" and not paused:
            _emit({"event": "paused", "step": step, "samples": _samples(step, samples_per_step), "seq": doc["seq"],
                   "ckpt": _last_ckpt})
            paused = True
        time.sleep(0.001)
    _emit({"event": "exit", "reason": reason, "step": step, "samples": _samples(step, samples_per_step),
           "ckpt": _last_ckpt})


def _samples(step: int, samples_per_step: int | None) -> int | None:
    return None if samples_per_step is None else step * samples_per_step


def _await_extension(leases: _LeaseFile, step: int, samples_per_step: int | None, wait_s: float,
                     sync: str | None) -> bool:
    """Pause at a lease end; True when a new lease arrives, False on a stop request or after ``wait_s``."""
    _publish(sync, step, "paused", leases.seq)
    _emit({"event": "paused", "step": step, "samples": _samples(step, samples_per_step), "seq": leases.seq,
           "ckpt": _last_ckpt})
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline and not stop_requested():
        if leases.refresh():
            _emit({"event": "resumed", "step": step, "seq": leases.seq, "ckpt": _last_ckpt})
            return True
        time.sleep(_POLL_S)
    return False


# ----- checkpoints --------------------------------------------------------------------
_MAGIC = b"ALLOCKP1"
_HEADER = struct.Struct("<8sQQ32s")  # magic, step, payload length, SHA-256 of the payload
_SUFFIX = ".ckpt"


def _checkpoint_files(directory: str) -> list[str]:
    """Checkpoint files, newest (highest step) first."""
    return sorted(glob.glob(os.path.join(glob.escape(directory), f"ckpt-*{_SUFFIX}")), reverse=True)


def checkpoint_step(path: str) -> int:
    """The step a checkpoint file name records."""
    return int(os.path.basename(path)[len("ckpt-"):-len(_SUFFIX)])


def read_checkpoint(path: str) -> dict[str, Any] | None:
    """``{"step", "state"}`` of a checkpoint file, or None when it is not a complete, intact checkpoint
    of the step its name says (bad header, wrong length, checksum mismatch, unreadable payload)."""
    try:
        with open(path, "rb") as f:
            header = f.read(_HEADER.size)
            if len(header) != _HEADER.size:
                return None
            magic, step, length, digest = _HEADER.unpack(header)
            if magic != _MAGIC or length != os.fstat(f.fileno()).st_size - _HEADER.size:
                return None
            payload = f.read(length)
        if len(payload) != length or hashlib.sha256(payload).digest() != digest or step != checkpoint_step(path):
            return None
        data = pickle.loads(payload)
    except Exception:  # noqa: BLE001 - any unreadable file is skipped, the next older one is tried
        return None
    if not isinstance(data, dict) or data.get("step") != step or "state" not in data:
        return None
    return data


def save_checkpoint(state: Any, *, step: int | None = None, all_ranks: bool = False) -> str | None:
    """Write ``state`` atomically (temporary file, fsync, ``os.replace``) to the checkpoint directory,
    as a commit of this launch (see :func:`fenced`).

    ``step`` (steps completed) defaults to ``state["step"]``. Only rank 0 writes
    unless ``all_ranks``. Keeps the newest two checkpoints. Returns the path (None on other ranks,
    or stand-alone without ``ALLOCOPT_CHECKPOINT_DIR``).

    Raises
    ------
    StaleLeaseError
        When another launch of the job holds the lease: nothing is written.
    """
    global _last_ckpt
    if step is None:
        if not (isinstance(state, dict) and "step" in state):
            raise ValueError("save_checkpoint needs step=... unless state is a dict with a 'step' key")
        step = int(state["step"])
    info = lease()
    if (info.rank != 0 and not all_ranks) or info.checkpoint_dir is None:
        _last_ckpt = step
        return None
    directory = info.checkpoint_dir if info.rank == 0 else os.path.join(info.checkpoint_dir, f"rank{info.rank}")
    os.makedirs(directory, mode=0o700, exist_ok=True)
    path = os.path.join(directory, f"ckpt-{step:012d}{_SUFFIX}")
    payload = pickle.dumps({"step": step, "state": state}, protocol=pickle.HIGHEST_PROTOCOL)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".tmp-ckpt-")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(_HEADER.pack(_MAGIC, step, len(payload), hashlib.sha256(payload).digest()))
            f.write(payload)
            f.flush()
            os.fsync(f.fileno())
        with fenced():
            os.replace(tmp, path)
            for old in _checkpoint_files(directory)[_KEEP_CHECKPOINTS:]:
                os.unlink(old)
            for torn in glob.glob(os.path.join(glob.escape(directory), ".tmp-ckpt-*")):
                with contextlib.suppress(OSError):
                    os.unlink(torn)  # left by killed writers: one launch writes here at a time
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    _last_ckpt = step
    return path


def load_checkpoint(*, all_ranks: bool = False) -> Any:
    """The state of the newest intact checkpoint, or None when there is none."""
    global _last_ckpt
    info = lease()
    if info.checkpoint_dir is None:
        return None
    directory = info.checkpoint_dir if info.rank == 0 or not all_ranks else \
        os.path.join(info.checkpoint_dir, f"rank{info.rank}")
    for path in _checkpoint_files(directory):
        data = read_checkpoint(path)
        if data is not None:
            _last_ckpt = int(data["step"])
            return data["state"]
    return None


__all__ = ["Lease", "StaleLeaseError", "check_lease", "checkpoint_step", "fenced", "lease", "load_checkpoint",
           "read_checkpoint", "report", "save_checkpoint", "steps", "stop_requested"]
