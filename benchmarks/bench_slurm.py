"""One ``allocopt slurm`` round at scale against real Slurm daemons, next to the same round's solve time.

Partition ``bench`` of .ci/slurm-setup.sh (nodes gpu-big-a: 256 x a100, gpu-big-v: 256 x v100).
Two jobs that did not opt in hold 156 GPUs of each type, leaving allocopt 100 + 100. The script
submits 1,200 held opted-in jobs (``sleep``; four models with different speed-ups), runs one round
(which releases 200), waits until Slurm runs them, then times rounds with 1,000 pending and 200
running jobs: observe (squeue, sinfo), plan (Engine.next_round: solve + mechanism), journal
(SQLite), enact (batched scontrol: update, release, requeuehold); +settle_s is the wait for requeued
jobs that change GPU type to stop (their checkpoint time, Slurm's KillWait) before their release.
Between timed rounds the script waits, as a minute between real rounds would, until the round's
leased jobs run and its requeued jobs have stopped, then ``--gap`` seconds more (the launches of
200 batch jobs by the slurmd daemons on this same machine take its CPUs for a few seconds). The baseline is the policy's solve alone on
the same problem (``allocopt.solve``), timed in the same run.

Usage (root, daemons up or startable)::

    PYTHONPATH=$PWD python benchmarks/bench_slurm.py [--jobs 1200] [--running 200] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import allocopt
from allocopt.bench.machine import machine_info
from allocopt.bench.output import (
    Column,
    add_results_option,
    results_table,
    write_results,
)
from allocopt.integrations.slurm import Journal, SlurmController, load_throughputs
from allocopt.integrations.slurm_commands import Slurm

ROOT = Path(__file__).resolve().parents[1]
PARTITION = "bench"
MODELS = {"m0": (40.0, 10.0), "m1": (30.0, 20.0), "m2": (20.0, 18.0), "m3": (50.0, 12.5)}  # a100, v100 steps/s


def sbatch(*options: str) -> str:
    out = subprocess.run(["sbatch", "--parsable", f"--partition={PARTITION}", "--output=/dev/null", *options],
                         capture_output=True, text=True, check=True).stdout
    return out.strip().split(";")[0]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=1200, help="opted-in jobs (default: %(default)s)")
    parser.add_argument("--running", type=int, default=200, help="GPUs left to allocopt (default: %(default)s)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds timed (default: %(default)s)")
    parser.add_argument("--gap", type=float, default=10.0,
                        help="seconds between a round's jobs being in place and the next round, for the job "
                             "launches of the daemons on this same machine to finish (default: %(default)s)")
    add_results_option(parser, "bench_slurm", Path(__file__).parent / "results")
    args = parser.parse_args()
    machine = machine_info()
    rows = []
    if subprocess.run(["sinfo", "-h", "-p", PARTITION], capture_output=True).returncode != 0:
        if subprocess.run(["bash", str(ROOT / ".ci" / "slurm-setup.sh")]).returncode != 0:
            print("Slurm daemons are not running and could not start (.ci/slurm-setup.sh)", file=sys.stderr)
            return 1
    per_type = 256 - args.running // 2
    submitted: list[str] = []
    work = Path(tempfile.mkdtemp(prefix="allocopt-bench-slurm-"))
    table = work / "throughputs.json"
    table.write_text(json.dumps([{"model": m, "scale_factor": 1, "gpu_type": t, "throughput": v}
                                 for m, vs in MODELS.items() for t, v in zip(("a100", "v100"), vs)]))
    try:
        for node in ("gpu-big-a", "gpu-big-v"):  # foreign jobs: never touched, their GPUs are not allocopt's
            submitted.append(sbatch(f"--nodelist={node}", f"--gres=gpu:{per_type}", "--wrap=sleep 900"))
        t0 = time.perf_counter()
        with ThreadPoolExecutor(8) as pool:
            submitted += pool.map(lambda k: sbatch("--hold", "--gres=gpu:1", "--job-name=allocopt-bench",
                                                   f"--comment=allocopt:model=m{k % 4}", "--wrap=sleep 900"),
                                  range(args.jobs))
        print(f"submitted {args.jobs} held jobs in {time.perf_counter() - t0:.1f} s")
        slurm = Slurm([PARTITION])
        _wait(lambda: sum(j.state == "RUNNING" for j in slurm.jobs(submitted[:2])) == 2, 60, "foreign jobs")
        controller = SlurmController(slurm, Journal(work / "controller.sqlite"), work / "spool",
                                     round_seconds=60.0, throughputs=load_throughputs(table), out=None)
        first = controller.run_round()
        print(f"round 0: released {len(first['actions']['release'])} jobs, {first['timings']['round_s']:.2f} s")
        _wait(lambda: sum(j.state == "RUNNING" for j in slurm.jobs()) >= args.running + 2, 180,
              f"{args.running} released jobs running")
        time.sleep(args.gap)
        print(f"{'round':>5} {'pending':>7} {'running':>7} {'observe_s':>9} {'plan_s':>7} {'journal_s':>9} "
              f"{'enact_s':>7} {'round_s':>7} {'+settle_s':>9} {'solve_s':>7} {'round/solve':>11} {'requeued':>8} {'released':>8} "
              f"{'scontrol':>8}")
        for _ in range(args.rounds):
            jobs = slurm.jobs()
            pending = sum(j.state == "PENDING" for j in jobs)
            running = sum(j.state == "RUNNING" and j.job_id in controller.records for j in jobs)
            commands = slurm.commands_run
            record = controller.run_round()
            problem, _ = controller.engine.problem()  # the baseline: the policy's solve of the same problem
            s0 = time.perf_counter()
            allocopt.solve(problem, controller.policy)
            solve_s = time.perf_counter() - s0
            tm = record["timings"]
            print(f"{record['idx']:>5} {pending:>7} {running:>7} {tm['observe_s']:>9.3f} {tm['solve_s']:>7.3f} "
                  f"{tm['journal_s']:>9.3f} {tm['enact_s']:>7.3f} {tm['round_s']:>7.3f} {tm['requeued_release_s']:>9.3f} "
                  f"{solve_s:>7.3f} "
                  f"{tm['round_s'] / solve_s:>11.1f} {len(record['actions']['requeuehold']):>8} "
                  f"{len(record['actions']['release']):>8} {slurm.commands_run - commands:>8}", flush=True)
            rows.append({"round": record["idx"], "pending": pending, "running": running, **tm, "policy_solve_s": solve_s,
                         "requeued": len(record["actions"]["requeuehold"]),
                         "released": len(record["actions"]["release"]), "scontrol": slurm.commands_run - commands})
            # as between rounds (a minute apart): the requeued jobs stop, the released ones start
            leased = set(record["leases"])
            _wait(lambda: {j.job_id for j in slurm.jobs() if j.state == "RUNNING" and j.job_id in controller.records}
                  == leased, 120, "the round's jobs running")
            time.sleep(args.gap)
    finally:
        for start in range(0, len(submitted), 500):
            subprocess.run(["scancel", *submitted[start:start + 500]], capture_output=True)
    if args.results and rows:
        write_results(args.results, "bench_slurm", machine=machine, data={"rounds": rows}, tables=[results_table(
            f"One allocopt slurm round, {args.jobs:,} opted-in jobs, {args.running} GPUs left to allocopt "
            "(target: the whole round within 2 s)", rows,
            [Column("round", "round"), Column("observe_s", "observe s", ".3f"), Column("solve_s", "plan s", ".3f"),
             Column("journal_s", "journal s", ".3f"), Column("enact_s", "enact s", ".3f"),
             Column("round_s", "whole round s", ".3f"), Column("policy_solve_s", "policy solve s", ".3f"),
             Column("requeued", "requeued"), Column("released", "released"), Column("scontrol", "scontrol calls")])])
    return 0


def _wait(predicate, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out waiting for {what}")
        time.sleep(0.5)


if __name__ == "__main__":
    sys.exit(main())
