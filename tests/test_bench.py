"""``allocopt bench``: a small run through the command line writes complete results whose objectives
match the cvxpy baselines; bad inputs are typed errors naming the option. No timing is asserted."""

from __future__ import annotations

import csv
import importlib.util
import json
import subprocess
import sys

import numpy as np
import pytest

from allocopt.bench.cli import main, run, standalone_parser
from allocopt.bench.runner import ROW_FIELDS, Config, History, run_target
from allocopt.bench.suite import POLICIES, TECHNIQUES, Target
from allocopt.errors import InvalidOptionError

pytest.importorskip("cvxpy", reason="the baselines need cvxpy: pip install -e '.[cvxpy]'")

SMALL = ["--quick", "--sizes", "16,24", "--no-progress"]


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench")
    done = subprocess.run([sys.executable, "-m", "allocopt.bench", *SMALL, "--out", str(out)],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    return out, done.stdout


def test_json_and_csv_hold_every_row(results):
    out, stdout = results
    document = json.loads((out / "bench.json").read_text())
    assert {"machine", "config", "notes", "rows"} <= set(document)
    rows = document["rows"]
    assert {r["policy"] for r in rows} == set(POLICIES)
    for row in rows:
        assert set(ROW_FIELDS) <= set(row)
        assert row["status"] == "ok", row
        assert row["backend"] == "highs"
    techniques = {(r["policy"], r["technique"]) for r in rows}
    for t in TECHNIQUES:
        for policy in t.policies or POLICIES:
            assert (policy, t.name) in techniques
    with open(out / "bench.csv", newline="") as fh:
        table = list(csv.DictReader(fh))
    assert tuple(table[0]) == ROW_FIELDS
    assert len(table) == len(rows)
    assert "mmf_space_sharing" in stdout


def test_objectives_agree_with_the_baselines(results):
    out, _ = results
    rows = json.loads((out / "bench.json").read_text())["rows"]
    for row in rows:
        assert row["baseline_status"] == "ok", row
        assert row["objectives_agree"] is True, row
        assert row["objective_rel_diff"] <= 1e-6
        assert row["ratio"] > 0


def test_plot_written(results):
    if importlib.util.find_spec("matplotlib") is None:
        pytest.skip("matplotlib not installed")
    out, _ = results
    assert (out / "bench-highs.png").stat().st_size > 0


def test_through_allocopt_cli(tmp_path):
    from allocopt import cli

    code = cli.main(["bench", *SMALL, "--policies", "max_min_fairness", "--instances", "table", "--no-plot",
                     "--out", str(tmp_path)])
    assert code == 0
    rows = json.loads((tmp_path / "bench.json").read_text())["rows"]
    assert {r["instance"] for r in rows} == {"table"}


@pytest.mark.parametrize("argv, option", [
    (["--policies", "max_min_fairness,nope"], "--policies"),
    (["--sizes", "0,16"], "--sizes"),
    (["--sizes", "many"], "--sizes"),
    (["--types", "3,x"], "--types"),
    (["--backends", "glpk"], "--backends"),
    (["--techniques", "magic"], "--techniques"),
    (["--repeat", "0"], "--repeat"),
    (["--policies", "sia", "--types", "8"], "--types"),
    (["--families", "--policies", "min_makespan"], "--policies"),
])
def test_bad_input_is_a_typed_error(tmp_path, capsys, argv, option):
    with pytest.raises(InvalidOptionError, match=option):
        main(standalone_parser().parse_args([*argv, "--out", str(tmp_path), "--no-progress"]))
    assert run([*argv, "--out", str(tmp_path), "--no-progress"]) == 2
    assert option in capsys.readouterr().err


def test_target_reports_verdict_ratio_and_agreement():
    target = Target("tiny max-min fairness", "max_min_fairness", "random", 512, 3, 60.0)
    result = run_target(target, Config(policies=["max_min_fairness"], sizes=[], types=[], backends=["highs"],
                                       instances=["random"], progress=False))
    assert set(result["techniques"]) == {t.name for t in target.techniques()}
    assert result["met"] == (result["total_s"] <= target.limit_s)
    assert result["techniques_agree"] is True
    assert result["baseline_status"] == "ok"
    assert [p[0] for p in result["baseline_points"]] == [128, 512]
    assert result["objectives_agree"] is True and result["ratio"] > 0


def test_extrapolation_of_baseline_times():
    history = History([(100, 1.0, False), (200, 4.0, False)])
    assert history.predict(400) == pytest.approx((16.0, False))  # quadratic through the two largest sizes
    assert history.predict(100) is None
    assert History([(100, 1.0, False)]).predict(300) == pytest.approx((3.0, True))  # one size: linear, a bound
    assert History([(100, 1.0, False), (200, 100.0, True)]).predict(400)[0] == pytest.approx(800.0)  # exponent <= 3


def test_resolve_target_rows_agree_with_cold_solves():
    from allocopt.bench.resolve import EVENTS, LP_POLICIES, event_pair, run_resolve_target
    from allocopt.bench.instances import random_problem

    rows = run_resolve_target(n_jobs=64, n_gpu_types=3, repetitions=1)
    assert [(r["policy"], r["event"]) for r in rows] == [(p, e) for p in LP_POLICIES for e in EVENTS]
    for r in rows:
        assert r["objective_rel_diff"] <= 1e-7
        assert r["total_s"] > 0 and r["baseline_total_s"] > 0 and r["ratio"] == r["baseline_total_s"] / r["total_s"]
        assert r["met"] == (r["ratio"] >= 10.0)
    full = random_problem(70, 3, 0)
    before, after = event_pair(full, 64, "throughput", 0)
    changed = np.flatnonzero((before.throughputs != after.throughputs).any(axis=1))
    assert changed.size == 3 and after.job_ids == before.job_ids
    before, after = event_pair(full, 64, "capacity", 0)
    assert (after.capacity >= before.capacity).all() and after.capacity.sum() > before.capacity.sum()
    assert event_pair(full, 64, "departure", 0)[1].num_jobs == 63
    assert event_pair(full, 64, "arrival", 0)[1].num_jobs == 65


def test_families_rows_compare_every_technique_with_the_plain_lp(tmp_path):
    done = subprocess.run([sys.executable, "-m", "allocopt.bench", "--families", "uniform,random", "--sizes", "96",
                           "--baseline-time-limit", "60", "--no-progress", "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    with (tmp_path / "families.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    assert {(r["policy"], r["family"], r["technique"]) for r in rows} == {  # both policies by default, no anchors
        (p, f, t) for p in ("max_min_fairness", "max_throughput") for f in ("uniform", "random")
        for t in ("plain", "auto", "closed_form", "aggregate_job_types", "price_decomposition")}
    for row in rows:
        assert row["status"] == "ok" and float(row["objective_rel_diff"]) <= 1e-6
        assert "DIFFERS" not in row["flag"] and float(row["vs_cvxpy"]) > 0
    chosen = {(r["policy"], r["family"]): r["chosen"] for r in rows if r["technique"] == "auto"}
    assert chosen["max_min_fairness", "uniform"] == "closed_form"
    assert chosen["max_throughput", "random"] != "price_decomposition"  # 96 jobs: below auto's 1,024
    assert "policy=max_throughput  family=uniform" in done.stdout and "technique=cvxpy" in done.stdout
    assert "issue" not in subprocess.run([sys.executable, "-m", "allocopt.bench", "--help"], capture_output=True,
                                         text=True).stdout


def test_families_max_throughput_auto_choice_ratios_and_flags():
    from allocopt.bench.families import SLOWDOWN_TOLERANCE, run_families

    seen, cells = [], []
    rows = run_families(["random", "gavel_table"], [1024], policies=["max_throughput"], baseline_time_limit_s=60,
                        anchors=False, on_row=lambda r: seen.append((r["family"], r["technique"])),
                        on_cell=lambda c: cells.append([r["technique"] for r in c]))
    techniques = ["plain", "auto", "closed_form", "aggregate_job_types", "price_decomposition"]
    assert cells == [techniques, techniques]  # one cell per family, written when its baseline is in
    assert seen == [(f, t) for f in ("random", "gavel_table") for t in [*techniques, "cvxpy"]]  # as they finish
    for family in ("random", "gavel_table"):
        cell = {r["technique"]: r for r in rows if r["family"] == family}
        plain = cell["plain"]
        for technique, row in cell.items():
            assert row["status"] == "ok" and row["policy"] == "max_throughput" and row["reference"] == "plain"
            assert row["vs_reference"] == pytest.approx(row["total_s"] / plain["total_s"])
            assert row["objective_rel_diff"] == pytest.approx(
                abs(row["objective"] - plain["objective"]) / abs(plain["objective"]), abs=1e-15)
            assert row["objective_rel_diff"] <= 1e-6 and "DIFFERS" not in row["flag"]
            slower = technique != "plain" and row["vs_reference"] > 1 + SLOWDOWN_TOLERANCE
            assert ("SLOWER" in row["flag"]) == slower
            assert row["baseline_status"] == "ok"
            assert row["vs_cvxpy"] == pytest.approx(row["baseline_total_s"] / row["total_s"])
    auto = {r["family"]: r["chosen"] for r in rows if r["technique"] == "auto"}
    assert auto["random"] == "price_decomposition"  # 1,024 distinct jobs, no deadlines
    assert auto["gavel_table"] in ("closed_form", "aggregate_job_types")  # 26 models: jobs repeat


def test_family_row_flags_a_slowdown_and_a_different_objective():
    from allocopt.bench.families import _row
    from allocopt.bench.timing import Measurement

    plain = Measurement(total_s=1.0, objective=100.0)
    flag = {name: _row("random", "max_throughput", 64, name, m, plain, "plain", "")["flag"] for name, m in (
        ("plain", plain), ("fast", Measurement(total_s=1.09, objective=100.0)),
        ("slow", Measurement(total_s=1.2, objective=100.0)), ("off", Measurement(total_s=0.5, objective=100.01)),
        ("both", Measurement(total_s=2.0, objective=99.0)))}
    assert flag == {"plain": "", "fast": "", "slow": "SLOWER", "off": "OBJECTIVE DIFFERS",
                    "both": "SLOWER OBJECTIVE DIFFERS"}
    failed = _row("random", "max_throughput", 64, "auto", Measurement(status="timeout: over 1 s"), plain, "plain", "")
    assert failed["flag"] is None and failed["vs_reference"] is None


def test_families_techniques_keep_the_plain_reference():
    from allocopt.bench.families import run_families

    rows = run_families(["random"], [64], policies=["max_throughput"], techniques=["auto"], baseline=False,
                        anchors=False)
    assert [r["technique"] for r in rows] == ["plain", "auto"] and rows[1]["vs_reference"] > 0


def test_families_water_filling_on_request_by_job_class():
    from allocopt.bench.families import run_families

    rows = run_families(["gavel_table", "random"], [256], policies=["water_filling"], baseline=False, anchors=False)
    auto = {r["family"]: r["chosen"] for r in rows if r["technique"] == "auto"}
    assert {(r["family"], r["technique"]) for r in rows} == {
        (f, t) for f in ("gavel_table", "random") for t in ("plain", "auto", "aggregate_job_types")}
    assert auto == {"gavel_table": "aggregate_job_types", "random": "plain"}  # 92 classes of 256 jobs; 256 of 256
    seen = []  # Gavel's water-filling baseline on a problem without entities: each job its own, as allocopt
    small = run_families(["random"], [48], policies=["water_filling"], anchors=False, on_row=seen.append)
    assert all(r["baseline_status"] == "ok" and r["vs_cvxpy"] > 0 for r in small)
    assert seen[-1]["objective"] == pytest.approx(small[0]["objective"], rel=1e-6)
    assert all(r["status"] == "ok" and r["objective_rel_diff"] <= 1e-6 for r in rows)


def test_a_baseline_is_stopped_at_its_wall_clock_and_memory_limits():
    from allocopt.bench.baselines import BASELINES
    from allocopt.bench.bounded import run_bounded
    from allocopt.bench.instances import random_problem, table_problem

    ok = run_bounded(BASELINES["max_min_fairness"], (random_problem(64, 3), {}, 30.0, 1), wall_limit_s=120)
    assert ok.ok and ok.objective is not None
    big = table_problem(512, 3, space_sharing=True)  # 130,816 pairs: cvxpy's tree needs far more than this
    capped = run_bounded(BASELINES["mmf_space_sharing"], (big, {"space_sharing": True}, 60.0, 1),
                         wall_limit_s=120, memory_limit_bytes=1200 << 20)
    assert capped.status.startswith("error") and capped.objective is None
    stopped = run_bounded(BASELINES["mmf_space_sharing"], (big, {"space_sharing": True}, 60.0, 1), wall_limit_s=1)
    assert stopped.status.startswith("timeout")
