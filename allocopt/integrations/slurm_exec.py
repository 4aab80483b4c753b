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
    ``SPOOL/nodes.json``) and the lease file the controller wrote before releasing the job. An elastic
    job's lease carries its epoch (``ALLOCOPT_EPOCH``: commits of a copy left from an earlier launch, e.g.
    on a node that was marked down, are refused); under ``srun`` with several tasks the ranks follow rank 0
    step by step (``ALLOCOPT_SYNC_FILE``), so that all stop at the same step.

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
    rank = _rank_environment(env)
    progress = "progress.jsonl" if rank.get("RANK", "0") == "0" else f"progress-r{rank['RANK']}.jsonl"
    env.update(rank)
    env.update({"ALLOCOPT_JOB_ID": job_id, "ALLOCOPT_PROGRESS_FILE": str(jdir / progress),
                "PYTHONUNBUFFERED": "1"})
    if lease.get("batch_size") is not None:  # an elastic job: the batch of this allocation
        env.update({"ALLOCOPT_BATCH_SIZE": str(lease["batch_size"]), "ALLOCOPT_LOCAL_BSZ": str(lease["local_bsz"]),
                    "ALLOCOPT_ACCUM_STEPS": str(lease["accum_steps"]), "ALLOCOPT_LR_SCALE": repr(float(lease["lr_scale"])),
                    "ALLOCOPT_REPLICAS": str(lease.get("replicas", ""))})
        # this launch's copy of its lease (the controller writes lease.json anew for the job's next launch)
        snapshot = jdir / f"lease-launch-{os.environ.get('SLURM_RESTART_COUNT', '0')}-r{rank.get('RANK', '0')}.json"
        tmp = snapshot.with_name("." + snapshot.name + ".tmp")
        tmp.write_text(json.dumps({k: v for k, v in lease.items() if k not in ("seq", "lease_end", "max_steps")}),
                       encoding="utf-8")
        os.replace(tmp, snapshot)
        env["ALLOCOPT_LEASE_FILE"] = str(snapshot)
    if lease.get("epoch") is not None:  # the launch's lease epoch: a copy left from an earlier launch cannot commit
        env.update({"ALLOCOPT_EPOCH": str(int(lease["epoch"])), "ALLOCOPT_FENCE_DIR": str(jdir)})
        if int(rank.get("WORLD_SIZE", "1")) > 1:  # the ranks of this launch step together (client.steps)
            env["ALLOCOPT_SYNC_FILE"] = str(jdir / f"sync-e{int(lease['epoch'])}.json")
    env.setdefault("ALLOCOPT_CHECKPOINT_DIR", str(jdir / "checkpoints"))
    gpu_type = node_gpu_type(spool, os.environ.get("SLURMD_NODENAME", "")) or lease.get("gpu_type")
    if gpu_type:
        env["ALLOCOPT_GPU_TYPE"] = str(gpu_type)
    if lease.get("total_steps") and "ALLOCOPT_TOTAL_STEPS" not in env:
        env["ALLOCOPT_TOTAL_STEPS"] = str(lease["total_steps"])
    jdir.mkdir(parents=True, exist_ok=True)
    os.execvpe(command[0], command, env)


def _rank_environment(env: dict[str, str]) -> dict[str, str]:
    """Inside an ``srun`` step (one task per GPU): ``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ``MASTER_ADDR`` (the
    job's first node) and ``MASTER_PORT`` (from the job id) a data-parallel program needs; {} in the batch
    script itself (no ``SLURM_STEP_ID``) or where they are set already."""
    if not env.get("SLURM_STEP_ID", "").isdigit() or "RANK" in env:
        return {}
    nodes = env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST") or ""
    first = re.sub(r"\[(\d+).*", r"\1", nodes.split(",")[0]) if nodes else "127.0.0.1"
    return {"RANK": env.get("SLURM_PROCID", "0"), "LOCAL_RANK": env.get("SLURM_LOCALID", "0"),
            "WORLD_SIZE": env.get("SLURM_NTASKS", "1"), "MASTER_ADDR": first,
            "MASTER_PORT": env.get("MASTER_PORT") or str(20000 + int(env.get("SLURM_JOB_ID", "0")) % 20000)}


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
