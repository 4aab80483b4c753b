"""Trace readers (Tiresias, Philly, Helios, Alibaba PAI) on the shipped samples, and fuzzed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import allocopt
from allocopt import simulate
from allocopt.errors import AllocoptError, DataFileError
from allocopt.mechanism.traces import (
    read_helios_trace,
    read_pai_trace,
    read_philly_trace,
    read_tiresias_trace,
)
from allocopt.mechanism.workload import TraceError
from allocopt.throughput.table import ThroughputTable

DATA = Path(allocopt.__file__).parent / "data"
TIRESIAS = DATA / "tiresias" / "60_job.csv"
PHILLY = DATA / "traces" / "philly_cluster_job_log.json"
HELIOS = DATA / "traces" / "helios_cluster_log.csv"
PAI_JOBS, PAI_TASKS = DATA / "traces" / "pai_job_table.csv", DATA / "traces" / "pai_task_table.csv"
EXAMPLES = int(os.environ.get("ALLOCOPT_FUZZ_EXAMPLES", "100"))


def test_tiresias_job_file_keeps_every_job_as_written():
    trace = read_tiresias_trace(TIRESIAS)
    wl = trace.workload
    rows = [line.split(",") for line in TIRESIAS.read_text().split()[1:]]
    assert wl.num_jobs == len(rows) == 60 and not trace.skipped
    assert wl.total_steps.tolist() == [int(r[5]) for r in rows]  # steps are the run time in seconds
    assert wl.scale_factors.tolist() == [int(r[1]) for r in rows]
    assert wl.arrival_s.tolist() == [float(r[2]) for r in rows]
    assert wl.models[:2] == ("vgg19", "vgg11")
    assert trace.throughputs.row("vgg19", 1).tolist() == [1.0]


def test_philly_log_uses_the_last_attempt_and_counts_what_it_leaves_out():
    trace = read_philly_trace(PHILLY)
    jobs = json.loads(PHILLY.read_text())
    first = trace.job_ids.index("application_1506638472019_14199")
    # the README's example: 8 GPUs, last attempt 01:13:30 -> 06:53:12 two days later
    assert trace.workload.scale_factors[first] == 8
    assert trace.workload.total_steps[first] == 2 * 86400 + 5 * 3600 + 39 * 60 + 42
    no_time = sum(1 for j in jobs if not j["attempts"] or j["attempts"][-1]["end_time"] in (None, "None"))
    assert any(j["attempts"] and j["attempts"][-1]["end_time"] == "None" for j in jobs)  # as the trace writes it
    assert trace.skipped == {"no run time": no_time} and no_time > 0
    assert trace.workload.num_jobs + no_time == len(jobs)
    assert trace.workload.arrival_s[0] == 0 and (np.diff(trace.workload.arrival_s) >= 0).all()
    passed = read_philly_trace(PHILLY, statuses={"Pass"})
    assert passed.skipped["status"] == sum(1 for j in jobs if j["status"] != "Pass")


def test_helios_log_keeps_gpu_jobs_with_their_duration():
    trace = read_helios_trace(HELIOS)
    lines = HELIOS.read_text().split("\n")[1:]
    rows = [line.split(",") for line in lines if line]
    gpu_rows = [r for r in rows if int(r[3]) > 0]
    assert trace.skipped == {"no GPU": len(rows) - len(gpu_rows)}
    assert sorted(trace.workload.total_steps.tolist()) == sorted(int(r[10]) for r in gpu_rows)
    assert trace.workload.total_steps[0] == 36848 and trace.workload.scale_factors[1] == 4
    done = read_helios_trace(HELIOS, statuses={"COMPLETED"})
    assert done.workload.num_jobs == sum(1 for r in gpu_rows if r[6] == "COMPLETED")


def test_pai_tables_join_gpus_and_launch_time():
    trace = read_pai_trace(PAI_JOBS, PAI_TASKS)
    # the first job: a ps (no GPU), 2 workers at 100% and an evaluator at 50% -> 3 GPUs; it launched 5 s after
    # submission and ran until its end
    job = [r.split(",") for r in PAI_JOBS.read_text().split()][0]
    tasks = [r.split(",") for r in PAI_TASKS.read_text().split() if r.startswith(job[0])]
    k = trace.job_ids.index(job[1])
    launch = min(float(t[4]) for t in tasks)
    assert trace.workload.scale_factors[k] == 3
    assert trace.workload.total_steps[k] == round(float(job[5]) - launch)
    assert "no GPU" in trace.skipped


def test_with_models_draws_measured_models_and_keeps_reference_run_times():
    table = ThroughputTable.gavel()
    trace = read_tiresias_trace(TIRESIAS).with_models(table, reference_gpu_type="v100", seed=1)
    wl = trace.workload
    rates = np.array([table.throughput(m, s, "v100") for m, s in wl.jobs()])
    seconds = [int(line.split(",")[5]) for line in TIRESIAS.read_text().split()[1:]]
    assert np.allclose(wl.total_steps / rates, seconds, atol=1 / rates.min())
    assert set(wl.models) <= {m for m, _ in table.entries}


def test_a_trace_runs_in_simulate_with_its_throughputs():
    trace = read_helios_trace(HELIOS)
    result = simulate(trace.workload, {"gpu": 32}, "tiresias", throughputs=trace.throughputs, ftf=False)
    assert np.isfinite(result.jobs["finish_s"]).all()
    # every job runs at least its trace run time
    assert (result.jobs["jct_s"] >= trace.workload.total_steps - 1e-6).all()


@pytest.mark.parametrize("fmt, path", [("tiresias", str(TIRESIAS)), ("philly", str(PHILLY)), ("helios", str(HELIOS)),
                                       ("pai", f"{PAI_JOBS},{PAI_TASKS}")])
def test_the_command_line_runs_a_public_trace_with_placement_and_admission(tmp_path, fmt, path):
    """``allocopt simulate --trace-format`` gives what simulate() gives on the reader's jobs."""
    cluster = {"gpu": 64}
    args = ["simulate", "--trace", path, "--trace-format", fmt, "--cluster", "gpu=64", "--gpus-per-node", "gpu=4",
            "--policy", "tiresias", "--placement", "scattered", "--admission", "load_based", "--no-ftf",
            "--json", str(tmp_path / "r.json")]
    done = subprocess.run([sys.executable, "-m", "allocopt", *args], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    got = json.loads((tmp_path / "r.json").read_text())
    trace = read_pai_trace(PAI_JOBS, PAI_TASKS) if fmt == "pai" else \
        {"tiresias": read_tiresias_trace, "philly": read_philly_trace, "helios": read_helios_trace}[fmt](path)
    want = simulate(trace.workload, allocopt.Cluster(cluster, 4), "tiresias", throughputs=trace.throughputs,
                    placement="scattered", admission="load_based", ftf=False)
    assert len(got["jobs"]["jct_s"]) == trace.workload.num_jobs
    assert got["metrics"]["average_jct_s"] == pytest.approx(want.metrics["average_jct_s"], rel=1e-9)


@pytest.mark.parametrize("args, message", [
    (["--trace-format", "pai", "--trace", str(PAI_JOBS)], "JOB_TABLE,TASK_TABLE"),
    (["--trace-format", "helios", "--trace", str(HELIOS), "--placement", "nowhere"], "unknown placement policy"),
    (["--trace-format", "tiresias", "--trace", str(TIRESIAS), "--throughputs", str(TIRESIAS)], "--throughputs"),
])
def test_the_command_line_names_a_bad_trace_option(args, message):
    done = subprocess.run([sys.executable, "-m", "allocopt", "simulate", "--cluster", "gpu=64", "--no-ftf", *args],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode != 0 and message in done.stderr and "Traceback" not in done.stderr


# ----- malformed input: a typed error naming the file, the line and the column ----------------------------

CSV_CASES = {  # reader, file, data line offset (header lines), {column index: (name, bad values)}
    "tiresias": (lambda p: read_tiresias_trace(p), TIRESIAS, 1, {
        1: ("num_gpu", ["abc", "nan", "-1", "1.5", "1e400", ""]),
        2: ("submit_time", ["abc", "nan", "-3", "inf", ""]), 5: ("duration", ["x", "nan", "-1", "inf", ""])}),
    "helios": (lambda p: read_helios_trace(p), HELIOS, 1, {
        3: ("gpu_num", ["abc", "-1", "0.5", "1e400", ""]),
        7: ("submit_time", ["abc", "2020-13-01 00:00:00", "2020-06-09", ""]), 10: ("duration", ["x", "-5", "inf", ""])}),
    "pai_jobs": (lambda p: read_pai_trace(p, PAI_TASKS), PAI_JOBS, 0, {
        4: ("start_time", ["abc", "nan", "-1", "inf", ""]), 5: ("end_time", ["abc", "nan", "-1", "inf"])}),
    "pai_tasks": (lambda p: read_pai_trace(PAI_JOBS, p), PAI_TASKS, 0, {
        2: ("inst_num", ["abc", "nan", "-2", "inf", ""]), 8: ("plan_gpu", ["abc", "nan", "-50", "inf"]),
        4: ("start_time", ["abc", "nan", "-1"])}),
}


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=st.sampled_from(sorted(CSV_CASES)), data=st.data())
def test_a_malformed_csv_value_names_file_line_and_column(tmp_path, case, data):
    reader, source, header, columns = CSV_CASES[case]
    lines = source.read_text().split("\n")
    number = data.draw(st.integers(header, len([x for x in lines if x]) - 1), label="line")
    index = data.draw(st.sampled_from(sorted(columns)), label="column")
    name, values = columns[index]
    fields = lines[number].split(",")
    fields[index] = data.draw(st.sampled_from(values), label="value")
    lines[number] = ",".join(fields)
    path = tmp_path / source.name
    path.write_text("\n".join(lines))
    with pytest.raises(TraceError) as caught:
        reader(path)
    assert caught.value.line == number + 1 and caught.value.field == name
    assert str(caught.value).startswith(f"{path}:{number + 1}: column {name}")


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=st.sampled_from(sorted(CSV_CASES)), data=st.data())
def test_a_line_with_the_wrong_number_of_columns_is_named(tmp_path, case, data):
    reader, source, header, _ = CSV_CASES[case]
    lines = source.read_text().split("\n")
    number = data.draw(st.integers(header, len([x for x in lines if x]) - 1), label="line")
    fields = lines[number].split(",")
    lines[number] = ",".join(fields[:-1] if data.draw(st.booleans()) else [*fields, "extra"])
    path = tmp_path / source.name
    path.write_text("\n".join(lines))
    with pytest.raises(TraceError) as caught:
        reader(path)
    assert caught.value.line == number + 1 and caught.value.field == "columns"


PHILLY_BAD = {"submitted_time": ["abc", 5, None, "2017-10-07"], "attempts": ["x", 5, {"a": 1}],
              "jobid": [], "status": []}


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_a_malformed_philly_job_names_its_line_and_field(tmp_path, data):
    lines = PHILLY.read_text().split("\n")
    number = data.draw(st.integers(1, len(lines) - 3), label="line")  # lines 2.. hold one job each
    job = json.loads(lines[number].rstrip(","))
    key = data.draw(st.sampled_from(sorted(PHILLY_BAD)), label="field")
    if PHILLY_BAD[key]:
        job[key] = data.draw(st.sampled_from(PHILLY_BAD[key]), label="value")
    else:
        del job[key]
    lines[number] = json.dumps(job) + ("," if lines[number].endswith(",") else "")
    path = tmp_path / PHILLY.name
    path.write_text("\n".join(lines))
    with pytest.raises(TraceError) as caught:
        read_philly_trace(path)
    assert caught.value.line == number + 1 and caught.value.field == key
    assert str(caught.value).startswith(f"{path}:{number + 1}: field {key}")


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(cut=st.integers(0, 2000))
def test_broken_philly_json_names_line_and_column(tmp_path, cut):
    text = PHILLY.read_text()
    path = tmp_path / PHILLY.name
    path.write_text(text[:cut] + "}" + text[cut:])
    try:
        read_philly_trace(path)
    except TraceError as err:
        assert err.line is not None and str(err).startswith(f"{path}:{err.line}:")
        if err.field == "json" and "invalid JSON" in str(err):
            assert "column" in str(err)


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=st.sampled_from([*sorted(CSV_CASES), "philly"]), garbage=st.text(max_size=40), data=st.data())
def test_any_inserted_line_is_accepted_or_a_typed_error(tmp_path, case, garbage, data):
    if case == "philly":
        reader, source = read_philly_trace, PHILLY
    else:
        reader, source = CSV_CASES[case][0], CSV_CASES[case][1]
    lines = source.read_text().split("\n")
    lines.insert(data.draw(st.integers(0, len(lines)), label="at"), garbage)
    path = tmp_path / source.name
    path.write_bytes("\n".join(lines).encode("utf-8"))
    try:
        reader(path)
    except AllocoptError as err:
        assert isinstance(err, (TraceError, DataFileError)) and str(path) in str(err)


def test_an_unreadable_or_empty_trace_is_a_typed_error(tmp_path):
    with pytest.raises(DataFileError, match="cannot read"):
        read_helios_trace(tmp_path / "absent.csv")
    (tmp_path / "empty.csv").write_text("\n")
    with pytest.raises(TraceError, match="no jobs"):
        read_tiresias_trace(tmp_path / "empty.csv")
    (tmp_path / "cpu.csv").write_text(HELIOS.read_text().split("\n")[0] + "\n1,u,vc,0,4,1,COMPLETED,2020-06-09 "
                                      "18:41:01,2020-06-09 18:41:01,2020-06-09 18:42:01,60,0\n")
    with pytest.raises(TraceError, match="no job of the trace is kept"):
        read_helios_trace(tmp_path / "cpu.csv")
    (tmp_path / "head.csv").write_text("job_id,num_gpu\n1,2\n")
    with pytest.raises(TraceError, match="header lacks") as caught:
        read_tiresias_trace(tmp_path / "head.csv")
    assert caught.value.field == "submit_time"


def test_sia_philly_workload_runs_under_order_policies():
    from allocopt.cluster import Cluster
    from allocopt.mechanism.sia_workloads import read_sia_workload
    from allocopt.throughput.profiles import shipped_profiles_dir

    path = DATA / "sia_workloads" / "philly" / "workload-1.csv"
    jobs = read_sia_workload(path)
    assert len(jobs) == 160
    cluster = Cluster({"aws": 24, "rtx": 24, "dgx-ext": 16}, gpus_per_node={"aws": 4, "rtx": 8, "dgx-ext": 8})
    first = jobs[:60]  # the first 60 jobs keep the test short
    results = {p: simulate(first, cluster, p, profiles=shipped_profiles_dir(), ftf=False)
               for p in ("order:fifo", "srtf")}
    for result in results.values():
        assert np.isfinite(result.jobs["finish_s"]).all() and result.metrics["num_jobs"] == 60
    # preemptive short-first beats arrival order on this trace (most jobs are short cifar10 runs)
    assert results["srtf"].metrics["average_jct_s"] < results["order:fifo"].metrics["average_jct_s"]
