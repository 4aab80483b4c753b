#!/usr/bin/env python
"""Benchmark: what the local (or, with ``--executor ray``, the Ray) executor adds to a job's start and stop,
on CPU pseudo-devices.

Runs the test job ``tests/jobs/count_steps.py`` for ``--rounds`` rounds on
two ``cpu`` devices, moving it between devices every round so that it is
stopped and relaunched each time, then once more with a job that ignores
SIGTERM. Reports, next to baselines measured in the same run:

* launch to first completed step, against a bare ``python -c "from
  allocopt.runtime import client"`` start-up (the part of a job's start the
  executor cannot remove); target: the executor adds < 1 s per job per round;
* stop request to every process gone, for a cooperative job and for one that
  must be killed, against the executor's ``grace_s``;
* the fraction of leases extended in a run where the job keeps its device.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from allocopt.bench.machine import machine_info
from allocopt.bench.output import (
    Column,
    add_results_option,
    results_table,
    write_results,
)
from allocopt.runtime import Lease, RoundPlan
from allocopt.runtime.devices import cpu_devices
from allocopt.runtime.local import JobSpec, LocalExecutor

COUNT_STEPS = str(Path(__file__).resolve().parents[1] / "tests" / "jobs" / "count_steps.py")


def client_import_s(repeat: int) -> float:
    """Median seconds for a fresh interpreter to import the job-side client."""
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        subprocess.run([sys.executable, "-c", "from allocopt.runtime import client"], check=True)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def executor(kind: str, jobs: dict[str, JobSpec], devices: int, work: Path, grace_s: float) -> LocalExecutor:
    """A local executor on ``devices`` cpu pseudo-devices, or a Ray executor on a local Ray instance."""
    if kind == "ray":
        from allocopt.runtime.ray_executor import RayExecutor

        return RayExecutor(jobs, {"cpu": devices}, work, grace_s=grace_s)
    return LocalExecutor(jobs, cpu_devices(devices), work, grace_s=grace_s)


def run(rounds: int, round_s: float, grace_s: float, work: Path, kind: str = "local") -> dict[str, float]:
    moving = executor(kind, {"a": JobSpec("a", [sys.executable, COUNT_STEPS, str(work / "a.txt")], 10**9)}, 2,
                      work / "moving", grace_s)
    for k in range(rounds):  # a new device every round: stop, then relaunch
        moving.run_round(RoundPlan(k, k * round_s, round_s, (Lease("a", "cpu", (k % 2,), round_s),)))
    moving.close()
    staying = executor(kind, {"a": JobSpec("a", [sys.executable, COUNT_STEPS, str(work / "b.txt")], 10**9)}, 1,
                       work / "staying", grace_s)
    for k in range(rounds):
        staying.run_round(RoundPlan(k, k * round_s, round_s, (Lease("a", "cpu", (0,), round_s, extended=k > 0),)))
    staying.close()
    stubborn = executor(kind, {"x": JobSpec("x", [sys.executable, COUNT_STEPS, str(work / "x.txt"), "--ignore-stop"],
                                            10)}, 1, work / "stubborn", grace_s)
    stubborn.run_round(RoundPlan(0, 0.0, round_s, (Lease("x", "cpu", (0,), round_s),)))
    stubborn.close()
    return {"launch_to_first_step_s": statistics.median(moving.stats.launch_to_first_step_s),
            "stop_cooperative_s": statistics.median(moving.stats.stop_s),
            "stop_killed_s": max(stubborn.stats.stop_s),
            "extension_fraction": staying.stats.extension_fraction}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--round-seconds", type=float, default=1.5)
    parser.add_argument("--grace-s", type=float, default=1.0)
    parser.add_argument("--executor", choices=("local", "ray"), default="local")
    add_results_option(parser, "bench_executor", Path(__file__).parent / "results")
    args = parser.parse_args(argv)
    baseline = client_import_s(5)
    with tempfile.TemporaryDirectory() as tmp:
        result = run(args.rounds, args.round_seconds, args.grace_s, Path(tmp), args.executor)
    machine = machine_info()
    print(f"{args.executor} executor; machine: {machine['cpu']}, {machine['cpus_usable']} usable CPUs, "
          f"load {machine['load_average']}")
    first = result["launch_to_first_step_s"]
    print(f"launch to first step      {first:7.3f} s   (bare client start-up {baseline:.3f} s; "
          f"executor adds {first - baseline:.3f} s, target < 1 s: {'met' if first - baseline < 1 else 'MISSED'})")
    print(f"stop, cooperative         {result['stop_cooperative_s']:7.3f} s   "
          f"({result['stop_cooperative_s'] / args.grace_s:.2f} x grace_s)")
    print(f"stop, SIGTERM ignored     {result['stop_killed_s']:7.3f} s   "
          f"({result['stop_killed_s'] / args.grace_s:.2f} x grace_s; SIGKILL comes at 1 x)")
    print(f"leases extended (job keeps its device): {result['extension_fraction']:.0%}")
    if args.results:
        row = {**result, "executor": args.executor, "client_start_s": baseline, "added_s": first - baseline}
        name = "bench_executor" if args.executor == "local" else f"bench_executor_{args.executor}"
        path = args.results if args.executor == "local" else str(Path(args.results).with_name(f"{name}.json"))
        write_results(path, name, machine=machine, data=row, tables=[results_table(
            f"{args.executor} executor on CPU pseudo-devices, {args.rounds} rounds of {args.round_seconds:g} s, "
            f"grace_s {args.grace_s:g} (target: under 1 s added per job per round)", [row],
            [Column("launch_to_first_step_s", "launch to first step s", ".3f"),
             Column("client_start_s", "bare client start-up s", ".3f"), Column("added_s", "executor adds s", ".3f"),
             Column("stop_cooperative_s", "cooperative stop s", ".3f"),
             Column("stop_killed_s", "stop, SIGTERM ignored s", ".3f"),
             Column("extension_fraction", "leases extended", ".0%")])])
    return 0


if __name__ == "__main__":
    sys.exit(main())
