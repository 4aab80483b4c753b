"""Test job for elastic jobs under allocopt slurm: logs each launch's batch and GPUs, and each step exactly once.

Usage: slurm_elastic_train.py OUTDIR [--alpha S] [--beta S] [--grad-sqr X --grad-var Y]

Each launch writes ``OUTDIR/launch-R.json`` (R: ``SLURM_RESTART_COUNT``): the batch variables of its
environment, its lease file (``ALLOCOPT_LEASE_FILE``: the lease's round, GPU type, replicas...), and the
GPUs Slurm gave it (``SLURM_GPUS_ON_NODE``, ``SLURM_JOB_NUM_NODES``, ``SLURMD_NODENAME``). Each step
appends ``STEP R`` to ``OUTDIR/steps.txt`` exactly once (the checkpoint records the file's length; a
resumed launch truncates the file to it) and sleeps ``(ALLOCOPT_ACCUM_STEPS + 1) * (alpha + beta *
ALLOCOPT_LOCAL_BSZ)`` seconds, as a data-parallel step whose micro-batch shrinks with more replicas.
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
    parser.add_argument("--grad-sqr", type=float)
    parser.add_argument("--grad-var", type=float)
    args = parser.parse_args()
    out = Path(args.outdir)
    lease = client.lease()
    restarts = os.environ.get("SLURM_RESTART_COUNT", "0")
    with open(os.environ["ALLOCOPT_LEASE_FILE"], encoding="utf-8") as f:
        lease_file = json.load(f)
    (out / f"launch-{restarts}.json").write_text(json.dumps({
        "restarts": int(restarts), "gpu_type": lease.gpu_type, "batch_size": lease.batch_size,
        "local_bsz": lease.local_bsz, "accum_steps": lease.accum_steps, "lr_scale": lease.lr_scale,
        "replicas": int(os.environ["ALLOCOPT_REPLICAS"]), "total_steps": lease.total_steps, "lease_file": lease_file,
        "gpus_on_node": int(os.environ.get("SLURM_GPUS_ON_NODE", "0")),
        "num_nodes": int(os.environ.get("SLURM_JOB_NUM_NODES", "1")), "node": os.environ.get("SLURMD_NODENAME")}))
    if args.grad_sqr is not None:
        client.report(grad_sqr=args.grad_sqr, grad_var=args.grad_var)
    seconds = (lease.accum_steps + 1) * (args.alpha + args.beta * (lease.local_bsz or 1))
    state = client.load_checkpoint()
    start = state["step"] if state else 0
    with open(out / "steps.txt", "a+b") as log:
        log.truncate(state["output_bytes"] if state else 0)
        for step in client.steps(start):
            time.sleep(seconds)
            log.write(f"{step} {restarts}\n".encode())
            log.flush()
            client.save_checkpoint({"step": step + 1, "output_bytes": log.tell()})
    return 0


if __name__ == "__main__":
    sys.exit(main())
