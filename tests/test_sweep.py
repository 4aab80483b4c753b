"""``allocopt sweep``: the grid's rows equal separate simulations, confidence intervals, figures, resuming
after a re-run and after SIGKILL, and the same table on Ray."""

from __future__ import annotations

import csv
import io
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

import allocopt
from allocopt.cluster import Cluster
from allocopt.errors import InvalidOptionError
from allocopt.experiments import (SweepSpecError, expand, load_spec, parse_spec, plot_sweep, run_sweep, summarize)
from allocopt.experiments.table import COLUMNS
from allocopt.mechanism import generate_workload
from allocopt.throughput import ThroughputTable

CLUSTER = {"v100": 2, "p100": 2, "k80": 2}
POLICIES = ["max_min_fairness", "max_min_fairness_perf"]
RATES = [2.0, 6.0]
SEEDS = [0, 1]
NUM_JOBS = 12
SPEC = f"""\
policies: {json.dumps(POLICIES)}
workloads:
  - generate: {{num_jobs: {NUM_JOBS}, jobs_per_hour: {json.dumps(RATES)}}}
clusters: [{json.dumps(CLUSTER)}]
seeds: {json.dumps(SEEDS)}
output: out
workers: 2
"""
# metrics that are wall-clock measurements, not simulation outcomes
TIMINGS = {"wall_s", "solve_s_per_round", "solve_s_total"}
# SimulationResult.metrics keys with a column of the same name
SAME = ["average_jct_s", "median_jct_s", "p99_jct_s", "makespan_s", "utilization", "restarts_per_job",
        "gpu_hours_per_job", "num_rounds", "num_solves", "average_ftf", "max_ftf", "unfair_fraction"]


def run_cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "allocopt", *args], capture_output=True, text=True, timeout=300,
                          cwd=cwd)


@pytest.fixture(scope="module")
def sweep(tmp_path_factory: pytest.TempPathFactory):
    directory = tmp_path_factory.mktemp("sweep")
    (directory / "spec.yaml").write_text(SPEC)
    spec = load_spec(directory / "spec.yaml")
    return spec, run_sweep(spec)


def outcome(row: dict) -> dict:
    return {k: v for k, v in row.items() if k not in TIMINGS}


def test_grid_has_one_point_per_combination(sweep):
    spec, result = sweep
    assert result.ran == 8 and result.skipped == 0 and not result.failed
    assert len(result.rows) == 8
    combos = {(r["policy"], r["jobs_per_hour"], r["seed"]) for r in result.rows}
    assert combos == {(p, r, s) for p in POLICIES for r in RATES for s in SEEDS}
    assert len({r["key"] for r in result.rows}) == 8
    lines = Path(spec.output, "results.csv").read_text().splitlines()
    assert lines[0].split(",") == list(COLUMNS) and len(lines) == 9


def test_parquet_table_holds_the_csv_rows(sweep):
    pq = pytest.importorskip("pyarrow.parquet", reason="the Parquet table needs pyarrow: pip install 'allocopt[parquet]'")
    _, result = sweep
    assert result.parquet is not None
    table = pq.read_table(result.parquet).to_pylist()
    assert [r["key"] for r in table] == [r["key"] for r in result.rows]
    for got, row in zip(table, result.rows):
        assert got["average_jct_s"] == row["average_jct_s"] and got["seed"] == row["seed"]
        assert json.loads(got["policy_options"]) == row["policy_options"]


def test_rows_equal_separate_simulate_runs(sweep, tmp_path):
    """Two points through the ``allocopt simulate`` command line, the other six through allocopt.simulate."""
    _, result = sweep
    table = ThroughputTable.gavel()
    for k, row in enumerate(sorted(result.rows, key=lambda r: (r["policy"], r["jobs_per_hour"], r["seed"]))):
        if k in (0, 7):
            out = tmp_path / f"{k}.json"
            proc = run_cli("simulate", "--generate", str(NUM_JOBS), "--jobs-per-hour", str(row["jobs_per_hour"]),
                           "--cluster", ",".join(f"{t}={n}" for t, n in CLUSTER.items()), "--seed", str(row["seed"]),
                           "--policy", row["policy"], "--json", str(out))
            assert proc.returncode == 0, proc.stderr
            document = json.loads(out.read_text())
            metrics, jct = document["metrics"], np.array(document["jobs"]["jct_s"])
        else:
            cluster = Cluster(CLUSTER)
            workload = generate_workload(table, NUM_JOBS, jobs_per_hour=row["jobs_per_hour"], seed=row["seed"],
                                         cluster=cluster)
            res = allocopt.simulate(workload, cluster, row["policy"], throughputs=table, seed=row["seed"])
            metrics, jct = res.metrics, res.jobs["jct_s"]
        for name in SAME:
            assert row[name] == metrics[name], (name, row, metrics)
        assert row["p95_jct_s"] == float(np.percentile(jct, 95))
        assert row["gpu_hours_by_type"] == metrics["gpu_hours_by_type"]
        assert set(row["gpu_hours_by_type"]) == set(CLUSTER)
        assert sum(row["gpu_hours_by_type"].values()) == pytest.approx(row["gpu_hours_total"], rel=1e-9)
        assert row["num_jobs"] == NUM_JOBS == row["num_measured"]


def test_summary_confidence_intervals_match_scipy(sweep):
    _, result = sweep
    summary = summarize(result.rows)
    checked = 0
    for policy in POLICIES:
        for rate in RATES:
            values = np.array([r["average_jct_s"] for r in result.rows
                               if r["policy"] == policy and r["jobs_per_hour"] == rate])
            low, high = stats.t.interval(0.95, df=len(values) - 1, loc=values.mean(), scale=stats.sem(values))
            (row,) = [s for s in summary if s["metric"] == "average_jct_s" and s["policy"] == policy
                      and s["jobs_per_hour"] == rate]
            assert row["n"] == 2
            assert row["mean"] == pytest.approx(values.mean(), rel=1e-12)
            assert row["std"] == pytest.approx(values.std(ddof=1), rel=1e-12)
            assert (row["ci95_low"], row["ci95_high"]) == pytest.approx((low, high), rel=1e-9)
            assert row["ci95_low"] < row["mean"] < row["ci95_high"]
            checked += 1
    assert checked == 4
    assert {s["metric"] for s in summary} >= {"p99_jct_s", "makespan_s", "average_ftf", "utilization",
                                              "gpu_hours_by_type.v100", "gpu_hours_by_type.k80"}
    (k80,) = [s for s in summary if s["metric"] == "gpu_hours_by_type.k80" and s["policy"] == POLICIES[0]
              and s["jobs_per_hour"] == RATES[0]]
    assert k80["mean"] == pytest.approx(np.mean([r["gpu_hours_by_type"]["k80"] for r in result.rows
                                                 if r["policy"] == POLICIES[0] and r["jobs_per_hour"] == RATES[0]]))


def test_summary_over_seeds_and_rates(sweep):
    _, result = sweep
    (row,) = [s for s in summarize(result.rows, ("p99_jct_s",), over=("seed", "jobs_per_hour"))
              if s["policy"] == POLICIES[0]]
    values = [r["p99_jct_s"] for r in result.rows if r["policy"] == POLICIES[0]]
    assert row["n"] == 4 and "jobs_per_hour" not in row
    assert row["mean"] == pytest.approx(np.mean(values), rel=1e-12)
    with pytest.raises(InvalidOptionError, match="over"):
        summarize(result.rows, over=("sed",))


def _pixels_near(image: np.ndarray, color: str, tol: float = 0.08) -> int:
    rgb = np.array([int(color[i:i + 2], 16) / 255 for i in (1, 3, 5)])
    return int((np.abs(image[..., :3] - rgb).max(axis=-1) < tol).sum())


def test_figures_show_a_series_per_policy(sweep, tmp_path):
    pytest.importorskip("matplotlib", reason="figures need matplotlib: pip install 'allocopt[plot]'")
    import matplotlib.image

    spec, result = sweep
    paths = plot_sweep(result.rows, spec.output, tmp_path)
    assert [p.name for p in paths] == ["jct_vs_load.png", "jct_cdf.png", "ftf_cdf.png", "timeline.png"]
    for path in paths:
        image = matplotlib.image.imread(path)
        assert image.shape[0] > 200 and image.shape[1] > 400
        ink = (image[..., :3] < 0.9).any(axis=-1).mean()
        assert 0.01 < ink < 0.9, (path.name, ink)  # neither blank nor filled
        for color in ("#1f77b4", "#ff7f0e"):  # matplotlib's first two series colours: one per policy
            assert _pixels_near(image, color) > 30, (path.name, color)


def test_rerun_does_no_work(sweep):
    spec, result = sweep
    table = Path(spec.output, "results.csv")
    before = table.read_bytes(), sorted((p.name, p.stat().st_mtime_ns) for p in Path(spec.output, "runs").iterdir())
    again = run_sweep(spec)
    assert (again.ran, again.skipped, again.failed) == (0, 8, [])
    assert [outcome(r) for r in again.rows] == [outcome(r) for r in result.rows]
    after = table.read_bytes(), sorted((p.name, p.stat().st_mtime_ns) for p in Path(spec.output, "runs").iterdir())
    assert after == before


def test_sweep_killed_and_restarted_has_each_point_once(tmp_path):
    spec_text = SPEC.replace(f"seeds: {json.dumps(SEEDS)}", "seeds: [0, 1, 2]").replace(
        f"num_jobs: {NUM_JOBS}", "num_jobs: 8")  # 12 points
    (tmp_path / "spec.yaml").write_text(spec_text)
    table = tmp_path / "out" / "results.csv"
    command = [sys.executable, "-m", "allocopt", "sweep", "spec.yaml", "--no-figures"]
    proc = subprocess.Popen(command, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            start_new_session=True)
    deadline = time.monotonic() + 120
    rows = 0
    while time.monotonic() < deadline and proc.poll() is None:
        rows = len(table.read_text().splitlines()) - 1 if table.exists() else 0
        if rows >= 2:
            break
        time.sleep(0.02)
    os.killpg(proc.pid, signal.SIGKILL)  # the sweep and its worker processes
    proc.wait()
    assert proc.returncode == -signal.SIGKILL, proc.stderr.read()
    done_at_kill = len(table.read_text().splitlines()) - 1
    assert 2 <= done_at_kill < 12
    with open(table, "a") as fh:  # a row torn by the kill: half of a line, no newline
        fh.write(table.read_text().splitlines()[1][:40])
    finished = run_cli("sweep", "spec.yaml", "--no-figures", "--workers", "1", cwd=tmp_path)
    assert finished.returncode == 0, finished.stderr
    assert f"({12 - done_at_kill} run, {done_at_kill} already done, 0 failed)" in finished.stdout
    lines = table.read_text().splitlines()
    keys = [line.split(",")[0] for line in lines[1:]]
    assert sorted(keys) == sorted(p.key for p in expand(load_spec(tmp_path / "spec.yaml")))
    assert len(keys) == len(set(keys)) == 12


def test_toml_spec_and_flags_are_the_same_sweep(tmp_path):
    (tmp_path / "a.toml").write_text(f"""\
policies = {json.dumps(POLICIES)}
seeds = {json.dumps(SEEDS)}
output = "out"
[[workloads]]
generate = {{ num_jobs = {NUM_JOBS}, jobs_per_hour = {json.dumps(RATES)} }}
[[clusters]]
v100 = 2
p100 = 2
k80 = 2
""")
    (tmp_path / "b.yaml").write_text(SPEC)
    toml_keys = [p.key for p in expand(load_spec(tmp_path / "a.toml"))]
    assert toml_keys == [p.key for p in expand(load_spec(tmp_path / "b.yaml"))]
    flagged = load_spec(None, {"policies": ",".join(POLICIES), "seeds": "0,1", "clusters": "v100=2,p100=2,k80=2",
                               "workloads": json.dumps([{"generate": {"num_jobs": NUM_JOBS, "jobs_per_hour": RATES}}])})
    assert [p.key for p in expand(flagged)] == toml_keys
    overridden = load_spec(tmp_path / "b.yaml", {"seeds": "5"})
    assert {p.params["seed"] for p in expand(overridden)} == {5}


@pytest.mark.parametrize("document, field", [
    ({"policies": ["fifo"], "workloads": [{"generate": {"num_jobs": 5, "jobs_per_hour": 1}}], "sedes": [0]},
     "sedes"),
    ({"workloads": [{"generate": {"num_jobs": 5, "jobs_per_hour": 1}}]}, "policies"),
    ({"policies": ["fifo"], "workloads": [{"generate": {"num_jobs": 5, "jobs_per_hour": -1}}]},
     "workloads[0].generate.jobs_per_hour"),
    ({"policies": ["fifo"], "workloads": [{"trace": "missing.trace"}]}, "workloads[0].trace"),
    ({"policies": ["fifo"], "workloads": [{"trace": "a", "sia": "b"}]}, "workloads[0]"),
    ({"policies": ["fifo"], "workloads": [{"generate": {"num_jobs": 5, "jobs_per_hour": 1}}], "seeds": ["x"]},
     "seeds"),
    ({"policies": ["fifo", {"name": "fifo"}], "workloads": [{"generate": {"num_jobs": 5, "jobs_per_hour": 1}}]},
     "policies"),
    ({"policies": [{"name": "fifo", "option": {}}], "workloads": [{"generate": {"num_jobs": 5, "jobs_per_hour": 1}}]},
     "policies[0]"),
    ({"policies": ["fifo"], "workloads": [{"generate": {"num_jobs": 5, "jobs_per_hour": 1}}],
      "clusters": [{"v100": -1}]}, "clusters[0].v100"),
    ({"policies": ["fifo"], "workloads": [{"generate": {"num_jobs": 5, "jobs_per_hour": 1}}], "window": [3, 2]},
     "window"),
])
def test_bad_spec_fields_are_named(document, field, tmp_path):
    with pytest.raises(SweepSpecError) as err:
        parse_spec(document, base_dir=tmp_path)
    assert err.value.field == field and str(err.value).startswith(field)
    assert isinstance(err.value, InvalidOptionError)


def test_window_past_the_generated_jobs_is_refused_before_running(tmp_path):
    spec = parse_spec({"policies": ["fifo"], "workloads": [{"generate": {"num_jobs": 5, "jobs_per_hour": 1}}],
                       "window": [2, 6], "output": str(tmp_path)})
    with pytest.raises(SweepSpecError, match="window: ends at job 6"):
        expand(spec)


def test_cli_reports_spec_errors_without_traceback(tmp_path):
    (tmp_path / "s.yaml").write_text("policies: [fifo]\nworkloads: [{trace: nowhere.trace}]\n")
    proc = run_cli("sweep", "s.yaml", cwd=tmp_path)
    assert proc.returncode == 2
    assert "workloads[0].trace: no file" in proc.stderr and "Traceback" not in proc.stderr
    assert "s.yaml: workloads[0].trace" in proc.stderr  # the file, then the field


def test_a_failing_point_is_reported_and_not_recorded(tmp_path):
    trace = Path(allocopt.__file__).parent / "data" / "gavel_traces" / "small_test.trace"
    spec = parse_spec({"policies": ["fifo"], "workloads": [{"trace": str(trace)}],
                       "clusters": [{"v100": 2, "k80": 4}, {"v100": 0, "k80": 1}], "output": str(tmp_path)})
    result = run_sweep(spec)
    assert result.ran == 1 and len(result.failed) == 1
    params, message = result.failed[0]
    assert params["cluster"] == "v100=0,k80=1" and "fits no GPU type" in message
    assert [r["cluster"] for r in result.rows] == ["v100=2,k80=4"]


@pytest.fixture(scope="module")
def ray_address():
    ray = pytest.importorskip("ray", reason="a sweep on Ray needs Ray: pip install 'allocopt[ray]'")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield ray.get_runtime_context().gcs_address
    ray.shutdown()


def test_the_same_sweep_on_ray_gives_the_same_table(sweep, ray_address, tmp_path):
    spec, result = sweep
    from dataclasses import replace

    on_ray = run_sweep(replace(spec, output=str(tmp_path), ray_address=ray_address, workers=1))
    assert on_ray.ran == 8 and not on_ray.failed
    key = {r["key"]: outcome(r) for r in result.rows}
    assert {r["key"]: outcome(r) for r in on_ray.rows} == key


def test_directory_workloads_expand_to_each_file_keyed_by_content(tmp_path):
    data = Path(allocopt.__file__).parent / "data"
    traces = tmp_path / "traces"
    traces.mkdir()
    for name in ("artifact_evaluation.trace", "small_test.trace"):
        (traces / name).write_bytes((data / "gavel_traces" / name).read_bytes())
    (traces / "w.csv").write_bytes((data / "sia_workloads" / "saturn" / "workload-1.csv").read_bytes())
    document = {"policies": ["fifo"], "workloads": [{"directory": "traces", "label": "set"}], "seeds": [0, 1]}
    points = expand(parse_spec(document, base_dir=tmp_path))
    assert [(p.params["workload"], p.params["workload_kind"], p.params["seed"]) for p in points] == [
        ("set/artifact_evaluation", "trace", 0), ("set/artifact_evaluation", "trace", 1),
        ("set/small_test", "trace", 0), ("set/small_test", "trace", 1), ("set/w", "sia", 0), ("set/w", "sia", 1)]
    assert {p.params["workload_set"] for p in points} == {"set"}
    with open(traces / "small_test.trace", "a") as fh:  # an edited file is a new point; the others keep their keys
        fh.write((data / "gavel_traces" / "small_test.trace").read_text().splitlines()[0] + "\n")
    again = expand(parse_spec(document, base_dir=tmp_path))
    changed = [p.params["workload"] for p, q in zip(points, again) if p.key != q.key]
    assert changed == ["set/small_test", "set/small_test"]


def test_one_sweep_writes_a_directory_at_a_time(sweep):
    from allocopt.errors import StateError
    from allocopt.experiments.run import _locked

    spec, _ = sweep
    with _locked(Path(spec.output)):
        with pytest.raises(StateError, match="another sweep is writing"):
            run_sweep(spec)
    assert run_sweep(spec).skipped == 8


def test_reading_a_table_of_another_version_changes_nothing_until_a_row_is_added(sweep, tmp_path):
    from allocopt.experiments.table import ResultsTable

    spec, result = sweep
    lines = Path(spec.output, "results.csv").read_text().splitlines()
    header = lines[0].split(",")
    old = tmp_path / "results.csv"  # a table without the column 'fidelity'
    k = header.index("fidelity")
    rows = list(csv.reader(io.StringIO("\n".join(lines))))
    with open(old, "w", newline="") as fh:
        csv.writer(fh, lineterminator="\n").writerows(r[:k] + r[k + 1:] for r in rows)
    before = old.read_bytes()
    table = ResultsTable(old)
    assert old.read_bytes() == before
    assert [r["average_jct_s"] for r in table.rows] == [r["average_jct_s"] for r in result.rows]
    assert all(r["fidelity"] is None for r in table.rows)
    table.append(result.rows[0])
    assert old.read_text().splitlines()[0].split(",") == list(COLUMNS)
    assert len(ResultsTable(old).rows) == 9


def test_public_traces_with_placement_and_admission_equal_separate_simulate_runs(tmp_path):
    """A sweep over a Tiresias job file and PAI's tables, with placement and admission plug-ins, gives
    what simulate() gives on the reader's jobs."""
    from allocopt.mechanism.traces import read_pai_trace, read_tiresias_trace

    data = Path(allocopt.__file__).parent / "data"
    tiresias, jobs, tasks = (data / "tiresias" / "60_job.csv", data / "traces" / "pai_job_table.csv",
                             data / "traces" / "pai_task_table.csv")
    spec = parse_spec({"policies": ["las", "srtf"], "clusters": [{"gpu": 64}], "gpus_per_node": 4, "ftf": False,
                       "workloads": [{"trace": str(tiresias), "format": "tiresias"},
                                     {"trace": str(jobs), "format": "pai", "task_table": str(tasks)}],
                       "placement": "scattered", "admission": "load_based", "output": str(tmp_path)})
    result = run_sweep(spec)
    assert result.ran == 4 and not result.failed
    for row in result.rows:
        assert row["placement"] == "scattered" and row["admission"] == "load_based"
        trace = (read_tiresias_trace(tiresias) if row["trace_format"] == "tiresias" else read_pai_trace(jobs, tasks))
        want = allocopt.simulate(trace.workload, Cluster({"gpu": 64}, 4), row["policy"],
                                 throughputs=trace.throughputs, placement="scattered", admission="load_based",
                                 ftf=False)
        assert row["average_jct_s"] == pytest.approx(want.metrics["average_jct_s"], rel=1e-12)
    assert {r["task_table"] for r in result.rows} == {None, str(tasks.resolve())}


@pytest.mark.parametrize("document, field", [
    ({"fidelity": "gavle"}, "fidelity"),
    ({"placement": "nowhere"}, "placement"),
    ({"admission": "some"}, "admission"),
    ({"workloads": [{"trace": "TRACE", "format": "philly", "task_table": "TRACE"}]}, "workloads[0]"),
    ({"workloads": [{"trace": "TRACE", "format": "pai"}]}, "workloads[0]"),
    ({"workloads": [{"trace": "TRACE", "format": "csv"}]}, "workloads[0].format"),
])
def test_bad_fidelity_plugins_and_trace_formats_are_named(document, field, tmp_path):
    trace = str(Path(allocopt.__file__).parent / "data" / "tiresias" / "60_job.csv")
    base = {"policies": ["las"], "workloads": [{"trace": trace, "format": "tiresias"}]}
    doc = json.loads(json.dumps({**base, **document}).replace("TRACE", trace))
    with pytest.raises(SweepSpecError) as err:
        parse_spec(doc, base_dir=tmp_path)
    assert err.value.field == field
