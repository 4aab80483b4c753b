"""The executor's watchdog: when the executor dies without stopping its jobs, kill their process trees.

:class:`~allocopt.runtime.local.LocalExecutor` starts one per work directory
(Linux), holding the read end of a pipe whose only write end the executor
holds. When the executor closes it (:meth:`close`) or dies (the kernel closes
it), the watchdog wakes up; if the work directory's lock is free (its executor
is gone and no new one took over), it kills every process tree journaled in
``jobs/*/pids.json`` and issues a new lease epoch for each job, so no job
process, not even an orphan that never uses the client, outlives the executor.
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
from pathlib import Path
from typing import Any

from allocopt.runtime.fence import issue_epoch
from allocopt.runtime.procs import ProcessTree

log = logging.getLogger(__name__)

LOCK_FILE = "executor.lock"


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
    while os.read(0, 4096):
        pass
    fd = os.open(work_dir / LOCK_FILE, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return 0  # the executor closed on purpose, or a new one owns the work directory
        for pid_file in sorted((work_dir / "jobs").glob("*/pids.json")):
            try:
                stop_recorded(pid_file)
            except (RuntimeError, OSError) as err:
                print(f"allocopt watchdog: {pid_file}: {err}", file=sys.stderr)
    finally:
        os.close(fd)
    return 0


if __name__ == "__main__":
    sys.exit(main())
