"""Lease epochs: the fence that keeps a stale copy of a job from ever committing.

Standard library only (the job-side client imports it). The executor issues a
new epoch for a job (:func:`issue_epoch`) before each launch and after each
stop; the launch gets it as ``ALLOCOPT_EPOCH``. The job commits (checkpoints,
any side effect done inside :func:`fenced`) only while holding the job's epoch
lock and only when the epoch file still holds its own epoch, so a copy that
survived its scheduler (or escaped containment) is refused: its commit raises
:class:`StaleLeaseError`, which ends it quietly with :data:`STALE_EXIT_STATUS`.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
from collections.abc import Iterator

EPOCH_FILE = "epoch"
LOCK_FILE = "epoch.lock"
STALE_EXIT_STATUS = 75  # EX_TEMPFAIL


class StaleLeaseError(SystemExit):
    """This process's lease epoch is no longer current: another copy of the job holds the lease
    (or none does). A ``SystemExit``, so ``except Exception`` in a training script cannot swallow it."""

    def __init__(self, mine: int, current: int | None):
        super().__init__(STALE_EXIT_STATUS)
        self.mine, self.current = mine, current

    def __str__(self) -> str:
        return f"lease epoch {self.mine} is stale (current: {self.current}); this copy of the job must stop"


@contextlib.contextmanager
def epoch_lock(directory: str, timeout_s: float | None = None) -> Iterator[None]:
    """Hold the job's epoch lock (``flock`` on ``directory/epoch.lock``); released when the holder dies.

    Raises TimeoutError after ``timeout_s`` (None: wait as long as it takes).
    """
    fd = os.open(os.path.join(directory, LOCK_FILE), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        limit = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | (fcntl.LOCK_NB if limit is not None else 0))
                break
            except BlockingIOError:
                if time.monotonic() >= limit:
                    raise TimeoutError(f"the epoch lock of {directory} is held for more than {timeout_s} s") from None
                time.sleep(0.005)
        yield
    finally:
        os.close(fd)  # releases the lock


def read_epoch(directory: str) -> int | None:
    """The job's current epoch (None: never issued)."""
    try:
        with open(os.path.join(directory, EPOCH_FILE), encoding="utf-8") as f:
            return int(f.read().strip() or 0)
    except FileNotFoundError:
        return None
    except ValueError:
        return -1  # unreadable: matches no launch, so nothing commits until the executor issues a new one


def issue_epoch(directory: str, timeout_s: float = 30.0) -> int:
    """Executor side: make a new epoch current for the job in ``directory`` and return it; every
    earlier launch is fenced off from then on."""
    os.makedirs(directory, exist_ok=True)
    with epoch_lock(directory, timeout_s):
        epoch = max(read_epoch(directory) or 0, 0) + 1
        tmp = os.path.join(directory, f".{EPOCH_FILE}.tmp")
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(str(epoch))
        os.chmod(tmp, 0o600)
        os.replace(tmp, os.path.join(directory, EPOCH_FILE))
    return epoch


_depth = 0  # fenced() sections this process is inside (the lock is taken once)


@contextlib.contextmanager
def fenced(directory: str | None, epoch: int | None) -> Iterator[None]:
    """Job side: run the block as a commit of lease ``epoch``, holding the epoch lock; raise
    :class:`StaleLeaseError` (before the block runs) when ``epoch`` is no longer current. Without a
    fence (``directory`` or ``epoch`` None: a stand-alone run) the block just runs. Re-entrant."""
    global _depth
    if directory is None or epoch is None or _depth:
        _depth += 1
        try:
            yield
        finally:
            _depth -= 1
        return
    with epoch_lock(directory):
        current = read_epoch(directory)
        if current != epoch:
            raise StaleLeaseError(epoch, current)
        _depth += 1
        try:
            yield
        finally:
            _depth -= 1


__all__ = ["EPOCH_FILE", "STALE_EXIT_STATUS", "StaleLeaseError", "epoch_lock", "fenced", "issue_epoch", "read_epoch"]
