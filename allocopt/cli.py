"""The ``allocopt`` command line.

``allocopt solve PROBLEM.json`` reads a problem document (see
:meth:`allocopt.Problem.to_json`) and writes the allocation as JSON (see
:meth:`allocopt.Allocation.to_json`); ``allocopt demo`` solves a realistic
problem drawn from Gavel's measured throughputs with every installed backend.

Exit codes: 0 success, 1 the solver failed or did not prove optimality,
2 invalid input (arguments, problem file, options). Errors are one line on
stderr, ``allocopt: error: ...``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from allocopt import __version__
from allocopt.allocation import Allocation
from allocopt.api import solve
from allocopt.backends import BACKENDS, get_backend, installed_backends
from allocopt.cluster import Cluster
from allocopt.errors import (AllocoptError, BackendNotInstalledError, InvalidOptionError, InvalidProblemError,
                             LicenseError, NotOptimalError, SolverError, UnknownBackendError)
from allocopt.formulations import POLICIES, get_policy
from allocopt.problem import Problem
from allocopt.throughput import ThroughputTable

EXIT_FAILURE = 1
EXIT_USAGE = 2
_USAGE_ERRORS = (InvalidProblemError, InvalidOptionError, BackendNotInstalledError)

#: The cluster of Gavel's continuous-trace experiments (Narayanan et al., OSDI 2020).
DEMO_CLUSTER = {"v100": 36, "p100": 36, "k80": 36}

# Keys of --option that have their own flag (passing both would clash in allocopt.solve).
_FLAGS = {"problem": "the PROBLEM argument", "policy": "--policy", "backend": "--backend",
          "time_limit_s": "--time-limit-s", "best_effort": "--best-effort"}


class _UsageError(Exception):
    """Bad input found by the command line itself (file, JSON, output path)."""


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line with ``argv`` (default ``sys.argv[1:]``); return the exit code."""
    args = _parser().parse_args(argv)
    try:
        return args.run(args)
    except _UsageError as err:
        return _error(str(err), EXIT_USAGE)
    except AllocoptError as err:
        return _error(str(err), EXIT_USAGE if isinstance(err, _USAGE_ERRORS) else EXIT_FAILURE)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="allocopt", description="Allocate heterogeneous GPU clusters among training jobs.",
        epilog="Exit codes: 0 success, 1 solver failure or non-optimal result, 2 invalid input.")
    parser.add_argument("--version", action="version", version=f"allocopt {__version__}")
    commands = parser.add_subparsers(title="commands", dest="command", required=True, metavar="COMMAND")

    s = commands.add_parser("solve", help="solve a problem given as JSON, write the allocation as JSON",
                            description="Solve the problem in PROBLEM (JSON, as written by Problem.to_json) "
                                        "and write the allocation as JSON.")
    s.add_argument("problem", metavar="PROBLEM", help="problem JSON file, or - to read stdin")
    s.add_argument("--policy", default="max_min_fairness",
                   help=f"scheduling policy (default: %(default)s; one of {', '.join(sorted(POLICIES))})")
    s.add_argument("--backend", default="highs",
                   help=f"solver backend (default: %(default)s; one of {', '.join(BACKENDS)}, auto)")
    s.add_argument("--out", metavar="FILE", help="write the allocation to FILE instead of stdout")
    s.add_argument("--time-limit-s", type=float, metavar="S", help="solver time limit per solve, in seconds")
    s.add_argument("--best-effort", action="store_true",
                   help="write non-optimal results (e.g. at the time limit) instead of failing")
    s.add_argument("--option", dest="options", action="append", type=_key_value, default=[],
                   metavar="KEY=VALUE",
                   help="policy option or allocopt.solve keyword (e.g. heterogeneity_aware=false, "
                        "threads=4); VALUE is read as JSON where it parses, else as a string; repeatable")
    s.set_defaults(run=_run_solve)

    d = commands.add_parser("demo", help="solve a realistic problem with every installed backend",
                            description="Draw jobs from Gavel's measured throughputs onto Gavel's "
                                        f"continuous-trace cluster ({_gpus(DEMO_CLUSTER)}), solve with "
                                        "each backend and compare.")
    d.add_argument("--jobs", type=_positive_int, default=100, help="number of jobs (default: %(default)s)")
    d.add_argument("--seed", type=int, default=0, help="random seed of the workload (default: %(default)s)")
    d.add_argument("--backends", type=_name_list, metavar="NAMES",
                   help="comma-separated backends to run (default: every installed one)")
    d.add_argument("--policy", default="max_min_fairness", help="scheduling policy (default: %(default)s)")
    d.set_defaults(run=_run_demo)

    f = commands.add_parser("fit-profiles", help="fit goodput throughput models to application profiles",
                            description="Fit the Pollux throughput model for every (application, GPU type) under "
                                        "PROFILE_DIR (laid out like Sia's profiles: <app>/placements-<type>.csv, "
                                        "scalability-<type>.csv) and report the median absolute relative error of "
                                        "predicted vs measured iteration time on placements held out of the fit.")
    f.add_argument("profile_dir", metavar="PROFILE_DIR", help="directory of application profiles")
    f.add_argument("--json", metavar="OUT", dest="json_out",
                   help="also write the results as JSON to OUT (- for stdout; the table then goes to stderr)")
    f.set_defaults(run=_run_fit_profiles)
    return parser


# ----- argument types ---------------------------------------------------------------
def _key_value(text: str) -> tuple[str, Any]:
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    try:
        return key.strip(), json.loads(value)
    except json.JSONDecodeError:
        return key.strip(), value


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def _name_list(text: str) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    if not names:
        raise argparse.ArgumentTypeError(f"expected comma-separated names, got {text!r}")
    return names


@contextlib.contextmanager
def _solver_output_to_stderr() -> Iterator[None]:
    """Send what solvers print to file descriptor 1 (logs, license banners) to stderr,
    so that stdout carries only allocopt's own output."""
    sys.stdout.flush()
    saved = os.dup(1)
    os.dup2(2, 1)
    try:
        yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)


def _error(message: str, code: int) -> int:
    print(f"allocopt: error: {message}", file=sys.stderr)
    return code


# ----- allocopt solve -----------------------------------------------------------------
def _run_solve(args: argparse.Namespace) -> int:
    options = dict(args.options)
    clashes = sorted(set(options) & set(_FLAGS))
    if clashes:
        raise InvalidOptionError(f"--option {clashes[0]}=... is not allowed; use {_FLAGS[clashes[0]]}")
    problem = _read_problem(args.problem)
    with _solver_output_to_stderr():
        allocation = solve(problem, args.policy, backend=args.backend, time_limit_s=args.time_limit_s,
                           best_effort=args.best_effort, **options)
    text = json.dumps(allocation.to_json(), indent=2) + "\n"
    if args.out is None:
        sys.stdout.write(text)
    else:
        try:
            Path(args.out).write_text(text, encoding="utf-8")
        except OSError as err:
            raise _UsageError(f"cannot write {args.out}: {err.strerror or err}") from None
    if not allocation.success:
        print(f"allocopt: warning: {allocation.status.value}: {allocation.message}", file=sys.stderr)
    return 0


def _read_problem(source: str) -> Problem:
    name = "<stdin>" if source == "-" else source
    try:
        text = sys.stdin.read() if source == "-" else Path(source).read_text(encoding="utf-8")
    except OSError as err:
        raise _UsageError(f"cannot read problem file {source}: {err.strerror or err}") from None
    except UnicodeDecodeError as err:
        raise _UsageError(f"{name} is not UTF-8 text: {err}") from None
    try:
        document = json.loads(text)
    except json.JSONDecodeError as err:
        raise _UsageError(f"{name}: invalid JSON at line {err.lineno}, column {err.colno}: {err.msg}") from None
    try:
        return Problem.from_json(document)
    except AllocoptError:
        raise
    except (TypeError, ValueError) as err:  # malformed values Problem.from_json does not name itself
        raise _UsageError(f"{name}: invalid problem: {err}") from None


# ----- allocopt demo --------------------------------------------------------------------
def _run_demo(args: argparse.Namespace) -> int:
    get_policy(args.policy)
    names = args.backends or installed_backends()
    unknown = [n for n in names if n not in BACKENDS]
    if unknown:
        raise UnknownBackendError(f"unknown backend(s) {unknown} in --backends; choose from {', '.join(BACKENDS)}")
    for name in names:
        get_backend(name).check_installed()

    table = ThroughputTable.gavel()
    cluster = Cluster(DEMO_CLUSTER)
    jobs = table.sample_jobs(cluster, args.jobs, seed=args.seed)
    problem = table.sample_problem(cluster, args.jobs, seed=args.seed)
    print(f"allocopt demo: {args.policy} on {args.jobs} jobs drawn from Gavel's measured throughputs "
          f"(seed {args.seed})\n")
    _print_problem(problem, jobs)

    allocations: dict[str, Allocation] = {}
    rows, notes, failed = [], [], False
    for name in names:
        try:
            with _solver_output_to_stderr():
                alloc = solve(problem, args.policy, backend=name)
        except LicenseError as err:
            rows.append([name, "skipped"] + ["-"] * 5)
            notes.append(f"{name}: skipped, {err}")
            continue
        except (NotOptimalError, SolverError) as err:
            rows.append([name, "failed"] + ["-"] * 5)
            notes.append(f"{name}: {err}")
            failed = True
            continue
        allocations[name] = alloc
        t = alloc.timings
        rows.append([name, alloc.status.value, _number(alloc.objective)]
                    + [f"{v:.4f}" for v in (t.model_build_s, t.solver_build_s, t.solve_s, t.total_s)])
    print("Backends (times in seconds)")
    print(_format_table(["backend", "status", "objective", "model build", "solver build", "solve", "total"],
                        rows, left=2))
    for note in notes:
        print(f"  note: {note}")
    objectives = [a.objective for a in allocations.values() if a.objective is not None]
    if len(objectives) > 1:
        spread = (max(objectives) - min(objectives)) / max(max(map(abs, objectives)), 1e-12)
        print(f"  agreement: max relative objective difference across {len(objectives)} backends: {spread:.1e}")
    if allocations:
        name, alloc = next(iter(allocations.items()))
        print(f"\nAllocation by {name} ({args.policy})")
        _print_allocation(alloc, jobs)
    return EXIT_FAILURE if failed or not allocations else 0


# ----- allocopt fit-profiles -------------------------------------------------------------
def _run_fit_profiles(args: argparse.Namespace) -> int:
    from allocopt.throughput.profiles import ProfileFormatError, discover, load_application

    try:
        pairs = discover(args.profile_dir)
    except ProfileFormatError as err:
        raise _UsageError(str(err)) from None
    results: list[dict[str, Any]] = []
    rows = []
    for app, gpu_type in pairs:
        try:
            profile = load_application(args.profile_dir, app, gpu_type)
            held = profile.heldout_error()
        except ProfileFormatError as err:
            print(f"allocopt: warning: skipped {app} on {gpu_type}: {err}", file=sys.stderr)
            results.append({"application": app, "gpu_type": gpu_type, "median_abs_rel_error": None,
                            "n_heldout": 0, "error": str(err)})
            rows.append([app, gpu_type, "-", "0", "skipped"])
            continue
        error = None if np.isnan(held.median_abs_rel_error) else held.median_abs_rel_error
        results.append({"application": app, "gpu_type": gpu_type, "median_abs_rel_error": error,
                        "n_heldout": held.n_heldout})
        rows.append([app, gpu_type, str(len(profile.observations)), str(held.n_heldout),
                     "-" if error is None else f"{error:.1%}"])
    if all("error" in r for r in results):
        raise _UsageError(f"no (application, GPU type) pair under {args.profile_dir} could be fitted")
    table = sys.stderr if args.json_out == "-" else sys.stdout
    print(f"Held-out iteration-time error of the fitted throughput model ({args.profile_dir})", file=table)
    print(_format_table(["application", "GPU type", "rows", "held out", "median |rel. error|"], rows, left=2),
          file=table)
    fitted = [r["median_abs_rel_error"] for r in results if r["median_abs_rel_error"] is not None]
    print(f"  {sum(e <= 0.10 for e in fitted)} of {len(fitted)} pairs with multi-GPU data within 10%", file=table)
    if args.json_out is not None:
        text = json.dumps(results, indent=2) + "\n"
        if args.json_out == "-":
            sys.stdout.write(text)
        else:
            try:
                Path(args.json_out).write_text(text, encoding="utf-8")
            except OSError as err:
                raise _UsageError(f"cannot write {args.json_out}: {err.strerror or err}") from None
    return 0


def _print_problem(problem: Problem, jobs: Sequence[tuple[str, int]]) -> None:
    cluster = problem.cluster
    gpus = _gpus(dict(zip(cluster.gpu_types, cluster.capacity.tolist())), sep="  ")
    scales, counts = np.unique(problem.scale_factors, return_counts=True)
    by_scale = ", ".join(f"{c} x {s} GPU{'s' if s > 1 else ''}" for s, c in zip(scales, counts))
    print(f"Cluster  {gpus}  ({cluster.capacity.sum()} GPUs)")
    print(f"Jobs     {problem.num_jobs} jobs of {len({m for m, _ in jobs})} models: {by_scale} "
          f"({problem.scale_factors.sum()} GPUs requested)\n")


def _print_allocation(alloc: Allocation, jobs: Sequence[tuple[str, int]]) -> None:
    problem = alloc.problem
    used = alloc.gpus_used
    print(_format_table(["GPU type", "GPUs used", "capacity", "utilization"],
                        [[t, f"{u:.1f}", str(c), f"{u / c:.1%}" if c else "-"]
                         for t, u, c in zip(problem.gpu_types, used, problem.capacity)]))
    norm = alloc.fair_share_ratio
    print(f"\nFair-share ratio s*e/(w*p), 1.0 = a cluster-proportional share: "
          f"min {norm.min():.3f}  median {np.median(norm):.3f}  max {norm.max():.3f}")
    order = np.argsort(norm, kind="stable")
    picks = order[np.unique(np.linspace(0, len(order) - 1, 5).round().astype(int))]
    print("\nExample jobs, from lowest to highest fair-share ratio (time fraction per GPU type)")
    rows = [[str(problem.job_ids[i]), jobs[i][0], str(jobs[i][1])]
            + [f"{x:.3f}" for x in alloc.matrix[i]]
            + [f"{alloc.effective_throughput[i]:.2f}", f"{norm[i]:.3f}"] for i in picks]
    print(_format_table(["job", "model", "GPUs", *problem.gpu_types, "steps/s", "ratio"], rows,
                        left=2))


def _gpus(counts: dict[str, int], sep: str = ", ") -> str:
    return sep.join(f"{t}={c}" for t, c in counts.items())


def _number(value: float | None) -> str:
    return "-" if value is None else f"{value:.6g}"


def _format_table(header: Sequence[str], rows: Sequence[Sequence[str]], *, left: int = 1) -> str:
    """Fixed-width columns, the first ``left`` left-aligned and the rest right-aligned."""
    widths = [max(len(row[k]) for row in [header, *rows]) for k in range(len(header))]
    lines = ["  ".join(cell.ljust(w) if k < left else cell.rjust(w)
                       for k, (cell, w) in enumerate(zip(row, widths))).rstrip()
             for row in [header, *rows]]
    return "\n".join("  " + line for line in lines)
