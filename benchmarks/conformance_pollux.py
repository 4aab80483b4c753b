"""Conformance of :class:`allocopt.adapters.sia_simulator.PolluxSimulatorPolicy` with Sia's port of Pollux.

Sia's simulator (github.com/siasosp23/artifacts, ``sia-simulator/``) stays outside
this repository: point ``--sia-dir`` at a checkout and run this script with a
Python that has Sia's dependencies for its Pollux (numpy < 1.24, pandas < 2,
pymoo 0.4.2.1, cvxpy, scipy) and allocopt's (highspy)::

    python benchmarks/conformance_pollux.py --sia-dir /tmp/sia --workloads workload-1 --max-jobs 10 --seeds 3 \
        --stand-in-python /path/to/venv-with-pymoo-0.6/bin/python

Each workload runs Sia's heterogeneity-unaware simulator
(``multi_simulator_unaware.multi_simulate``: 16 virtual nodes of 4 GPUs on its
64-GPU cluster, ``--policy pollux``, p = -1, 60 s rounds) with Sia's
``PolluxPolicyUnaware`` (its NSGA-II search, pymoo 0.4), then with the allocopt
stand-in bound as ``pollux_unaware.PolluxPolicyUnaware`` by a shim module first
on ``sys.path`` (nothing of Sia's is modified): ``technique="genetic"`` (Pollux's
search on pymoo 0.6) and exact (the MILP). Runs whose policy draws random
numbers are repeated for ``--seeds`` seeds (numpy's global seed at the start of
the simulation) and averaged. Prints average JCT and makespan and the ratios of
the stand-in's average JCT to Sia's.

``--dump-rounds DIR`` makes Sia's own run pickle every round into
``DIR/<workload>-seed<s>/round-NNNNN.pkl``: the round's :class:`PolluxProblem`
(:func:`~allocopt.adapters.pollux_simulator.pollux_problem_from_sia`), the replicas
Sia's search chose, the fitness Sia's own ``Problem`` gives them and the
seconds its ``optimize()`` took; ``bench_pollux.py --dumped DIR`` solves them exactly.

The results file (``--results``, default ``benchmarks/results/conformance_pollux.json``; ``--json``
names it too) has a row per workload and every run's numbers (per-job timelines too); it is
rewritten after every workload, so an interrupted run keeps the workloads it finished.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from conformance_table import cell, ratio  # benchmarks/, next to this script

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from allocopt.bench.machine import machine_info  # noqa: E402
from allocopt.bench.output import (  # noqa: E402
    Column,
    add_results_option,
    results_table,
    write_results,
)

DUMP_SHIM = '''"""Sia's own PolluxPolicyUnaware, each round's inputs and answer pickled (conformance_pollux.py)."""
import importlib.util
import os
import pickle
import time
from pathlib import Path

import numpy as np

from allocopt.adapters.pollux_simulator import pollux_problem_from_sia

_spec = importlib.util.spec_from_file_location("_sia_pollux_unaware", os.environ["ALLOCOPT_SIA_POLLUX"])
_sia = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_sia)
DUMP = os.environ.get("ALLOCOPT_POLLUX_DUMP")


class PolluxPolicyUnaware(_sia.PolluxPolicyUnaware):
    def optimize(self, jobs, nodes, base_allocations, node_template):
        problem, order, node_keys = pollux_problem_from_sia(jobs, nodes, base_allocations)
        started = time.perf_counter()
        allocations, desired = super().optimize(jobs, nodes, base_allocations, node_template)
        seconds = time.perf_counter() - started
        if DUMP:
            at = {key: k for k, key in enumerate(node_keys)}
            replicas = np.zeros((len(order), len(node_keys)), dtype=np.int64)
            for i, key in enumerate(order):
                for node in allocations.get(key, []):
                    replicas[i, at[node]] += 1
            # Sia's own fitness of its answer (its Problem, in its job and node order)
            own = _sia.Problem([jobs[key] for key in order], [nodes[key] for key in node_keys],
                               problem.previous.copy(), self.p_fairness)
            out = {}
            own._evaluate(replicas.reshape(1, -1), out)
            path = Path(DUMP) / f"round-{len(list(Path(DUMP).glob('round-*.pkl'))):05d}.pkl"
            path.write_bytes(pickle.dumps({"problem": problem, "replicas": replicas, "seconds": seconds,
                                           "sia_fitness": float(-out["F"][0, 0]), "p": self.p_fairness}))
        return allocations, desired
'''

STAND_IN_SHIM = '''"""allocopt's stand-in bound as Sia's ``pollux_unaware.PolluxPolicyUnaware``."""
import os

from allocopt.adapters.sia_simulator import PolluxSimulatorPolicy


class PolluxPolicyUnaware(PolluxSimulatorPolicy):
    def __init__(self, p_fairness=-1):
        super().__init__(p_fairness, technique=os.environ.get("ALLOCOPT_POLLUX_TECHNIQUE", "auto"),
                         seed=int(os.environ.get("ALLOCOPT_POLLUX_SEED", "0")))
'''

# Under pymoo >= 0.5 (allocopt's genetic search) Sia's other pymoo 0.4 policies cannot be imported; the
# unaware simulator only names them in isinstance checks, so the stand-in's shim puts classes of the same
# names first on sys.path (Sia's files stay untouched).
PLACEHOLDERS = {"sia_unaware.py": "class SiaUnaware:\n    pass\n",
                "pollux_unaware_fix.py": "class PolluxPolicyUnawareFix:\n    pass\n"}

RUN = """
import contextlib, io, json, os, random, sys, time, types
import numpy as np
sys.path[:0] = [{shim!r}, {simulator!r}]
os.chdir({simulator!r})
np.random.seed({seed}); random.seed({seed})
import simulator_config
simulator_config.cluster_nnodes = {nnodes!r}
import multi_simulator_unaware
args = types.SimpleNamespace(workload={workload!r}, policy='pollux', policy_p_val=-1.0, mip_lambda_n=None,
                             mip_lambda_a=None, cluster_scale=None, interval=60, output=None, debug=False, nfuture=5)
t0 = time.perf_counter()
with contextlib.redirect_stdout(io.StringIO()):
    logs, jcts = multi_simulator_unaware.multi_simulate(args)
import pollux_unaware
makespan = max(j['completion_time'] for j in logs[-1]['submitted_jobs'])
jobs = {{j['name']: [j['submission_time'], j['start_time'], j['completion_time'], j['num_restarts']]
        for j in logs[-1]['submitted_jobs']}}
print('CONFORMANCE ' + json.dumps({{'average_jct_s': sum(jcts.values()) / len(jcts), 'makespan_s': makespan,
                                    'jobs': len(jcts), 'rounds': len(logs), 'wall_s': time.perf_counter() - t0,
                                    'policy_file': pollux_unaware.__file__, 'per_job': jobs}}))
"""

#: Nodes per GPU type of Sia's simulated 64-GPU cluster (``simulator_config.py``).
SATURN = {"aws": 6, "dgx-ext": 2, "rtx": 3}


def run(simulator: Path, workload: Path, shim: Path, seed: int, timeout_s: float, env_extra: dict,
        python: str | None = None) -> dict:
    code = RUN.format(shim=str(shim), simulator=str(simulator), workload=str(workload), seed=seed, nnodes=SATURN)
    env = dict(os.environ, ALLOCOPT_SIA_POLLUX=str(simulator / "pollux_unaware.py"), **env_extra)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    try:
        proc = subprocess.run([python or sys.executable, "-c", code], env=env, capture_output=True, text=True,
                              timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return {"error": f"over {timeout_s:.0f} s"}
    match = re.search(r"^CONFORMANCE (.*)$", proc.stdout, flags=re.M)
    if proc.returncode != 0 or not match:
        return {"error": ((proc.stderr.strip().splitlines() or ["no output"])[-1])[:200]}
    result = json.loads(match.group(1))
    if not result["policy_file"].startswith(str(shim)):
        return {"error": f"the shim was not imported ({result['policy_file']})"}
    return result


def mean(results: list[dict]) -> dict:
    """Average JCT and makespan over seeds (an error if any seed failed)."""
    errors = [r for r in results if "error" in r]
    if errors or not results:
        return errors[0] if errors else {}
    return {"average_jct_s": sum(r["average_jct_s"] for r in results) / len(results),
            "makespan_s": sum(r["makespan_s"] for r in results) / len(results), "jobs": results[0]["jobs"],
            "runs": [round(r["average_jct_s"], 1) for r in results], "per_job": results[0]["per_job"]}


def truncated(workload: Path, max_jobs: int | None, directory: Path) -> Path:
    """The workload's first ``max_jobs`` jobs by submission time, as a CSV in ``directory``."""
    if not max_jobs:
        return workload
    lines = workload.read_text().splitlines()
    header, rows = lines[0], lines[1:]
    column = header.split(",").index("time")
    rows = sorted(rows, key=lambda row: float(row.split(",")[column]))[:max_jobs]
    path = directory / f"{workload.stem}-first{max_jobs}.csv"
    path.write_text("\n".join([header, *rows]) + "\n")
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sia-dir", required=True, type=Path,
                        help="a checkout of siasosp23/artifacts (or its sia-simulator/ folder)")
    parser.add_argument("--workloads", nargs="*", default=["workload-1"], help="saturn workload names (no .csv)")
    parser.add_argument("--max-jobs", type=int, default=10, help="first jobs of each workload (0: all)")
    parser.add_argument("--seeds", type=int, default=1, help="seeds of the runs that draw random numbers")
    parser.add_argument("--first-seed", type=int, default=0, help="seeds are first-seed, first-seed + 1, ...")
    parser.add_argument("--timeout", type=float, default=3600.0, help="seconds per simulation")
    parser.add_argument("--skip-sia", action="store_true", help="leave out Sia's own Pollux")
    parser.add_argument("--skip-genetic", action="store_true", help="leave out the stand-in's genetic search")
    parser.add_argument("--skip-exact", action="store_true", help="leave out the exact stand-in")
    parser.add_argument("--dump-rounds", metavar="DIR", type=Path,
                        help="Sia's own run pickles each round into DIR/<workload>-seed<s>/ (bench_pollux.py --dumped)")
    parser.add_argument("--stand-in-python", default=None,
                        help="the Python of the stand-in's runs (its genetic search needs pymoo >= 0.6, Sia's "
                             "Pollux pymoo 0.4.2.1: two environments); default this one")
    add_results_option(parser, "conformance_pollux", Path(__file__).parent / "results", ("--results", "--json"))
    args = parser.parse_args(argv)
    machine = machine_info()
    simulator = args.sia_dir.resolve()
    if (simulator / "sia-simulator").is_dir():
        simulator = simulator / "sia-simulator"
    if not (simulator / "multi_simulator_unaware.py").is_file():
        parser.error(f"{args.sia_dir} holds no sia-simulator/multi_simulator_unaware.py")
    everything, rows = {}, []
    with tempfile.TemporaryDirectory(prefix="allocopt-pollux-shim-") as tmp:
        shims = {}
        for name, text in (("sia", DUMP_SHIM), ("stand_in", STAND_IN_SHIM)):
            shims[name] = Path(tmp) / name
            shims[name].mkdir()
            (shims[name] / "pollux_unaware.py").write_text(text)
            if name == "stand_in":
                for file, placeholder in PLACEHOLDERS.items():
                    (shims[name] / file).write_text(placeholder)
        print(f"Sia's unaware simulator, saturn (first {args.max_jobs or 'all'} jobs), 16 x 4-GPU nodes, Pollux "
              f"p=-1, 60 s rounds, {args.seeds} seed(s); ratio = stand-in / Sia average JCT")
        header = (f"{'workload':<12} {'jobs':>4} {'Sia JCT s':>10} {'makespan s':>11} {'genetic':>10} {'ratio':>7} "
                  f"{'exact':>10} {'ratio':>7} {'makespan':>10}")
        print(header)
        print("-" * len(header))
        for name in args.workloads:
            workload = truncated(simulator / "workloads" / "saturn" / f"{name}.csv", args.max_jobs, Path(tmp))
            t0 = time.perf_counter()
            sia, genetic = [], []
            for seed in range(args.first_seed, args.first_seed + args.seeds):
                extra = {}
                if args.dump_rounds:
                    dump = args.dump_rounds.resolve() / f"{name}-seed{seed}"
                    dump.mkdir(parents=True, exist_ok=True)
                    extra["ALLOCOPT_POLLUX_DUMP"] = str(dump)
                if not args.skip_sia:
                    sia.append(run(simulator, workload, shims["sia"], seed, args.timeout, extra))
                if not args.skip_genetic:
                    genetic.append(run(simulator, workload, shims["stand_in"], seed, args.timeout,
                                       {"ALLOCOPT_POLLUX_TECHNIQUE": "genetic", "ALLOCOPT_POLLUX_SEED": str(seed)},
                                       args.stand_in_python))
            exact = {} if args.skip_exact else run(simulator, workload, shims["stand_in"], 0, args.timeout,
                                                   {"ALLOCOPT_POLLUX_TECHNIQUE": "auto"}, args.stand_in_python)
            base, ga = mean(sia), mean(genetic)
            print(f"{name:<12} {base.get('jobs', exact.get('jobs', 0)):>4} {cell(base, 'average_jct_s', 10)} "
                  f"{cell(base, 'makespan_s', 11)} {cell(ga, 'average_jct_s', 10)} {ratio(ga, base)} "
                  f"{cell(exact, 'average_jct_s', 10)} {ratio(exact, base)} {cell(exact, 'makespan_s', 10)}   "
                  f"({time.perf_counter() - t0:.0f} s)", flush=True)
            for label, result in (("Sia", base), ("genetic", ga), ("exact", exact)):
                if "error" in result:
                    print(f"    {label}: {result['error']}")
                elif "runs" in result and len(result["runs"]) > 1:
                    print(f"    {label} per seed: {result['runs']}")
            everything[name] = {"sia": sia, "genetic": genetic, "exact": exact}
            rows.append(_row(name, base, ga, exact))
            if args.results:  # after every workload: an interrupted run keeps its rows
                seeds = list(range(args.first_seed, args.first_seed + args.seeds))
                title = (f"Sia's unaware simulator (saturn, first {args.max_jobs or 'all'} jobs, 16 x 4-GPU nodes, "
                         f"Pollux p=-1) with Sia's PolluxPolicyUnaware and allocopt's stand-in; Sia's and genetic "
                         f"averaged over {args.seeds} seed(s); ratios to Sia's average JCT")
                write_results(args.results, "conformance_pollux", machine=machine,
                              data={"max_jobs": args.max_jobs, "seeds": seeds, "rows": rows, "runs": everything},
                              tables=[results_table(title, rows, ROW_COLUMNS)])
    return 0


ROW_COLUMNS = [Column("workload", "workload", left=True), Column("jobs", "jobs"),
               Column("sia_jct_s", "Sia avg JCT s", ",.1f"), Column("sia_makespan_s", "Sia makespan s", ",.0f"),
               Column("genetic_jct_s", "genetic avg JCT s", ",.1f"), Column("genetic_ratio", "ratio", ".4f"),
               Column("exact_jct_s", "exact avg JCT s", ",.1f"), Column("exact_ratio", "ratio", ".4f"),
               Column("exact_makespan_s", "exact makespan s", ",.0f")]


def _row(name: str, base: dict, genetic: dict, exact: dict) -> dict:
    """A workload's row of the results table: average JCT and makespan of each run, ratios to Sia's JCT."""
    def over(a: dict, b: dict) -> float | None:
        return a["average_jct_s"] / b["average_jct_s"] if "average_jct_s" in a and "average_jct_s" in b else None

    return {"workload": name, "jobs": base.get("jobs", genetic.get("jobs", exact.get("jobs"))),
            "sia_jct_s": base.get("average_jct_s"), "sia_makespan_s": base.get("makespan_s"),
            "genetic_jct_s": genetic.get("average_jct_s"), "genetic_ratio": over(genetic, base),
            "exact_jct_s": exact.get("average_jct_s"), "exact_ratio": over(exact, base),
            "exact_makespan_s": exact.get("makespan_s"),
            "errors": {label: r["error"] for label, r in (("sia", base), ("genetic", genetic), ("exact", exact))
                       if "error" in r}}


if __name__ == "__main__":
    sys.exit(main())
