"""The ``allocopt`` command line, run as a real subprocess on real files."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

import allocopt
from allocopt import cli
from allocopt.backends import get_backend
from allocopt.throughput import ThroughputTable
from conftest import ALL_BACKENDS
from tests.runtime.helpers import count_steps_command, interruptible, steps_written

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


@pytest.mark.parametrize("backend", ALL_BACKENDS)
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


@pytest.mark.skipif(get_backend("gurobi").unavailable_reason() is not None,
                    reason=get_backend("gurobi").unavailable_reason() or "")
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


# ----- every malformed input: one error line naming the file (and line), exit 2, no traceback ---------
JOB = '{name: a, command: "true", total_steps: 3}'
TRACE_LINE = "ResNet-18 (batch size 16)\tcmd\tdir\t--n\tFalse\t100\t1\t1.0\t-1\t0\n"


@pytest.mark.parametrize("name, content, command, fragments", [
    ("jobs.yaml", "jobs: [\n", ["run"], ["jobs.yaml, line 2: invalid YAML"]),
    ("jobs.yaml", "jobs:\n  - name: a\n\tcommand: x\n", ["run"], ["jobs.yaml, line 3: invalid YAML", "'\\t'"]),
    ("jobs.yaml", b"\x89PNG\r\n\x1a\n\x00\x00", ["run"], ["jobs.yaml, line 3: binary data"]),
    ("jobs.yaml", b"jobs:\n  - {name: \xe9t\xe9, command: x, total_steps: 1}\n", ["run"],
     ["jobs.yaml, line 2: not UTF-8"]),
    ("jobs.yaml", "jobs:\n  - {name: a, command: x, total_steps: " + "9" * 5000 + "}\n", ["run"],
     ["jobs.yaml: invalid YAML", "too many digits"]),
    ("jobs.json", '{"jobs": ' + "[" * 5000 + "]" * 5000 + "}", ["run"], ["jobs.json", "nested"]),
    ("problem.json", '{"cluster": {"gpus": {"v100": 1e300}}, "jobs": []}', ["solve"], ["cluster.gpus.v100", "1e+300"]),
    ("problem.json", '{"cluster": {"gpus": {"v100": ' + "9" * 5000 + '}}, "jobs": []}', ["solve"],
     ["problem.json: invalid JSON", "too many digits"]),
    pytest.param("problem.json", "[" * 100000 + "]" * 100000, ["solve"], ["problem.json", "nested too deeply"],
                 id="problem.json-100000-deep"),  # the content as its id would not fit in PYTEST_CURRENT_TEST
    ("problem.json", '{"cluster": {"gpus": {"v100": NaN}}, "jobs": []}', ["solve"], ["NaN is not a JSON number"]),
    ("problem.json", b"\xff\xfe{\x00}\x00", ["solve"], ["problem.json, line 1: binary data"]),
    ("problem.json", '{"cluster": {"gpus": {"v100": 2}, "nodes": 1}, "jobs": []}', ["solve"],
     ["cluster has unknown field(s) ['nodes']"]),
    ("problem.json", '{"cluster": {"gpus": {"v100": 2}}, "jobs": [{"id": null, "throughputs": {"v100": 1}}]}',
     ["solve"], ["jobs[0].id is None"]),
    ("problem.json", '{"cluster": {"gpus": {"v100": 2}}, "jobs": [{"id": 1, "throughputs": {"v100": 1}, '
                     '"scale_factor": "2"}]}', ["solve"], ["jobs[0].scale_factor (id 1) is '2'"]),
    ("a.trace", b"ResNet-18\xff\tcmd\n", ["simulate", "--trace"], ["a.trace, line 1: not UTF-8"]),
    ("a.trace", TRACE_LINE + TRACE_LINE.replace("\t100\t", "\t1e400\t"), ["simulate", "--trace"],
     ["a.trace:2: total_steps is '1e400'"]),
    ("w.csv", b"name,time,application,num_replicas,batch_size\nbert-0,0,bert,1,\xff\n", ["simulate", "--workload"],
     ["w.csv, line 2: not UTF-8"]),
    ("t.csv", b"model,scale_factor,gpu_type,throughput\nm,1,v100,\x00\n",
     ["simulate", "--generate", "3", "--throughputs"], ["t.csv, line 2: binary"]),
    ("state.json", '{"format": "allocopt-engine", "format_version": 1, "version": 0, "policy": "max_min_fairness",'
                   '\n "backend": "highs", "cluster": null, "jobs": []}', ["serve", "--state"],
     ["state.json: invalid engine state: cluster must be an object"]),
])
def test_malformed_input_files_exit_2_naming_the_file(tmp_path, name, content, command, fragments):
    path = tmp_path / name
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    if command == ["run"]:
        args = ["run", str(path), "--cluster", "cpu=1", "--state", str(tmp_path / "s.db")]
    else:
        args = [*command, str(path)]
    assert_clean_error(run_cli(*args), 2, *fragments)


@pytest.mark.parametrize("bad, fragment", [
    ("{name: b, command: x, total_steps: abc}", "job 'b': total_steps must be an integer from 1 to 2**53, got 'abc'"),
    ("{name: b, command: x, total_steps: -5}", "job 'b': total_steps must be an integer from 1 to 2**53, got -5"),
    ("{name: b, command: x, total_steps: 1e300}", "job 'b': total_steps must be an integer"),
])
def test_a_job_with_a_bad_field_fails_alone(tmp_path, bad, fragment):
    good = json.dumps({"name": "a", "command": count_steps_command(tmp_path / "a.txt"), "total_steps": 3})
    jobs = write(tmp_path, f"jobs:\n  - {good}\n  - {bad}\n", "jobs.yaml")
    result = run_cli("run", str(jobs), "--cluster", "cpu=1", "--state", str(tmp_path / "s.db"),
                     "--round-seconds", "0.5")
    assert result.returncode == 1, result.stderr
    assert "Traceback" not in result.stderr
    assert f"{jobs}: {fragment}" in result.stderr
    report = json.loads(result.stdout)
    assert report["jobs"]["a"]["status"] == "done" and report["jobs"]["a"]["steps_done"] == 3
    assert report["jobs"]["b"]["status"] == "failed"
    assert steps_written(tmp_path / "a.txt") == [0, 1, 2]


def test_corrupted_state_journal_names_the_path(tmp_path):
    jobs = write(tmp_path, f"jobs:\n  - {JOB}\n", "jobs.yaml")
    state = tmp_path / "S.db"
    state.write_bytes(b"SQLite format 3\x00" + bytes(range(256)) * 16)
    assert_clean_error(run_cli("run", str(jobs), "--cluster", "cpu=1", "--state", str(state)), 2,
                       f"{state}: not a readable allocopt journal")


@pytest.mark.parametrize("args, fragment", [
    (["solve", "P", "--option", "heterogeneity_aware=maybe"], "heterogeneity_aware must be true or false (an option "
                                                              "of policy 'max_min_fairness'), got 'maybe'"),
    (["solve", "P", "--option", "threads=2.5"], "threads must be a positive integer"),
    (["solve", "P", "--option", "mip_gap=NaN"], "mip_gap must be in [0, 1)"),
    (["solve", "P", "--option", "verbose=1"], "verbose must be true or false"),
    (["solve", "P", "--time-limit-s", "-1"], "time_limit_s must be a positive number"),
    (["serve", "--port", "99999"], "expected a TCP port 0-65535, got '99999'"),
    (["simulate", "--generate", "99999999999999999999999"], "expected a positive integer"),
    (["simulate", "--generate", "3", "--cluster", "v100=1e300"], "expected TYPE=N"),
])
def test_bad_arguments_exit_2(tmp_path, args, fragment):
    problem = str(write(tmp_path, SMALL))
    result = run_cli(*[problem if a == "P" else a for a in args])
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert fragment in result.stderr.strip().splitlines()[-1]


def test_exit_codes_are_documented_in_help():
    text = " ".join(run_cli("--help").stdout.split())
    for code, meaning in cli.EXIT_CODES.items():
        assert f"{code} {' '.join(meaning.split())}" in text


def test_ctrl_c_exits_130_with_one_line():
    process = subprocess.Popen([sys.executable, "-m", "allocopt", "solve", "-"], stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=interruptible)
    try:
        _wait_until_idle(process.pid)  # imported, blocked reading stdin
        process.send_signal(signal.SIGINT)
        out, err = process.communicate(timeout=60)
    finally:
        process.kill()
    assert process.returncode == 130
    assert (out, err) == ("", "allocopt: interrupted\n")


def _wait_until_idle(pid: int, timeout_s: float = 60.0) -> None:
    """Until the process has used no CPU for 0.5 s (it is blocked), or timeout_s."""
    def cpu() -> int:
        fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
        return int(fields[11]) + int(fields[12])

    deadline, last, since = time.monotonic() + timeout_s, -1, time.monotonic()
    while time.monotonic() < deadline:
        now = cpu()
        if now != last:
            last, since = now, time.monotonic()
        elif time.monotonic() - since > 0.5:
            return
        time.sleep(0.05)
