"""allocopt beside its anchors' own code, on the anchors' own instances: Soroush and POP.

* **Soroush** (microsoft/Soroush, NSDI 2024), cluster_scheduling/scripts/benchmark.py:
  ``create_problem_instance(8192, {v100, p100, k80: n/4}, seed, ss_share=False,
  introduce_skew=True)`` (Gavel's ``utils.generate_job``; Soroush expects a Gavel
  checkout next to it, ``--gavel-dir``), then its allocators: the approximate
  waterfillers and the equi-depth / geometric binners. Its binners solve with Gurobi
  (``Method=2``); where gurobipy's size-limited license refuses the model, they are
  solved with cvxpy + HiGHS instead (``--their-solver``) and the row says so.
  Gavel's exact water-filling needs ECOS and GLPK_MI (not installed); allocopt's exact
  ``water_filling`` is the reference its fairness metric is computed against
  (``fairness``: geometric mean over jobs of ``min(r, 1/r)``, ``r = max(0.1, e) /
  max(0.1, e_exact)``, as Soroush's ``__main__`` computes it).
* **POP** (stanford-futuredata/POP, SOSP 2021), cluster_scheduling/figure2.py:
  ``create_problem_instance(2048, {v100, p100, k80: n/4}, "max_min_fairness_packed",
  seed)`` and its ``harness`` with ``num_sub_clusters`` = 1 (exact) or k (POP-k), with
  MOSEK replaced by ``--pop-solver`` (no MOSEK here). POP's code needs numpy < 2 (it
  converts 1-element arrays with ``float``): give it a Python with ``--pop-python``. ``harness`` reports setup plus
  the slowest sub-problem (sub-problems run in parallel in the paper); ``wall_s`` is
  this machine's sequential time.

For each anchor and seed the script (1) builds the anchor's instance with the anchor's
code, converts it to an allocopt Problem (:func:`problem_from_record`; ``--dump-dir``
writes the records as JSON) and checks that allocopt's generator
(``allocopt.bench.instances.soroush_problem`` / ``pop_figure2_problem``) gives the same
instance; (2) times the anchor's methods and allocopt's default ``allocopt.solve`` on
that instance in the same process, and compares fairness / objectives.

Each anchor runs in a child process of its own (their modules have clashing names)::

    python benchmarks/anchors.py --soroush-dir /tmp/soroush --gavel-dir /tmp/gavel \\
        --pop-dir /tmp/pop --out /tmp/anchors.json

The anchors' code is never imported by allocopt; bring it with ``git clone``.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import io
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

import allocopt
from allocopt.bench import instances
from allocopt.bench.machine import format_machine, machine_info
from allocopt.bench.output import (
    Column,
    add_results_option,
    results_table,
    write_results,
)
from allocopt.problem import PairThroughputs

GPU_TYPES = ("v100", "p100", "k80")  # the cluster_spec order of both anchors' scripts


# ----- instances as records (JSON) and back ---------------------------------------------------
def record_from_anchor(anchor: str, seed: int, throughputs: dict, scale_factors: dict, priorities: dict,
                       cluster_spec: dict[str, int]) -> dict[str, Any]:
    """An anchor's instance (Gavel's dicts keyed by ``JobIdPair``) as a JSON-ready record."""
    gpus = sorted(cluster_spec)
    singles = sorted((j for j in throughputs if not j.is_pair()), key=lambda j: j[0])
    pairs = sorted((j for j in throughputs if j.is_pair()), key=lambda j: (j[0], j[1]))
    return {"anchor": anchor, "seed": seed, "cluster": {g: int(cluster_spec[g]) for g in gpus},
            "job_ids": [int(j[0]) for j in singles],
            "throughputs": [[float(throughputs[j][g]) for g in gpus] for j in singles],
            "scale_factors": [int(scale_factors[j]) for j in singles],
            "priority_weights": [float(priorities[j]) for j in singles],
            "pairs": [[int(p[0]), int(p[1])] for p in pairs],
            "pair_throughputs": [[[float(v) for v in throughputs[p][g]] for g in gpus] for p in pairs]}


def problem_from_record(record: dict[str, Any], *, scale_factors: bool = True) -> allocopt.Problem:
    """The allocopt Problem of a record (``scale_factors=False``: every job on one GPU, as POP's figure 2)."""
    cluster = allocopt.Cluster(record["cluster"])
    pair_throughputs = None
    if record["pairs"]:
        pair_throughputs = PairThroughputs([tuple(p) for p in record["pairs"]], np.asarray(record["pair_throughputs"]))
    scales = record["scale_factors"] if scale_factors else None
    return allocopt.Problem(np.asarray(record["throughputs"]), cluster, job_ids=record["job_ids"],
                            scale_factors=scales, priority_weights=record["priority_weights"],
                            pair_throughputs=pair_throughputs)


def same_instance(theirs: allocopt.Problem, ours: allocopt.Problem) -> list[str]:
    """Differences between two instances (GPU types matched by name); empty when identical."""
    cols = [ours.gpu_types.index(g) for g in theirs.gpu_types]
    diffs = []
    checks = {"num_jobs": (theirs.num_jobs, ours.num_jobs),
              "capacity": (theirs.capacity, ours.capacity[cols])}
    if theirs.num_jobs == ours.num_jobs:
        checks.update(throughputs=(theirs.throughputs, ours.throughputs[:, cols]),
                      scale_factors=(theirs.scale_factors, ours.scale_factors),
                      priority_weights=(theirs.priority_weights, ours.priority_weights))
        if theirs.pairs is not None or ours.pairs is not None:
            checks["pairs"] = (theirs.pairs, ours.pairs)
            if theirs.pairs is not None and ours.pairs is not None and theirs.pairs.shape == ours.pairs.shape:
                checks["pair_throughputs"] = (theirs.pair_throughput_array, ours.pair_throughput_array[:, cols])
    for name, (a, b) in checks.items():
        if a is None or b is None or not np.array_equal(np.asarray(a), np.asarray(b)):
            diffs.append(name)
    return diffs


def fairness(effective: np.ndarray, exact: np.ndarray) -> float:
    """Soroush's fairness of an allocation against the exact max-min fair one (1 = identical)."""
    r = np.maximum(0.1, effective) / np.maximum(0.1, exact)
    return float(10 ** np.mean(np.log10(np.minimum(r, 1 / r))))


class _Rows(list):
    """Rows, each also written to the real stdout as one ``ROW <json>`` line as soon as it is measured."""

    def append(self, row: dict[str, Any]) -> None:
        super().append(row)
        print("ROW " + json.dumps(row), file=sys.__stdout__, flush=True)


def _timed(fn, *args, **kwargs) -> tuple[Any, float]:
    start = time.perf_counter()
    with contextlib.redirect_stdout(io.StringIO()):  # their methods print progress
        out = fn(*args, **kwargs)
    return out, time.perf_counter() - start


def _their_matrix(allocation: dict, job_ids: list[int], gpus: list[str]) -> np.ndarray:
    by_id = {job_id[0]: shares for job_id, shares in allocation.items() if not job_id.is_pair()}
    return np.array([[float(by_id.get(j, {}).get(g, 0.0) or 0.0) for g in gpus] for j in job_ids])


def _dump(record: dict[str, Any], dump_dir: str | None, name: str) -> None:
    if dump_dir:
        Path(dump_dir).mkdir(parents=True, exist_ok=True)
        (Path(dump_dir) / name).write_text(json.dumps(record))


# ----- Soroush ----------------------------------------------------------------------------------
#: Variables and linear constraints gurobipy's size-limited (pip) license accepts.
GUROBI_SIZE_LIMIT = 2000


def _gurobi_refusal(n_vars: int) -> str | None:
    """Why gurobipy refuses an LP of ``n_vars`` variables here, or None when it solves it."""
    try:
        import gurobipy as gp
        with gp.Env(params={"OutputFlag": 0}) as env, gp.Model(env=env) as model:
            x = model.addVars(n_vars, ub=1.0)
            model.addConstr(gp.quicksum(x.values()) <= 1)
            model.optimize()
        return None
    except Exception as exc:  # the license error, whatever its class
        return f"{type(exc).__name__}: {exc}"


def _their_solver_patch(solver: str, note: list[str]) -> None:
    """cvxpy ``solve(solver=GUROBI, Method=2, ...)`` in their code: on a model over
    :data:`GUROBI_SIZE_LIMIT` (which the license here refuses), ``solver`` with its defaults instead."""
    import cvxpy as cp
    original = cp.Problem.solve

    def solve(self, *args, **kwargs):
        if kwargs.get("solver") == cp.GUROBI:
            size = self.size_metrics
            rows = size.num_scalar_eq_constr + size.num_scalar_leq_constr
            if max(size.num_scalar_variables, rows) > GUROBI_SIZE_LIMIT:
                kwargs = {"solver": solver}
                note.append(f"{size.num_scalar_variables} variables, {rows} constraints")
        return original(self, *args, **kwargs)
    cp.Problem.solve = solve


GUROBI_METHODS = ("equi-depth binner (EB)", "geometric binner (GB)")  # Soroush's methods that solve an LP


def run_soroush(args: argparse.Namespace) -> list[dict[str, Any]]:
    root = Path(args.soroush_dir).resolve()
    code = root / "cluster_scheduling" if (root / "cluster_scheduling").is_dir() else root
    gavel = Path(args.gavel_dir).resolve() if args.gavel_dir else code.parent / "gavel"
    if not (gavel / "scheduler" / "utils.py").is_file():
        raise SystemExit(f"Soroush needs a Gavel checkout: pass --gavel-dir (no {gavel}/scheduler/utils.py)")
    link = code.parent / "gavel"  # Soroush imports gavel.scheduler.*
    if not link.exists():
        link.symlink_to(gavel)
    np.int = int  # Soroush's binners use np.int (removed in numpy 1.24)
    sys.path[:0] = [str(code), str(code.parent), str(gavel / "scheduler")]
    cwd = os.getcwd()
    os.chdir(code)  # benchmark.py reads ../gavel/scheduler/simulation_throughputs.json
    try:
        from alg import (
            adapt_waterfiller,
            approx_waterfiller,
            equi_depth_binner,
            geometric_binner,
        )
        from scripts import benchmark
    finally:
        os.chdir(cwd)
    used: list[str] = []
    refusal = _gurobi_refusal(GUROBI_SIZE_LIMIT + 1)
    if refusal and args.their_solver != "GUROBI":
        _their_solver_patch(args.their_solver, used)
    methods = {
        "approx(1)": lambda p: approx_waterfiller.get_rates(p, num_iter=1),
        "approx(1)-prio-thru-aware": lambda p: approx_waterfiller.get_rates(p, num_iter=1, priority_aware=True,
                                                                             throughput_aware=True),
        "approx(1)_bet(10)-prio-aware (AW)": lambda p: adapt_waterfiller.get_rates(
            p, num_iter_approx_water=1, num_iter_adapt_water=10, biased_toward_lower_norm_eff_thru=False,
            biased_alpha=0.5, priority_aware=True, throughput_aware=False),
        "equi-depth binner (EB)": lambda p: equi_depth_binner.get_rates(
            p, num_iter_approx_water=1, num_iter_bet=2, priority_aware=True, min_epsilon=1e-6, k=1, alpha=0,
            min_beta=1e-4, num_bins=5, throughput_aware=False),
        "geometric binner (GB)": lambda p: geometric_binner.get_rates(2, 0.1, p, 1e-8),
    }
    unknown = set(args.soroush_methods) - set(methods)
    if unknown:
        raise SystemExit(f"unknown --soroush-methods {sorted(unknown)}; choose from {sorted(methods)}")
    rows = _Rows()
    for n in args.sizes:
        spec = {g: max(n // 4, 1) for g in GPU_TYPES}
        for seed in args.seeds:
            os.chdir(code)
            try:
                (tputs, scales, prios, their), gen_s = _timed(benchmark.create_problem_instance, n, spec, seed=seed,
                                                              ss_share=False, introduce_skew=True)
            finally:
                os.chdir(cwd)
            record = record_from_anchor("soroush", seed, tputs, scales, prios, spec)
            _dump(record, args.dump_dir, f"soroush_n{n}_seed{seed}.json")
            problem = problem_from_record(record)
            diffs = same_instance(problem, instances.soroush_problem(n, seed))
            base = {"anchor": "soroush", "n_jobs": n, "seed": seed, "generator_identical": not diffs,
                    "generator_diffs": ",".join(diffs), "their_generate_s": gen_s, "status": "ok"}
            exact, exact_s = _timed(allocopt.solve, problem, "water_filling")
            e_exact = exact.effective_throughput
            rows.append({**base, "method": "allocopt water_filling (exact)", "time_s": exact_s, "fairness": 1.0,
                         "total_vs_exact": 1.0, "min_ratio_vs_exact": 1.0,
                         "note": exact.extras.get("technique", "")})
            mmf, mmf_s = _timed(allocopt.solve, problem, "max_min_fairness")
            rows.append({**base, "method": "allocopt max_min_fairness (one LP)", "time_s": mmf_s,
                         **_compare(problem, mmf.effective_throughput, e_exact, exact_s),
                         "note": mmf.extras.get("technique", "")})
            for name, method in methods.items():
                if name not in args.soroush_methods:
                    continue
                used.clear()
                try:
                    (allocation, their_s), wall = _timed(method, their)
                except Exception as exc:
                    rows.append({**base, "method": name, "status": f"failed: {type(exc).__name__}: {exc}"[:300]})
                    continue
                matrix = _their_matrix(allocation, record["job_ids"], their.gpu_list)
                cols = [problem.gpu_types.index(g) for g in their.gpu_list]
                effective = (matrix * problem.throughputs[:, cols]).sum(axis=1)
                note = (f"Gurobi refuses {used[0]} ({refusal.splitlines()[0][:80]}); solved with cvxpy + "
                        f"{args.their_solver}") if used else ("Gurobi" if name in GUROBI_METHODS else "")
                rows.append({**base, "method": name, "time_s": their_s, "wall_s": wall,
                             **_compare(problem, effective, e_exact, exact_s), "note": note})
    return rows


def _compare(problem: allocopt.Problem, effective: np.ndarray, exact: np.ndarray, exact_s: float) -> dict[str, Any]:
    share = problem.scale_factors / (problem.priority_weights * problem.proportional_throughputs)
    return {"fairness": fairness(effective, exact), "total_vs_exact": float(effective.sum() / exact.sum()),
            "min_ratio_vs_exact": float((effective * share).min() / (exact * share).min()),
            "exact_s": exact_s}


# ----- POP ----------------------------------------------------------------------------------------
def run_pop(args: argparse.Namespace) -> list[dict[str, Any]]:
    code = Path(args.pop_dir).resolve()
    code = code / "cluster_scheduling" if (code / "cluster_scheduling").is_dir() else code
    cwd = os.getcwd()
    sys.path[:0] = [str(code), str(code / "scheduler")]
    os.chdir(code)  # figure2.py reads scheduler/simulation_throughputs.json
    try:
        import figure2
        import utils as gavel_utils
    finally:
        os.chdir(cwd)
    rows = _Rows()
    for n in args.pop_sizes:
        spec = {g: max(n // 4, 1) for g in GPU_TYPES}
        for seed in args.seeds:
            os.chdir(code)
            try:
                (tputs, scales, prios), gen_s = _timed(figure2.create_problem_instance, n, spec,
                                                       "max_min_fairness_packed", seed)
            finally:
                os.chdir(cwd)
            record = record_from_anchor("pop_figure2", seed, tputs, scales, prios, spec)
            if n <= args.dump_max_jobs:
                _dump(record, args.dump_dir, f"pop_figure2_n{n}_seed{seed}.json")
            problem = problem_from_record(record)
            del record
            diffs = same_instance(problem, instances.pop_figure2_problem(n, seed))
            base = {"anchor": "pop_figure2", "n_jobs": n, "seed": seed, "generator_identical": not diffs,
                    "generator_diffs": ",".join(diffs), "their_generate_s": gen_s, "status": "ok"}
            ours, ours_s = _timed(allocopt.solve, problem, "max_min_fairness", space_sharing=True)
            share = problem.scale_factors / (problem.priority_weights * problem.proportional_throughputs)
            exact = float((ours.effective_throughput * share).min())
            rows.append({**base, "method": "allocopt max_min_fairness (default)", "time_s": ours_s,
                         "objective": ours.objective, "objective_vs_allocopt": exact / ours.objective,
                         "note": ours.extras.get("technique", "")})
            for row in _pop_logged_rows(code, problem, share, ours, base):
                rows.append(row)
            for k in args.pop_partitions:
                if k > 1:
                    part, part_s = _timed(allocopt.solve, problem, "max_min_fairness", space_sharing=True,
                                            partitions=k)
                    rows.append({**base, "method": f"allocopt partitions={k}", "time_s": part_s,
                                 "objective": part.objective, "objective_vs_allocopt": part.objective / ours.objective})
                if k == 1 and n > args.pop_exact_max_jobs:
                    rows.append({**base, "method": "POP-1 (exact, their code)", "status":
                                 f"skipped: {n} jobs > --pop-exact-max-jobs {args.pop_exact_max_jobs}"})
                    continue
                policy = gavel_utils.get_policy("max_min_fairness_packed", solver=args.pop_solver)
                try:
                    (allocation, their_s), wall = _timed(figure2.harness, policy, tputs, scales, prios, spec,
                                                         num_sub_clusters=k)
                except Exception as exc:
                    rows.append({**base, "method": f"POP-{k} (their code)",
                                 "status": f"failed: {type(exc).__name__}: {exc}"[:300]})
                    continue
                effective = _pop_effective(allocation, tputs, problem)
                value = float((effective * share).min())
                rows.append({**base, "method": f"POP-{k} (their code, {args.pop_solver})", "time_s": their_s,
                             "wall_s": wall, "objective": value, "objective_vs_allocopt": value / ours.objective})
    return rows


#: POP's logged figure-2 run (cluster_scheduling/logs/non_trace_num_jobs=2048.out: the runtimes, then each
#: configuration's effective throughputs per job), in figure2.py's ``__main__`` order.
POP_LOGGED_CONFIGS = ("POP-1 (MOSEK, POP's log)", "POP-2 (MOSEK, POP's log)", "POP-4 (MOSEK, POP's log)",
                      "POP-8 (MOSEK, POP's log)", "Gandiva (POP's log)")


def _pop_logged_rows(code: Path, problem: allocopt.Problem, share: np.ndarray, ours: Any,
                     base: dict[str, Any]) -> list[dict[str, Any]]:
    """POP's own logged run of figure 2 (2,048 jobs, seed 0, on POP's machine) evaluated on ``problem``."""
    import ast
    log = code / "logs" / "non_trace_num_jobs=2048.out"
    if problem.num_jobs != 2048 or base["seed"] != 0 or not log.is_file():
        return []
    lines = log.read_text().splitlines()
    runtimes, throughputs = ast.literal_eval(lines[0]), ast.literal_eval(lines[1])
    rows = []
    for name, runtime, logged in zip(POP_LOGGED_CONFIGS, runtimes, throughputs):
        effective = np.array([logged[job] for job in problem.job_ids])
        value = float((effective * share).min())
        rows.append({**base, "method": name, "time_s": runtime, "objective": value,
                     "objective_vs_allocopt": value / ours.objective, "note": "POP's machine, not this one"})
    return rows


def _pop_effective(allocation: dict, throughputs: dict, problem: allocopt.Problem) -> np.ndarray:
    """Each job's steps/s under a Gavel packed allocation (figure2.py's sum), in problem job order."""
    row = {job: i for i, job in enumerate(problem.job_ids)}
    e = np.zeros(problem.num_jobs)
    for job_id, shares in allocation.items():
        for g, share in shares.items():
            if job_id.is_pair():
                for member, single in enumerate(job_id.singletons()):
                    e[row[single[0]]] += share * throughputs[job_id][g][member]
            else:
                e[row[job_id[0]]] += share * throughputs[job_id][g]
    return e


# ----- driver ---------------------------------------------------------------------------------------
def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--soroush-dir", help="a microsoft/Soroush checkout (or its cluster_scheduling folder)")
    parser.add_argument("--gavel-dir", help="a stanford-futuredata/gavel checkout (default: <soroush>/gavel)")
    parser.add_argument("--pop-dir", help="a stanford-futuredata/POP checkout (or its cluster_scheduling folder)")
    parser.add_argument("--sizes", type=_ints, default=[8192], help="Soroush job counts (default 8192)")
    parser.add_argument("--pop-sizes", type=_ints, default=[2048], help="POP job counts (default 2048)")
    parser.add_argument("--seeds", type=_ints, default=[0], help="the anchors' trial seeds (default 0)")
    parser.add_argument("--soroush-methods", default="approx(1),approx(1)-prio-thru-aware,"
                        "approx(1)_bet(10)-prio-aware (AW),equi-depth binner (EB),geometric binner (GB)",
                        type=lambda s: s.split(","), help="Soroush's methods to run (comma-separated names)")
    parser.add_argument("--pop-partitions", type=_ints, default=[8], help="POP-k to run (1 = exact; default 8)")
    parser.add_argument("--pop-exact-max-jobs", type=int, default=512,
                        help="run POP's exact (k=1) only up to this many jobs (default 512)")
    parser.add_argument("--their-solver", default="HIGHS",
                        help="cvxpy solver for Soroush's models too large for the Gurobi license (default HIGHS)")
    parser.add_argument("--pop-solver", default="SCIPY",
                        help="cvxpy solver for POP's models in place of MOSEK (default SCIPY: HiGHS through scipy)")
    parser.add_argument("--pop-python", default=sys.executable,
                        help="Python for POP's code (it needs numpy < 2 and cvxpy < 1.6; default this one)")
    parser.add_argument("--dump-dir", help="write the anchors' instances here as JSON")
    parser.add_argument("--dump-max-jobs", type=int, default=512, help="dump POP instances up to this size")
    add_results_option(parser, "anchors", Path(__file__).parent / "results", ("--results", "--out"))
    parser.add_argument("--only", choices=("soroush", "pop"), help=argparse.SUPPRESS)  # the child processes
    args = parser.parse_args(argv)
    if args.only:
        run_soroush(args) if args.only == "soroush" else run_pop(args)
        return 0
    rows: list[dict[str, Any]] = []
    own = sys.argv[1:] if argv is None else argv
    for anchor, given in (("soroush", args.soroush_dir), ("pop", args.pop_dir)):
        if not given:
            continue
        python = args.pop_python if anchor == "pop" else sys.executable
        other: collections.deque[str] = collections.deque(maxlen=40)
        with subprocess.Popen([python, __file__, *own, "--only", anchor], stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) as child:
            for line in child.stdout:  # rows as they are measured; a child that fails keeps the rows it gave
                if line.startswith("ROW "):
                    rows.append(json.loads(line[4:]))
                    if args.results:  # rewritten after every row: an interrupted run keeps what it measured
                        _write(args.results, rows)
                    print(f"{rows[-1]['anchor']} n={rows[-1]['n_jobs']} {rows[-1]['method']}: "
                          f"{rows[-1].get('time_s', rows[-1]['status'])}", file=sys.stderr, flush=True)
                else:
                    other.append(line)
        if child.returncode:
            print(f"{anchor}: exit status {child.returncode}\n{''.join(other)}", file=sys.stderr)
    print(format_machine(machine_info()))
    _print_table(rows)
    if args.results:
        _write(args.results, rows)
    return 0


def _write(path: str, rows: list[dict[str, Any]]) -> None:
    columns = [Column("anchor", "anchor", left=True), Column("n_jobs", "jobs", ","), Column("seed", "seed"),
               Column("method", "method", left=True), Column("status", "status", left=True),
               Column("time_s", "seconds", ".4g"), Column("fairness", "fairness", ".4g"),
               Column("total_vs_exact", "total vs exact", ".4g"), Column("min_ratio_vs_exact", "min vs exact", ".4g"),
               Column("objective_vs_allocopt", "objective vs allocopt", ".8g")]
    write_results(path, "anchors", data={"rows": rows},
                  tables=[results_table("Soroush's and POP's code beside allocopt on their own instances", rows,
                                        columns)])


def _print_table(rows: list[dict[str, Any]]) -> None:
    fields = ("anchor", "n_jobs", "seed", "generator_identical", "method", "status", "time_s", "wall_s", "fairness",
              "total_vs_exact", "min_ratio_vs_exact", "objective_vs_allocopt", "note")
    print("| " + " | ".join(fields) + " |")
    print("|" + "---|" * len(fields))
    for row in rows:
        cells = []
        for f in fields:
            v = row.get(f, "")
            cells.append(f"{v:.4g}" if isinstance(v, float) else str(v))
        print("| " + " | ".join(cells) + " |")


if __name__ == "__main__":
    sys.exit(main())
