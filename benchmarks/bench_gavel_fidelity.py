"""allocopt's simulator next to the original Gavel simulator, on Gavel's traces and clusters.

Reference numbers (hard-coded below) come from Gavel's simulator
(github.com/stanford-futuredata/gavel at commit c4fa400, unmodified, in its
own virtual environment), run by ``benchmarks/conformance_gavel.py``'s driver:
``simulate_scheduler_with_trace.py``'s ``main`` with seed 0, 360 s rounds, one
GPU per server, ``V:P:K`` GPUs of v100:p100:k80, ``simulation_throughputs.json``
and ``--solver SOLVER``: ECOS, Gavel's default, or HIGHS (cvxpy's HiGHS, the LP
solver of allocopt's default backend). Average JCT is Gavel's
``get_average_jct()``, makespan its timestamp then.

Gavel's LPs have many optimal solutions (max-min fairness leaves every job
above the bottleneck free; the heterogeneity-agnostic policies do not care on
which type a job runs). ECOS, an interior-point solver, returns a point inside
the optimal face, dual simplex a vertex; the mechanism then turns different
(equally optimal) allocations into different JCTs. Each case runs with the
allocopt solvers of ``--solvers``, each against Gavel with ECOS: ``ECOS``
(``backend="cvxpy"`` with ECOS, CLARABEL when cvxpy has no ECOS; finish-time
fairness as one conic program written as Gavel writes it,
``method="conic_gavel"``; max-min fairness, max-sum throughput and the
bisection of min total duration as Gavel writes their LPs,
``gavel_program=True``), ``HIGHS`` (allocopt's default
backend; under Gavel's names its LP policies run HiGHS's interior point
without crossover, the Gavel adapter's HiGHS path) and ``HIGHS-SIMPLEX`` (dual
simplex, ``solver_options={"solver": "simplex"}``; also compared with Gavel's
own code run with ``--solver HIGHS``, cvxpy's HiGHS, where measured). Where
several jobs are entitled to equal shares, Gavel's own result depends on the
solver's digits beyond 1e-6 (rounding its allocations to 6 decimals moves its
JCT by up to 4%; ``docs/how-to/reproduce-gavel.md``), which bounds how
closely any other solver can follow it.

Run: ``python benchmarks/bench_gavel_fidelity.py [--traces DIR] [--threshold 0.05] [--solvers ECOS,HIGHS]``.
``artifact_evaluation`` and ``small_test`` ship with allocopt; the other
physical-cluster traces are read from ``--traces`` (default
``../shared/data/gavel/traces``) and skipped when absent.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import allocopt
from allocopt.bench.machine import machine_info
from allocopt.bench.output import (
    Column,
    add_results_option,
    results_table,
    write_results,
)
from allocopt.mechanism.workload import shipped_trace

# (trace, Gavel policy, v100:p100:k80, Gavel's solver) -> (average JCT s, makespan s), Gavel seed 0
GAVEL = {
    ("artifact_evaluation", "fifo", "2:0:4", "ECOS"): (7581.7, 11803.0),
    ("artifact_evaluation", "fifo_perf", "2:0:4", "ECOS"): (6723.9, 12994.9),
    ("artifact_evaluation", "finish_time_fairness", "2:0:4", "ECOS"): (5546.0, 8479.7),
    ("artifact_evaluation", "finish_time_fairness_perf", "2:0:4", "ECOS"): (4718.8, 7084.7),
    ("artifact_evaluation", "gandiva", "2:0:4", "ECOS"): (4996.5, 7215.9),
    ("artifact_evaluation", "isolated", "2:0:4", "ECOS"): (5924.5, 10641.0),
    ("artifact_evaluation", "max_min_fairness", "2:0:4", "ECOS"): (6031.7, 10640.7),
    ("artifact_evaluation", "max_min_fairness_perf", "2:0:4", "ECOS"): (4322.1, 6401.1),
    ("artifact_evaluation", "max_sum_throughput_perf", "2:0:4", "ECOS"): (4581.2, 8316.8),
    ("artifact_evaluation", "min_total_duration_perf", "2:0:4", "ECOS"): (5097.1, 5659.9),
    ("artifact_evaluation", "fifo", "2:2:2", "ECOS"): (7581.7, 11803.0),
    ("artifact_evaluation", "fifo_perf", "2:2:2", "ECOS"): (5350.7, 10835.1),
    ("artifact_evaluation", "finish_time_fairness", "2:2:2", "ECOS"): (4211.2, 5878.2),
    ("artifact_evaluation", "finish_time_fairness_perf", "2:2:2", "ECOS"): (3610.8, 5929.7),
    ("artifact_evaluation", "gandiva", "2:2:2", "ECOS"): (3545.6, 5984.4),
    ("artifact_evaluation", "isolated", "2:2:2", "ECOS"): (4286.7, 6433.1),
    ("artifact_evaluation", "max_min_fairness", "2:2:2", "ECOS"): (4214.9, 5592.4),
    ("artifact_evaluation", "max_min_fairness_perf", "2:2:2", "ECOS"): (3429.3, 5890.7),
    ("artifact_evaluation", "max_sum_throughput_perf", "2:2:2", "ECOS"): (2985.9, 5487.5),
    ("artifact_evaluation", "min_total_duration_perf", "2:2:2", "ECOS"): (3789.9, 4414.2),
    ("small_test", "fifo", "2:2:2", "ECOS"): (438.3, 818.7),
    ("small_test", "fifo_perf", "2:2:2", "ECOS"): (808.0, 1744.1),
    ("small_test", "finish_time_fairness", "2:2:2", "ECOS"): (629.1, 1277.4),
    ("small_test", "finish_time_fairness_perf", "2:2:2", "ECOS"): (404.8, 1012.7),
    ("small_test", "gandiva", "2:2:2", "ECOS"): (368.4, 810.4),
    ("small_test", "isolated", "2:2:2", "ECOS"): (633.3, 1346.3),
    ("small_test", "max_min_fairness", "2:2:2", "ECOS"): (633.7, 1346.3),
    ("small_test", "max_min_fairness_perf", "2:2:2", "ECOS"): (276.9, 769.7),
    ("small_test", "max_sum_throughput_perf", "2:2:2", "ECOS"): (533.3, 1045.6),
    ("small_test", "min_total_duration_perf", "2:2:2", "ECOS"): (419.3, 854.3),
    ("medium_test", "allox", "2:2:2", "ECOS"): (19173.9, 44857.9),
    ("medium_test", "fifo", "2:2:2", "ECOS"): (61922.7, 88995.1),
    ("medium_test", "fifo_perf", "2:2:2", "ECOS"): (23047.8, 52648.9),
    ("medium_test", "finish_time_fairness", "2:2:2", "ECOS"): (30737.8, 48203.1),
    ("medium_test", "finish_time_fairness_perf", "2:2:2", "ECOS"): (26904.2, 40603.1),
    ("medium_test", "gandiva", "2:2:2", "ECOS"): (26897.6, 40472.5),
    ("medium_test", "isolated", "2:2:2", "ECOS"): (30934.2, 48120.1),
    ("medium_test", "max_min_fairness", "2:2:2", "ECOS"): (30992.3, 48182.9),
    ("medium_test", "max_min_fairness_packed", "2:2:2", "ECOS"): (21973.6, 33587.4),
    ("medium_test", "max_min_fairness_perf", "2:2:2", "ECOS"): (26935.5, 40745.0),
    ("medium_test", "max_sum_throughput_perf", "2:2:2", "ECOS"): (25815.8, 43049.3),
    ("medium_test", "min_total_duration_perf", "2:2:2", "ECOS"): (37820.5, 38386.0),
    ("debug", "fifo", "2:2:2", "ECOS"): (50349.7, 74522.0),
    ("debug", "fifo_perf", "2:2:2", "ECOS"): (20144.9, 40899.7),
    ("debug", "finish_time_fairness", "2:2:2", "ECOS"): (22148.9, 38849.2),
    ("debug", "finish_time_fairness_perf", "2:2:2", "ECOS"): (18975.7, 33935.9),
    ("debug", "gandiva", "2:2:2", "ECOS"): (19808.9, 34023.4),
    ("debug", "isolated", "2:2:2", "ECOS"): (22696.4, 39712.3),
    ("debug", "max_min_fairness", "2:2:2", "ECOS"): (22850.9, 39638.6),
    ("debug", "max_min_fairness_perf", "2:2:2", "ECOS"): (18966.2, 33822.6),
    ("debug", "max_sum_throughput_perf", "2:2:2", "ECOS"): (19571.5, 33342.6),
    ("debug", "min_total_duration_perf", "2:2:2", "ECOS"): (27321.9, 29602.3),
    ("debug_v2", "fifo", "2:2:2", "ECOS"): (28312.1, 43536.3),
    ("debug_v2", "fifo_perf", "2:2:2", "ECOS"): (13111.8, 25749.9),
    ("debug_v2", "finish_time_fairness", "2:2:2", "ECOS"): (12830.2, 28822.6),
    ("debug_v2", "finish_time_fairness_perf", "2:2:2", "ECOS"): (10542.1, 21777.9),
    ("debug_v2", "gandiva", "2:2:2", "ECOS"): (10822.3, 21862.2),
    ("debug_v2", "isolated", "2:2:2", "ECOS"): (12111.5, 28981.3),
    ("debug_v2", "max_min_fairness", "2:2:2", "ECOS"): (12274.4, 29315.1),
    ("debug_v2", "max_min_fairness_perf", "2:2:2", "ECOS"): (10528.5, 21644.1),
    ("debug_v2", "max_sum_throughput_perf", "2:2:2", "ECOS"): (11808.5, 19863.0),
    ("debug_v2", "min_total_duration_perf", "2:2:2", "ECOS"): (16739.2, 17302.2),
    ("highmem_test", "fifo", "2:2:2", "ECOS"): (450.9, 901.6),
    ("highmem_test", "fifo_perf", "2:2:2", "ECOS"): (359.5, 881.5),
    ("highmem_test", "finish_time_fairness", "2:2:2", "ECOS"): (325.4, 954.8),
    ("highmem_test", "finish_time_fairness_perf", "2:2:2", "ECOS"): (253.9, 637.2),
    ("highmem_test", "gandiva", "2:2:2", "ECOS"): (328.1, 592.5),
    ("highmem_test", "isolated", "2:2:2", "ECOS"): (279.5, 785.4),
    ("highmem_test", "max_min_fairness", "2:2:2", "ECOS"): (279.5, 785.4),
    ("highmem_test", "max_min_fairness_perf", "2:2:2", "ECOS"): (253.9, 637.2),
    ("highmem_test", "max_sum_throughput_perf", "2:2:2", "ECOS"): (308.5, 663.5),
    ("highmem_test", "min_total_duration_perf", "2:2:2", "ECOS"): (343.0, 426.9),
    ("max_min_fairness", "fifo", "4:4:4", "ECOS"): (99257.9, 267763.4),
    ("max_min_fairness", "fifo_perf", "4:4:4", "ECOS"): (84234.3, 205141.4),
    ("max_min_fairness", "finish_time_fairness", "4:4:4", "ECOS"): (77525.3, 184991.0),
    ("max_min_fairness", "finish_time_fairness_perf", "4:4:4", "ECOS"): (75286.2, 163624.7),
    ("max_min_fairness", "gandiva", "4:4:4", "ECOS"): (63617.3, 177188.6),
    ("max_min_fairness", "isolated", "4:4:4", "ECOS"): (66524.8, 184964.9),
    ("max_min_fairness", "max_min_fairness", "4:4:4", "ECOS"): (66558.7, 186641.4),
    ("max_min_fairness", "max_min_fairness_perf", "4:4:4", "ECOS"): (66166.3, 165408.2),
    ("max_min_fairness", "max_sum_throughput_perf", "4:4:4", "ECOS"): (79107.4, 179262.5),
    ("max_min_fairness", "min_total_duration_perf", "4:4:4", "ECOS"): (145188.6, 161777.5),
    ("minimize_makespan", "fifo", "4:4:4", "ECOS"): (422220.8, 545218.5),
    ("minimize_makespan", "fifo_perf", "4:4:4", "ECOS"): (125576.0, 280771.4),
    ("minimize_makespan", "finish_time_fairness", "4:4:4", "ECOS"): (129583.3, 252395.4),
    ("minimize_makespan", "finish_time_fairness_perf", "4:4:4", "ECOS"): (115622.3, 220001.3),
    ("minimize_makespan", "gandiva", "4:4:4", "ECOS"): (95263.2, 241665.6),
    ("minimize_makespan", "isolated", "4:4:4", "ECOS"): (118624.2, 256294.1),
    ("minimize_makespan", "max_min_fairness", "4:4:4", "ECOS"): (118751.9, 255523.5),
    ("minimize_makespan", "max_min_fairness_perf", "4:4:4", "ECOS"): (106202.8, 220422.4),
    ("minimize_makespan", "max_sum_throughput_perf", "4:4:4", "ECOS"): (113707.3, 238895.9),
    ("minimize_makespan", "min_total_duration_perf", "4:4:4", "ECOS"): (215790.3, 217720.4),
    ("artifact_evaluation", "max_min_fairness", "2:0:4", "HIGHS"): (5756.6, 8407.3),
    ("artifact_evaluation", "max_min_fairness_perf", "2:0:4", "HIGHS"): (4331.4, 6609.4),
    ("artifact_evaluation", "max_sum_throughput_perf", "2:0:4", "HIGHS"): (4463.6, 8079.3),
    ("artifact_evaluation", "min_total_duration_perf", "2:0:4", "HIGHS"): (5158.1, 5753.4),
    ("artifact_evaluation", "max_min_fairness", "2:2:2", "HIGHS"): (4192.1, 6050.4),
    ("artifact_evaluation", "max_min_fairness_perf", "2:2:2", "HIGHS"): (3429.3, 5890.7),
    ("artifact_evaluation", "max_sum_throughput_perf", "2:2:2", "HIGHS"): (3099.9, 5971.2),
    ("artifact_evaluation", "min_total_duration_perf", "2:2:2", "HIGHS"): (3863.3, 4479.0),
}



def interior_point_solver() -> str:
    """ECOS (Gavel's) when cvxpy has it, else CLARABEL (another interior-point solver)."""
    try:
        import cvxpy
    except ImportError:
        return "CLARABEL"
    return "ECOS" if "ECOS" in cvxpy.installed_solvers() else "CLARABEL"


# allocopt settings per --solvers name
SOLVERS = {"ECOS": {"backend": "cvxpy", "policy_options": {"solver_options": {"solver": interior_point_solver()}}},
           "HIGHS": {"backend": "highs"},
           "HIGHS-SIMPLEX": {"backend": "highs", "policy_options": {"solver_options": {"solver": "simplex"}}}}


def trace_path(name: str, traces: Path) -> Path | None:
    if name in ("artifact_evaluation", "small_test"):
        return Path(shipped_trace(name))
    path = traces / f"{name}.trace"
    return path if path.is_file() else None


def settings_for(solver: str, policy: str) -> dict:
    settings = SOLVERS[solver]
    if solver == "ECOS" and "finish_time_fairness" in policy:  # one conic program, written as Gavel's
        settings = {**settings, "policy_options": {**settings["policy_options"], "method": "conic_gavel"}}
    if solver == "ECOS" and policy in ("max_min_fairness", "max_min_fairness_perf", "max_sum_throughput_perf",
                                       "min_total_duration_perf"):
        # Gavel's LP (min total duration: each LP of Gavel's bisection), as Gavel writes it
        settings = {**settings, "policy_options": {**settings["policy_options"], "gavel_program": True}}
    return settings


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    here = Path(__file__).resolve().parent.parent
    parser.add_argument("--traces", type=Path, default=here.parent / "shared" / "data" / "gavel" / "traces")
    parser.add_argument("--threshold", type=float, default=0.05, help="relative difference for OK (default 0.05)")
    parser.add_argument("--solvers", default="ECOS,HIGHS", help=f"comma-separated, of {', '.join(SOLVERS)}")
    parser.add_argument("--only", default="", help="run the cases whose key contains this text")
    add_results_option(parser, "bench_gavel_fidelity", Path(__file__).parent / "results")
    args = parser.parse_args()
    machine = machine_info()
    solvers = [s.strip().upper() for s in args.solvers.split(",") if s.strip()]
    unknown = [s for s in solvers if s not in SOLVERS]
    if unknown:
        parser.error(f"unknown solver(s) {', '.join(unknown)}; choose from {', '.join(SOLVERS)}")
    print(f"{'trace':20s} {'policy':26s} {'cluster':7s} {'allocopt':13s} {'vs Gavel':8s} {'Gavel JCT':>10s} "
          f"{'allocopt':>10s} {'ratio':>7s} {'Gavel mksp':>11s} {'allocopt':>10s} {'ratio':>7s}  verdict  wall")
    counts = {}
    rows = []
    for (trace, policy, spec, gavel_solver), (g_jct, g_makespan) in GAVEL.items():
        for solver in solvers:
            # every allocopt solver against Gavel with ECOS; dual simplex also against Gavel with HiGHS
            if gavel_solver == "HIGHS" and solver != "HIGHS-SIMPLEX":
                continue
            if args.only not in f"{trace} {policy} {spec} {solver}":
                continue
            path = trace_path(trace, args.traces)
            if path is None:
                print(f"{trace:20s} {policy:26s} {spec:7s} skipped: {args.traces / trace}.trace not found")
                break
            cluster = dict(zip(("v100", "p100", "k80"), (int(v) for v in spec.split(":"))))
            started = time.perf_counter()
            result = allocopt.simulate(path, cluster, "gavel:" + policy, seed=0, fidelity="gavel",
                                       round_seconds=360.0, ftf=False, **settings_for(solver, policy))
            wall = time.perf_counter() - started
            jct, makespan = result.metrics["average_jct_s"], result.metrics["makespan_s"]
            d_jct, d_makespan = jct / g_jct - 1, makespan / g_makespan - 1
            worst = max(abs(d_jct), abs(d_makespan))
            ok = worst <= args.threshold
            count = counts.setdefault((solver, gavel_solver), [0, 0, 0])
            count[0] += 1
            count[1] += worst <= 0.01
            count[2] += ok
            label = f"{interior_point_solver()} (cvxpy)" if solver == "ECOS" else solver
            rows.append({"trace": trace, "policy": policy, "cluster": spec, "allocopt": label, "gavel": gavel_solver,
                         "gavel_jct_s": g_jct, "jct_s": jct, "jct_ratio": jct / g_jct, "gavel_makespan_s": g_makespan,
                         "makespan_s": makespan, "makespan_ratio": makespan / g_makespan,
                         "verdict": "OK" if ok else "DIFF", "within_1pct": worst <= 0.01})
            print(f"{trace:20s} {policy:26s} {spec:7s} {label:13s} {gavel_solver:8s} {g_jct:10.1f} {jct:10.1f} "
                  f"{jct / g_jct:7.4f} {g_makespan:11.1f} {makespan:10.1f} {makespan / g_makespan:7.4f}  "
                  f"{'OK  ' if ok else 'DIFF'}     {wall:.1f}s")
            sys.stdout.flush()
    summary = []
    for (solver, gavel_solver), (total, one, within) in counts.items():
        print(f"allocopt {solver} vs Gavel {gavel_solver}: {within}/{total} cases within {args.threshold:.0%}, "
              f"{one}/{total} within 1% (average JCT and makespan)")
        summary.append({"allocopt": solver, "gavel": gavel_solver, "cases": total, "within_1pct": one,
                        "within_threshold": within})
    if args.results:
        tables = [results_table(f"Cases within 1% and {args.threshold:.0%} of Gavel's average JCT and makespan",
                                summary, [Column("allocopt", "allocopt solver", left=True),
                                          Column("gavel", "Gavel's solver", left=True), Column("cases", "cases"),
                                          Column("within_1pct", "within 1%"),
                                          Column("within_threshold", f"within {args.threshold:.0%}")]),
                  results_table("Every case (ratios: allocopt / Gavel)", rows,
                                [Column("trace", "trace", left=True), Column("cluster", "GPUs v100:p100:k80", left=True),
                                 Column("policy", "policy", left=True), Column("allocopt", "allocopt solver", left=True),
                                 Column("gavel", "Gavel's solver", left=True),
                                 Column("gavel_jct_s", "Gavel avg JCT s", ",.1f"), Column("jct_ratio", "JCT ratio", ".4f"),
                                 Column("gavel_makespan_s", "Gavel makespan s", ",.1f"),
                                 Column("makespan_ratio", "makespan ratio", ".4f"), Column("verdict", "verdict")])]
        write_results(args.results, "bench_gavel_fidelity", tables=tables, machine=machine,
                      data={"threshold": args.threshold, "summary": summary, "rows": rows})
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONWARNINGS", "ignore")
    raise SystemExit(main())
