"""Test job for allocopt slurm: a "training" loop whose step time depends on the GPU type it was given.

Usage: slurm_train.py OUTPUT --step-s a100=0.02,v100=0.06

Each completed step appends ``STEP TYPE SLURM_RESTART_COUNT`` to OUTPUT, exactly
once per step: the checkpoint records the file's length and a resumed run
truncates the file to it (a run killed between writing a step and checkpointing
it repeats nothing). It stops on SIGTERM after the current step (allocopt's client),
checkpointing every step, and ends at ALLOCOPT_TOTAL_STEPS.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

from allocopt.runtime import client


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("output")
    parser.add_argument("--step-s", required=True, help="seconds per step by GPU type: a100=0.02,v100=0.06")
    args = parser.parse_args()
    step_s = {k: float(v) for k, v in (p.split("=") for p in args.step_s.split(","))}
    lease = client.lease()
    seconds = step_s[lease.gpu_type]
    restarts = os.environ.get("SLURM_RESTART_COUNT", "0")
    state = client.load_checkpoint()
    start = state["step"] if state else 0
    with open(args.output, "a+b") as out:
        out.truncate(state["output_bytes"] if state else 0)
        for step in client.steps(start):
            time.sleep(seconds)
            out.write(f"{step} {lease.gpu_type} {restarts}\n".encode())
            out.flush()
            client.save_checkpoint({"step": step + 1, "output_bytes": out.tell()})
    return 0


if __name__ == "__main__":
    sys.exit(main())
