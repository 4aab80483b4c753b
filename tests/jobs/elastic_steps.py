"""Test job for elastic runs: every rank logs the steps it runs; a step sleeps like a data-parallel step.

Usage: elastic_steps.py OUTDIR [--alpha S] [--beta S] [--slow TYPE=FACTOR ...] [--grad-sqr X --grad-var Y]
                         [--checkpoint-every N] [--stop-s S]

Each launch (lease epoch ``E``) writes ``OUTDIR/launch-eE-rR.json`` per rank R: its rank, world size,
GPU type, pid, node (``SLURMD_NODENAME`` under Slurm), the batch variables of its environment and the lease
file's copy of them. Every
rank appends each step it runs to ``OUTDIR/steps-eE-rR.txt``; rank 0 does so in the same fenced
commit as the checkpoint of that step, so a step is logged by a launch exactly when it ran there (the
checkpoint records rank 0's log and its length, to which the next launch truncates it: a launch killed
between logging a step and checkpointing it leaves no line).
A step sleeps ``(ALLOCOPT_ACCUM_STEPS + 1) * (alpha + beta * ALLOCOPT_LOCAL_BSZ) * factor`` seconds,
``factor`` the ``--slow`` factor of the launch's GPU type (1 for others): step time grows with the
micro-batch and shrinks as replicas split the batch, as a data-parallel step does. With
``--grad-sqr``/``--grad-var`` the job reports them as its gradient statistics. ``--checkpoint-every N``
checkpoints (and logs) every N-th step only (steps after the last checkpoint of a launch are then run
again by the next one: for tests that time steps rather than count them). ``--stop-s S``: a launch asked to
stop takes S seconds more to exit (as one that saves a large checkpoint).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from allocopt.runtime import client


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("outdir")
    parser.add_argument("--alpha", type=float, default=0.004)
    parser.add_argument("--beta", type=float, default=0.0001)
    parser.add_argument("--slow", action="append", default=[])
    parser.add_argument("--grad-sqr", type=float)
    parser.add_argument("--grad-var", type=float)
    parser.add_argument("--checkpoint-every", type=int, default=1)
    parser.add_argument("--stop-s", type=float, default=0.0)
    args = parser.parse_args()
    lease = client.lease()
    out = Path(args.outdir)
    factors = {t: float(f) for t, _, f in (s.partition("=") for s in args.slow)}
    with open(os.environ["ALLOCOPT_LEASE_FILE"], encoding="utf-8") as f:
        lease_file = json.load(f)
    tag = f"e{lease.epoch}-r{lease.rank}"
    (out / f"launch-{tag}.json").write_text(json.dumps({
        "epoch": lease.epoch, "rank": lease.rank, "world_size": lease.world_size, "gpu_type": lease.gpu_type,
        "pid": os.getpid(), "node": os.environ.get("SLURMD_NODENAME"), "batch_size": lease.batch_size, "local_bsz": lease.local_bsz,
        "accum_steps": lease.accum_steps, "lr_scale": lease.lr_scale, "total_steps": lease.total_steps,
        "lease_file": {k: lease_file.get(k) for k in ("batch_size", "local_bsz", "accum_steps", "lr_scale")}}))
    if args.grad_sqr is not None and lease.rank == 0:
        client.report(grad_sqr=args.grad_sqr, grad_var=args.grad_var)
    seconds = (lease.accum_steps + 1) * (args.alpha + args.beta * (lease.local_bsz or 1)) \
        * factors.get(lease.gpu_type or "", 1.0)
    state = client.load_checkpoint()
    start = state["step"] if state else 0
    if state and "log" in state and lease.rank == 0:  # a step logged by a launch killed before its checkpoint
        with client.fenced(), open(state["log"], "r+b") as old:
            old.truncate(state["log_bytes"])
    path = out / f"steps-{tag}.txt"
    with open(path, "a", encoding="utf-8") as log:
        for step in client.steps(start):
            time.sleep(seconds)
            if (step + 1) % args.checkpoint_every:
                continue
            with client.fenced():
                log.write(f"{step}\n")
                log.flush()
                client.save_checkpoint({"step": step + 1, "log": str(path), "log_bytes": log.tell()})  # rank 0 only
    if client.stop_requested():
        time.sleep(args.stop_s)
    return 0


if __name__ == "__main__":
    sys.exit(main())
