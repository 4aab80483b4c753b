"""A quiet library: allocopt.solve and Engine print nothing (stdout or stderr, Python or C) unless asked;
diagnostics go to the "allocopt" logger."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import textwrap

import pytest

import allocopt
from conftest import ALL_BACKENDS

INSTALLED = ALL_BACKENDS

# Solves, a best-effort non-optimal solve (logged as a warning) and engine rounds, on one backend.
SCRIPT = textwrap.dedent("""
    import sys
    import allocopt
    from allocopt.runtime.executor import JobRoundResult, RoundOutcome

    backend = sys.argv[1]
    cluster = allocopt.Cluster({"v100": 2, "k80": 2})
    problem = allocopt.Problem([[40, 10], [12, 4], [100, 50]], cluster)
    allocopt.solve(problem, "max_min_fairness", backend=backend)
    allocopt.solve(problem, "max_throughput", backend=backend)
    late = allocopt.Problem([[10, 5], [10, 5]], allocopt.Cluster({"v100": 1, "k80": 1}),
                            num_steps_remaining=[3600, 3600], slos=[200, 300])
    assert not allocopt.solve(late, "max_throughput", backend=backend, best_effort=True).success
    engine = allocopt.Engine(cluster, backend=backend, round_seconds=60.0, recompute_min_seconds=0.0)
    for k in range(4):
        engine.add_job(k, throughputs={"v100": 10.0 + k, "k80": 3.0})
    engine.allocate()
    for _ in range(3):
        plan = engine.next_round()
        engine.record_round([JobRoundResult(l.job_id, RoundOutcome.PREEMPTED, 1, 60.0, measured_steps_per_s=9.0)
                             for l in plan.leases])
""")


@pytest.mark.parametrize("backend", INSTALLED)
def test_library_calls_print_nothing_in_a_fresh_process(backend):
    # a fresh process: first solves print banners (HiGHS >= 1.16's copyright, Gurobi's license) from C code
    result = subprocess.run([sys.executable, "-c", SCRIPT, backend], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert (result.stdout, result.stderr) == ("", "")


@pytest.mark.parametrize("backend", INSTALLED)
def test_library_calls_print_nothing_in_process(backend, capfd):
    problem = allocopt.Problem([[40, 10], [12, 4], [100, 50]], allocopt.Cluster({"v100": 1, "k80": 1}))
    allocopt.solve(problem, "max_min_fairness", backend=backend)
    engine = allocopt.Engine({"v100": 1, "k80": 1}, backend=backend)
    engine.add_job("a", throughputs={"v100": 4.0, "k80": 1.0})
    engine.allocate()
    engine.next_round()
    assert capfd.readouterr() == ("", "")


def test_verbose_is_the_way_to_ask_for_solver_output(capfd):
    problem = allocopt.Problem([[40, 10], [12, 4]], allocopt.Cluster({"v100": 1, "k80": 1}))
    allocopt.solve(problem, "max_min_fairness", backend="highs", verbose=True)
    out, err = capfd.readouterr()
    assert "HiGHS" in out + err


def test_non_optimal_results_are_logged_not_printed(caplog, capfd):
    late = allocopt.Problem([[10, 5], [10, 5]], allocopt.Cluster({"v100": 1, "k80": 1}),
                            num_steps_remaining=[3600, 3600], slos=[200, 300])
    with caplog.at_level(logging.WARNING, logger="allocopt"):
        allocation = allocopt.solve(late, "max_throughput", best_effort=True)
    assert not allocation.success
    assert [(r.name, r.levelno) for r in caplog.records] == [("allocopt.api", logging.WARNING)]
    assert allocation.status.value in caplog.records[0].getMessage()
    assert capfd.readouterr() == ("", "")


def test_cli_verbosity_flags(tmp_path):
    late = {"cluster": {"gpus": {"v100": 1, "k80": 1}},
            "jobs": [{"id": "a", "throughputs": {"v100": 10.0, "k80": 5.0}, "num_steps_remaining": 3600.0,
                      "slo_s": 200.0},
                     {"id": "b", "throughputs": {"v100": 10.0, "k80": 5.0}, "num_steps_remaining": 3600.0,
                      "slo_s": 300.0}]}
    path = tmp_path / "late.json"
    path.write_text(json.dumps(late))

    def run(*flags: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "allocopt", *flags, "solve", str(path), "--policy",
                               "max_throughput", "--best-effort"], capture_output=True, text=True, timeout=300)

    default, quiet = run(), run("-q")
    assert default.returncode == quiet.returncode == 0
    assert json.loads(default.stdout)["allocation"] == json.loads(quiet.stdout)["allocation"]
    assert default.stderr.startswith("allocopt: warning: infeasible") and default.stderr.count("\n") == 1
    assert quiet.stderr == ""


def test_an_inaccurate_cvxpy_solution_is_said_in_the_result_not_warned(capfd):
    """cvxpy warns on stderr when its solver's answer is inaccurate (SCS stopped after 5 iterations here);
    the result says it instead (here the answer fails the check of every answer against the problem)."""
    pytest.importorskip("cvxpy")
    problem = allocopt.Problem([[40, 10], [12, 4], [100, 50]], allocopt.Cluster({"v100": 1, "k80": 1}))
    allocation = allocopt.solve(problem, "max_throughput", backend="cvxpy", best_effort=True,
                                solver_options={"solver": "SCS", "max_iters": 5})
    assert allocation.status is allocopt.Status.ERROR and "failed its check" in allocation.message
    assert capfd.readouterr() == ("", "")
