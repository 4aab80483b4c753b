"""Test harness: `allocopt run` with a SIGKILL injected at an exact point of a job's launch.

Usage: fault_scheduler.py MODE N ALLOCOPT-RUN-ARGS...

MODE ``after-fork``: the scheduler SIGKILLs itself right after its N-th process start returned
(the child exists and is recorded by launch token, not yet by pid). MODE ``before-death-signal``:
the N-th child SIGKILLs the scheduler after fork, before it arms its death signal (the race a
parent check after ``prctl`` closes). The scheduler itself is the real one, unmodified otherwise.
"""

from __future__ import annotations

import os
import signal
import sys
import time

from allocopt import cli
from allocopt.runtime import launch, local


def main() -> int:
    mode, n, argv = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
    count = {"starts": 0}
    if mode == "after-fork":
        original = local.start_process

        def start_process(*args, **kwargs):
            result = original(*args, **kwargs)
            count["starts"] += 1
            if count["starts"] == n:
                os.kill(os.getpid(), signal.SIGKILL)
            return result

        local.start_process = start_process
    elif mode == "before-death-signal":
        contain = launch.contain_child  # start_process (allocopt.runtime.launch) arms the death signal with it
        original_start = local.start_process

        def start_process(*args, **kwargs):
            count["starts"] += 1
            if count["starts"] == n:
                def child_hook(parent: int) -> None:  # runs in the forked child
                    os.kill(parent, signal.SIGKILL)
                    while os.getppid() == parent:
                        time.sleep(0.001)
                    contain(parent)
                launch.contain_child = child_hook
            try:
                return original_start(*args, **kwargs)
            finally:
                launch.contain_child = contain

        local.start_process = start_process
    else:
        raise SystemExit(f"unknown mode {mode}")
    return cli.main(["run", *argv])


if __name__ == "__main__":
    sys.exit(main())
