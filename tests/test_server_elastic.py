"""The HTTP service's goodput engine of elastic jobs (``/elastic``), over real HTTP on loopback."""

from __future__ import annotations

import json
import time
import types
from collections.abc import Iterator

import pytest

import allocopt
from allocopt.runtime.elastic import ElasticSpec, GoodputEngine, GoodputOptions, load_job_profiles
from allocopt.runtime.executor import JobRoundResult, RoundOutcome
from allocopt.server import ServiceOptions

pytest.importorskip("uvicorn", reason="the service needs the 'service' extra (pip install 'allocopt[service]')")
from allocopt.server.app import OPERATIONS  # noqa: E402
from allocopt.server.http import AllocoptServer  # noqa: E402
from tests.test_server import request, start_cli_server, stop, validator  # noqa: E402

CLUSTER = {"v100": 4, "k80": 4}
CONFIG = {"cluster": {"gpus": CLUSTER}, "policy": "sia", "round_seconds": 60.0, "refit_budget_s": 30.0}
#: True seconds of one micro-batch of one sample's share, per GPU type: v100 is three times faster than k80.
SPEED = {"v100": (0.02, 0.001), "k80": (0.06, 0.003)}


def true_iteration_s(gpu_type: str, replicas: int, local_bsz: int, accum_steps: int) -> tuple[float, float]:
    """(compute seconds of a micro-batch, iteration seconds) of the simulated jobs."""
    fixed, per_sample = SPEED[gpu_type]
    compute = fixed + per_sample * local_bsz
    sync = 0.0 if replicas == 1 else 0.01 * replicas
    return compute, (accum_steps + 1) * compute + sync


@pytest.fixture
def fixed_clock(monkeypatch) -> None:
    """The goodput engine's wall clock stands still, so two engines given the same calls plan the same rounds."""
    import allocopt.runtime.elastic as elastic

    monkeypatch.setattr(elastic, "time", types.SimpleNamespace(time=lambda: 1.7e9, perf_counter=time.perf_counter))


@pytest.fixture
def server() -> Iterator[AllocoptServer]:
    with AllocoptServer(("127.0.0.1", 0), options=ServiceOptions(max_body_bytes=64 * 1024)) as srv:
        assert request(f"{srv.url}/elastic", "POST", CONFIG)[0] == 201
        yield srv


def twin_engine(server: AllocoptServer, applications: list[str]) -> GoodputEngine:
    """A goodput engine configured as ``CONFIG`` is over HTTP (the service caps its solves at --solve-timeout)."""
    return GoodputEngine(allocopt.Cluster(CLUSTER), "sia", round_seconds=60.0,
                         profiles=load_job_profiles(None, applications),
                         options=GoodputOptions({"time_limit_s": server.options.solve_timeout_s}, refit_budget_s=30.0))


def results_of(plan: dict, *, steps: int = 50) -> list[dict]:
    """Every lease ran its round at the simulated jobs' true speed and reported gradient statistics."""
    out = []
    for lease in plan["leases"]:
        batch = lease["batch"]
        compute, iteration = true_iteration_s(lease["gpu_type"], len(lease["gpu_ids"]), batch["local_bsz"],
                                              batch["accum_steps"])
        out.append({"job_id": lease["job_id"], "outcome": "preempted", "steps": steps,
                    "run_seconds": lease["max_seconds"], "measured_steps_per_s": 1.0 / iteration,
                    "restarted": not lease["extended"],
                    "metrics": {"grad_sqr": 2.0, "grad_var": 50.0,
                                "sync_time": iteration - (batch["accum_steps"] + 1) * compute}})
    return out


def as_results(documents: list[dict]) -> list[JobRoundResult]:
    return [JobRoundResult(r["job_id"], RoundOutcome(r["outcome"]), r["steps"], r["run_seconds"],
                           r["measured_steps_per_s"], r["restarted"], metrics=r["metrics"]) for r in documents]


JOBS = [
    {"id": "resnet", "batch_size": 128, "application": "cifar10", "max_replicas": 4},
    {"id": "bert", "batch_size": 64, "max_batch_size": 512, "max_local_bsz": 128, "lr_scaling": "sqrt"},
    {"id": 7, "batch_size": 32, "gpu_types": ["v100"], "min_replicas": 1, "max_replicas": 2},
]


def test_elastic_rounds_over_http_match_a_goodput_engine(server, fixed_clock):
    twin = twin_engine(server, ["cifar10"])
    for job in JOBS:
        status, out = request(f"{server.url}/elastic/jobs", "POST", job)
        assert status == 201 and out["id"] == job["id"] and out["batch_size"] == job["batch_size"], out
        spec = {k: v for k, v in job.items() if k not in ("id", "gpu_types")}
        twin.add_job(job["id"], ElasticSpec(**spec), gpu_types=job.get("gpu_types"))
    step = {"gpu_type": "v100", "num_nodes": 1, "replicas": 1, "local_bsz": 64, "compute_s": 0.08, "iter_s": 0.09}
    assert request(f"{server.url}/elastic/jobs/bert/step_time", "POST", step)[0] == 200
    twin.observe_step_time("bert", "v100", 1, 1, 64, 0.08, 0.09)
    assert request(f"{server.url}/elastic/jobs/bert/gradient", "POST", {"grad_sqr": 1.0, "grad_var": 20.0})[0] == 200
    twin.observe_gradient("bert", 1.0, 20.0)
    check = validator("round_plan")
    seen: dict[object, set[tuple[str, int]]] = {}
    for index in range(5):
        status, plan = request(f"{server.url}/elastic/rounds/next", "POST", {} if index % 2 else None)
        assert status == 200, plan
        check.validate(plan)
        expected = twin.next_round()
        assert plan == json.loads(json.dumps({
            "round_index": expected.round_index, "start_s": expected.start_s, "round_seconds": expected.round_seconds,
            "leases": [{**lease.__dict__, "gpu_ids": list(lease.gpu_ids), "batch": lease.batch.__dict__}
                       for lease in expected.leases], "stop": list(expected.stop)}))
        assert plan["round_index"] == index and plan["leases"]
        assert all(lease["batch"]["batch_size"] == len(lease["gpu_ids"]) * lease["batch"]["local_bsz"]
                   * (lease["batch"]["accum_steps"] + 1) for lease in plan["leases"])
        for lease in plan["leases"]:
            seen.setdefault(lease["job_id"], set()).add((lease["gpu_type"], len(lease["gpu_ids"])))
        results = results_of(plan)
        status, out = request(f"{server.url}/elastic/rounds/{index}/results", "POST", results)
        assert status == 200 and out == {"round_index": index, "recorded": len(results)}, out
        twin.record_round(as_results(results))
    assert request(f"{server.url}/elastic")[1] == json.loads(json.dumps(twin.to_json()))
    assert {t for t, _ in seen["resnet"]} == {"v100", "k80"}  # profiled on each type
    assert {t for t, _ in seen[7]} == {"v100"}
    status, jobs = request(f"{server.url}/elastic/jobs")
    assert status == 200 and [j["id"] for j in jobs["jobs"]] == ["resnet", "bert", 7] and jobs["round_index"] == 5
    status, job = request(f"{server.url}/elastic/jobs/7")
    assert status == 200 and job["gpu_types"] == ["v100"] and job["gradient"] == {"grad_sqr": 2.0, "grad_var": 50.0}
    assert job["batch"] == twin.get_job(7)["batch"] and job["gpu_ids"] == twin.get_job(7)["gpu_ids"]
    status, out = request(f"{server.url}/elastic/jobs/bert", "DELETE")
    assert status == 200 and out == {"removed": "bert", "round_index": 5}
    twin.remove_job("bert")
    assert request(f"{server.url}/elastic/rounds/next", "POST", {})[1]["leases"] == [
        json.loads(json.dumps({**lease.__dict__, "gpu_ids": list(lease.gpu_ids), "batch": lease.batch.__dict__}))
        for lease in twin.next_round().leases]


def test_a_job_measured_on_each_type_gets_its_learned_step_times_back(server):
    job = {"id": "j", "batch_size": 64, "max_batch_size": 256, "max_replicas": 2}
    assert request(f"{server.url}/elastic/jobs", "POST", job)[0] == 201
    types_run = []
    for index in range(6):
        plan = request(f"{server.url}/elastic/rounds/next", "POST", {})[1]
        (lease,) = plan["leases"]
        types_run.append(lease["gpu_type"])
        assert request(f"{server.url}/elastic/rounds/{index}/results", "POST", results_of(plan))[0] == 200
    assert len(set(types_run[:2])) == 2  # one type, then the other (Sia's profiling of a new job)
    assert types_run[-1] == "v100"  # then the faster type
    status, out = request(f"{server.url}/elastic/jobs/j")
    assert status == 200 and {p["gpu_type"] for p in out["step_times"]} == {"v100", "k80"}
    for point in out["step_times"]:
        compute, iteration = true_iteration_s(point["gpu_type"], point["replicas"], point["local_bsz"], 0)
        assert point["compute_s"] == pytest.approx(compute, rel=1e-6)
        assert point["predicted_iter_s"] == pytest.approx(point["iter_s"], rel=0.10), point
    assert out["throughputs"]["k80"] < out["throughputs"]["v100"]
    # reported directly: a new point on k80 is learned as well
    step = {"gpu_type": "k80", "local_bsz": 16, "compute_s": 0.108, "iter_s": 0.108}
    status, mean = request(f"{server.url}/elastic/jobs/j/step_time", "POST", step)
    assert status == 200 and mean == {**step, "num_nodes": 1, "replicas": 1, "count": 1}
    points = {(p["gpu_type"], p["local_bsz"]): p for p in request(f"{server.url}/elastic/jobs/j")[1]["step_times"]}
    assert points[("k80", 16)]["predicted_iter_s"] == pytest.approx(0.108, rel=0.10)


GOOD_JOB = {"id": "n", "batch_size": 64}


@pytest.mark.parametrize("method, path, body, status, field", [
    ("POST", "/elastic/jobs", {"batch_size": 64}, 400, "id"),
    ("POST", "/elastic/jobs", {"id": "n"}, 400, "batch_size"),
    ("POST", "/elastic/jobs", {"id": "n", "batch_size": 0}, 400, "batch_size"),
    ("POST", "/elastic/jobs", {"id": "n", "batch_size": 64.5}, 400, "batch_size"),
    ("POST", "/elastic/jobs", {"id": "n", "batch_size": 2 ** 31 + 1}, 400, "batch_size"),
    ("POST", "/elastic/jobs", {"id": "n", "batch_size": 64, "max_batch_size": 32}, 400, "max_batch_size"),
    ("POST", "/elastic/jobs", {"id": "n", "batch_size": 64, "min_local_bsz": 8, "max_local_bsz": 4}, 400,
     "max_local_bsz"),
    ("POST", "/elastic/jobs", {"id": "n", "batch_size": 64, "min_replicas": 3, "max_replicas": 2}, 400,
     "max_replicas"),
    ("POST", "/elastic/jobs", {"id": "n", "batch_size": 64, "min_replicas": 9}, 400, "min_replicas"),
    ("POST", "/elastic/jobs", {"id": "n", "batch_size": 64, "lr_scaling": "cubic"}, 400, "lr_scaling"),
    ("POST", "/elastic/jobs", {"id": "n", "batch_size": 64, "restart_delay_s": 0}, 400, "restart_delay_s"),
    ("POST", "/elastic/jobs", {"id": "n", "batch_size": 64, "total_samples": -1}, 400, "total_samples"),
    ("POST", "/elastic/jobs", {"id": "n", "batch_size": 64, "application": "nope"}, 400, "application"),
    ("POST", "/elastic/jobs", {"id": "n", "batch_size": 64, "application": " "}, 400, "application"),
    ("POST", "/elastic/jobs", {"id": "n", "batch_size": 64, "seed_profile": "/etc/passwd"}, 400, "seed_profile"),
    ("POST", "/elastic/jobs", {"id": "n", "batch_size": 64, "gpu_types": ["a100"]}, 400, "gpu_types[0]"),
    ("POST", "/elastic/jobs", {"id": "n", "batch_size": 64, "gpu_types": []}, 400, "gpu_types"),
    ("POST", "/elastic/jobs", {"id": "n", "batch_size": 64, "scale_factor": 2}, 400, "scale_factor"),
    ("POST", "/elastic/jobs", {"id": "a", "batch_size": 64}, 409, "id"),
    ("POST", "/elastic/jobs", b"{", 400, "body"),
    ("GET", "/elastic/jobs/zzz", None, 404, "job"),
    ("DELETE", "/elastic/jobs/zzz", None, 404, "job"),
    ("POST", "/elastic/jobs/a/step_time", {"gpu_type": "a100", "local_bsz": 8, "compute_s": 0.1, "iter_s": 0.1}, 400,
     "gpu_type"),
    ("POST", "/elastic/jobs/a/step_time", {"gpu_type": "v100", "local_bsz": 8, "compute_s": 0.2, "iter_s": 0.1}, 400,
     "iter_s"),
    ("POST", "/elastic/jobs/a/step_time", {"gpu_type": "v100", "local_bsz": 8, "compute_s": -1.0, "iter_s": 0.1},
     400, "compute_s"),
    ("POST", "/elastic/jobs/a/step_time", {"gpu_type": "v100", "local_bsz": 0, "compute_s": 0.1, "iter_s": 0.1}, 400,
     "local_bsz"),
    ("POST", "/elastic/jobs/a/step_time", {"gpu_type": "v100", "num_nodes": 2, "replicas": 1, "local_bsz": 8,
                                           "compute_s": 0.1, "iter_s": 0.1}, 400, "num_nodes"),
    ("POST", "/elastic/jobs/a/step_time", {"gpu_type": "v100", "local_bsz": 8, "compute_s": 0.1}, 400, "iter_s"),
    ("POST", "/elastic/jobs/zzz/step_time", {"gpu_type": "v100", "local_bsz": 8, "compute_s": 0.1, "iter_s": 0.1},
     404, "job"),
    ("POST", "/elastic/jobs/a/gradient", {"grad_sqr": 0.0, "grad_var": 0.0}, 400, "grad_sqr"),
    ("POST", "/elastic/jobs/a/gradient", {"grad_sqr": 1.0, "grad_var": -1.0}, 400, "grad_var"),
    ("POST", "/elastic/jobs/a/gradient", {"grad_sqr": 1.0}, 400, "grad_var"),
    ("POST", "/elastic/rounds/next", {"round_seconds": 30}, 400, "round_seconds"),
    ("POST", "/elastic/rounds/0/results", "RESULTS", 409, "index"),  # already recorded
    ("POST", "/elastic/rounds/7/results", [], 409, "index"),
    ("POST", "/elastic/rounds/x/results", [], 400, "index"),
    ("POST", "/elastic/rounds/1/results", {"job_id": "a"}, 400, "body"),
    ("POST", "/elastic/rounds/1/results", [{"job_id": "a", "outcome": "done", "steps": 1, "run_seconds": 1.0}], 400,
     "results[0].outcome"),
    ("POST", "/elastic/rounds/1/results", [{"job_id": "a", "outcome": "preempted", "steps": 1, "run_seconds": 1.0,
                                            "metrics": {"grad_sqr": -1.0}}], 400, "results[0].metrics.grad_sqr"),
    ("POST", "/elastic/rounds/1/results", [{"job_id": "a", "outcome": "preempted", "steps": 1, "run_seconds": 1.0,
                                            "metrics": {"loss": 1.0}}], 400, "results[0].metrics.loss"),
    ("POST", "/elastic/rounds/1/results", [{"job_id": "zzz", "outcome": "preempted", "steps": 1, "run_seconds": 1.0}],
     400, "results[0].job_id"),
    ("POST", "/elastic", {"cluster": {"gpus": {"v100": 1}}, "policy": "max_min_fairness"}, 400, "policy"),
    ("POST", "/elastic", {"cluster": {"gpus": {"v100": 1}}, "policy_options": {"p": "x"}}, 400, "policy_options.p"),
    ("POST", "/elastic", {"cluster": {"gpus": {"v100": 1}}, "policy_options": {"q": 1}}, 400, "policy_options.q"),
    ("POST", "/elastic", {"cluster": {"gpus": {"v100": 1}}, "policy_options": {"time_limit_s": 1e9}}, 400,
     "policy_options.time_limit_s"),
    ("POST", "/elastic", {"cluster": {"gpus": {"v100": 1}}, "round_seconds": 0}, 400, "round_seconds"),
    ("POST", "/elastic", {"cluster": {"gpus": {"v100": -1}}}, 400, "cluster.gpus.v100"),
    ("POST", "/elastic", "SEEDED_STATE", 400, "jobs[0].spec.seed_profile"),
    ("POST", "/elastic", "BAD_STATE", 400, "jobs[0].measured[0][2]"),
])
def test_bad_elastic_requests_get_typed_errors_naming_the_field(server, method, path, body, status, field):
    assert request(f"{server.url}/elastic/jobs", "POST", {"id": "a", "batch_size": 32})[0] == 201
    plan = request(f"{server.url}/elastic/rounds/next", "POST", {})[1]
    assert request(f"{server.url}/elastic/rounds/0/results", "POST", results_of(plan))[0] == 200
    plan = request(f"{server.url}/elastic/rounds/next", "POST", {})[1]
    before = request(f"{server.url}/elastic")[1]
    if body in ("SEEDED_STATE", "BAD_STATE"):
        state = json.loads(json.dumps(before))
        if body == "SEEDED_STATE":
            state["jobs"][0]["spec"]["seed_profile"] = "/etc/passwd"
        else:
            state["jobs"][0]["measured"][0][2] = -1.0
        body = state
    raw = body if isinstance(body, bytes) else None
    code, out = request(f"{server.url}{path}", method, results_of(plan) if body == "RESULTS" else
                        None if raw is not None else body, raw=raw)
    assert code == status and out["field"] == field and out["error"] and out["type"], out
    assert request(f"{server.url}/elastic")[1] == before
    assert request(f"{server.url}/elastic/rounds/1/results", "POST", results_of(plan))[0] == 200


def test_one_engine_at_a_time(server):
    code, out = request(f"{server.url}/engine/jobs")
    assert code == 409 and "/elastic" in out["error"]
    health = request(f"{server.url}/health")[1]
    assert health["engine"] is True and health["num_jobs"] == 0 and health["engine_version"] is None
    assert request(f"{server.url}/engine", "POST", {"cluster": {"gpus": CLUSTER}})[0] == 201
    code, out = request(f"{server.url}/elastic/jobs")
    assert code == 409 and "/engine" in out["error"] and "--policy sia" in out["error"]
    with AllocoptServer(("127.0.0.1", 0)) as empty:
        code, out = request(f"{empty.url}/elastic/rounds/next", "POST", {})
        assert code == 409 and "POST /elastic" in out["error"]


def test_restore_a_goodput_engine_over_http(server):
    assert request(f"{server.url}/elastic/jobs", "POST", JOBS[0])[0] == 201
    plan = request(f"{server.url}/elastic/rounds/next", "POST", {})[1]
    assert request(f"{server.url}/elastic/rounds/0/results", "POST", results_of(plan))[0] == 200
    state = request(f"{server.url}/elastic")[1]
    validator("goodput_engine_state").validate(state)
    assert state["jobs"][0]["measured"] and state["round_index"] == 1
    assert request(f"{server.url}/elastic", "POST", CONFIG)[1]["jobs"] == []
    status, out = request(f"{server.url}/elastic", "POST", state)
    assert status == 201 and out == state


def test_cli_serves_a_goodput_engine_and_keeps_its_state(tmp_path):
    state = tmp_path / "engine.json"
    proc, url = start_cli_server("--cluster", json.dumps(CLUSTER), "--policy", "sia", "--state", str(state))
    try:
        assert request(f"{url}/elastic/jobs", "POST", JOBS[0])[0] == 201
        assert request(f"{url}/elastic/jobs", "POST", {"id": "x", "batch_size": -1})[0] == 400
        plan = request(f"{url}/elastic/rounds/next", "POST", {})[1]
        assert request(f"{url}/elastic/rounds/0/results", "POST", results_of(plan))[0] == 200
        saved = request(f"{url}/elastic")[1]
        assert request(f"{url}/engine")[0] == 409
    finally:
        stop(proc)
    assert json.loads(state.read_text()) == saved
    proc, url = start_cli_server("--state", str(state))
    try:
        assert request(f"{url}/elastic")[1] == saved
        status, job = request(f"{url}/elastic/jobs/resnet")
        assert status == 200 and job["step_times"] and job["application"] == "cifar10"
        assert request(f"{url}/elastic/rounds/next", "POST", {})[1]["round_index"] == 1
    finally:
        stop(proc)


def test_openapi_describes_the_elastic_endpoints(server):
    document = request(f"{server.url}/openapi.json")[1]
    elastic = [op for op in OPERATIONS if op.path.startswith("/elastic")]
    assert len(elastic) == 10
    for op in elastic:
        assert op.method.lower() in document["paths"][op.path]
    components = document["components"]["schemas"]
    assert {"GoodputEngineState", "ElasticJob", "ElasticJobState", "StepTime", "Gradient",
            "ElasticRoundResult"} <= set(components)
    assert document["paths"]["/elastic/rounds/next"]["post"]["responses"]["200"]["content"]["application/json"][
        "schema"] == {"$ref": "#/components/schemas/RoundPlan"}
    assert not document["paths"]["/elastic/rounds/next"]["post"]["requestBody"]["required"]
    assert request(f"{server.url}/schemas/goodput_engine_state")[1]["title"] == "allocopt goodput engine state"
