#!/usr/bin/env python
"""Benchmark: the goodput matrix of 5,000 jobs x 30 configurations, and refitting one job's model.

**Goodput matrix.** The cluster is Sia's heterogeneous "saturn" cluster at 2x
scale (128 GPUs: 12 aws nodes x 4 T4, 6 rtx nodes x 8 RTX 2080Ti, 4 dgx-ext
nodes x 8 A100), whose Sia configuration set has 30 configurations. Jobs are
drawn uniformly from the applications of the profiles shipped with allocopt
(bert, cifar10, imagenet); each (application, GPU type) has its model fitted
to the shipped profile. Three workloads of 5,000 jobs:

``shared``
    every job of an application uses the same models (fresh jobs);
``per-job-grad``
    each job has its own gradient statistics (a random epoch and batch size of
    its application's validation curves) -- how Sia's simulator runs: the
    throughput fit is per application and GPU type, the statistics per job;
``per-job-all``
    each job also has its own throughput parameters (the application's,
    every time parameter times a log-normal factor, sigma 0.05), as after
    per-job online refits: nothing is shared.

``goodput_matrix`` is timed on each (wall and process CPU seconds, best of
``--repeat``) and compared with the straightforward baseline measured in the
same run: one ``GoodputModel.optimize`` call per job and GPU type over that
type's configurations (how Pollux's and Sia's code call their goodput
functions), on ``--baseline-jobs`` jobs of ``per-job-all``, extrapolated
linearly to 5,000. Target (reported, not asserted): well under 1 s.

**Refits.** For every shipped (application, GPU type), a job starts with the
1-GPU rows of its profile and then gains multi-GPU observations one at a time
(``--observations`` placements' rows in random order). After each one the
throughput model is refitted twice: warm (from the previous fit, as an online
estimator does) and cold (Pollux's starting point). Reported: median and 90th
percentile seconds per refit. Target: milliseconds.

Usage::

    python benchmarks/bench_goodput.py
    python benchmarks/bench_goodput.py --repeat 5 --baseline-jobs 500 --json out.json
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from allocopt import Cluster
from allocopt.bench.machine import format_machine, machine_info
from allocopt.bench.output import (
    Column,
    add_results_option,
    milliseconds,
    results_table,
    seconds,
    write_results,
)
from allocopt.configurations import Configurations, sia_configurations
from allocopt.throughput import GoodputModel, goodput_matrix, load_profiles
from allocopt.throughput.profiles import ApplicationProfile, shipped_profiles_dir

CLUSTER = Cluster({"aws": 48, "rtx": 48, "dgx-ext": 32}, gpus_per_node={"aws": 4, "rtx": 8, "dgx-ext": 8})
TARGET_MATRIX_S = 1.0


def timed(fn: Callable[[], Any], repeat: int) -> tuple[float, float, Any]:
    """Best wall and CPU seconds of ``repeat`` runs, and the last result."""
    walls, cpus = [], []
    for _ in range(repeat):
        w, c = time.perf_counter(), time.process_time()
        result = fn()
        walls.append(time.perf_counter() - w)
        cpus.append(time.process_time() - c)
    return min(walls), min(cpus), result


def workloads(profiles: dict[tuple[str, str], ApplicationProfile], n_jobs: int, seed: int
              ) -> dict[str, list[dict[str, GoodputModel]]]:
    rng = np.random.default_rng(seed)
    apps = sorted({a for a, _ in profiles})
    base = {key: prof.goodput_model() for key, prof in profiles.items()}
    app_of = rng.integers(len(apps), size=n_jobs)
    shared = [{t: base[apps[a], t] for t in CLUSTER.gpu_types} for a in app_of]
    per_grad, per_all = [], []
    for a in app_of:
        prof = profiles[apps[a], CLUSTER.gpu_types[0]]
        epochs = min(c.grad_sqr.size for c in prof.validation.values())
        grad = prof.grad_params(rng.uniform(prof.init_batch_size, prof.max_batch_size), int(rng.integers(epochs)))
        per_grad.append({t: replace(base[apps[a], t], grad_params=grad) for t in CLUSTER.gpu_types})
        factor = float(np.exp(rng.normal(0, 0.05)))
        per_all.append({t: replace(m, perf_params=m.perf_params.scaled(factor)) for t, m in per_grad[-1].items()})
    return {"shared": shared, "per-job-grad": per_grad, "per-job-all": per_all}


def baseline(jobs: list[dict[str, GoodputModel]], configs: Configurations) -> np.ndarray:
    """One ``optimize`` call per job and GPU type."""
    out = np.zeros((len(jobs), len(configs)))
    for j, name in enumerate(CLUSTER.gpu_types):
        cols = np.flatnonzero(configs.gpu_type == j)
        for i, job in enumerate(jobs):
            out[i, cols] = job[name].optimize(configs.num_nodes[cols], configs.num_gpus[cols])[0]
    return out


def bench_matrix(profiles: dict[tuple[str, str], ApplicationProfile], args: argparse.Namespace) -> dict[str, Any]:
    configs = sia_configurations(CLUSTER)
    loads = workloads(profiles, args.jobs, args.seed)
    rows = {}
    for name, jobs in loads.items():
        wall, cpu, G = timed(lambda: goodput_matrix(jobs, configs), args.repeat)
        rows[name] = {"wall_s": wall, "cpu_s": cpu, "valid_fraction": float((G > 0).mean())}
        print(f"  {name:13s} wall {wall:7.3f} s   cpu {cpu:7.3f} s   ({(G > 0).mean():.0%} of entries > 0)")
    subset = loads["per-job-all"][:args.baseline_jobs]
    wall, cpu, B = timed(lambda: baseline(subset, configs), 1)
    np.testing.assert_allclose(B, goodput_matrix(subset, configs), rtol=1e-12)
    scale = args.jobs / len(subset)
    rows["baseline per-job optimize"] = {"wall_s": wall * scale, "cpu_s": cpu * scale, "measured_jobs": len(subset)}
    print(f"  {'baseline':13s} wall {wall * scale:7.3f} s   cpu {cpu * scale:7.3f} s   (one optimize per job and "
          f"type; {len(subset)} jobs measured, x{scale:g}; same values)")
    worst = rows["per-job-all"]["wall_s"]
    speedup = rows["baseline per-job optimize"]["wall_s"] / worst
    print(f"  speedup over the baseline (per-job-all, wall): {speedup:.0f}x; target: under {TARGET_MATRIX_S:g} s -> "
          f"{'met' if worst < TARGET_MATRIX_S else 'NOT met'} (worst workload, wall)")
    return {"n_jobs": args.jobs, "n_configurations": len(configs), "workloads": rows}


def bench_refits(profiles: dict[tuple[str, str], ApplicationProfile], args: argparse.Namespace) -> dict[str, Any]:
    rng = np.random.default_rng(args.seed)
    warm_all, cold_all, rows = [], [], {}
    for (app, gpu_type), prof in profiles.items():
        obs = prof.observations
        start = np.flatnonzero(obs.num_replicas == 1)
        extra = rng.permutation(np.flatnonzero(obs.num_replicas > 1))[:args.observations]
        params = obs.select(start).fit()
        warm, cold = [], []
        for k in range(1, extra.size + 1):
            current = obs.select(np.concatenate([start, extra[:k]]))
            t = time.perf_counter()
            params = current.fit(initial=params)
            warm.append(time.perf_counter() - t)
            t = time.perf_counter()
            current.fit()
            cold.append(time.perf_counter() - t)
        rows[f"{app}/{gpu_type}"] = {"warm_median_s": statistics.median(warm), "cold_median_s": statistics.median(cold),
                                     "observations": [int(start.size + 1), int(start.size + extra.size)]}
        warm_all += warm
        cold_all += cold
        print(f"  {app:9s} {gpu_type:8s} {start.size + 1:3d}-{start.size + extra.size:3d} observations   "
              f"warm {1e3 * statistics.median(warm):6.2f} ms   cold {1e3 * statistics.median(cold):6.2f} ms")
    summary = {"warm_median_s": statistics.median(warm_all), "warm_p90_s": float(np.quantile(warm_all, 0.9)),
               "cold_median_s": statistics.median(cold_all), "cold_p90_s": float(np.quantile(cold_all, 0.9)),
               "refits": len(warm_all)}
    print(f"  all {len(warm_all)} refits: warm median {1e3 * summary['warm_median_s']:.2f} ms, p90 "
          f"{1e3 * summary['warm_p90_s']:.2f} ms; cold median {1e3 * summary['cold_median_s']:.2f} ms, p90 "
          f"{1e3 * summary['cold_p90_s']:.2f} ms")
    return {"per_profile": rows, "summary": summary}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=5000, help="jobs in the goodput matrix (default %(default)s)")
    parser.add_argument("--repeat", type=int, default=3, help="runs per timing, best reported (default %(default)s)")
    parser.add_argument("--baseline-jobs", type=int, default=1000,
                        help="jobs the per-job baseline is measured on (default %(default)s)")
    parser.add_argument("--observations", type=int, default=40,
                        help="multi-GPU observations added one at a time per profile (default %(default)s)")
    parser.add_argument("--seed", type=int, default=0)
    add_results_option(parser, "bench_goodput", Path(__file__).parent / "results", ("--results", "--json"))
    args = parser.parse_args()
    machine = machine_info()
    print(format_machine(machine))
    profiles = load_profiles(shipped_profiles_dir())
    print(f"\nGoodput matrix: {args.jobs} jobs x {len(sia_configurations(CLUSTER))} configurations "
          f"({', '.join(f'{t}={c}' for t, c in zip(CLUSTER.gpu_types, CLUSTER.capacity))}), best of {args.repeat}")
    matrix = bench_matrix(profiles, args)
    print(f"\nRefit after each new observation ({args.observations} per profile)")
    refits = bench_refits(profiles, args)
    print(f"\nload average at the end: {os.getloadavg()}")
    if args.results:
        workloads = [{"workload": name, **row} for name, row in matrix["workloads"].items()]
        tables = [results_table(f"Goodput matrix, {matrix['n_jobs']:,} jobs x {matrix['n_configurations']} "
                                f"configurations (best of {args.repeat})", workloads,
                                [Column("workload", "workload", left=True), Column("wall_s", "wall s", seconds),
                                 Column("cpu_s", "CPU s", seconds)]),
                  results_table(f"Refitting one job's throughput model after a new observation "
                                f"({refits['summary']['refits']} refits)", [refits["summary"]],
                                [Column("warm_median_s", "warm median ms", milliseconds),
                                 Column("warm_p90_s", "warm p90 ms", milliseconds),
                                 Column("cold_median_s", "cold median ms", milliseconds),
                                 Column("cold_p90_s", "cold p90 ms", milliseconds)])]
        write_results(args.results, "bench_goodput", tables=tables, machine=machine,
                      data={"goodput_matrix": matrix, "refits": refits})


if __name__ == "__main__":
    main()
