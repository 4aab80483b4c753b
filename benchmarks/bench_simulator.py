#!/usr/bin/env python
"""Benchmark: the round-based mechanism and the trace-driven simulator.

Three parts (each can be skipped):

* ``mechanism``: per-round mechanism work at ``--active-jobs`` active jobs
  (default 10,000; target under 50 ms) on a cluster of ``--mechanism-gpus``
  GPUs per type of v100, p100 and k80: priorities plus greedy selection
  (:meth:`PriorityMechanism.select`), placement onto GPU ids (half of the
  jobs kept their previous GPUs), and counter updates, excluding the solve.
  The median of ``--repeat`` rounds counts.
* ``continuous``: a generated workload of ``--jobs`` jobs (default 1,000)
  arriving at ``--jobs-per-hour`` on ``--gpus-per-type`` (default 36) v100,
  p100 and k80 GPUs with heterogeneity-aware max-min fairness
  (``max_min_fairness_perf``; target: under 2 minutes on 2 cores), and the
  same workload with the agnostic policy (``gavel:max_min_fairness``) for the
  JCT ratio; ``--policies`` names others (e.g. ``max_min_fairness,finish_time_fairness``),
  ``--ftf`` adds the finish-time-fairness companion simulation (``simulate(ftf=True)``).
* ``artifact``: Gavel's ``artifact_evaluation.trace`` (15 jobs at t=0) on the
  artifact's cluster, v100=2, p100=0, k80=4, with
  ``max_min_fairness_perf``, through the mechanism and in ideal mode.

Usage::

    python benchmarks/bench_simulator.py
    python benchmarks/bench_simulator.py --parts mechanism --active-jobs 20000
    python benchmarks/bench_simulator.py --parts continuous --jobs 1000 --jobs-per-hour 3 --json out.json
    python benchmarks/bench_simulator.py --parts continuous --jobs 20000 --jobs-per-hour 60 --gpus-per-type 720 \
        --policies max_min_fairness,finish_time_fairness
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np

import allocopt
from allocopt.bench.machine import format_machine, machine_info
from allocopt.bench.output import (
    Column,
    add_results_option,
    results_table,
    seconds,
    write_results,
)
from allocopt.mechanism import (
    GpuLayout,
    MechanismOptions,
    PriorityMechanism,
    generate_workload,
    place,
    shipped_trace,
    simulate,
)
from allocopt.throughput import ThroughputTable


def bench_mechanism(active_jobs: int, gpus_per_type: int, repeat: int, seed: int) -> dict:
    table = ThroughputTable.gavel()
    cluster = allocopt.Cluster({"v100": gpus_per_type, "p100": gpus_per_type, "k80": gpus_per_type})
    problem = table.sample_problem(cluster, active_jobs, seed=seed)
    rng = np.random.default_rng(seed)
    X = rng.dirichlet(np.ones(3), size=active_jobs) * (problem.throughputs > 0)
    X *= (cluster.capacity / np.maximum((X * problem.scale_factors[:, None]).sum(axis=0), 1e-9)).min()
    mech = PriorityMechanism(problem.throughputs, problem.scale_factors, cluster.capacity, cluster.gpu_types,
                             MechanismOptions())
    rows = np.arange(active_jobs)
    mech.add_jobs(rows)
    mech.reset(0.0, rows, X)
    layout = GpuLayout(cluster)
    previous: dict = {}
    select_s, place_s, total_s, scheduled = [], [], [], []
    for _ in range(repeat):
        t0 = time.perf_counter()
        chosen = mech.select(rows)
        t1 = time.perf_counter()
        run = np.flatnonzero(chosen >= 0)
        placements = place(layout, run.tolist(), chosen[run], problem.scale_factors[run], previous)
        t2 = time.perf_counter()
        mech.record(run, chosen[run], np.full(run.size, 360.0))
        t3 = time.perf_counter()
        previous = {int(j): p.gpu_ids for j, p in zip(run.tolist(), placements)}
        select_s.append(t1 - t0)
        place_s.append(t2 - t1)
        total_s.append(t3 - t0)
        scheduled.append(run.size)
    return {"active_jobs": active_jobs, "gpus": int(cluster.capacity.sum()),
            "scheduled_jobs_per_round": float(np.mean(scheduled)),
            "select_ms": 1e3 * float(np.median(select_s)), "place_ms": 1e3 * float(np.median(place_s)),
            "round_ms": 1e3 * float(np.median(total_s)), "target_ms": 50.0}


DEFAULT_POLICIES = {"aware": "max_min_fairness_perf", "agnostic": "gavel:max_min_fairness"}


def bench_continuous(jobs: int, jobs_per_hour: float, seed: int, gpus_per_type: int = 36,
                     policies: dict[str, str] = DEFAULT_POLICIES, ftf: bool = True) -> dict:
    cluster = {"v100": gpus_per_type, "p100": gpus_per_type, "k80": gpus_per_type}
    workload = generate_workload(ThroughputTable.gavel(), jobs, jobs_per_hour=jobs_per_hour, seed=seed,
                                 cluster=None if gpus_per_type == 36 else cluster)
    out = {"jobs": jobs, "jobs_per_hour": jobs_per_hour, "cluster": cluster, "ftf": ftf}
    for label, policy in policies.items():
        started = time.perf_counter()
        result = simulate(workload, cluster, policy, seed=seed, ftf=ftf)
        m = result.metrics
        out[label] = {"policy": policy, "wall_s": time.perf_counter() - started,
                      "average_jct_h": m["average_jct_s"] / 3600, "median_jct_h": m["median_jct_s"] / 3600,
                      "p99_jct_h": m["p99_jct_s"] / 3600, "makespan_h": m["makespan_s"] / 3600,
                      "utilization": m["utilization"], "num_rounds": m["num_rounds"], "num_solves": m["num_solves"],
                      "solve_s_total": m["solve_s_total"], "restarts_per_job": m["restarts_per_job"]}
    if {"aware", "agnostic"} <= set(out):
        out["agnostic_over_aware_average_jct"] = out["agnostic"]["average_jct_h"] / out["aware"]["average_jct_h"]
    out["target_wall_s"] = 120.0
    return out


def bench_artifact() -> dict:
    cluster = {"v100": 2, "p100": 0, "k80": 4}
    out = {"trace": "artifact_evaluation", "cluster": cluster, "policy": "max_min_fairness_perf"}
    for mode in ("mechanism", "ideal"):
        m = simulate(shipped_trace("artifact_evaluation"), cluster, "max_min_fairness_perf", mode=mode).metrics
        out[mode] = {"average_jct_s": m["average_jct_s"], "makespan_s": m["makespan_s"],
                     "utilization": m["utilization"], "num_rounds": m["num_rounds"]}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--parts", default="mechanism,continuous,artifact")
    parser.add_argument("--active-jobs", type=int, default=10_000)
    parser.add_argument("--mechanism-gpus", type=int, default=1000, help="GPUs per type for the mechanism part")
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--jobs-per-hour", type=float, default=3.0)
    parser.add_argument("--gpus-per-type", type=int, default=36, help="GPUs of each type for the continuous part")
    parser.add_argument("--policies", help="comma-separated policies for the continuous part (default: "
                        "max_min_fairness_perf and gavel:max_min_fairness)")
    parser.add_argument("--ftf", action=argparse.BooleanOptionalAction, default=True,
                        help="run the finish-time-fairness companion simulation (default: on, as simulate)")
    parser.add_argument("--seed", type=int, default=0)
    add_results_option(parser, "bench_simulator", Path(__file__).parent / "results", ("--results", "--json"))
    args = parser.parse_args()
    parts = set(args.parts.split(","))
    report: dict = {"machine": machine_info()}
    print(format_machine(report["machine"]))
    if "mechanism" in parts:
        report["mechanism"] = r = bench_mechanism(args.active_jobs, args.mechanism_gpus, args.repeat, args.seed)
        print(f"mechanism: {r['active_jobs']} active jobs, {r['gpus']} GPUs, {r['scheduled_jobs_per_round']:.0f} "
              f"scheduled/round: select {r['select_ms']:.1f} ms + place {r['place_ms']:.1f} ms, round "
              f"{r['round_ms']:.1f} ms (target < {r['target_ms']:.0f} ms)")
    if "continuous" in parts:
        policies = ({p: p for p in args.policies.split(",")} if args.policies else DEFAULT_POLICIES)
        report["continuous"] = r = bench_continuous(args.jobs, args.jobs_per_hour, args.seed, args.gpus_per_type,
                                                    policies, args.ftf)
        for label in policies:
            x = r[label]
            print(f"continuous {label:8s} ({x['policy']}): {r['jobs']} jobs at {r['jobs_per_hour']}/h on "
                  f"{args.gpus_per_type} GPUs per type in "
                  f"{x['wall_s']:.1f} s wall ({x['num_rounds']} rounds, {x['num_solves']} solves, "
                  f"{x['solve_s_total']:.1f} s solving): avg JCT {x['average_jct_h']:.2f} h, median "
                  f"{x['median_jct_h']:.2f} h, p99 {x['p99_jct_h']:.1f} h, makespan {x['makespan_h']:.1f} h, "
                  f"utilization {x['utilization']:.3f}")
        if "agnostic_over_aware_average_jct" in r:
            print(f"continuous: agnostic / aware average JCT = {r['agnostic_over_aware_average_jct']:.2f}x "
                  f"(target wall < {r['target_wall_s']:.0f} s per run)")
    if "artifact" in parts:
        report["artifact"] = r = bench_artifact()
        for mode in ("mechanism", "ideal"):
            x = r[mode]
            print(f"artifact_evaluation on v100=2,p100=0,k80=4 ({mode}): avg JCT {x['average_jct_s']:.1f} s, "
                  f"makespan {x['makespan_s']:.1f} s, utilization {x['utilization']:.3f}")
    if args.results:
        tables = []
        if "mechanism" in report:
            tables.append(results_table(
                "Round mechanism (select and place one round; target under 50 ms)", [report["mechanism"]],
                [Column("active_jobs", "active jobs", ","), Column("gpus", "GPUs", ","),
                 Column("select_ms", "select ms", ".1f"), Column("place_ms", "place ms", ".1f"),
                 Column("round_ms", "round ms", ".1f")]))
        if "continuous" in report:
            r = report["continuous"]
            rows = [{"label": label, **x} for label, x in r.items() if isinstance(x, dict) and "wall_s" in x]
            tables.append(results_table(
                f"Continuous trace: {r['jobs']:,} jobs at {r['jobs_per_hour']:g}/h on {args.gpus_per_type} GPUs "
                "per type (target: under 120 s wall per run)", rows,
                [Column("policy", "policy", left=True), Column("wall_s", "wall s", seconds),
                 Column("solve_s_total", "solving s", seconds), Column("num_rounds", "rounds", ","),
                 Column("num_solves", "solves", ","), Column("average_jct_h", "avg JCT h", ".2f"),
                 Column("makespan_h", "makespan h", ".1f"), Column("utilization", "utilization", ".3f")]))
        if "artifact" in report:
            r = report["artifact"]
            tables.append(results_table(
                "Gavel's artifact_evaluation trace on v100=2,p100=0,k80=4, max_min_fairness_perf",
                [{"mode": mode, **r[mode]} for mode in ("mechanism", "ideal")],
                [Column("mode", "mode", left=True), Column("average_jct_s", "avg JCT s", ",.1f"),
                 Column("makespan_s", "makespan s", ",.1f"), Column("utilization", "utilization", ".3f")]))
        write_results(args.results, "bench_simulator", tables=tables, machine=report.pop("machine"), data=report)


if __name__ == "__main__":
    main()
