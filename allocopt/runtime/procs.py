"""Process trees of launched jobs: find, signal and reap every process a job started (Linux ``/proc``).

A rank is started as the leader of a new session; everything it forks stays in
that session unless it calls ``setsid`` itself, and every process it starts
inherits the launch token in its environment (``ALLOCOPT_LAUNCH``) unless it
scrubs it. A :class:`ProcessTree` is the union of the session (processes
started after the leader), the leader's descendants and the token holders, so a
job's whole tree is found even after its leader died (a forking job whose
scheduler was killed), and pids reused by unrelated processes are not.

The executor's process is made a child subreaper (:func:`become_subreaper`):
orphaned grandchildren of its jobs are re-parented to it instead of ``init``
(which, in a container, may never reap them) and it reaps them here.
Elsewhere than Linux only the process group is used.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import time
from dataclasses import dataclass

LAUNCH_VAR = "ALLOCOPT_LAUNCH"  # environment variable carrying a launch's token
_PROC = "/proc"
_LINUX = sys.platform.startswith("linux") and os.path.isdir(_PROC)
_PR_SET_PDEATHSIG, _PR_SET_CHILD_SUBREAPER = 1, 36  # from <linux/prctl.h>
# resolved here, not in a forked child: loading a library after fork can deadlock in a threaded process
_PRCTL = ctypes.CDLL(None, use_errno=True).prctl if sys.platform.startswith("linux") else None


@dataclass(frozen=True)
class ProcInfo:
    """One process as ``/proc/PID/stat`` shows it; ``ticks`` is its start time (clock ticks since boot)."""

    pid: int
    ppid: int
    sid: int
    ticks: int
    zombie: bool


def _stat(pid: int) -> ProcInfo | None:
    try:
        with open(f"{_PROC}/{pid}/stat", encoding="utf-8", errors="replace") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return ProcInfo(pid, int(fields[1]), int(fields[3]), int(fields[19]), fields[0] in ("Z", "X"))
    except (OSError, IndexError, ValueError):
        return None


def start_ticks(pid: int) -> int | None:
    """Start time of ``pid`` (clock ticks since boot), to tell it from a later process with a reused pid."""
    info = _stat(pid)
    return None if info is None else info.ticks


def process_table() -> dict[int, ProcInfo]:
    """Every process visible now, by pid."""
    out = {}
    for name in os.listdir(_PROC):
        if name.isdigit():
            info = _stat(int(name))
            if info is not None:
                out[info.pid] = info
    return out


def _has_token(pid: int, token: bytes) -> bool:
    try:
        with open(f"{_PROC}/{pid}/environ", "rb") as f:
            return token in f.read().split(b"\0")
    except OSError:
        return False


def become_subreaper() -> None:
    """Make this process the reaper of its descendants' orphans (Linux; no-op elsewhere)."""
    if _PRCTL is not None:
        _PRCTL(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)


def contain_child(parent_pid: int) -> None:
    """In a forked child before exec: get SIGKILL when the parent dies, and exit at once if it is
    already gone (it died between fork and ``prctl``: the signal would never come)."""
    if _PRCTL is not None:
        _PRCTL(_PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != parent_pid:
            os._exit(137)


@dataclass(frozen=True)
class ProcessTree:
    """The processes of one launched rank.

    Attributes
    ----------
    pid : int or None
        The rank's process, leader of its own session and process group (None: not known, as for a
        launch a killed executor journaled before it forked; only the token finds its processes).
    ticks : int or None
        The leader's start time; session members that started earlier are not the job's.
    token : str
        The launch token (``ALLOCOPT_LAUNCH=<token>`` in the environment of every process of the launch).
    """

    pid: int | None
    ticks: int | None
    token: str

    def members(self, table: dict[int, ProcInfo] | None = None, *, tokens: bool = True) -> list[ProcInfo]:
        """The live or zombie processes of the tree, never this process; ``tokens=False`` skips reading
        every process's environment (zombies have none: enough to find the tree's exited processes)."""
        if not _LINUX:
            return [ProcInfo(self.pid, 0, self.pid, 0, False)] if self.pid and _group_exists(self.pid) else []
        table = process_table() if table is None else table
        me, found = os.getpid(), set()
        leader = table.get(self.pid) if self.pid else None
        if leader is not None and (self.ticks is None or leader.ticks == self.ticks):
            found.add(self.pid)
        # a pid reused by a later session leader: only processes older than it can be the job's
        before = leader.ticks if leader is not None and self.pid not in found and leader.sid == self.pid else None
        for info in table.values() if self.pid else ():
            if (info.sid == self.pid and (self.ticks is None or info.ticks >= self.ticks)
                    and (before is None or info.ticks < before)):
                found.add(info.pid)
        children: dict[int, list[int]] = {}
        for info in table.values():
            children.setdefault(info.ppid, []).append(info.pid)
        stack = list(found)
        while stack:  # descendants that left the session (setsid)
            for child in children.get(stack.pop(), ()):
                if child not in found:
                    found.add(child)
                    stack.append(child)
        token = f"{LAUNCH_VAR}={self.token}".encode()
        for pid in table if tokens else ():
            if pid not in found and pid != me and _has_token(pid, token):
                found.add(pid)
        found.discard(me)
        return [table[p] for p in found if p in table]

    def alive(self) -> bool:
        """Whether any process of the tree runs (zombies do not count)."""
        return any(not p.zombie for p in self.members())

    def signal(self, sig: int) -> None:
        """Send ``sig`` to every process of the tree (no error for those already gone)."""
        if not _LINUX:
            if self.pid:
                _signal_group(self.pid, sig)
            return
        for p in self.members():
            if not p.zombie:
                try:
                    os.kill(p.pid, sig)
                except (ProcessLookupError, PermissionError):
                    pass

    def kill(self, timeout_s: float = 10.0, *, keep: frozenset[int] = frozenset()) -> None:
        """SIGKILL the whole tree until nothing of it runs (new forks included); reap the zombies that
        are this process's children, except ``keep`` (pids whose status a ``Popen`` still collects).

        Raises
        ------
        RuntimeError
            When processes of the tree are still alive after ``timeout_s``.
        """
        limit = time.monotonic() + timeout_s
        while True:
            members = self.members()
            reap_children([p for p in members if p.zombie], keep)
            live = [p for p in members if not p.zombie]
            if not live:
                return
            if time.monotonic() >= limit:
                raise RuntimeError(f"processes {sorted(p.pid for p in live)} of the launch led by {self.pid} "
                                   f"survived SIGKILL for {timeout_s:.0f} s")
            for p in live:
                try:
                    os.kill(p.pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
            time.sleep(0.005)


def reap_children(procs: list[ProcInfo], keep: frozenset[int] = frozenset()) -> None:
    """Collect the exit status of those of ``procs`` that are this process's children (orphans
    re-parented to this subreaper), except ``keep``."""
    me = os.getpid()
    for p in procs:
        if p.ppid == me and p.pid not in keep:
            try:
                os.waitpid(p.pid, os.WNOHANG)
            except ChildProcessError:
                pass


def _group_exists(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


__all__ = ["LAUNCH_VAR", "ProcInfo", "ProcessTree", "become_subreaper", "contain_child", "process_table",
           "reap_children", "start_ticks"]
