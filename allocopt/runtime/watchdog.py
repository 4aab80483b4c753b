"""The executor's watchdog: when the executor dies without stopping its jobs, kill their process trees.

:class:`~allocopt.runtime.local.LocalExecutor` starts one per work directory
(Linux), holding the read end of a pipe whose only write end the executor
holds. When the executor closes it (:meth:`close`, which first writes
:data:`CLOSING`) it just exits; when the executor dies (the kernel closes the
pipe) it takes the work directory's lock (released by the dying executor a
moment later; if a new executor took it first, that one cleans up), kills every
process tree journaled in ``jobs/*/pids.json`` and issues a new lease epoch for
each job, so no job process, not even an orphan that never uses the client,
outlives the executor.
The journal files stay for the next executor, which logs their device intervals.

Run as ``python -m allocopt.runtime.watchdog WORK_DIR``; standard library and
the runtime's process and fence modules only.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

from allocopt.runtime.fence import issue_epoch
from allocopt.runtime.procs import ProcessTree

log = logging.getLogger(__name__)

LOCK_FILE = "executor.lock"
CLOSING = b"closing"  # what the executor writes before it closes the pipe on purpose
_LOCK_WAIT_S = 10.0


def stop_recorded(pid_file: Path) -> list[dict[str, Any]] | None:
    """Kill every process tree journaled in ``pid_file`` (session, descendants, launch token) and fence
    the job off with a new lease epoch; return the entries (None when the journal is unreadable).

    Raises
    ------
    RuntimeError
        When processes survive SIGKILL.
    """
    try:
        entries = json.loads(pid_file.read_text(encoding="utf-8"))
        trees = [ProcessTree(e.get("pid"), e.get("ticks"), e.get("token") or "-") for e in entries]
    except FileNotFoundError:
        return []
    except (OSError, ValueError, AttributeError, TypeError):
        log.warning("unreadable process journal %s: its processes cannot be found", pid_file)
        return None
    for tree in trees:
        tree.kill()
    issue_epoch(str(pid_file.parent))
    for tree in trees:  # anything the trees forked while they were killed
        tree.kill()
    return entries


def main(argv: list[str] | None = None) -> int:
    """Wait for end of file on stdin, then stop the work directory's journaled jobs if it is unowned."""
    work_dir = Path((argv if argv is not None else sys.argv[1:])[0])
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    received = b""
    while chunk := os.read(0, 4096):
        received += chunk
    if CLOSING in received:
        return 0  # the executor stopped its jobs and closed on purpose
    fd = os.open(work_dir / LOCK_FILE, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        limit = time.monotonic() + _LOCK_WAIT_S  # the dying executor's files close one by one
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= limit:
                    return 0  # a new executor owns the work directory: it stopped what was left
                time.sleep(0.02)
        for pid_file in sorted((work_dir / "jobs").glob("*/pids.json")):
            try:
                stop_recorded(pid_file)
            except (RuntimeError, OSError) as err:
                sys.stderr.write(f"allocopt watchdog: {pid_file}: {err}\n")  # its own process: no logging set up
    finally:
        os.close(fd)
    return 0


if __name__ == "__main__":
    sys.exit(main())
