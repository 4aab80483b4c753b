"""allocopt's simulator next to the original Gavel simulator, on Gavel's traces and clusters.

Reference numbers (hard-coded below) come from Gavel's simulator
(github.com/stanford-futuredata/gavel, ``scheduler/scheduler.py`` at commit
c4fa40097339e9608ab71fd64c8bdea96a5e4a4c; policies ``max_min_fairness.py`` at
40a22a725f2e70478483e98c9b07c6fc588e0c40 with ``proportional.py`` and
``policy.py`` at bd16effde1884c9d6390fad5aaeac1a26f5b774a), its simulation
code paths run unchanged on CPU, outside this repository, with::

    python scripts/drivers/simulate_scheduler_with_trace.py -t traces/TRACE.trace -p POLICY -c V:P:K \\
        --throughputs_file simulation_throughputs.json --seed 0 --time_per_iteration 360 --solver SOLVER

(one GPU per server; ``V:P:K`` GPUs of v100:p100:k80). ``SOLVER`` is ECOS,
Gavel's default, or HIGHS (cvxpy's HiGHS, the LP solver of allocopt's default
backend). Average JCT is Gavel's ``get_average_jct()``, makespan its final
timestamp.

Gavel's LPs have many optimal solutions (max-min fairness leaves every job
above the bottleneck free; the heterogeneity-agnostic policies do not care on
which type a job runs). ECOS, an interior-point solver, returns a central one,
HiGHS a vertex; the mechanism then turns different (equally optimal)
allocations into different JCTs. So each case runs twice: allocopt with
``backend="cvxpy"`` and CLARABEL (interior point) against Gavel with ECOS,
and allocopt's default HiGHS backend against Gavel with HiGHS.

Run: ``python benchmarks/bench_gavel_fidelity.py [--traces DIR] [--threshold 0.05]``.
``max_min_fairness.trace`` and ``minimize_makespan.trace`` are read from
``--traces`` (default ``../shared/data/gavel/traces``) and skipped when absent.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import allocopt
from allocopt.mechanism.workload import shipped_trace

# (trace, Gavel policy, v100:p100:k80, Gavel's solver) -> (average JCT s, makespan s), Gavel seed 0
GAVEL = {
    ("artifact_evaluation", "fifo", "2:0:4", "ECOS"): (8368.8, 19947.8),
    ("artifact_evaluation", "fifo", "2:2:2", "ECOS"): (5738.8, 19947.1),
    ("artifact_evaluation", "fifo", "4:4:4", "ECOS"): (3528.4, 19946.5),
    ("artifact_evaluation", "fifo", "8:8:8", "ECOS"): (3956.3, 19945.3),
    ("artifact_evaluation", "fifo_perf", "2:0:4", "ECOS"): (6723.9, 12994.9),
    ("artifact_evaluation", "fifo_perf", "2:2:2", "ECOS"): (5350.7, 10835.1),
    ("artifact_evaluation", "fifo_perf", "4:4:4", "ECOS"): (2547.8, 5590.5),
    ("artifact_evaluation", "fifo_perf", "8:8:8", "ECOS"): (1360.4, 3030.3),
    ("artifact_evaluation", "max_min_fairness", "2:0:4", "ECOS"): (6031.7, 10640.7),
    ("artifact_evaluation", "max_min_fairness", "2:2:2", "ECOS"): (4214.9, 5592.4),
    ("artifact_evaluation", "max_min_fairness", "4:4:4", "ECOS"): (2331.9, 3965.9),
    ("artifact_evaluation", "max_min_fairness", "8:8:8", "ECOS"): (1628.6, 3141.6),
    ("artifact_evaluation", "max_min_fairness_packed", "2:0:4", "ECOS"): (3528.6, 5814.0),
    ("artifact_evaluation", "max_min_fairness_packed", "2:2:2", "ECOS"): (2802.7, 4002.7),
    ("artifact_evaluation", "max_min_fairness_packed", "4:4:4", "ECOS"): (1743.3, 3732.5),
    ("artifact_evaluation", "max_min_fairness_packed", "8:8:8", "ECOS"): (1355.5, 3354.7),
    ("artifact_evaluation", "max_min_fairness_perf", "2:0:4", "ECOS"): (4322.1, 6401.1),
    ("artifact_evaluation", "max_min_fairness_perf", "2:2:2", "ECOS"): (3429.3, 5890.7),
    ("artifact_evaluation", "max_min_fairness_perf", "4:4:4", "ECOS"): (1835.5, 3065.8),
    ("artifact_evaluation", "max_min_fairness_perf", "8:8:8", "ECOS"): (1357.0, 3011.6),
    ("artifact_evaluation", "max_sum_throughput_perf", "2:0:4", "ECOS"): (4581.2, 8316.8),
    ("artifact_evaluation", "max_sum_throughput_perf", "2:2:2", "ECOS"): (2985.9, 5487.5),
    ("artifact_evaluation", "max_sum_throughput_perf", "4:4:4", "ECOS"): (1883.7, 3751.3),
    ("artifact_evaluation", "max_sum_throughput_perf", "8:8:8", "ECOS"): (1366.4, 3011.3),
    ("max_min_fairness", "max_min_fairness", "4:4:4", "ECOS"): (66558.7, 186641.4),
    ("max_min_fairness", "max_min_fairness_packed", "4:4:4", "ECOS"): (64407.5, 151325.1),
    ("max_min_fairness", "max_min_fairness_perf", "4:4:4", "ECOS"): (66166.3, 165408.2),
    ("minimize_makespan", "min_total_duration", "4:4:4", "ECOS"): (215790.3, 217720.4),
    ("artifact_evaluation", "max_min_fairness", "2:0:4", "HIGHS"): (5756.6, 8407.3),
    ("artifact_evaluation", "max_min_fairness", "2:2:2", "HIGHS"): (4192.1, 6050.4),
    ("artifact_evaluation", "max_min_fairness", "4:4:4", "HIGHS"): (2129.4, 3871.4),
    ("artifact_evaluation", "max_min_fairness", "8:8:8", "HIGHS"): (1612.2, 3317.3),
    ("artifact_evaluation", "max_min_fairness_packed", "2:0:4", "HIGHS"): (3698.1, 6233.3),
    ("artifact_evaluation", "max_min_fairness_packed", "2:2:2", "HIGHS"): (2931.1, 4727.2),
    ("artifact_evaluation", "max_min_fairness_packed", "4:4:4", "HIGHS"): (1903.3, 5653.0),
    ("artifact_evaluation", "max_min_fairness_packed", "8:8:8", "HIGHS"): (1514.8, 3883.5),
    ("artifact_evaluation", "max_min_fairness_perf", "2:0:4", "HIGHS"): (4331.4, 6609.4),
    ("artifact_evaluation", "max_min_fairness_perf", "2:2:2", "HIGHS"): (3429.3, 5890.7),
    ("artifact_evaluation", "max_min_fairness_perf", "4:4:4", "HIGHS"): (1884.0, 3752.0),
    ("artifact_evaluation", "max_min_fairness_perf", "8:8:8", "HIGHS"): (1331.2, 3011.3),
    ("artifact_evaluation", "max_sum_throughput_perf", "2:0:4", "HIGHS"): (4463.6, 8079.3),
    ("artifact_evaluation", "max_sum_throughput_perf", "2:2:2", "HIGHS"): (3099.9, 5971.2),
    ("artifact_evaluation", "max_sum_throughput_perf", "4:4:4", "HIGHS"): (1879.5, 4094.4),
    ("artifact_evaluation", "max_sum_throughput_perf", "8:8:8", "HIGHS"): (1394.3, 3354.4),
    ("max_min_fairness", "max_min_fairness", "4:4:4", "HIGHS"): (74308.5, 188474.1),
    ("max_min_fairness", "max_min_fairness_packed", "4:4:4", "HIGHS"): (57987.4, 152597.6),
    ("max_min_fairness", "max_min_fairness_perf", "4:4:4", "HIGHS"): (65649.5, 165440.4),
    ("minimize_makespan", "min_total_duration", "4:4:4", "HIGHS"): (218227.0, 219515.6),
}

# Gavel's 'min_total_duration' is its heterogeneity-aware MinTotalDuration_Perf
ALLOCOPT_NAME = {"min_total_duration": "min_total_duration_perf"}


def interior_point_solver() -> str:
    """ECOS (Gavel's) when cvxpy has it, else CLARABEL (another interior-point solver)."""
    try:
        import cvxpy
    except ImportError:
        return "CLARABEL"
    return "ECOS" if "ECOS" in cvxpy.installed_solvers() else "CLARABEL"


# allocopt settings mirroring each Gavel solver
SOLVERS = {"ECOS": {"backend": "cvxpy", "policy_options": {"solver_options": {"solver": interior_point_solver()}}},
           "HIGHS": {"backend": "highs"}}


def trace_path(name: str, traces: Path) -> Path | None:
    if name == "artifact_evaluation":
        return Path(shipped_trace(name))
    path = traces / f"{name}.trace"
    return path if path.is_file() else None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    here = Path(__file__).resolve().parent.parent
    parser.add_argument("--traces", type=Path, default=here.parent / "shared" / "data" / "gavel" / "traces")
    parser.add_argument("--threshold", type=float, default=0.05, help="relative difference for OK (default 0.05)")
    parser.add_argument("--only", default="", help="run the cases whose key contains this text")
    args = parser.parse_args()
    print(f"{'trace':20s} {'policy':26s} {'cluster':7s} {'solver':11s} {'Gavel JCT':>10s} {'allocopt':>10s} "
          f"{'diff':>7s} {'Gavel mksp':>11s} {'allocopt':>10s} {'diff':>7s}  verdict  wall")
    within = total = 0
    for (trace, policy, spec, solver), (g_jct, g_makespan) in GAVEL.items():
        if args.only not in f"{trace} {policy} {spec} {solver}":
            continue
        path = trace_path(trace, args.traces)
        if path is None:
            print(f"{trace:20s} {policy:26s} {spec:7s} skipped: {args.traces / trace}.trace not found")
            continue
        cluster = dict(zip(("v100", "p100", "k80"), (int(v) for v in spec.split(":"))))
        started = time.perf_counter()
        settings = SOLVERS[solver]
        if solver == "ECOS" and "finish_time_fairness" in policy:  # one conic program, as Gavel solves it
            settings = {**settings, "policy_options": {**settings["policy_options"], "method": "conic"}}
        result = allocopt.simulate(path, cluster, "gavel:" + ALLOCOPT_NAME.get(policy, policy), seed=0,
                                   round_seconds=360.0, ftf=False, **settings)
        wall = time.perf_counter() - started
        jct, makespan = result.metrics["average_jct_s"], result.metrics["makespan_s"]
        d_jct, d_makespan = jct / g_jct - 1, makespan / g_makespan - 1
        ok = abs(d_jct) <= args.threshold and abs(d_makespan) <= args.threshold
        within += ok
        total += 1
        label = f"{solver}/{interior_point_solver() if solver == 'ECOS' else 'HiGHS'}"
        print(f"{trace:20s} {policy:26s} {spec:7s} {label:11s} {g_jct:10.0f} {jct:10.0f} {d_jct:+7.1%} "
              f"{g_makespan:11.0f} {makespan:10.0f} {d_makespan:+7.1%}  {'OK  ' if ok else 'DIFF'}     {wall:.1f}s")
        sys.stdout.flush()
    print(f"{within}/{total} cases within {args.threshold:.0%} of Gavel (average JCT and makespan)")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONWARNINGS", "ignore")
    raise SystemExit(main())
