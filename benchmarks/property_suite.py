#!/usr/bin/env python
"""The property checks of ``tests/test_properties.py`` over a long budget of random problems.

Each problem (seeded, both families: moderate and the wide edges of the supported
numeric range, with and without entities) is solved with every policy of the suite
on every backend asked for; each answer must be optimal, pass allocopt's own check
(``allocopt.verify``, inside ``allocopt.solve``) and the base constraints, and agree
with HiGHS. Every ``--reference-every``-th moderate problem with at most 6 jobs is
also compared with the dense ``scipy.optimize.linprog`` formulations of the test
file; water-filling's exact levels on both families, with the exact lexicographic
max-min vector (``dense_water_filling(..., exact=True)``). Prints the counts by
outcome (``ok``, ``disagree``, ``error:<type>``, ``infeasible-answer``) per policy
and backend, and exits 1 if anything but ``ok`` was counted.

Usage::

    python benchmarks/property_suite.py --budget 5000 --jobs 2
    python benchmarks/property_suite.py --budget 500 --backends pulp,cvxpy --seed 7
    python benchmarks/property_suite.py --budget 2500 --first 2500  # problems 2500..4999 of the run
    python benchmarks/property_suite.py --policies water_filling,water_filling/float --seed 1
    python benchmarks/property_suite.py --budget 150 --sizes 20-120x2-8 --seed 23  # larger problems
"""

from __future__ import annotations

import argparse
import collections
import multiprocessing
import signal
import sys
import time
import traceback
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

import test_properties as props  # noqa: E402

import allocopt  # noqa: E402
from allocopt.bench.machine import machine_info  # noqa: E402
from allocopt.bench.output import (  # noqa: E402
    Column,
    add_results_option,
    results_table,
    write_results,
)
from allocopt.errors import LicenseError  # noqa: E402

FEAS_TOL = 1e-6


def draw(seed: int, index: int, jobs: tuple[int, int] = (1, 12), types: tuple[int, int] = (1, 4)
         ) -> tuple[int, int, int, bool, bool]:
    """Problem ``index`` of the run: (seed, n_jobs, n_types, wide, entities); ``jobs`` and ``types`` are
    the (inclusive) ranges of the sizes."""
    rng = np.random.default_rng([seed, index])
    return (int(rng.integers(2**32)), int(rng.integers(jobs[0], jobs[1] + 1)),
            int(rng.integers(types[0], types[1] + 1)), bool(rng.random() < 0.5), bool(rng.random() < 0.5))


def feasible(alloc: allocopt.Allocation) -> bool:
    problem, X = alloc.problem, alloc.matrix
    used = alloc.gpus_used
    return bool(np.all(X >= -FEAS_TOL) and np.all(alloc.time_fraction <= 1 + FEAS_TOL)
                and np.all(used <= problem.capacity + FEAS_TOL * np.maximum(problem.capacity, 1))
                and np.all(X[~problem.runnable] <= FEAS_TOL))


def agree(policy: str, backend: str, alloc: allocopt.Allocation, reference: allocopt.Allocation) -> bool:
    tol = props.AGREEMENT[backend]
    a, b = alloc.objective, reference.objective
    if abs(a - b) > tol * max(abs(a), abs(b)) + 1e-12:
        return False
    if policy.startswith("water_filling"):
        u = props.rates(alloc.problem).max(axis=1)
        return bool(np.all(np.abs(props.normalized(alloc) - props.normalized(reference)) <= 10 * tol * u + 1e-12))
    return True


def check(args: tuple[int, int, tuple[str, ...], int, tuple[str, ...], tuple[int, int], tuple[int, int]]
          ) -> list[tuple[str, str, str, str]]:
    """Outcomes (policy, backend, outcome, detail) of one problem."""
    seed, index, backends, reference_every, policies, jobs, types = args
    problem_seed, n_jobs, n_types, wide, entities = draw(seed, index, jobs, types)
    out = []
    problem, entity_policies = props.make_problem(problem_seed, n_jobs, n_types, wide, entities)
    tag = f"seed={problem_seed} n_jobs={n_jobs} n_types={n_types} wide={wide} entities={entities}"
    for policy in policies:
        name, options = policy.split("/")[0], dict(props.POLICIES[policy])
        if name == "water_filling":
            options["entity_policies"] = entity_policies
        answers = {}
        for backend in ("highs", *[b for b in backends if b != "highs"]):
            if backend == "gurobi" and n_jobs > 3:
                continue
            try:
                alloc = allocopt.solve(problem, name, backend=backend, **options)
            except LicenseError:
                continue
            except Exception as err:  # counted and reported, never hidden
                out.append((policy, backend, f"error:{type(err).__name__}", f"{tag}: {err}"[:300]))
                continue
            if alloc.status is not allocopt.Status.OPTIMAL or not feasible(alloc):
                out.append((policy, backend, "infeasible-answer", f"{tag}: {alloc.status} {alloc.message}"[:300]))
                continue
            answers[backend] = alloc
            if backend in backends:
                ok = backend == "highs" or "highs" not in answers or agree(policy, backend, alloc, answers["highs"])
                out.append((policy, backend, "ok" if ok else "disagree", tag))
        exact = policy == "water_filling"  # its exact levels: checked on both families
        if (reference_every and index % reference_every == 0 and (exact or not wide) and n_jobs <= 6
                and "highs" in answers and policy != "min_makespan" and policy != "finish_time_fairness"):
            alloc = answers["highs"]
            try:
                if policy == "max_throughput":
                    ok = abs(alloc.objective - props.dense_max_throughput(problem)) <= 1e-7 * abs(alloc.objective)
                elif name == "water_filling":
                    expected = props.dense_water_filling(problem, entity_policies, exact=exact)
                    ok = bool(np.all(np.abs(props.normalized(alloc) - expected)
                                     <= (1e-8 if exact else 1e-5) * props.rates(problem).max(axis=1)))
                else:
                    expected = props.dense_max_min(problem, policy == "max_min_fairness")
                    ok = abs(alloc.objective - expected) <= 1e-7 * abs(expected)
                out.append((policy, "dense-reference", "ok" if ok else "disagree", tag))
            except Exception:
                out.append((policy, "dense-reference", "error:reference", f"{tag}: {traceback.format_exc(limit=1)}"))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--budget", type=int, default=5000, help="number of random problems (default 5000)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--first", type=int, default=0,
                        help="index of the first problem, to run a long budget in ranges (default 0)")
    parser.add_argument("--backends", default="highs,scipy,pulp,cvxpy",
                        help="comma-separated backends (gurobi only on problems of at most 3 jobs)")
    parser.add_argument("--policies", default=",".join(props.POLICIES),
                        help="comma-separated policies of the suite (default: all of them)")
    parser.add_argument("--jobs", type=int, default=1, help="worker processes")
    parser.add_argument("--reference-every", type=int, default=5,
                        help="compare every N-th small moderate problem with the dense formulation (0: never)")
    parser.add_argument("--sizes", default="1-12x1-4",
                        help="ranges of jobs and GPU types, JOBSxTYPES (default 1-12x1-4; the dense reference "
                             "only at 6 jobs or fewer)")
    add_results_option(parser, "property_suite", Path(__file__).parent / "results", ("--results", "--json"))
    args = parser.parse_args(argv)
    try:
        jobs, types = (tuple(int(v) for v in part.split("-")) for part in args.sizes.split("x"))
        if len(jobs) != 2 or len(types) != 2 or not (1 <= jobs[0] <= jobs[1] and 1 <= types[0] <= types[1]):
            raise ValueError
    except ValueError:
        parser.error(f"--sizes {args.sizes!r}: expected JOBSxTYPES ranges such as 1-12x1-4 or 20-120x2-8")
    backends = tuple(b for b in args.backends.split(",") if b)
    policies = tuple(p for p in args.policies.split(",") if p)
    unknown = sorted(set(policies) - set(props.POLICIES))
    if unknown:
        parser.error(f"unknown policies {unknown}; the suite's are {', '.join(props.POLICIES)}")
    machine = machine_info()
    tasks = [(args.seed, i, backends, args.reference_every, policies, jobs, types)
             for i in range(args.first, args.first + args.budget)]
    counts: collections.Counter = collections.Counter()
    failures: list[tuple[str, str, str, str]] = []
    t0 = time.perf_counter()
    done = 0
    # SIGINT (Ctrl-C) or SIGTERM stops early and still reports the problems done (a shell ignores
    # SIGINT in the background jobs it starts, so it is restored here)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        with multiprocessing.Pool(args.jobs, _worker_signals) if args.jobs > 1 else _Serial() as pool:
            for outcomes in pool.imap_unordered(check, tasks, chunksize=4):
                done += 1
                for policy, backend, outcome, detail in outcomes:
                    counts[(policy, backend, outcome)] += 1
                    if outcome != "ok":
                        failures.append((policy, backend, outcome, detail))
                        print(f"{outcome}: {policy} on {backend}: {detail}", file=sys.stderr, flush=True)
                if done % 100 == 0:
                    print(f"{done}/{args.budget} problems, {time.perf_counter() - t0:.0f} s", file=sys.stderr,
                          flush=True)
    except KeyboardInterrupt:
        print(f"stopped after {done} of {args.budget} problems", file=sys.stderr)
    by_outcome = collections.Counter()
    for (policy, backend, outcome), count in sorted(counts.items()):
        print(f"{policy:24s} {backend:16s} {outcome:24s} {count}")
        by_outcome[outcome] += count
    print(f"{done} problems in {time.perf_counter() - t0:.0f} s; answers by outcome: {dict(by_outcome)}")
    if args.results:
        table: dict[tuple[str, str], collections.Counter] = {}
        for (policy, backend, outcome), count in sorted(counts.items()):
            table.setdefault((policy, backend), collections.Counter())[outcome] += count
        rows = [{"policy": policy, "backend": backend, "ok": c.get("ok", 0),
                 "other": ", ".join(f"{o}: {n}" for o, n in sorted(c.items()) if o != "ok") or "-"}
                for (policy, backend), c in table.items()]
        write_results(args.results, "property_suite", machine=machine,
                      tables=[results_table(f"Answers by outcome on {done:,} random problems (seed {args.seed}, "
                                            f"sizes {args.sizes})", rows,
                                            [Column("policy", "policy", left=True),
                                             Column("backend", "backend", left=True), Column("ok", "ok", ","),
                                             Column("other", "other outcomes", left=True)])],
                      data={"budget": args.budget, "first": args.first, "done": done, "seed": args.seed,
                            "sizes": args.sizes, "backends": backends,
                            "counts": [[*k, v] for k, v in sorted(counts.items())], "failures": failures})
    return 0 if set(by_outcome) <= {"ok"} else 1


def _worker_signals() -> None:
    """Workers leave Ctrl-C to the main process and die on the SIGTERM its pool sends at the end (with
    the main process's handlers, forked, a worker raised KeyboardInterrupt there, sometimes while
    holding the task queue's lock, and the pool waited forever for the other worker)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


class _Serial:
    """``multiprocessing.Pool``'s ``imap_unordered`` in this process."""

    def __enter__(self) -> _Serial:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    @staticmethod
    def imap_unordered(function, tasks, chunksize: int = 1):
        return map(function, tasks)


if __name__ == "__main__":
    sys.exit(main())
