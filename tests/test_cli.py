"""The ``allocopt`` command line, run as a real subprocess on real files."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

import allocopt
from allocopt import cli
from allocopt.backends import BACKENDS, get_backend
from allocopt.throughput import ThroughputTable

TOL = 1e-6

SMALL = {"cluster": {"gpus": {"v100": 1, "k80": 1}},
         "jobs": [{"id": "a", "throughputs": {"v100": 40.0, "k80": 10.0}},
                  {"id": "b", "throughputs": {"v100": 12.0, "k80": 4.0}},
                  {"id": "c", "throughputs": {"v100": 100.0, "k80": 50.0}}]}

# "a" needs 18 steps/s and "b" 12 steps/s by their deadlines; the cluster gives 15 in total.
UNMEETABLE_DEADLINES = {"cluster": {"gpus": {"v100": 1, "k80": 1}},
                        "jobs": [{"id": "a", "throughputs": {"v100": 10.0, "k80": 5.0},
                                  "num_steps_remaining": 3600.0, "slo_s": 200.0},
                                 {"id": "b", "throughputs": {"v100": 10.0, "k80": 5.0},
                                  "num_steps_remaining": 3600.0, "slo_s": 300.0}]}


def run_cli(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "allocopt", *args], input=stdin, capture_output=True,
                          text=True, timeout=300)


@pytest.fixture
def gavel_problem_doc() -> dict:
    cluster = allocopt.Cluster({"v100": 4, "p100": 4, "k80": 4})
    return ThroughputTable.gavel().sample_problem(cluster, 15, seed=7).to_json()


def write(tmp_path, document: dict | str, name: str = "problem.json"):
    path = tmp_path / name
    path.write_text(document if isinstance(document, str) else json.dumps(document))
    return path


def assert_valid_allocation(output: dict, problem_doc: dict) -> None:
    problem = allocopt.Problem.from_json(problem_doc)
    assert output["gpu_types"] == list(problem.gpu_types)
    assert [row["id"] for row in output["allocation"]] == list(problem.job_ids)
    X = np.array([[row["fractions"][t] for t in problem.gpu_types] for row in output["allocation"]])
    assert np.all(X >= -TOL)
    assert np.all(X.sum(axis=1) <= 1 + TOL)
    assert np.all(problem.scale_factors @ X <= problem.capacity + TOL)
    assert np.all(X[~problem.runnable] <= TOL)
    effective = [row["effective_throughput"] for row in output["allocation"]]
    np.testing.assert_allclose(effective, (problem.throughputs * X).sum(axis=1), rtol=1e-9)


def assert_clean_error(result: subprocess.CompletedProcess, code: int, *fragments: str) -> None:
    assert result.returncode == code, result.stderr
    assert "Traceback" not in result.stderr
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("allocopt: error: "), result.stderr
    for fragment in fragments:
        assert fragment in lines[0]


def test_solve_file_to_stdout(tmp_path, gavel_problem_doc):
    result = run_cli("solve", str(write(tmp_path, gavel_problem_doc)), "--policy", "max_min_fairness",
                     "--backend", "highs")
    assert result.returncode == 0, result.stderr
    output = json.loads(result.stdout)
    assert output["status"] == "optimal" and output["backend"] == "highs"
    assert output["policy"] == "max_min_fairness" and output["objective"] > 0
    assert_valid_allocation(output, gavel_problem_doc)


def test_solve_reads_stdin(gavel_problem_doc):
    result = run_cli("solve", "-", "--policy", "max_throughput", stdin=json.dumps(gavel_problem_doc))
    assert result.returncode == 0, result.stderr
    output = json.loads(result.stdout)
    assert output["policy"] == "max_throughput"
    assert_valid_allocation(output, gavel_problem_doc)


def test_solve_out_writes_file(tmp_path):
    out = tmp_path / "allocation.json"
    result = run_cli("solve", str(write(tmp_path, SMALL)), "--out", str(out), "--time-limit-s", "60")
    assert result.returncode == 0, result.stderr
    assert result.stdout == ""
    output = json.loads(out.read_text())
    assert_valid_allocation(output, SMALL)
    assert output["objective"] == pytest.approx(8 / 11, rel=1e-6)


@pytest.mark.parametrize("backend", [pytest.param(name, marks=pytest.mark.skipif(
    not get_backend(name).is_installed(), reason=f"backend {name!r} is not installed")) for name in BACKENDS])
def test_stdout_is_only_json_whatever_the_solver_prints(tmp_path, backend):
    # solver logs and license banners are printed by C code straight to file descriptor 1
    result = run_cli("solve", str(write(tmp_path, SMALL)), "--backend", backend, "--option", "verbose=true")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["backend"] == backend


def test_policy_options_are_parsed_as_json(tmp_path):
    path = str(write(tmp_path, SMALL))
    aware = json.loads(run_cli("solve", path).stdout)
    result = run_cli("solve", path, "--option", "heterogeneity_aware=false")
    assert result.returncode == 0, result.stderr
    unaware = json.loads(result.stdout)
    assert unaware["objective"] != pytest.approx(aware["objective"])
    # equal time for every job: one third of the cluster's 2 GPUs each
    assert unaware["objective"] == pytest.approx(2 / 3, rel=1e-6)


@pytest.mark.parametrize("document, fragments", [
    ('{"cluster": {"gpus": {"v100": 1}},\n "jobs": [\n  {"id": "a", "throughputs": {"v100": 1.0,}}]}',
     ["problem.json, line 3: invalid JSON at column"]),
    ({"cluster": {"gpus": {"v100": 1}}, "jobs": [{"id": "a", "throughputs": {"v100": 1.0, "a100": 2.0}}]},
     ["job 'a'", "unknown GPU type", "a100"]),
    ({"cluster": {"gpus": {"v100": 1, "k80": 1}},
      "jobs": [{"id": "a", "throughputs": {"v100": 1.0, "k80": 1.0}},
               {"id": "b", "throughputs": {"v100": 2.0, "k80": -1.0}}]},
     ["jobs[1].throughputs.k80 (id 'b')", "-1.0"]),
    ({"cluster": {"gpus": {"v100": 1}}, "jobs": [{"id": "a", "throughputs": {"v100": "fast"}}]},
     ["jobs[0].throughputs.v100 (id 'a')", "'fast'"]),
    ({"jobs": []}, ["'cluster'"]),
], ids=["bad-json", "unknown-gpu-type", "negative-throughput", "non-numeric-throughput", "no-cluster"])
def test_malformed_problem_exits_2(tmp_path, document, fragments):
    result = run_cli("solve", str(write(tmp_path, document)))
    assert_clean_error(result, 2, *fragments)


def test_missing_file_exits_2(tmp_path):
    assert_clean_error(run_cli("solve", str(tmp_path / "nope.json")), 2, "cannot read problem file", "nope.json")


def test_unknown_policy_and_backend_exit_2(tmp_path):
    path = str(write(tmp_path, SMALL))
    assert_clean_error(run_cli("solve", path, "--policy", "fastest_first"), 2, "unknown policy 'fastest_first'",
                       "max_min_fairness")
    assert_clean_error(run_cli("solve", path, "--backend", "cplex"), 2, "unknown backend 'cplex'")


@pytest.mark.parametrize("option, fragment", [
    ("not_an_option=1", "has no option(s) ['not_an_option']"),
    ("backend=gurobi", "use --backend"),
])
def test_bad_policy_option_exits_2(tmp_path, option, fragment):
    assert_clean_error(run_cli("solve", str(write(tmp_path, SMALL)), "--option", option), 2, fragment)


def test_option_without_value_is_a_usage_error(tmp_path):
    result = run_cli("solve", str(write(tmp_path, SMALL)), "--option", "heterogeneity_aware")
    assert result.returncode == 2
    assert "expected KEY=VALUE" in result.stderr and "Traceback" not in result.stderr


def test_not_optimal_exits_1_unless_best_effort(tmp_path):
    path = str(write(tmp_path, UNMEETABLE_DEADLINES))
    assert_clean_error(run_cli("solve", path, "--policy", "max_throughput"), 1, "deadlines", "cannot be met")
    result = run_cli("solve", path, "--policy", "max_throughput", "--best-effort")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["status"] == "infeasible"
    assert result.stderr.startswith("allocopt: warning: infeasible")
    assert_valid_allocation(json.loads(result.stdout), UNMEETABLE_DEADLINES)


def test_unwritable_out_exits_2(tmp_path):
    result = run_cli("solve", str(write(tmp_path, SMALL)), "--out", str(tmp_path / "missing-dir" / "a.json"))
    assert_clean_error(result, 2, "cannot write")


def test_help_and_version():
    result = run_cli("--help")
    assert result.returncode == 0
    assert "solve" in result.stdout and "demo" in result.stdout
    solve_help = run_cli("solve", "--help")
    assert solve_help.returncode == 0 and "--option KEY=VALUE" in solve_help.stdout
    version = run_cli("--version")
    assert version.returncode == 0 and version.stdout.strip() == f"allocopt {allocopt.__version__}"


def test_no_command_is_a_usage_error():
    result = run_cli()
    assert result.returncode == 2 and "Traceback" not in result.stderr


def test_demo_prints_summary():
    result = run_cli("demo", "--jobs", "20", "--backends", "highs")
    assert result.returncode == 0, result.stderr
    out = result.stdout
    for fragment in ("20 jobs", "v100=36", "Backends (times in seconds)", "optimal", "Allocation by highs",
                     "Fair-share ratio", "job-0"):
        assert fragment in out, out
    assert "Traceback" not in result.stderr


@pytest.mark.skipif(not get_backend("gurobi").is_installed(), reason="gurobipy is not installed")
def test_demo_skips_a_backend_whose_license_is_too_small():
    # 1000 jobs x 3 GPU types: 3001 variables, over the size-limited license's 2000 (fine with a full license)
    result = run_cli("demo", "--jobs", "1000", "--backends", "highs,gurobi")
    assert result.returncode == 0, result.stderr
    gurobi_row = next(line.split() for line in result.stdout.splitlines() if line.lstrip().startswith("gurobi "))
    assert gurobi_row[1] in ("optimal", "skipped")
    assert "Allocation by highs" in result.stdout


def _without_timings(text: str) -> list[str]:
    return [line for line in text.splitlines() if not line.lstrip().startswith("highs ")]


def test_demo_is_deterministic_given_the_seed(capsys):
    outputs = []
    for seed in (5, 5, 6):
        assert cli.main(["demo", "--jobs", "12", "--seed", str(seed), "--backends", "highs"]) == 0
        outputs.append(_without_timings(capsys.readouterr().out))
    assert outputs[0] == outputs[1]
    assert outputs[0] != outputs[2]


def test_demo_rejects_unknown_backend():
    assert_clean_error(run_cli("demo", "--backends", "highs,cplex"), 2, "unknown backend(s) ['cplex']")
