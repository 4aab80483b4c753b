#!/usr/bin/env python
"""Benchmark: space-sharing max-min fairness with every pair of jobs allowed to share GPUs.

Instance (defaults): 512 single-GPU jobs drawn uniformly (seeded) from the 26
scale-factor-1 job types of Gavel's measured throughput table
(``../shared/data/gavel/simulation_throughputs.json``, see SOURCES.md there),
all 130,816 pairs with their measured co-located throughputs (``(0, 0)`` where
the pair does not fit on a GPU type), GPU types k80, p100 and v100 with 128
GPUs each, priority weights 1. Without the file, a seeded synthetic table of
the same shape is used (``--synthetic`` forces it).

Three ways to the same optimum, each from the same validated ``Problem``
(building it from the pair dict is timed separately as ``problem_s``):

* ``allocopt[highs]``: ``allocopt.solve(problem, "max_min_fairness",
  space_sharing=True)``, the pairwise LP (one variable per job and per pair
  and GPU type), split into formulation, ``Model.compile``, hand-over to
  HiGHS and HiGHS's solve (``Allocation.timings``);
* ``gavel-cvxpy[HIGHS]``: the same LP written the way Gavel's
  ``MaxMinFairnessPolicyWithPacking.get_allocation`` writes it, one cvxpy
  expression tree: a variable over all combinations (jobs, then pairs), one
  objective term per job summing ``coefficients * x[combinations of the
  job]``, ``cp.minimum`` over the terms, per-job time rows indexed the same
  way (the correct per-job loop, not the mis-grouping vectorized reshape),
  with allocopt's normalization ``s_i / (w_i p_i)`` so the optimum is the
  same; solved by cvxpy's HIGHS. Split into building the expression tree,
  ``get_problem_data``, the solver and unpacking;
* ``allocopt by job type``: ``allocopt.solve(problem, "max_min_fairness", space_sharing=True,
  aggregate_job_types=True)``,
  the LP over job types (26 types, 351 type pairs) spread back to the jobs.

Checks: objectives agree (relative difference <= 1e-6) and every allocation is
feasible (each job's time over all combinations containing it <= 1, capacity
with each pair counted once). Reports, without asserting, the target: the
pairwise LP on highs at least 10x faster end to end than gavel-cvxpy[HIGHS].

Usage::

    python benchmarks/bench_space_sharing.py                    # 512 jobs, ~5 min on 2 cores
    python benchmarks/bench_space_sharing.py --jobs 128         # quick
    python benchmarks/bench_space_sharing.py --profile          # also cProfile allocopt's model build and
                                                                # time HiGHS without the redundant unit bounds
    python benchmarks/bench_space_sharing.py --json out.json --repeat 3 --skip-cvxpy --synthetic
"""

from __future__ import annotations

import argparse
import ast
import cProfile
import dataclasses
import gc
import io
import itertools
import json
import pstats
import statistics
import time
from pathlib import Path

import numpy as np

from machine import machine_info
import allocopt
from allocopt.backends import SolveOptions, get_backend, solve_model
from allocopt.formulations.base import base_model

GAVEL_TABLE = Path(__file__).resolve().parents[2] / "shared" / "data" / "gavel" / "simulation_throughputs.json"
GPU_TYPES = ("k80", "p100", "v100")
OBJECTIVE_RTOL = 1e-6
TARGET_SPEEDUP = 10.0


# ----------------------------------------------------------------------------------------------
# Instances
# ----------------------------------------------------------------------------------------------
@dataclasses.dataclass
class JobTypeTable:
    """Throughputs of job types: ``isolated[t, j]`` steps/s of type t alone on
    GPU type j, ``paired[t, u, j] = (steps/s of t, steps/s of u)`` when a job of
    type t shares a GPU of type j with one of type u."""

    source: str
    names: list[str]
    isolated: np.ndarray  # (n_types, n_gpu_types)
    paired: np.ndarray  # (n_types, n_types, n_gpu_types, 2)


def load_gavel_table(path: Path) -> JobTypeTable:
    """The scale-factor-1 job types of Gavel's ``simulation_throughputs.json``."""
    with open(path) as fh:
        raw = json.load(fh)
    keys = [key for key in raw[GPU_TYPES[0]] if ast.literal_eval(key)[1] == 1]
    isolated = np.array([[raw[gpu][key]["null"] for gpu in GPU_TYPES] for key in keys])
    paired = np.array([[[raw[gpu][a][b] for gpu in GPU_TYPES] for b in keys] for a in keys])
    return JobTypeTable(str(path), [ast.literal_eval(key)[0] for key in keys], isolated, paired)


def synthetic_table(n_types: int = 26, seed: int = 0) -> JobTypeTable:
    """A seeded stand-in with Gavel's shape: base speeds log-uniform in [1, 100]
    steps/s, GPU speedups 1 / 2.5 / 3.5 with log-normal noise (sigma 0.2); a
    pair member keeps 30-100% of its isolated speed (the same share for both
    members of a same-type pair), and 15% of (type pair, GPU type) entries are
    (0, 0) (the pair does not fit)."""
    rng = np.random.default_rng(seed)
    base = np.exp(rng.uniform(0.0, np.log(100.0), n_types))
    isolated = base[:, None] * np.array([1.0, 2.5, 3.5]) * np.exp(rng.normal(0.0, 0.2, (n_types, 3)))
    keep = rng.uniform(0.3, 1.0, (n_types, n_types, 3))
    fits = rng.random((n_types, n_types, 3)) >= 0.15
    fits = fits & fits.transpose(1, 0, 2)
    paired = np.stack([keep * isolated[:, None, :], keep.transpose(1, 0, 2) * isolated[None, :, :]], axis=-1)
    paired[~fits] = 0.0
    return JobTypeTable(f"synthetic (seed {seed})", [f"type{t}" for t in range(n_types)], isolated, paired)


def make_problem(table: JobTypeTable, n_jobs: int, gpus_per_type: int, seed: int) -> allocopt.Problem:
    """``n_jobs`` single-GPU jobs of uniformly drawn types, every pair allowed to share."""
    rng = np.random.default_rng([seed, n_jobs])
    kind = rng.integers(0, len(table.names), n_jobs)
    pairs = {(a, b): dict(zip(GPU_TYPES, table.paired[kind[a], kind[b]].tolist()))
             for a, b in itertools.combinations(range(n_jobs), 2)}
    cluster = allocopt.Cluster({gpu: gpus_per_type for gpu in GPU_TYPES})
    return allocopt.Problem(table.isolated[kind], cluster, pair_throughputs=pairs)


# ----------------------------------------------------------------------------------------------
# Results
# ----------------------------------------------------------------------------------------------
@dataclasses.dataclass
class Result:
    """One way to the optimum; seconds are medians over repeats. ``formulate_s``:
    building the model or expression tree; ``compile_s``: flattening it to solver
    arrays (``Model.compile`` / ``get_problem_data``); ``transfer_s``: handing it
    to the solver and reading back (everything of the solve call outside the
    solver's own clock); ``solve_s``: the solver's own time."""

    name: str
    status: str = "ok"
    formulate_s: float | None = None
    compile_s: float | None = None
    transfer_s: float | None = None
    solve_s: float | None = None
    total_s: float | None = None
    objective: float | None = None
    objective_rel_diff: float | None = None
    speedup_vs_cvxpy: float | None = None
    max_violation: float | None = None
    columns: int | None = None
    runs: list[dict[str, float]] = dataclasses.field(default_factory=list)

    def finish(self, runs: list[dict[str, float]]) -> None:
        self.runs = runs
        for key in ("formulate_s", "compile_s", "transfer_s", "solve_s", "total_s"):
            setattr(self, key, statistics.median(run[key] for run in runs))
        self.objective = runs[-1]["objective"]


def max_violation(problem: allocopt.Problem, X: np.ndarray, P: np.ndarray) -> float:
    """Largest violation of: fractions >= 0, each job's time over all
    combinations containing it <= 1, GPUs used (a pair once) <= capacity."""
    time_used = X.sum(axis=1)
    for member in (0, 1):
        np.add.at(time_used, problem.pairs[:, member], P.sum(axis=1))
    gpus = problem.scale_factors @ X + problem.scale_factors[problem.pairs[:, 0]] @ P
    return max(float(np.max(-X, initial=0.0)), float(np.max(-P, initial=0.0)),
               float(np.max(time_used - 1.0, initial=0.0)),
               float(np.max((gpus - problem.capacity) / problem.capacity, initial=0.0)))


def normalization(problem: allocopt.Problem) -> np.ndarray:
    """``s_i / (w_i p_i)``: max-min fairness's factor from steps/s to normalized throughput."""
    return problem.scale_factors / (problem.priority_weights * problem.proportional_throughputs)


# ----------------------------------------------------------------------------------------------
# allocopt
# ----------------------------------------------------------------------------------------------
def run_allocopt(problem: allocopt.Problem, repeat: int) -> Result:
    result = Result("allocopt[highs]")
    runs = []
    for _ in range(repeat):
        gc.collect()
        alloc = allocopt.solve(problem, "max_min_fairness", space_sharing=True, backend="highs")
        t = alloc.timings
        runs.append({"formulate_s": t.total_s - t.model_build_s - t.solver_build_s - t.solve_s,
                     "compile_s": t.model_build_s, "transfer_s": t.solver_build_s, "solve_s": t.solve_s,
                     "total_s": t.total_s, "objective": alloc.objective})
    result.max_violation = max_violation(problem, alloc.matrix, alloc.pair_matrix)
    result.columns = alloc.matrix.size + alloc.pair_matrix.size + 1
    result.finish(runs)
    return result


def run_by_job_type(problem: allocopt.Problem, repeat: int) -> Result:
    result = Result("allocopt by job type")
    runs = []
    for _ in range(repeat):
        gc.collect()
        alloc = allocopt.solve(problem, "max_min_fairness", backend="highs", space_sharing=True,
                               aggregate_job_types=True)
        t = alloc.timings
        runs.append({"formulate_s": t.total_s - t.model_build_s - t.solver_build_s - t.solve_s,
                     "compile_s": t.model_build_s, "transfer_s": t.solver_build_s, "solve_s": t.solve_s,
                     "total_s": t.total_s, "objective": alloc.objective})
    result.max_violation = max_violation(problem, alloc.matrix, alloc.pair_matrix)
    result.columns = alloc.extras["type_matrix"].size + alloc.extras["type_pair_matrix"].size + 1
    result.finish(runs)
    return result


# ----------------------------------------------------------------------------------------------
# Gavel-style cvxpy
# ----------------------------------------------------------------------------------------------
def build_gavel_cvxpy(problem: allocopt.Problem):
    """Space-sharing max-min fairness as one cvxpy expression tree, Gavel's way.

    Combination ``c`` is job ``c`` alone for ``c < n`` and pair ``c - n``
    otherwise; ``x[c, j]`` is its time on GPU type ``j``. Combinations that
    cannot run on a type (zero throughput) are fixed to 0, as allocopt bounds them.
    """
    import cvxpy as cp

    n, k = problem.num_jobs, problem.cluster.num_gpu_types
    pairs, PT = problem.pairs, problem.pair_throughput_array
    scale = normalization(problem)
    relevant: list[list[int]] = [[i] for i in range(n)]
    steps: list[list[np.ndarray]] = [[problem.throughputs[i]] for i in range(n)]
    for p, (a, b) in enumerate(pairs.tolist()):
        relevant[a].append(n + p)
        relevant[b].append(n + p)
        steps[a].append(PT[p, :, 0])
        steps[b].append(PT[p, :, 1])
    scale_factors_array = np.concatenate([problem.scale_factors, problem.scale_factors[pairs[:, 0]]])
    scale_factors_array = np.repeat(scale_factors_array[:, None].astype(np.float64), k, axis=1)

    x = cp.Variable((n + pairs.shape[0], k))
    objective_terms = [cp.sum(cp.multiply(np.array(steps[i]) * scale[i], x[relevant[i]])) for i in range(n)]
    per_job_allocations = [cp.sum(x[relevant[i]]) for i in range(n)]
    constraints = [
        x >= 0,
        cp.sum(cp.multiply(scale_factors_array, x), axis=0) <= problem.capacity.astype(np.float64),
        cp.vstack(per_job_allocations) <= 1,
    ]
    usable = np.concatenate([problem.runnable, PT.sum(axis=2) > 0])
    rows, cols = np.nonzero(~usable)
    if rows.size:
        constraints.append(x[rows, cols] == 0)
    return cp.Problem(cp.Maximize(cp.minimum(*objective_terms)), constraints), x


def run_gavel_cvxpy(problem: allocopt.Problem, repeat: int) -> Result:
    import cvxpy as cp

    result = Result("gavel-cvxpy[HIGHS]")
    if "HIGHS" not in cp.installed_solvers():
        result.status = "skipped: cvxpy has no HIGHS solver"
        return result
    n = problem.num_jobs
    runs = []
    for _ in range(repeat):
        gc.collect()
        t0 = time.perf_counter()
        prob, x = build_gavel_cvxpy(problem)
        t1 = time.perf_counter()
        data, chain, inverse_data = prob.get_problem_data("HIGHS")
        t2 = time.perf_counter()
        raw = chain.solve_via_data(prob, data, False, False, {})
        t3 = time.perf_counter()
        prob.unpack_results(raw, chain, inverse_data)
        t4 = time.perf_counter()
        if prob.status != cp.OPTIMAL:
            result.status = f"error: cvxpy status {prob.status}"
            return result
        inner = prob.solver_stats.solve_time if prob.solver_stats and prob.solver_stats.solve_time else t3 - t2
        inner = min(float(inner), t3 - t2)
        runs.append({"formulate_s": t1 - t0, "compile_s": t2 - t1, "transfer_s": (t3 - t2 - inner) + (t4 - t3),
                     "solve_s": inner, "total_s": t4 - t0, "objective": float(prob.value)})
    values = np.asarray(x.value)
    result.max_violation = max_violation(problem, values[:n], values[n:])
    result.columns = int(data["A"].shape[1]) if "A" in data else values.size
    result.finish(runs)
    return result


# ----------------------------------------------------------------------------------------------
# Profile of allocopt's model building
# ----------------------------------------------------------------------------------------------
def profile_model_build(problem: allocopt.Problem, top: int = 18) -> str:
    """cProfile of everything allocopt does before HiGHS starts solving:
    ``base_model``, the max-min objective, ``Model.compile`` and the HiGHS
    backend's ``build`` (passModel)."""
    scale = normalization(problem)

    def build() -> None:
        base = base_model(problem, name="max_min_fairness", space_sharing=True)
        base.model.maximize_minimum(base.throughput * scale, name="normalized_throughput")
        get_backend("highs").build(base.model.compile(), SolveOptions())

    profiler = cProfile.Profile()
    profiler.enable()
    build()
    profiler.disable()
    out = io.StringIO()
    pstats.Stats(profiler, stream=out).sort_stats("cumulative").print_stats(top)
    return out.getvalue()


def solve_without_unit_bounds(problem: allocopt.Problem) -> tuple[float, float]:
    """HiGHS's solve seconds and objective for allocopt's pairwise LP with the
    column upper bounds of 1 on ``X`` and ``P`` dropped (the time rows imply
    them; bounds of 0 on unusable entries stay)."""
    base = base_model(problem, name="max_min_fairness", space_sharing=True)
    base.model.maximize_minimum(base.throughput * normalization(problem), name="normalized_throughput")
    compiled = base.model.compile()
    compiled = dataclasses.replace(compiled, col_ub=np.where(compiled.col_ub == 1.0, np.inf, compiled.col_ub))
    solution = solve_model(compiled, "highs")
    return solution.solve_seconds, solution.objective


# ----------------------------------------------------------------------------------------------
# Output
# ----------------------------------------------------------------------------------------------
def _fmt(value: float | None, spec: str = ".3f") -> str:
    return "-" if value is None else format(value, spec)


def format_table(results: list[Result]) -> str:
    header = (f"{'solver':<22}{'formulate_s':>12}{'compile_s':>11}{'transfer_s':>11}{'solve_s':>10}"
              f"{'total_s':>10}{'speedup':>9}{'columns':>10}{'objective':>14}{'rel.diff':>10}{'violation':>11}")
    lines = [header, "-" * len(header)]
    for r in results:
        if r.status != "ok":
            lines.append(f"{r.name:<22}{r.status}")
            continue
        lines.append(f"{r.name:<22}{_fmt(r.formulate_s):>12}{_fmt(r.compile_s):>11}{_fmt(r.transfer_s):>11}"
                     f"{_fmt(r.solve_s):>10}{_fmt(r.total_s):>10}{_fmt(r.speedup_vs_cvxpy, '.1f'):>9}"
                     f"{r.columns or 0:>10}{_fmt(r.objective, '.9f'):>14}{_fmt(r.objective_rel_diff, '.1e'):>10}"
                     f"{_fmt(r.max_violation, '.1e'):>11}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=512)
    parser.add_argument("--gpus", type=int, default=None, help="GPUs per type (default: jobs / 4)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--gavel-table", type=Path, default=GAVEL_TABLE)
    parser.add_argument("--synthetic", action="store_true", help="use the synthetic table even if Gavel's exists")
    parser.add_argument("--skip-cvxpy", action="store_true")
    parser.add_argument("--profile", action="store_true", help="cProfile allocopt's model building")
    parser.add_argument("--json", type=Path, help="write machine, instance and results here")
    args = parser.parse_args(argv)

    table = (load_gavel_table(args.gavel_table) if args.gavel_table.exists() and not args.synthetic
             else synthetic_table(seed=args.seed))
    gpus = args.gpus or max(1, args.jobs // 4)
    t0 = time.perf_counter()
    problem = make_problem(table, args.jobs, gpus, args.seed)
    problem_s = time.perf_counter() - t0
    machine = machine_info()
    instance = {"throughputs": table.source, "job_types": len(table.names), "jobs": problem.num_jobs,
                "pairs": int(problem.pairs.shape[0]), "gpu_types": dict(zip(GPU_TYPES, problem.capacity.tolist())),
                "problem_s": problem_s}
    print(f"machine: {machine['cpu']}, {machine['cpus_usable']} usable CPUs, load {machine['load_average']}, "
          f"{machine['platform']}, Python {machine['python']}, {machine['versions']}")
    print(f"instance: {instance}", flush=True)

    results = [run_allocopt(problem, args.repeat)]
    print(f"  {results[-1].name}: {results[-1].total_s:.2f} s", flush=True)
    if not args.skip_cvxpy:
        results.append(run_gavel_cvxpy(problem, args.repeat))
        print(f"  {results[-1].name}: {_fmt(results[-1].total_s, '.2f')} s", flush=True)
    results.append(run_by_job_type(problem, args.repeat))

    reference = results[0].objective
    cvxpy_total = next((r.total_s for r in results if r.name.startswith("gavel") and r.status == "ok"), None)
    for r in results:
        if r.status == "ok":
            r.objective_rel_diff = abs(r.objective - reference) / max(abs(reference), 1e-12)
            r.speedup_vs_cvxpy = cvxpy_total / r.total_s if cvxpy_total else None
    print()
    print(format_table(results))
    print()
    mismatch = [r.name for r in results if r.status == "ok" and r.objective_rel_diff > OBJECTIVE_RTOL]
    print("objectives agree (rel <= 1e-6)" if not mismatch else f"OBJECTIVE MISMATCH: {mismatch}")
    if cvxpy_total:
        speedup = results[0].speedup_vs_cvxpy
        print(f"target: allocopt[highs] >= {TARGET_SPEEDUP:.0f}x faster than gavel-cvxpy[HIGHS] end to end: "
              f"{speedup:.1f}x -> {'MET' if speedup >= TARGET_SPEEDUP else 'NOT MET'}; "
              f"allocopt by job type: {results[-1].speedup_vs_cvxpy:.0f}x")
    share = results[0].solve_s / results[0].total_s
    print(f"allocopt[highs]: {100 * share:.1f}% of the time inside HiGHS's solve; outside it "
          f"{results[0].total_s - results[0].solve_s:.2f} s (Problem construction, {problem_s:.2f} s, not included)")
    if args.profile:
        print("\nProfile of allocopt's model build (base_model, objective, Model.compile, HiGHS passModel):")
        print(profile_model_build(problem))
        solve_s, objective = solve_without_unit_bounds(problem)
        print(f"HiGHS on the same LP without the upper bounds of 1 on X and P (implied by the time rows): "
              f"solve {solve_s:.2f} s (with them: {results[0].solve_s:.2f} s), objective {objective:.9f}")
    if args.json:
        args.json.write_text(json.dumps({"machine": machine, "instance": instance,
                                         "results": [dataclasses.asdict(r) for r in results]}, indent=2))
    return 0 if not mismatch else 1


if __name__ == "__main__":
    raise SystemExit(main())
