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

``--finish N`` cancels N running jobs before each timed round (as jobs that completed), so that the
round starts others and resizes. ``--policy sia`` times the same round of elastic jobs (comment ``batch_size=16,max_batch_size=256,
max_local_bsz=64,max_replicas=2``: the goodput engine picks each job's GPU type, count and batch), whose
changes are enacted by requeuehold, ``scontrol update`` (ExcNodeList, NumNodes, Gres) and release; results
go to ``bench_slurm_elastic.json``.

Usage (root, daemons up or startable)::

    PYTHONPATH=$PWD python benchmarks/bench_slurm.py [--jobs 1200] [--running 200] [--rounds 3] [--policy sia --finish 20]
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
from allocopt.runtime.elastic import GoodputEngine, is_goodput_policy

ROOT = Path(__file__).resolve().parents[1]
PARTITION = "bench"
ELASTIC = "batch_size=16,max_batch_size=256,max_local_bsz=64,max_replicas=2"
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
    parser.add_argument("--finish", type=int, default=0,
                        help="running opted-in jobs cancelled before each timed round, as jobs that completed: "
                             "the round starts others in their place and resizes (default: %(default)s)")
    parser.add_argument("--policy", default="max_min_fairness",
                        help="the controller's policy (default: %(default)s); sia: elastic jobs")
    add_results_option(parser, "bench_slurm", Path(__file__).parent / "results")
    args = parser.parse_args()
    elastic = is_goodput_policy(args.policy)
    name = "bench_slurm_elastic" if elastic else "bench_slurm"
    if elastic and args.results == str(Path(__file__).parent / "results" / "bench_slurm.json"):
        args.results = str(Path(__file__).parent / "results" / f"{name}.json")
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
                                                   f"--comment=allocopt:{ELASTIC if elastic else f'model=m{k % 4}'}",
                                                   "--wrap=sleep 900"),
                                  range(args.jobs))
        print(f"submitted {args.jobs} held {'elastic ' if elastic else ''}jobs in {time.perf_counter() - t0:.1f} s")
        slurm = Slurm([PARTITION])
        _wait(lambda: sum(j.state == "RUNNING" for j in slurm.jobs(submitted[:2])) == 2, 60, "foreign jobs")
        controller = SlurmController(slurm, Journal(work / "controller.sqlite"), work / "spool", policy=args.policy,
                                     round_seconds=60.0, throughputs=load_throughputs(table), out=None)
        first = controller.run_round()
        print(f"round 0: released {len(first['actions']['release'])} jobs, {first['timings']['round_s']:.2f} s")
        leased = set(first["leases"])
        _wait(lambda: leased <= {j.job_id for j in slurm.jobs() if j.state == "RUNNING"}, 180,
              f"the {len(leased)} released jobs running")
        time.sleep(args.gap)
        print(f"{'round':>5} {'pending':>7} {'running':>7} {'observe_s':>9} {'plan_s':>7} {'journal_s':>9} "
              f"{'enact_s':>7} {'round_s':>7} {'+settle_s':>9} {'solve_s':>7} {'round/solve':>11} {'requeued':>8} {'released':>8} "
              f"{'scontrol':>8}")
        for _ in range(args.rounds):
            if args.finish:
                done = [j.job_id for j in slurm.jobs() if j.state == "RUNNING" and j.job_id in controller.records]
                subprocess.run(["scancel", *done[:args.finish]], capture_output=True, check=False)
                gone = set(done[:args.finish])
                _wait(lambda gone=gone: not {j.job_id for j in slurm.jobs()} & gone, 60, "cancelled jobs gone")
            jobs = slurm.jobs()
            pending = sum(j.state == "PENDING" for j in jobs)
            running = sum(j.state == "RUNNING" and j.job_id in controller.records for j in jobs)
            gpus = sum(j.gpus[1] for j in jobs if j.state == "RUNNING" and j.job_id in controller.records)
            commands = slurm.commands_run
            record = controller.run_round()
            solve_s = _policy_solve_s(controller)
            tm = record["timings"]
            print(f"{record['idx']:>5} {pending:>7} {running:>7} {tm['observe_s']:>9.3f} {tm['solve_s']:>7.3f} "
                  f"{tm['journal_s']:>9.3f} {tm['enact_s']:>7.3f} {tm['round_s']:>7.3f} {tm['requeued_release_s']:>9.3f} "
                  f"{solve_s:>7.3f} "
                  f"{tm['round_s'] / solve_s:>11.1f} {len(record['actions']['requeuehold']):>8} "
                  f"{len(record['actions']['release']):>8} {slurm.commands_run - commands:>8}", flush=True)
            rows.append({"round": record["idx"], "pending": pending, "running": running, "gpus": gpus,
                         "finished": args.finish,
                         **tm, "policy_solve_s": solve_s,
                         "requeued": len(record["actions"]["requeuehold"]),
                         "released": len(record["actions"]["release"]), "scontrol": slurm.commands_run - commands})
            # as between rounds (a minute apart): the requeued jobs stop, the released ones start
            leased = set(record["leases"])
            _wait(lambda leased=leased: {j.job_id for j in slurm.jobs()
                                         if j.state == "RUNNING" and j.job_id in controller.records} == leased,
                  120, "the round's jobs running",
                  lambda leased=leased: [(j.job_id, j.state, j.reason, j.nodes, j.gpus, j.job_id in leased)
                                         for j in slurm.jobs() if (j.state == "RUNNING") != (j.job_id in leased)
                                         and j.job_id in controller.records])
            time.sleep(args.gap)
    finally:
        for start in range(0, len(submitted), 500):
            subprocess.run(["scancel", *submitted[start:start + 500]], capture_output=True)
    if args.results and rows:
        write_results(args.results, name, machine=machine, data={"policy": args.policy, "rounds": rows},
                      tables=[results_table(
            f"One allocopt slurm round, {args.jobs:,} opted-in {'elastic ' if elastic else ''}jobs "
            f"(--policy {args.policy}), {args.running} GPUs left to allocopt (target: the whole round within 2 s)",
            rows,
            [Column("round", "round"), Column("pending", "pending"), Column("running", "running"),
             Column("observe_s", "observe s", ".3f"), Column("solve_s", "plan s", ".3f"),
             Column("journal_s", "journal s", ".3f"), Column("enact_s", "enact s", ".3f"),
             Column("round_s", "whole round s", ".3f"), Column("policy_solve_s", "policy solve s", ".3f"),
             Column("requeued", "requeued"), Column("released", "released"), Column("scontrol", "scontrol calls")])])
    return 0


def _policy_solve_s(controller: SlurmController) -> float:
    """Seconds of the policy's solve alone on the round's problem: ``allocopt.solve`` of the engine's problem
    (rigid jobs), or the goodput engine's plan of the same jobs and cluster on a copy (elastic jobs)."""
    engine = controller.engine
    if isinstance(engine, GoodputEngine):
        copy = GoodputEngine.from_json(engine.to_json(), controller.profiles)
        s0 = time.perf_counter()
        copy.next_round()
        return time.perf_counter() - s0
    problem, _ = engine.problem()
    s0 = time.perf_counter()
    allocopt.solve(problem, controller.policy)
    return time.perf_counter() - s0


def _wait(predicate, timeout_s: float, what: str, details=None) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out waiting for {what}" + (f": {details()[:20]}" if details else ""))
        time.sleep(0.5)


if __name__ == "__main__":
    sys.exit(main())
