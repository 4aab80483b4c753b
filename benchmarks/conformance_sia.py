"""Conformance of :class:`allocopt.adapters.sia_simulator.SiaSimulatorPolicy` with Sia's own policy.

Sia's simulator (github.com/siasosp23/artifacts, ``sia-simulator/``) stays outside
this repository: point ``--sia-dir`` at a checkout and run this script with a
Python that has Sia's dependencies (pandas < 2, numpy < 1.24, scipy, cvxpy with
CBC (``cylp``), rich) and allocopt's (highspy)::

    python benchmarks/conformance_sia.py --sia-dir /tmp/sia --workloads workload-1 --max-jobs 40
    python benchmarks/conformance_sia.py --sia-dir /tmp/sia --suite phoebe --max-jobs 0

``--suite phoebe`` runs ``adaptdl/benchmark/phoebe_workload.csv`` of the artifact on
Sia's physical testbed (``simulator_config.py``'s phoebe cluster: 3 rtx, 2 dgx-ext
and 1 quad node). Each workload runs Sia's simulator (``multi_simulator.multi_simulate``, the
settings of Sia's ``run_experiment.sh``: p = -0.5, lambda_n = 1.1, 60 s rounds,
projected throughputs) three times: with Sia's ``SiaPolicy``, with the allocopt
stand-in at Sia's MIP gap (1e-4) and with it exact (``mip_gap=0``). The
stand-in is swapped in by a shim ``sia`` module first on ``sys.path`` that binds
it as ``sia.SiaPolicy``, so Sia's ``Cluster`` treats it as its own; nothing of
Sia's is modified. ``--sia-program CBC`` makes the stand-in solve Sia's own cvxpy
program with CBC (``SiaSimulatorPolicy(sia_program="CBC")``, needs cylp) instead of
allocopt's ``sia`` policy with HiGHS; ``--skip-sia`` leaves Sia's own run out.
``--allocopt-sia-program CBC`` has allocopt's own simulator solve Sia's program too
(``policy_options={"faithful_to_sia": True, "sia_program": "CBC"}``); ``--skip-stand-in``
leaves the stand-in out. ``--dump-rounds DIR`` pickles every round the stand-in solves (its
``GoodputProblem`` and options) for ``bench_sia.py --dumped DIR``. ``--max-jobs`` keeps the first jobs of a workload (by
submission) so runs stay short. Prints average JCT and makespan and the ratio
of the stand-in's average JCT to Sia's. Then allocopt's own simulator
(:func:`allocopt.mechanism.simulator.simulate` with ``policy="sia"`` and
``policy_options={"faithful_to_sia": True}``, on the profiles in the simulator's
``traces/`` read as Sia reads them (``load_profiles(..., sia_numbers=True)``) and the
same cluster) runs the same workload: its average JCT and makespan against Sia's
simulator with Sia's policy (with ``--allocopt-sia-program CBC`` identical to it on
the saturn 10-job samples and phoebe).
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

SHIM = '''"""allocopt's stand-in bound as Sia's ``sia.SiaPolicy``."""
import os
import pickle
from pathlib import Path

import allocopt.adapters.sia_simulator as stand_in
from allocopt.adapters.sia_simulator import SiaSimulatorPolicy, restart_penalty_s as get_restart_penalty  # noqa

DUMP = os.environ.get("ALLOCOPT_SIA_DUMP")
if DUMP:  # --dump-rounds: each round's GoodputProblem and solve options, pickled, in order
    solve = stand_in.solve

    def recording_solve(problem, policy, **options):
        path = Path(DUMP) / f"round-{len(list(Path(DUMP).glob('round-*.pkl'))):05d}.pkl"
        path.write_bytes(pickle.dumps({"problem": problem, "policy": policy, "options": options}))
        return solve(problem, policy, **options)

    stand_in.solve = recording_solve


class SiaPolicy(SiaSimulatorPolicy):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, mip_gap=float(os.environ.get("ALLOCOPT_SIA_MIP_GAP", "1e-4")),
                         sia_program=os.environ.get("ALLOCOPT_SIA_PROGRAM") or None, **kwargs)
'''

RUN = """
import contextlib, io, json, os, sys, time, types
sys.path[:0] = ([{shim!r}] if {shim!r} else []) + [{simulator!r}]
os.chdir({simulator!r})
import simulator_config
simulator_config.cluster_nnodes = {nnodes!r}
import multi_simulator
args = types.SimpleNamespace(workload={workload!r}, policy='sia', policy_p_val=-0.5, mip_lambda_n=1.1,
                             mip_lambda_a=0.01, cluster_scale=None, project_throughputs=True,
                             disable_bsz_tuning=False, share_max_replicas=True, oracle_num_nodes=0,
                             oracle_num_replicas=0, interval=60, output=None, debug=False)
t0 = time.perf_counter()
with contextlib.redirect_stdout(io.StringIO()):
    logs, jcts = multi_simulator.multi_simulate(args)
import sia
makespan = max(j['completion_time'] for j in logs[-1]['submitted_jobs'])
print('CONFORMANCE ' + json.dumps({{'average_jct_s': sum(jcts.values()) / len(jcts), 'makespan_s': makespan,
                                    'jobs': len(jcts), 'rounds': len(logs), 'wall_s': time.perf_counter() - t0,
                                    'policy_file': sia.__file__}}))
"""


#: Nodes per GPU type of Sia's simulated clusters (``simulator_config.py``; the order is Sia's).
CLUSTERS = {"saturn": {"aws": 6, "dgx-ext": 2, "rtx": 3}, "phoebe": {"rtx": 3, "dgx-ext": 2, "quad": 1}}
GPUS_PER_NODE = {"aws": 4, "azure": 8, "dgx": 8, "dgx-ext": 8, "quad": 4, "rtx": 8}

ALLOCOPT = """
import json, sys, time
from allocopt import Cluster
from allocopt.mechanism.simulator import simulate
from allocopt.throughput.profiles import load_profiles
nnodes = {nnodes!r}
cluster = Cluster({{t: n * {per_node!r}[t] for t, n in nnodes.items()}}, {{t: {per_node!r}[t] for t in nnodes}})
t0 = time.perf_counter()
result = simulate({workload!r}, cluster, "sia", profiles=load_profiles({traces!r}, sia_numbers=True),
                  round_seconds=60.0, policy_options={options!r})
print("CONFORMANCE " + json.dumps({{"average_jct_s": result.metrics["average_jct_s"],
                                    "makespan_s": result.metrics["makespan_s"], "jobs": result.metrics["num_jobs"],
                                    "rounds": result.metrics["num_rounds"], "wall_s": time.perf_counter() - t0}}))
"""


def run(simulator: Path, workload: Path, shim: Path | None, mip_gap: float, timeout_s: float,
        nnodes: dict | None = None, code: str | None = None, sia_program: str | None = None,
        dump: Path | None = None) -> dict:
    nnodes = nnodes or CLUSTERS["saturn"]
    code = code or RUN.format(shim=str(shim) if shim else "", simulator=str(simulator), workload=str(workload),
                              nnodes=nnodes)
    env = dict(os.environ, ALLOCOPT_SIA_MIP_GAP=repr(mip_gap), ALLOCOPT_SIA_PROGRAM=sia_program or "",
               ALLOCOPT_SIA_DUMP=str(dump or ""))
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    try:
        proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                              timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return {"error": f"over {timeout_s:.0f} s"}
    match = re.search(r"^CONFORMANCE (.*)$", proc.stdout, flags=re.M)
    if proc.returncode != 0 or not match:
        return {"error": ((proc.stderr.strip().splitlines() or ["no output"])[-1])[:160]}
    result = json.loads(match.group(1))
    if shim is not None and not result.get("policy_file", str(shim)).startswith(str(shim)):
        return {"error": f"Sia's own policy was imported ({result['policy_file']}), not the stand-in"}
    return result


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
    parser.add_argument("--suite", default="saturn", choices=sorted(CLUSTERS),
                        help="saturn: workloads/saturn/ of the simulator on its 64-GPU cluster; phoebe: the "
                             "artifact's adaptdl/benchmark/phoebe_workload.csv on the 44-GPU testbed")
    parser.add_argument("--workloads", nargs="*", default=["workload-1"],
                        help="workload names (no .csv; saturn only)")
    parser.add_argument("--skip-allocopt", action="store_true", help="leave out allocopt's own simulator")
    parser.add_argument("--max-jobs", type=int, default=40, help="first jobs of each workload (0: all)")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per simulation")
    parser.add_argument("--skip-exact", action="store_true", help="leave out the mip_gap=0 run")
    parser.add_argument("--sia-program", metavar="SOLVER", default=None,
                        help="the stand-in solves Sia's own cvxpy program with this cvxpy solver (Sia's: CBC) "
                             "instead of allocopt's sia policy with HiGHS")
    parser.add_argument("--allocopt-sia-program", metavar="SOLVER", default=None,
                        help="allocopt's own simulator solves Sia's own cvxpy program with this cvxpy solver "
                             "(policy option sia_program; Sia's: CBC)")
    parser.add_argument("--skip-stand-in", action="store_true", help="leave out the stand-in runs")
    parser.add_argument("--skip-sia", action="store_true",
                        help="leave out Sia's own policy (the ratio columns then show '-')")
    parser.add_argument("--dump-rounds", metavar="DIR", type=Path,
                        help="the stand-in's run (mip_gap 1e-4) pickles each round's GoodputProblem and solve "
                             "options into DIR/<workload>/round-NNNNN.pkl (bench_sia.py --dumped reads them)")
    add_results_option(parser, "conformance_sia", Path(__file__).parent / "results")
    args = parser.parse_args(argv)
    machine = machine_info()
    rows = []
    simulator = args.sia_dir.resolve()
    if (simulator / "sia-simulator").is_dir():
        simulator = simulator / "sia-simulator"
    nnodes = CLUSTERS[args.suite]
    if args.suite == "phoebe":
        phoebe = simulator.parent / "adaptdl" / "benchmark" / "phoebe_workload.csv"
        if not phoebe.is_file():
            parser.error(f"{phoebe} not found; --suite phoebe needs the whole artifact checkout as --sia-dir")
        workloads = [("phoebe", phoebe)]
    else:
        workloads = [(name, simulator / "workloads" / args.suite / f"{name}.csv") for name in args.workloads]
    if not (simulator / "multi_simulator.py").is_file():
        parser.error(f"{args.sia_dir} holds no sia-simulator/multi_simulator.py")
    options = {"faithful_to_sia": True}
    if args.allocopt_sia_program:
        options["sia_program"] = args.allocopt_sia_program
    with tempfile.TemporaryDirectory(prefix="allocopt-sia-shim-") as tmp:
        shim = Path(tmp) / "shim"
        shim.mkdir()
        (shim / "sia.py").write_text(SHIM)
        print(f"Sia's simulator, {args.suite} (first {args.max_jobs or 'all'} jobs), cluster {nnodes}, p=-0.5, "
              "lambda_n=1.1, 60 s rounds; ratio = stand-in / Sia average JCT; allocopt = allocopt's simulator "
              "(faithful_to_sia), its average JCT and makespan / Sia's")
        header = (f"{'workload':<12} {'jobs':>4} {'Sia JCT s':>10} {'makespan s':>11} {'stand-in':>10} {'ratio':>7} "
                  f"{'exact':>10} {'ratio':>7} {'allocopt':>10} {'ratio':>7} {'makespan':>8}")
        print(header)
        print("-" * len(header))
        for name, path in workloads:
            workload = truncated(path, args.max_jobs, Path(tmp))
            t0 = time.perf_counter()
            base = {} if args.skip_sia else run(simulator, workload, None, 1e-4, args.timeout, nnodes)
            dump = None
            if args.dump_rounds:
                dump = args.dump_rounds.resolve() / name
                dump.mkdir(parents=True, exist_ok=True)
            ours = {} if args.skip_stand_in else run(simulator, workload, shim, 1e-4, args.timeout, nnodes,
                                                     sia_program=args.sia_program, dump=dump)
            exact = {} if args.skip_exact or args.skip_stand_in else run(simulator, workload, shim, 0.0, args.timeout, nnodes,
                                                   sia_program=args.sia_program)
            own = {} if args.skip_allocopt else run(
                simulator, workload, None, 0.0, args.timeout, nnodes,
                ALLOCOPT.format(nnodes=nnodes, per_node=GPUS_PER_NODE, workload=str(workload),
                                traces=str(simulator / "traces"), options=options))
            makespan = (f"{own['makespan_s'] / base['makespan_s']:>8.4f}" if "makespan_s" in own and
                        "makespan_s" in base else f"{'-':>8}")
            print(f"{name:<12} {base.get('jobs', ours.get('jobs', 0)):>4} {cell(base, 'average_jct_s', 10)} "
                  f"{cell(base, 'makespan_s', 11)} {cell(ours, 'average_jct_s', 10)} {ratio(ours, base)} "
                  f"{cell(exact, 'average_jct_s', 10)} {ratio(exact, base)} "
                  f"{cell(own, 'average_jct_s', 10)} {ratio(own, base)} {makespan}   "
                  f"({time.perf_counter() - t0:.0f} s)", flush=True)
            if args.skip_sia and "makespan_s" in own:
                print(f"    allocopt makespan: {own['makespan_s']:,.1f} s")
            for label, result in (("Sia", base), ("stand-in", ours), ("exact", exact), ("allocopt", own)):
                if "error" in result:
                    print(f"    {label}: {result['error']}")
            rows.append(_row(name, base, ours, exact, own))
            if args.results:  # after every workload: an interrupted run keeps its rows
                write_results(args.results, "conformance_sia", machine=machine, data={"suite": args.suite, "rows": rows},
                              tables=[results_table(
                                  f"Sia's simulator ({args.suite}, first {args.max_jobs or 'all'} jobs) with Sia's "
                                  "policy, the stand-in and allocopt's simulator (faithful_to_sia); ratios to Sia's",
                                  rows, ROW_COLUMNS)])
    return 0


ROW_COLUMNS = [Column("workload", "workload", left=True), Column("jobs", "jobs"),
               Column("sia_jct_s", "Sia avg JCT s", ",.1f"), Column("sia_makespan_s", "Sia makespan s", ",.0f"),
               Column("stand_in_jct_s", "stand-in avg JCT s", ",.1f"), Column("stand_in_ratio", "ratio", ".4f"),
               Column("allocopt_jct_s", "allocopt avg JCT s", ",.1f"), Column("allocopt_ratio", "ratio", ".4f"),
               Column("allocopt_makespan_ratio", "makespan ratio", ".4f")]


def _row(name: str, base: dict, ours: dict, exact: dict, own: dict) -> dict:
    def over(a: dict, b: dict, key: str) -> float | None:
        return a[key] / b[key] if key in a and key in b else None

    return {"workload": name, "jobs": base.get("jobs", ours.get("jobs", own.get("jobs"))),
            "sia_jct_s": base.get("average_jct_s"), "sia_makespan_s": base.get("makespan_s"),
            "stand_in_jct_s": ours.get("average_jct_s"), "stand_in_ratio": over(ours, base, "average_jct_s"),
            "exact_jct_s": exact.get("average_jct_s"), "allocopt_jct_s": own.get("average_jct_s"),
            "allocopt_makespan_s": own.get("makespan_s"), "allocopt_ratio": over(own, base, "average_jct_s"),
            "allocopt_makespan_ratio": over(own, base, "makespan_s"),
            "runs": {"sia": base, "stand_in": ours, "exact": exact, "allocopt": own}}


if __name__ == "__main__":
    sys.exit(main())
