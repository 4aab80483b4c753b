"""The job side of ``allocopt slurm``: run a job's command with the allocopt job client's environment.

In a batch script::

    exec python -m allocopt.integrations.slurm_exec --spool /shared/allocopt -- python train.py

(the same as ``allocopt slurm exec``, without loading the command line's solvers: a job restarted
every round starts faster). Standard library only.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from allocopt.errors import InvalidOptionError


def job_dir(spool: str | os.PathLike, job_id: str) -> Path:
    """The directory of a job's lease, progress and checkpoint files (shared with the compute nodes)."""
    return Path(spool) / "jobs" / str(job_id)


def exec_job(spool: str | os.PathLike | None, command: Sequence[str]) -> None:
    """Replace this process by ``command`` with the job client's environment.

    Reads ``SLURM_JOB_ID``, ``SLURMD_NODENAME`` (the GPU type is the node's, from the controller's
    ``SPOOL/nodes.json``) and the lease file the controller wrote before releasing the job.

    Raises
    ------
    InvalidOptionError
        Outside a Slurm job, without a spool directory or without a command.
    """
    command = list(command[1:] if command[:1] == ["--"] else command)
    job_id = os.environ.get("SLURM_JOB_ID")
    if not job_id:
        raise InvalidOptionError("allocopt slurm exec runs inside a Slurm job (SLURM_JOB_ID is not set)")
    if not spool:
        raise InvalidOptionError("allocopt slurm exec needs --spool DIR (the controller's) or ALLOCOPT_SLURM_SPOOL")
    if not command:
        raise InvalidOptionError("allocopt slurm exec needs a command: allocopt slurm exec -- python train.py")
    jdir = job_dir(spool, job_id)
    try:
        lease = json.loads((jdir / "lease.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        lease = {}
    env = dict(os.environ)
    env.update({"ALLOCOPT_JOB_ID": job_id, "ALLOCOPT_PROGRESS_FILE": str(jdir / "progress.jsonl"),
                "PYTHONUNBUFFERED": "1"})
    env.setdefault("ALLOCOPT_CHECKPOINT_DIR", str(jdir / "checkpoints"))
    gpu_type = node_gpu_type(spool, os.environ.get("SLURMD_NODENAME", "")) or lease.get("gpu_type")
    if gpu_type:
        env["ALLOCOPT_GPU_TYPE"] = str(gpu_type)
    if lease.get("total_steps") and "ALLOCOPT_TOTAL_STEPS" not in env:
        env["ALLOCOPT_TOTAL_STEPS"] = str(lease["total_steps"])
    jdir.mkdir(parents=True, exist_ok=True)
    os.execvpe(command[0], command, env)


def node_gpu_type(spool: str | os.PathLike, node: str) -> str | None:
    """The GPU type of ``node``: from the controller's ``SPOOL/nodes.json``, else from its typed GRES
    (``scontrol show node``; a job Slurm started before the controller's first round). The lease file
    may already name the job's next lease's type, so the node decides."""
    try:
        gpu_type = json.loads((Path(spool) / "nodes.json").read_text(encoding="utf-8")).get(node)
    except (OSError, ValueError, AttributeError):
        gpu_type = None
    if gpu_type or not node:
        return gpu_type
    try:
        out = subprocess.run(["scontrol", "--oneliner", "show", "node", node], capture_output=True, text=True,
                             timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    types = set(re.findall(r"(?:^|[\s,=])gpu:([^:,(\s]+):\d+", out.split("GresUsed=")[0]))
    return types.pop() if len(types) == 1 else None


def add_exec_arguments(parser: argparse.ArgumentParser) -> None:
    """``--spool DIR`` and ``-- COMMAND ...``."""
    parser.add_argument("--spool", default=os.environ.get("ALLOCOPT_SLURM_SPOOL"), metavar="DIR",
                        help="the controller's --spool (default: $ALLOCOPT_SLURM_SPOOL)")
    parser.add_argument("job_command", nargs=argparse.REMAINDER, metavar="-- COMMAND ...")


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m allocopt.integrations.slurm_exec --spool DIR -- COMMAND ...``; exit 2 on bad use."""
    parser = argparse.ArgumentParser(prog="allocopt slurm exec", description=__doc__.splitlines()[0])
    add_exec_arguments(parser)
    args = parser.parse_args(argv)
    try:
        exec_job(args.spool, args.job_command)
    except (InvalidOptionError, OSError) as err:
        parser.exit(2, f"allocopt slurm exec: error: {err}\n")
    return 0  # not reached


if __name__ == "__main__":
    sys.exit(main())
