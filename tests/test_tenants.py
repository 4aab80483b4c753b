"""Tenants in the simulator: weights under contention, GPU quotas, per-tenant metrics, typed errors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from allocopt.experiments import parse_spec, run_sweep, summarize
from allocopt.mechanism.priority import greedy_fill, quota_fill, select_jobs
from allocopt.mechanism.simulator import simulate
from allocopt.mechanism.tenants import TenantError, folded_weights, read_tenants, resolve_tenants
from allocopt.mechanism.traces import read_helios_trace, read_pai_trace, read_philly_trace
from allocopt.mechanism.workload import TraceError, Workload, read_gavel_trace
from allocopt.throughput import ThroughputTable

DATA = Path(__file__).resolve().parents[1] / "allocopt" / "data" / "traces"
TABLE = ThroughputTable([("m", 1), ("m", 2)], ["v100", "k80"], np.array([[1.0, 0.5], [1.8, 0.9]]))
JOBS, STEPS, GPUS = 40, 20_000, 4  # per tenant half of the jobs; every job 1 GPU


def _workload(tenants: tuple[str, ...] | None = None) -> Workload:
    tenants = tenants or tuple("a" if k % 2 == 0 else "b" for k in range(JOBS))
    return Workload(("m",) * JOBS, np.ones(JOBS, dtype=np.int64), np.full(JOBS, STEPS), np.zeros(JOBS),
                    np.ones(JOBS), "two tenants", None, tenants)


def _gpu_time_ratio(result, first: str, second: str) -> float:
    """GPU-seconds ``first``'s jobs received over ``second``'s, up to the time ``first``'s jobs all finished
    (both tenants have work all along: the contention window)."""
    tenant = result.jobs["tenant"]
    end = result.jobs["finish_s"][tenant == first].max()
    work = STEPS * (JOBS // 2)  # each tenant's GPU-seconds of work (1 step/s on a v100)
    assert result.jobs["finish_s"][tenant == second].min() > end  # the second still had work
    return work / (GPUS * end - work)


@pytest.mark.parametrize("policy", ["max_min_fairness", "max_min_fairness_perf",
                                    "gavel:max_min_fairness_water_filling"])
def test_a_weight_2_tenant_gets_twice_the_gpu_time_of_a_weight_1_tenant(policy):
    result = simulate(_workload(), {"v100": GPUS, "k80": 0}, policy, throughputs=TABLE, ftf=False,
                      tenants={"a": 2, "b": 1})
    assert _gpu_time_ratio(result, "a", "b") == pytest.approx(2.0, rel=0.05)
    per = result.metrics["tenants"]
    assert per["a"]["average_jct_s"] < 0.8 * per["b"]["average_jct_s"]
    assert result.config["tenants"]["a"] == {"weight": 2.0, "gpu_quota": None}


def test_without_tenant_weights_the_tenants_share_equally():
    result = simulate(_workload(), {"v100": GPUS, "k80": 0}, "max_min_fairness", throughputs=TABLE, ftf=False)
    per = result.metrics["tenants"]  # the jobs name tenants: metrics per tenant, no weights applied
    assert per["a"]["average_jct_s"] == pytest.approx(per["b"]["average_jct_s"], rel=0.01)
    assert per["a"]["gpu_hours_share"] == pytest.approx(0.5, abs=0.01)
    assert "tenants" not in result.config


def test_a_tenant_with_many_jobs_weighs_as_much_as_one_with_few():
    """Hierarchical weighting: 30 jobs of tenant a and 10 of tenant b, equal weights: each tenant gets half."""
    labels = tuple("a" if k % 4 else "b" for k in range(JOBS))
    result = simulate(_workload(labels), {"v100": GPUS, "k80": 0}, "max_min_fairness", throughputs=TABLE,
                      ftf=False, tenants="equal")
    tenant = result.jobs["tenant"]
    end = result.jobs["finish_s"][tenant == "b"].max()  # b (10 jobs) finishes first, having had half the GPUs
    assert end == pytest.approx(2 * STEPS * 10 / GPUS, rel=0.05)
    plain = simulate(_workload(labels), {"v100": GPUS, "k80": 0}, "max_min_fairness", throughputs=TABLE, ftf=False)
    assert plain.jobs["finish_s"][tenant == "b"].max() > 1.5 * end  # per job, b's jobs got a quarter


def test_folded_weights_give_each_tenant_its_weight():
    jobs = np.array([1.0, 1.0, 3.0, 2.0])
    tenant = np.array([0, 0, 0, 1])
    folded = folded_weights(jobs, tenant, np.array([1.0, 4.0]))
    per = np.bincount(tenant, folded)
    assert per[1] / per[0] == pytest.approx(4.0)
    assert folded[2] / folded[0] == pytest.approx(3.0)


@pytest.mark.parametrize("policy", ["max_min_fairness", "las"])
def test_a_quota_caps_the_gpus_a_tenant_holds(policy):
    quota = 2
    result = simulate(_workload(), {"v100": 8, "k80": 0}, policy, throughputs=TABLE, ftf=False,
                      tenants={"a": {"weight": 1, "gpu_quota": quota}, "b": {"weight": 1}})
    tenant = result.jobs["tenant"]
    work = STEPS * (JOBS // 2)
    assert result.jobs["finish_s"][tenant == "a"].max() >= work / quota * 0.999  # never more than 2 GPUs
    assert result.jobs["finish_s"][tenant == "b"].max() < 0.5 * work / quota  # b takes the rest
    assert result.jobs["finish_s"][tenant == "a"].max() == pytest.approx(work / quota, rel=0.01)  # always 2 GPUs


def test_quota_fill_equals_a_sequential_walk():
    rng = np.random.default_rng(3)
    for _ in range(300):
        n, k = int(rng.integers(0, 30)), int(rng.integers(1, 4))
        sizes = rng.choice([1, 2, 4, 8], size=n)
        tenant = rng.integers(0, k, size=n)
        quotas = np.where(rng.random(k) < 0.3, np.inf, rng.integers(1, 12, size=k).astype(float))
        capacity = int(rng.integers(0, 24))
        left = quotas.copy()
        taken = quota_fill(sizes, tenant, capacity, left)
        expected, free, room = np.zeros(n, dtype=bool), capacity, quotas.copy()
        for i in range(n):
            if sizes[i] <= free and sizes[i] <= room[tenant[i]]:
                expected[i], free, room[tenant[i]] = True, free - sizes[i], room[tenant[i]] - sizes[i]
        assert np.array_equal(taken, expected)
        assert np.array_equal(left, room)
        unlimited = quota_fill(sizes, tenant, capacity, np.full(k, np.inf))
        assert np.array_equal(unlimited, greedy_fill(sizes, capacity))


def test_select_jobs_respects_quotas_across_types():
    n = 12
    prio = np.ones((n, 2))
    T = np.ones((n, 2))
    tenant = np.array([0] * 8 + [1] * 4)
    chosen = select_jobs(prio, np.zeros((n, 2)), prio, T, np.full(n, 2), np.array([8, 8]), [0, 1],
                         tenant_of=tenant, gpu_quotas=np.array([6.0, np.inf]))
    held = np.bincount(tenant[chosen >= 0], np.full(int((chosen >= 0).sum()), 2), minlength=2)
    assert held[0] == 6 and held[1] == 8


def _trace(tmp_path: Path, tenants: list[str | None]) -> Path:
    lines = [f"ResNet-18 (batch size 64)\tcmd\tdir\t--n\t0\t1000\t1\t1\t-1\t{k * 10}"
             + ("" if t is None else f"\t{t}") for k, t in enumerate(tenants)]
    path = tmp_path / "jobs.trace"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_a_gavel_trace_names_tenants_in_an_11th_column(tmp_path):
    wl = read_gavel_trace(_trace(tmp_path, ["vc1", "vc2", "vc1"]))
    assert wl.tenants == ("vc1", "vc2", "vc1")
    assert read_gavel_trace(_trace(tmp_path, [None, None])).tenants is None


def test_a_trace_mixing_lines_with_and_without_tenant_names_the_line(tmp_path):
    with pytest.raises(TraceError, match=r"jobs.trace:3: 10 tab-separated columns, expected 11") as caught:
        read_gavel_trace(_trace(tmp_path, ["vc1", "vc2", None]))
    assert caught.value.line == 3 and caught.value.field == "columns"


def test_a_job_of_an_unknown_tenant_is_named(tmp_path):
    path = _trace(tmp_path, ["vc1", "vc2", "vc3"])
    with pytest.raises(TenantError, match=r"jobs.trace:3: job 2 names tenant 'vc3'") as caught:
        simulate(path, {"v100": 2}, "max_min_fairness", tenants={"vc1": 1, "vc2": 2}, ftf=False)
    assert caught.value.line == 3 and caught.value.field == "tenant"


def test_tenants_without_tenant_column_are_refused(tmp_path):
    with pytest.raises(TenantError, match="name no tenant"):
        simulate(_trace(tmp_path, [None, None]), {"v100": 2}, "max_min_fairness", tenants={"a": 1}, ftf=False)


@pytest.mark.parametrize("text, line, field", [
    ("tenant,weight\na,1\nb,-2\n", 3, "weight"),
    ("tenant,weight\na,1\nb,x\n", 3, "weight"),
    ("tenant,weight,gpu_quota\na,1,2.5\n", 2, "gpu_quota"),
    ("tenant,weight\na,1\na,2\n", 3, "tenant"),
    ("tenant,share\na,1\n", 1, "weight"),
    ("tenant,weight\na,1,3\n", 2, "columns"),
    ("tenant,weight\na,1e9\n", 2, "weight"),
])
def test_a_malformed_tenants_file_names_its_line_and_column(tmp_path, text, line, field):
    path = tmp_path / "tenants.csv"
    path.write_text(text)
    with pytest.raises(TenantError, match=rf"tenants.csv:{line}:") as caught:
        read_tenants(path)
    assert caught.value.line == line and caught.value.field == field


def test_tenants_files_in_csv_and_json_read_the_same(tmp_path):
    (tmp_path / "t.csv").write_text("tenant,weight,gpu_quota\na,2,16\nb,1,\n")
    (tmp_path / "t.json").write_text(json.dumps({"a": {"weight": 2, "gpu_quota": 16}, "b": 1}))
    csv_, json_ = read_tenants(tmp_path / "t.csv"), read_tenants(tmp_path / "t.json")
    assert csv_.names == json_.names == ("a", "b")
    assert np.array_equal(csv_.weights, json_.weights) and np.array_equal(csv_.gpu_quotas, [16, np.inf])


def test_a_quota_below_a_jobs_gpus_is_refused():
    wl = _workload()
    wl = Workload(wl.models, np.full(JOBS, 2), wl.total_steps, wl.arrival_s, wl.priority_weights, wl.source, None,
                  wl.tenants)
    with pytest.raises(TenantError, match="needs 2 GPUs but its tenant 'a' has gpu_quota 1") as caught:
        resolve_tenants({"a": {"gpu_quota": 1}, "b": 1}, wl)
    assert caught.value.field == "gpu_quota"


def test_public_trace_readers_map_virtual_clusters_and_users():
    converted = read_philly_trace(DATA / "philly_cluster_job_log.json")
    k = converted.job_ids.index("application_1506638472019_14199")  # the sample's first job: vc ee9e8c, user ce2f4c
    assert converted.workload.tenants[k] == "ee9e8c"
    by_user = read_philly_trace(DATA / "philly_cluster_job_log.json", tenant_field="user")
    assert by_user.workload.tenants[by_user.job_ids.index("application_1506638472019_14199")] == "ce2f4c"
    helios = read_helios_trace(DATA / "helios_cluster_log.csv").workload
    assert helios.tenants is not None and all(t.startswith("vc") for t in helios.tenants)
    users = read_helios_trace(DATA / "helios_cluster_log.csv", tenant_field="user").workload.tenants
    assert all(t.startswith("u") for t in users)
    pai = read_pai_trace(DATA / "pai_job_table.csv", DATA / "pai_task_table.csv").workload
    assert pai.tenants is not None and len(pai.tenants) == pai.num_jobs
    assert read_philly_trace(DATA / "philly_cluster_job_log.json", tenant_field=None).workload.tenants is None


def test_a_philly_trace_simulates_with_equal_tenants():
    converted = read_philly_trace(DATA / "philly_cluster_job_log.json")
    wl = converted.workload
    result = simulate(wl, {"gpu": 64}, "max_min_fairness", throughputs=converted.throughputs, tenants="equal",
                      ftf=False)
    per = result.metrics["tenants"]
    assert set(per) == set(wl.tenants)
    assert sum(v["num_jobs"] for v in per.values()) == wl.num_jobs
    assert sum(v["gpu_hours"] for v in per.values()) == pytest.approx(result.jobs["gpu_hours"].sum())


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "allocopt", "simulate", *args], capture_output=True, text=True,
                          timeout=300)


def test_cli_simulates_tenants_and_reports_a_bad_tenants_file(tmp_path):
    trace = _trace(tmp_path, ["a", "b", "a", "b"])
    (tmp_path / "t.csv").write_text("tenant,weight\na,2\nb,1\n")
    out = tmp_path / "r.json"
    proc = _cli("--trace", str(trace), "--cluster", "v100=2", "--tenants", str(tmp_path / "t.csv"), "--json", str(out))
    assert proc.returncode == 0, proc.stderr
    assert "tenant a: num_jobs 2" in proc.stdout
    assert json.loads(out.read_text())["config"]["tenants"]["a"]["weight"] == 2.0
    (tmp_path / "bad.csv").write_text("tenant,weight\na,2\nb,zero\n")
    proc = _cli("--trace", str(trace), "--cluster", "v100=2", "--tenants", str(tmp_path / "bad.csv"))
    assert proc.returncode == 2
    assert "bad.csv:3:" in proc.stderr and "Traceback" not in proc.stderr


def test_sweep_reports_per_tenant_metrics(tmp_path):
    trace = _trace(tmp_path, ["a", "b"] * 4)
    (tmp_path / "t.csv").write_text("tenant,weight\na,3\nb,1\n")
    spec = parse_spec({"policies": ["max_min_fairness"], "workloads": [{"trace": str(trace)}],
                       "clusters": [{"v100": 2}], "seeds": [0, 1], "tenants": str(tmp_path / "t.csv"),
                       "output": str(tmp_path / "out"), "ftf": False})
    result = run_sweep(spec)
    assert not result.failed
    row = result.rows[0]
    assert row["tenants"] == str((tmp_path / "t.csv").resolve())
    assert set(row["tenant_average_jct_s"]) == {"a", "b"}
    assert row["tenant_average_jct_s"]["a"] < row["tenant_average_jct_s"]["b"]
    metrics = {r["metric"]: r for r in summarize(result.rows)}
    assert metrics["tenant_gpu_hours.a"]["n"] == 2


def test_mangled_tenant_files_raise_only_typed_errors(tmp_path):
    """Random edits of a valid CSV file either read or raise a TenantError naming its line and a column."""
    from allocopt.errors import DataFileError

    valid = "tenant,weight,gpu_quota\nalice,1,\nbob,2.5,8\ncarol,0.5,16\n"
    rng = np.random.default_rng(11)
    alphabet = list("0123456789-.,ex\n ") + ["nan", "inf", "1e9", '"']
    path = tmp_path / "tenants.csv"
    for _ in range(400):
        text = list(valid)
        for _ in range(int(rng.integers(1, 4))):
            k = int(rng.integers(0, len(text)))
            text[k] = str(rng.choice(alphabet)) if rng.random() < 0.7 else ""
        path.write_text("".join(text))
        try:
            read_tenants(path)
        except TenantError as err:
            assert err.field in ("tenant", "weight", "gpu_quota", "columns", "json")
            assert str(err).startswith(f"{path}")
        except DataFileError:
            pass
