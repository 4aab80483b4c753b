"""Conformance of :mod:`allocopt.adapters.gavel` with Gavel's own code.

Gavel (github.com/stanford-futuredata/gavel, tested at commit c4fa400) stays
outside this repository: point ``--gavel-dir`` at a checkout and run this script
with a Python that has Gavel's simulator dependencies (numpy < 2.3, cvxpy with
ECOS and cvxopt (GLPK_MI, or Gavel's water-filling silently stops after one
level), scipy, grpcio + generated stubs (``make rpc_stubs`` in ``scheduler/``),
psutil, matrix_completion) and allocopt's (highspy, swiglpk: without it water-filling runs
without exact levels and logs a warning)::

    python benchmarks/conformance_gavel.py --gavel-dir /tmp/gavel [--traces artifact_evaluation ...]

The adapter is swapped in without touching Gavel: a shim ``policies`` package
whose modules export the adapter's classes under Gavel's class names is put
first on ``PYTHONPATH``, so Gavel's ``utils.get_policy``, its scheduler and its
tests import allocopt where they imported Gavel's policies.

1. Gavel's ``scheduler/tests/policies_tests.py``, with Gavel's policies and with
   the adapter (pass/total).
2. Gavel's simulator (``scripts/drivers/simulate_scheduler_with_trace.py``'s
   ``main``) on physical-cluster traces: each policy with Gavel's own code
   (ECOS), the adapter with ECOS (through allocopt's cvxpy backend), with
   ``highs`` (the adapter's default: on Gavel's LP policies HiGHS's interior
   point without crossover, a point inside the optimal face, as ECOS returns)
   and with ``highs-simplex`` (dual simplex: an optimal vertex). Prints average
   JCT and makespan and their ratio to Gavel's. ``--round-allocations 6`` rounds every policy's answer
   (Gavel's too) before Gavel's mechanism reads it: where a policy gives jobs
   equal shares, the mechanism orders them by the solver's last digits, and the
   rounded runs show which differences are that noise.

Each run is a subprocess with a time limit; the table says which ran out.
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

from allocopt.adapters.gavel import GAVEL_CLASSES  # noqa: E402
from allocopt.bench.machine import machine_info  # noqa: E402
from allocopt.bench.output import (  # noqa: E402
    Column,
    add_results_option,
    results_table,
    write_results,
)

DEFAULT_POLICIES = ("max_min_fairness", "max_min_fairness/gavel", "max_min_fairness_perf", "max_min_fairness_packed",
                    "finish_time_fairness", "finish_time_fairness/gavel", "finish_time_fairness_perf",
                    "min_total_duration_perf", "min_total_duration_perf/gavel", "max_sum_throughput_perf", "fifo",
                    "fifo/gavel", "fifo_perf", "gandiva", "allox", "isolated")
DEFAULT_TRACES = ("artifact_evaluation",)

SIMULATE = """
import json, sys, time, types
sys.argv = ['simulate']
sys.path[:0] = [{drivers!r}] + ([{shim!r}] if {shim!r} else [])  # the shim before Gavel's own policies
import simulate_scheduler_with_trace as driver
import scheduler
import utils
results = {{'policy_module': utils.max_min_fairness.__name__, 'policy_file': utils.max_min_fairness.__file__}}
original = scheduler.Scheduler.get_average_jct
def get_average_jct(self, *args, **kwargs):
    value = original(self, *args, **kwargs)
    results['average_jct_s'] = value
    results['makespan_s'] = self.get_current_timestamp()
    return value
scheduler.Scheduler.get_average_jct = get_average_jct
if {digits!r} is not None:  # every policy's allocation rounded to `digits` decimals (Gavel's and the adapter's)
    _get_policy = utils.get_policy
    def get_policy(*a, **k):
        policy = _get_policy(*a, **k)
        allocate = policy.get_allocation
        def get_allocation(*args, **kwargs):
            allocation = allocate(*args, **kwargs)
            if allocation is None:
                return None
            return {{job: {{t: round(v, {digits!r}) for t, v in row.items()}} for job, row in allocation.items()}}
        policy.get_allocation = get_allocation
        return policy
    utils.get_policy = get_policy
args = types.SimpleNamespace(trace_file={trace!r}, policy={policy!r}, throughputs_file={throughputs!r},
                             cluster_spec={cluster!r}, num_gpus_per_server='1:1:1', seed=0, solver={solver!r},
                             debug=False, checkpoint_threshold=None, checkpoint_file=None,
                             time_per_iteration=360, window_start=None, window_end=None)
t0 = time.perf_counter()
driver.main(args)
results['wall_s'] = time.perf_counter() - t0
print('CONFORMANCE ' + json.dumps(results))
"""


# POLICY/gavel: the adapter's flag for Gavel's own behaviour where allocopt differs on purpose
FAITHFUL = {"fifo": """
import os
if os.environ.get("GAVEL_FAITHFUL"):
    _FIFOPolicy = FIFOPolicy

    class FIFOPolicy(_FIFOPolicy):
        def __init__(self, mode="base", seed=None, packing_threshold=1.5):
            super().__init__(mode, seed, packing_threshold, faithful_type_choice=True)
""", "min_total_duration": """
import os
if os.environ.get("GAVEL_FAITHFUL"):
    _MinTotalDurationPolicyWithPerf = MinTotalDurationPolicyWithPerf

    class MinTotalDurationPolicyWithPerf(_MinTotalDurationPolicyWithPerf):
        def __init__(self, solver=None):
            super().__init__(solver, faithful_bisection=True)
""", "finish_time_fairness": """
import os
if os.environ.get("GAVEL_FAITHFUL"):
    _FinishTimeFairnessPolicy = FinishTimeFairnessPolicy

    class FinishTimeFairnessPolicy(_FinishTimeFairnessPolicy):
        def __init__(self, solver=None):
            super().__init__(solver, faithful_agnostic=True)
""", "max_min_fairness": """
import os
if os.environ.get("GAVEL_FAITHFUL"):
    _MaxMinFairnessPolicy = MaxMinFairnessPolicy

    class MaxMinFairnessPolicy(_MaxMinFairnessPolicy):
        def __init__(self, solver=None):
            super().__init__(solver, faithful_agnostic=True)
"""}


def write_shim(directory: Path) -> Path:
    """A ``policies`` package whose Gavel modules export the adapter's classes."""
    package = directory / "policies"
    package.mkdir(parents=True, exist_ok=True)
    (package / "__init__.py").write_text('"""allocopt standing in for Gavel\'s policies."""\n')
    modules: dict[str, list[str]] = {}
    for class_name, (module, _, _) in GAVEL_CLASSES.items():
        modules.setdefault(module, []).append(class_name)
    for module, classes in modules.items():
        (package / f"{module}.py").write_text(
            f"from allocopt.adapters.gavel import {', '.join(sorted(classes))}  # noqa: F401\n")
    for module, code in FAITHFUL.items():  # GAVEL_FAITHFUL=1: Gavel's behaviour where allocopt differs
        with open(package / f"{module}.py", "a") as f:
            f.write(code)
    return directory


def environment(shim: Path | None) -> dict[str, str]:
    env = dict(os.environ)
    paths = ([str(shim)] if shim else []) + [str(ROOT)]
    env["PYTHONPATH"] = os.pathsep.join(paths + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    return env


def run_policy_tests(scheduler_dir: Path, shim: Path | None, timeout_s: float) -> tuple[int, int, str]:
    """Gavel's policies_tests.py: (passed, total, failing test names)."""
    if shim is not None:  # the tests must import the shim's policies, not Gavel's
        check = subprocess.run([sys.executable, "-c", "import sys; sys.path.append('..'); import policies.allox as m; "
                                "print(m.__file__)"], cwd=scheduler_dir / "tests", env=environment(shim),
                               capture_output=True, text=True, timeout=timeout_s)
        if not check.stdout.strip().startswith(str(shim)):
            return 0, 0, f"Gavel's policies were imported, not the adapter: {check.stdout.strip() or check.stderr}"
    proc = subprocess.run([sys.executable, "policies_tests.py"], cwd=scheduler_dir / "tests",
                          env=environment(shim), capture_output=True, text=True, timeout=timeout_s)
    failed = re.findall(r"^(?:FAIL|ERROR): (test_\w+)", proc.stderr, flags=re.M)
    total = re.search(r"^Ran (\d+) tests?", proc.stderr, flags=re.M)
    if total is None:
        return 0, 0, (proc.stderr.strip().splitlines() or ["no output"])[-1]
    return int(total.group(1)) - len(failed), int(total.group(1)), ", ".join(failed)


def run_simulation(scheduler_dir: Path, trace: str, policy: str, cluster: str, solver: str,
                   shim: Path | None, timeout_s: float, digits: int | None = None) -> dict:
    """One simulation; ``POLICY/gavel`` is ``POLICY`` with the adapter's flag for Gavel's behaviour
    (``fifo/gavel``: ``faithful_type_choice``; ``min_total_duration_perf/gavel``: ``faithful_bisection``;
    ``max_min_fairness/gavel``, ``finish_time_fairness/gavel``: ``faithful_agnostic``);
    ``digits``: the policy's allocations rounded to that many decimals before Gavel's mechanism reads them."""
    env = environment(shim)
    if policy.endswith("/gavel"):
        policy, env["GAVEL_FAITHFUL"] = policy.removesuffix("/gavel"), "1"
    code = SIMULATE.format(drivers=str(scheduler_dir / "scripts" / "drivers"),
                           trace=str(scheduler_dir / "traces" / "physical_cluster" / f"{trace}.trace"),
                           throughputs=str(scheduler_dir / "simulation_throughputs.json"),
                           policy=policy, cluster=cluster, solver=solver, shim=str(shim) if shim else "",
                           digits=digits)
    try:
        proc = subprocess.run([sys.executable, "-c", code], cwd=scheduler_dir, env=env,
                              capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return {"error": f"over {timeout_s:.0f} s"}
    match = re.search(r"^CONFORMANCE (.*)$", proc.stdout, flags=re.M)
    if proc.returncode != 0 or not match:
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        return {"error": last[:120]}
    result = json.loads(match.group(1))
    if shim is not None and not result["policy_file"].startswith(str(shim)):
        return {"error": f"Gavel's policies were imported ({result['policy_file']}), not the adapter"}
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gavel-dir", required=True, type=Path, help="a checkout of Gavel (holds scheduler/)")
    parser.add_argument("--traces", nargs="*", default=list(DEFAULT_TRACES),
                        help="physical-cluster traces (names without .trace)")
    parser.add_argument("--policies", nargs="*", default=list(DEFAULT_POLICIES))
    parser.add_argument("--clusters", nargs="*", default=["2:2:2"], help="v100:p100:k80 GPU counts")
    parser.add_argument("--adapter-solvers", nargs="*", default=["ECOS", "highs", "highs-simplex"],
                        help="the adapter's solver per column (Gavel's solver argument: a cvxpy solver name, "
                             "an allocopt backend, highs-ipm or highs-simplex)")
    parser.add_argument("--round-allocations", type=int, default=None, metavar="DIGITS",
                        help="round every allocation (Gavel's and the adapter's) to DIGITS decimals before "
                             "Gavel's mechanism reads it: shows which differences are solver noise")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds per run")
    parser.add_argument("--skip-tests", action="store_true")
    parser.add_argument("--skip-simulations", action="store_true")
    add_results_option(parser, "conformance_gavel", Path(__file__).parent / "results")
    args = parser.parse_args(argv)
    machine = machine_info()
    tests, rows = [], []
    scheduler_dir = args.gavel_dir.resolve() / "scheduler"
    if not (scheduler_dir / "scheduler.py").is_file():
        parser.error(f"{args.gavel_dir} is not a Gavel checkout (no scheduler/scheduler.py)")
    with tempfile.TemporaryDirectory(prefix="allocopt-gavel-shim-") as tmp:
        shim = write_shim(Path(tmp))
        if not args.skip_tests:
            print("Gavel's scheduler/tests/policies_tests.py")
            for label, path in (("Gavel's policies", None), ("allocopt adapter", shim)):
                passed, total, failed = run_policy_tests(scheduler_dir, path, args.timeout)
                tests.append({"policies": label, "passed": passed, "total": total, "failing": failed or "-"})
                print(f"  {label:<18} {passed}/{total} passed" + (f"  (failing: {failed})" if failed else ""))
        if args.skip_simulations:
            _write(args, machine, tests, rows)
            return 0
        rounding = f", allocations rounded to {args.round_allocations} decimals" if args.round_allocations else ""
        print(f"\nGavel's simulator (seed 0, 360 s rounds, 1 GPU per server{rounding}); ratio = adapter / Gavel")
        header = (f"{'trace':<20} {'policy':<26} {'cluster':<7} {'Gavel ECOS JCT s':>16} {'makespan s':>11} "
                  + " ".join(f"{'adapter ' + solver:>{max(15, len(solver) + 8)}} {'ratio':>7}"
                             for solver in args.adapter_solvers))
        print(header)
        print("-" * len(header))
        for trace in args.traces:
            for cluster in args.clusters:
                for policy in args.policies:
                    t0 = time.perf_counter()
                    results = {"Gavel": run_simulation(scheduler_dir, trace, policy, cluster, "ECOS", None,
                                                       args.timeout, args.round_allocations)}
                    for solver in args.adapter_solvers:
                        results[f"adapter {solver}"] = run_simulation(scheduler_dir, trace, policy, cluster, solver,
                                                                      shim, args.timeout, args.round_allocations)
                    base = results["Gavel"]
                    cells = " ".join(f"{cell(results[f'adapter {s}'], 'average_jct_s', max(15, len(s) + 8), 3, 'error')} "
                                     f"{ratio(results[f'adapter {s}'], base)}" for s in args.adapter_solvers)
                    print(f"{trace:<20} {policy:<26} {cluster:<7} {cell(base, 'average_jct_s', 16, 3, 'error')} "
                          f"{cell(base, 'makespan_s', 11, 3, 'error')} {cells}   ({time.perf_counter() - t0:.0f} s)", flush=True)
                    for label, result in results.items():
                        if "error" in result:
                            print(f"    {label}: {result['error']}")
                    row = {"trace": trace, "cluster": cluster, "policy": policy,
                           "gavel_jct_s": base.get("average_jct_s"), "gavel_makespan_s": base.get("makespan_s"),
                           "results": results}
                    for s in args.adapter_solvers:
                        r = results[f"adapter {s}"]
                        row[f"ratio {s}"] = (r["average_jct_s"] / base["average_jct_s"]
                                             if "average_jct_s" in r and "average_jct_s" in base else None)
                    rows.append(row)
                    _write(args, machine, tests, rows)  # after every case: an interrupted run keeps its rows
    return 0


def _write(args: argparse.Namespace, machine: dict, tests: list[dict], rows: list[dict]) -> None:
    if not args.results:
        return
    tables = [results_table("Gavel's scheduler/tests/policies_tests.py", tests,
                            [Column("policies", "policies", left=True), Column("passed", "passed"),
                             Column("total", "tests"), Column("failing", "failing", left=True)])]
    if rows:
        tables.append(results_table(
            "Gavel's simulator with Gavel's policies (ECOS) and with the adapter; ratio: adapter / Gavel average JCT",
            rows, [Column("trace", "trace", left=True), Column("cluster", "GPUs", left=True),
                   Column("policy", "policy", left=True), Column("gavel_jct_s", "Gavel avg JCT s", ",.1f"),
                   Column("gavel_makespan_s", "Gavel makespan s", ",.1f"),
                   *(Column(f"ratio {s}", f"adapter {s}", ".4f") for s in args.adapter_solvers)]))
    write_results(args.results, "conformance_gavel", machine=machine, tables=tables,
                  data={"policy_tests": tests, "rows": rows, "round_allocations": args.round_allocations})


if __name__ == "__main__":
    sys.exit(main())
