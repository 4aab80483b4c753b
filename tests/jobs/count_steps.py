"""Test job: appends each completed step number to an output file, exactly once per step.

Usage: count_steps.py OUTPUT [--sleep-s S] [--crash-at STEP] [--return-at STEP] [--ignore-stop] [--env-out FILE]

The checkpoint records the output file's length, and a resumed run truncates the
file to it, so the file lists every step exactly once even when a run is killed
between writing a step and checkpointing it. Each step's line and its checkpoint
are one fenced commit (``client.fenced()``), so a stale copy of the job that
survived its scheduler cannot add a line either. ``--crash-at`` exits with status 3
before running that step, ``--return-at`` leaves the loop there and exits 0;
``--ignore-stop`` ignores SIGTERM and keeps stepping
past its lease (it must be killed); ``--env-out PREFIX`` writes the environment of rank r as JSON to PREFIX.r.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time

from allocopt.runtime import client


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("output")
    parser.add_argument("--sleep-s", type=float, default=0.005)
    parser.add_argument("--crash-at", type=int)
    parser.add_argument("--return-at", type=int)
    parser.add_argument("--ignore-stop", action="store_true")
    parser.add_argument("--env-out")
    args = parser.parse_args()
    lease = client.lease()
    if args.env_out:
        with open(f"{args.env_out}.{lease.rank}", "w", encoding="utf-8") as f:
            json.dump({"env": dict(os.environ), "pid": os.getpid(), "rank": lease.rank,
                       "executable": sys.executable}, f)
    if args.ignore_stop:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        while True:
            time.sleep(0.05)
    state = client.load_checkpoint()
    start = state["step"] if state else 0
    size = state["output_bytes"] if state else 0
    # only rank 0 owns the output file: another rank that starts later must not truncate it
    # to the size of a checkpoint rank 0 has since moved past
    with open(args.output if lease.rank == 0 else os.devnull, "a+b") as out:
        if lease.rank == 0:
            with client.fenced():
                out.truncate(size)
        for step in client.steps(start):
            if args.crash_at is not None and step == args.crash_at:
                return 3
            if args.return_at is not None and step == args.return_at:
                return 0
            time.sleep(args.sleep_s)
            with client.fenced():
                if lease.rank == 0:
                    out.write(f"{step}\n".encode())
                    out.flush()
                client.save_checkpoint({"step": step + 1, "output_bytes": out.tell()})  # written by rank 0 only
    return 0


if __name__ == "__main__":
    sys.exit(main())
