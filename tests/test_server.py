"""The language-neutral interface: JSON Schemas, and the HTTP service on loopback with real HTTP (urllib)."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

import allocopt
from allocopt.runtime.executor import JobRoundResult, Lease, RoundOutcome, RoundPlan
from allocopt.schemas import SCHEMAS, load_schema
from allocopt.server import AllocoptServer
from allocopt.throughput import ThroughputTable

CLUSTER = {"v100": 4, "p100": 4, "k80": 4}


def request(url: str, method: str = "GET", body: object = None, *, raw: bytes | None = None,
            headers: dict[str, str] | None = None) -> tuple[int, dict]:
    """Status and decoded JSON of one HTTP request (error statuses included)."""
    data = raw if raw is not None else None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=60) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def gavel_problem_doc(num_jobs: int = 12, seed: int = 5) -> dict:
    return ThroughputTable.gavel().sample_problem(allocopt.Cluster(CLUSTER), num_jobs, seed=seed).to_json()


@pytest.fixture
def server() -> Iterator[AllocoptServer]:
    """The server class on a free loopback port, in a thread, with an engine and a 64 KiB body limit."""
    srv = AllocoptServer(("127.0.0.1", 0), allocopt.Engine(CLUSTER), max_body_bytes=64 * 1024, quiet=True)
    thread = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    yield srv
    srv.shutdown()
    srv.server_close()
    thread.join(timeout=10)


def start_cli_server(*args: str) -> tuple[subprocess.Popen, str]:
    """``allocopt serve --port 0`` as a real subprocess; its process and base URL."""
    proc = subprocess.Popen([sys.executable, "-m", "allocopt", "serve", "--port", "0", "--quiet", *args],
                            stderr=subprocess.PIPE, text=True)
    line = proc.stderr.readline()
    assert "serving on http://" in line, line + proc.stderr.read()
    return proc, line.split("serving on ")[1].strip()


def stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    proc.wait(timeout=10)
    proc.stderr.close()


@pytest.fixture(scope="module")
def cli_server() -> Iterator[str]:
    proc, url = start_cli_server("--cluster", json.dumps(CLUSTER))
    yield url
    stop(proc)


# ----- JSON Schemas ----------------------------------------------------------------------------------
def validator(name: str):
    js = pytest.importorskip("jsonschema", reason="jsonschema is not installed (pip install 'allocopt[dev]')")
    from referencing import Registry, Resource

    schemas = {n: load_schema(n) for n in SCHEMAS}
    registry = Registry().with_resources((s["$id"], Resource.from_contents(s)) for s in schemas.values())
    js.Draft202012Validator.check_schema(schemas[name])
    return js.Draft202012Validator(schemas[name], registry=registry, format_checker=js.FormatChecker())


def rich_problem() -> allocopt.Problem:
    cluster = allocopt.Cluster({"v100": 2, "k80": 2}, gpus_per_node={"v100": 2, "k80": 4})
    return allocopt.Problem.from_dicts(
        {"a": {"v100": 4.0, "k80": 1.0}, "b": {"v100": 3.0, "k80": 2.0}, 7: {"v100": 2.0, "k80": 0.0}}, cluster,
        scale_factors={"a": 1, "b": 1, 7: 2}, priority_weights={"a": 1.0, "b": 2.0, 7: 1.0},
        num_steps_remaining={"a": 1e4, "b": 2e4, 7: 5e3}, time_since_start={"a": 10.0, "b": 0.0, 7: 5.0},
        slos={"a": 1e6}, time_isolated={"a": 1.0, "b": 2.0, 7: 0.0}, entities={"a": "u1", "b": "u2", 7: "u1"},
        entity_weights={"u1": 2.0}, costs={"v100": 2.5, "k80": 0.5},
        pair_throughputs={("a", "b"): {"v100": (3.0, 2.0), "k80": (0.8, 1.5)}})


def test_schemas_are_valid_and_packaged():
    assert set(SCHEMAS) == {"problem", "allocation", "round_plan", "engine_state"}
    for name in SCHEMAS:
        validator(name)


def test_documents_of_the_code_match_the_schemas():
    problem = rich_problem()
    validator("problem").validate(problem.to_json())
    validator("problem").validate(gavel_problem_doc())
    allocation = validator("allocation")
    allocation.validate(allocopt.solve(problem, "max_min_fairness", space_sharing=True).to_json())
    allocation.validate(allocopt.solve(problem, "proportional").to_json())  # closed form: backend null
    plan = RoundPlan(round_index=3, start_s=1080.0, round_seconds=360.0, stop=("b",),
                     leases=(Lease("a", "v100", (0,), 360.0), Lease(7, "k80", (2, 3), 360.0, max_steps=100,
                                                                   extended=True, co_located_with="a")))
    validator("round_plan").validate(json.loads(json.dumps(dataclasses.asdict(plan))))
    validator("engine_state").validate(json.loads(json.dumps(busy_engine().to_json())))


def busy_engine() -> allocopt.Engine:
    """An engine with jobs, a measurement and a planned round, so every part of its state is filled."""
    engine = allocopt.Engine({"v100": 2, "k80": 2})
    engine.add_job("a", {"v100": 2.0, "k80": 1.0}, num_steps_remaining=100.0)
    engine.add_job(7, {"v100": 3.0, "k80": 1.0}, scale_factor=2, num_steps_remaining=50.0)
    engine.observe_throughput("a", "v100", 2.5)
    engine.next_round()
    return engine


@pytest.mark.parametrize("name, edit", [
    ("problem", lambda d: d.pop("cluster")),
    ("problem", lambda d: d["jobs"][0]["throughputs"].update(v100=-1.0)),
    ("problem", lambda d: d["jobs"][0].update(scale_factor=0)),
    ("problem", lambda d: d["jobs"][0].update(colour="red")),
    ("problem", lambda d: d["jobs"][0].update(id=[1])),
    ("problem", lambda d: d["cluster"]["gpus"].update(v100=1.5)),
    ("allocation", lambda d: d.update(status="great")),
    ("allocation", lambda d: d["allocation"][0].pop("fractions")),
    ("allocation", lambda d: d["timings"].update(num_solves=-1)),
    ("round_plan", lambda d: d["leases"][0].pop("gpu_ids")),
    ("round_plan", lambda d: d.update(round_seconds=0)),
    ("engine_state", lambda d: d.update(format="allocopt-problem")),
    ("engine_state", lambda d: d["jobs"][0].update(scale_factor=0)),
    ("engine_state", lambda d: d["rounds"]["jobs"][0][1].pop("received_s")),
    ("engine_state", lambda d: d["measured"].append(["a"])),
])
def test_schemas_reject_invalid_documents(name, edit):
    problem = rich_problem()
    documents = {"problem": problem.to_json(),
                 "allocation": allocopt.solve(problem, "max_min_fairness").to_json(),
                 "round_plan": {"round_index": 0, "start_s": 0.0, "round_seconds": 360.0, "stop": [],
                                "leases": [{"job_id": "a", "gpu_type": "v100", "gpu_ids": [0], "max_seconds": 360.0}]},
                 "engine_state": json.loads(json.dumps(busy_engine().to_json()))}
    document = documents[name]
    v = validator(name)
    v.validate(document)
    edit(document)
    assert not v.is_valid(document)


# ----- POST /solve ------------------------------------------------------------------------------------
def test_solve_returns_what_allocopt_solve_returns(cli_server):
    doc = gavel_problem_doc()
    status, out = request(f"{cli_server}/solve", "POST", {**doc, "policy": "max_min_fairness",
                                                         "backend": "highs", "options": {"threads": 1}})
    assert status == 200, out
    validator("allocation").validate(out)
    expected = allocopt.solve(allocopt.Problem.from_json(doc), "max_min_fairness", threads=1)
    assert out["objective"] == pytest.approx(expected.objective, rel=1e-7)
    assert [row["id"] for row in out["allocation"]] == list(expected.job_ids)
    np.testing.assert_allclose([row["effective_throughput"] for row in out["allocation"]],
                               expected.effective_throughput, rtol=1e-6)
    status, out = request(f"{cli_server}/solve", "POST", {**doc, "policy": "max_min_fairness",
                                                         "options": {"heterogeneity_aware": False}})
    assert status == 200 and out["objective"] == pytest.approx(
        allocopt.solve(allocopt.Problem.from_json(doc), heterogeneity_aware=False).objective, rel=1e-7)


def test_solve_reports_an_infeasible_problem_as_422(server):
    doc = {"cluster": {"gpus": {"v100": 1}},
           "jobs": [{"id": "a", "throughputs": {"v100": 10.0}, "num_steps_remaining": 3600.0, "slo_s": 200.0},
                    {"id": "b", "throughputs": {"v100": 10.0}, "num_steps_remaining": 3600.0, "slo_s": 300.0}]}
    status, out = request(f"{server.url}/solve", "POST", {**doc, "policy": "max_throughput"})
    assert status == 422 and out["type"] == "InfeasibleError", out


# ----- engine endpoints ---------------------------------------------------------------------------------
def test_engine_endpoints(server):
    url = f"{server.url}/engine"
    doc = gavel_problem_doc(num_jobs=6)
    for job in doc["jobs"]:
        status, out = request(f"{url}/jobs", "POST", job)
        assert status == 201 and out["id"] == job["id"], out
    status, out = request(f"{url}/jobs/{doc['jobs'][0]['id']}", "PATCH", {"priority_weight": 2.0})
    assert status == 200 and out["priority_weight"] == 2.0
    doc["jobs"][0]["priority_weight"] = 2.0
    removed = doc["jobs"].pop(1)
    status, out = request(f"{url}/jobs/{removed['id']}", "DELETE")
    assert status == 200 and out["removed"] == removed["id"]
    status, out = request(f"{url}/capacity/k80", "PUT", {"count": 2})
    assert status == 200 and out["cluster"]["gpus"]["k80"] == 2
    doc["cluster"]["gpus"]["k80"] = 2
    status, out = request(f"{url}/allocation")
    assert status == 200 and out["waiting_jobs"] == [] and out["engine_version"] == server.engine.version
    validator("allocation").validate(out["allocation"])
    expected = allocopt.solve(allocopt.Problem.from_json(doc))
    assert out["allocation"]["objective"] == pytest.approx(expected.objective, rel=1e-7)
    assert [row["id"] for row in out["allocation"]["allocation"]] == list(expected.job_ids)

    job = doc["jobs"][0]["id"]
    status, out = request(f"{url}/jobs/{job}/throughput", "POST", {"gpu_type": "v100", "steps_per_s": 1.25})
    assert status == 200 and out["steps_per_s"] == 1.25
    status, out = request(f"{url}/jobs/{job}")
    assert status == 200 and out["throughputs"]["v100"] == 1.25
    status, out = request(f"{url}/jobs")
    assert status == 200 and [j["id"] for j in out["jobs"]] == [j["id"] for j in doc["jobs"]]
    status, state = request(url)
    assert status == 200 and state["format"] == "allocopt-engine"
    assert allocopt.Engine.from_json(state).to_json() == server.engine.to_json()


def test_integer_job_ids_in_paths(server):
    assert request(f"{server.url}/engine/jobs", "POST", {"id": 7, "throughputs": {"v100": 2.0}})[0] == 201
    assert request(f"{server.url}/engine/jobs", "POST", {"id": "7x", "throughputs": {"v100": 2.0}})[0] == 201
    status, out = request(f"{server.url}/engine/jobs/7", "PATCH", {"scale_factor": 2})
    assert status == 200 and out["id"] == 7 and out["scale_factor"] == 2
    assert request(f"{server.url}/engine/jobs/7x", "DELETE")[1]["removed"] == "7x"


def test_configure_and_restore_the_engine(server):
    status, out = request(f"{server.url}/engine", "POST",
                          {"cluster": {"gpus": {"a100": 8}}, "policy": "max_throughput"})
    assert status == 201 and out["policy"] == "max_throughput" and out["jobs"] == []
    request(f"{server.url}/engine/jobs", "POST", {"id": "a", "throughputs": {"a100": 9.0}})
    state = request(f"{server.url}/engine")[1]
    request(f"{server.url}/engine", "POST", {"cluster": {"gpus": {"v100": 1}}})
    status, out = request(f"{server.url}/engine", "POST", state)
    assert status == 201 and out == state
    assert request(f"{server.url}/engine/allocation")[1]["allocation"]["policy"] == "max_throughput"


def test_no_engine_configured_is_409():
    srv = AllocoptServer(("127.0.0.1", 0), quiet=True)
    thread = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        status, out = request(f"{srv.url}/engine/allocation")
        assert status == 409 and "POST /engine" in out["error"]
        assert request(f"{srv.url}/health")[1]["engine"] is False
    finally:
        srv.shutdown()
        srv.server_close()


# ----- bad requests ----------------------------------------------------------------------------------------
SMALL = {"cluster": {"gpus": {"v100": 1, "k80": 1}},
         "jobs": [{"id": "a", "throughputs": {"v100": 40.0, "k80": 10.0}}]}


@pytest.mark.parametrize("method, path, body, status, field", [
    ("POST", "/engine/jobs", b"{not json", 400, "body"),
    ("POST", "/engine/jobs", b"\xff\xfe", 400, "body"),
    ("POST", "/engine/jobs", [1, 2], 400, "body"),
    ("POST", "/engine/jobs", {"throughputs": {"v100": 1.0}}, 400, "id"),
    ("POST", "/engine/jobs", {"id": "n"}, 400, "throughputs"),
    ("POST", "/engine/jobs", {"id": "n", "throughputs": {"v100": -1.0}}, 400, "throughputs.v100"),
    ("POST", "/engine/jobs", {"id": "n", "throughputs": {"v100": "fast"}}, 400, "throughputs.v100"),
    ("POST", "/engine/jobs", {"id": "n", "throughputs": {"tpu": 1.0}}, 400, "gpu_type"),
    ("POST", "/engine/jobs", {"id": "n", "throughputs": {"v100": 1.0}, "scale_factor": "two"}, 400,
     "scale_factor"),
    ("POST", "/engine/jobs", {"id": "n", "throughputs": {"v100": 1.0}, "colour": 1}, 400, "colour"),
    ("POST", "/engine/jobs", {"id": {"x": 1}, "throughputs": {"v100": 1.0}}, 400, "job_id"),
    ("POST", "/engine/jobs", {"id": "a", "throughputs": {"v100": 1.0}}, 409, "job_id"),
    ("PATCH", "/engine/jobs/zz", {"priority_weight": 2.0}, 404, "job_id"),
    ("PATCH", "/engine/jobs/a", {"priority_weight": 0}, 400, "priority_weight"),
    ("DELETE", "/engine/jobs/zz", None, 404, "job_id"),
    ("POST", "/engine/jobs/a/throughput", {"gpu_type": "v100"}, 400, "steps_per_s"),
    ("POST", "/engine/jobs/a/throughput", {"gpu_type": "tpu", "steps_per_s": 1.0}, 400, "gpu_type"),
    ("PUT", "/engine/capacity/v100", {"count": -2}, 400, "gpus"),
    ("PUT", "/engine/capacity/v100", {}, 400, "count"),
    ("POST", "/engine", {"cluster": {"gpus": {"v100": 1}}, "policy": "nope"}, 400, "policy"),
    ("POST", "/engine", {"policy": "max_min_fairness"}, 400, "cluster"),
    ("POST", "/solve", {**SMALL, "policy": "nope"}, 400, "policy"),
    ("POST", "/solve", {**SMALL, "backend": "nope"}, 400, "backend"),
    ("POST", "/solve", {**SMALL, "options": {"nope": 1}}, 400, "options"),
    ("POST", "/solve", {**SMALL, "options": {"backend": "highs"}}, 400, "options.backend"),
    ("POST", "/solve", {**SMALL, "options": [1]}, 400, "options"),
    ("POST", "/solve", {**SMALL, "policy": 3}, 400, "policy"),
    ("POST", "/solve", {"jobs": []}, 400, "document"),
    ("POST", "/solve", {**SMALL, "jobs": [{"id": "a", "throughputs": {"v100": -4.0, "k80": 1.0}}]}, 400,
     "jobs[0].throughputs.v100"),
    ("GET", "/nope", None, 404, None),
    ("GET", "/schemas/nope", None, 404, "name"),
    ("DELETE", "/solve", None, 405, None),
])
def test_bad_requests_get_4xx_naming_the_field_and_change_nothing(server, method, path, body, status, field):
    assert request(f"{server.url}/engine/jobs", "POST", {"id": "a", "throughputs": {"v100": 1.0}})[0] == 201
    before = server.engine.to_json()
    raw = body if isinstance(body, bytes) else None
    code, out = request(f"{server.url}{path}", method, None if raw else body, raw=raw)
    assert code == status, out
    assert out["field"] == field and out["error"] and out["type"]
    assert server.engine.to_json() == before
    assert request(f"{server.url}/health")[0] == 200
    assert request(f"{server.url}/engine/allocation")[0] == 200


def test_oversized_body_is_413(server):
    status, out = request(f"{server.url}/solve", "POST", raw=b" " * (server.max_body_bytes + 1))
    assert status == 413 and "limit" in out["error"]
    assert request(f"{server.url}/health")[0] == 200


def test_schemas_are_served(server):
    status, out = request(f"{server.url}/schemas/problem")
    assert status == 200 and out == load_schema("problem")


# ----- concurrency and the real command ----------------------------------------------------------------------
def test_concurrent_requests(server):
    url = f"{server.url}"

    def call(k: int) -> int:
        kind = k % 5
        if kind == 0:
            return request(f"{url}/solve", "POST", {**SMALL, "options": {"threads": 1}})[0]
        if kind == 4:
            return request(f"{url}/engine/allocation")[0]
        status = request(f"{url}/engine/jobs", "POST", {"id": f"j{k}", "throughputs": {"v100": 1.0 + k}})[0]
        if kind == 3:
            status = max(status, request(f"{url}/engine/jobs/j{k}", "DELETE")[0])
        return status

    with ThreadPoolExecutor(max_workers=8) as pool:
        statuses = list(pool.map(call, range(50)))
    assert all(s in (200, 201) for s in statuses), statuses
    expected = {f"j{k}" for k in range(50) if k % 5 in (1, 2)}
    assert set(server.engine.job_ids) == expected
    status, out = request(f"{url}/engine/allocation")
    assert status == 200 and {row["id"] for row in out["allocation"]["allocation"]} == expected


def test_cli_server_keeps_state_across_restarts(tmp_path):
    state = tmp_path / "engine.json"
    proc, url = start_cli_server("--cluster", '{"v100": 2}', "--state", str(state))
    try:
        assert request(f"{url}/engine/jobs", "POST", {"id": "a", "throughputs": {"v100": 3.0}})[0] == 201
        assert request(f"{url}/engine/jobs", "POST", {"id": "b", "throughputs": {"v100": -3.0}})[0] == 400
        allocation = request(f"{url}/engine/allocation")[1]["allocation"]
    finally:
        stop(proc)
    proc, url = start_cli_server("--state", str(state))
    try:
        status, out = request(f"{url}/engine/allocation")
        assert status == 200 and out["allocation"]["allocation"] == allocation["allocation"]
    finally:
        stop(proc)


def test_cli_serve_rejects_a_bad_cluster():
    result = subprocess.run([sys.executable, "-m", "allocopt", "serve", "--cluster", '{"v100": -1}'],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and "--cluster" in result.stderr


def test_cli_serve_reports_a_port_in_use(server):
    result = subprocess.run([sys.executable, "-m", "allocopt", "serve", "--port", str(server.server_address[1])],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and "cannot serve" in result.stderr and "Traceback" not in result.stderr
    assert request(f"{server.url}/health")[0] == 200


# ----- rounds ----------------------------------------------------------------------------------------------
def round_results(plan: dict, fraction: float = 1.0) -> list[dict]:
    """Every lease of ``plan`` ran ``fraction`` of its round at 0.9x the engine's estimate of 5 steps/s."""
    return [{"job_id": lease["job_id"], "outcome": "preempted", "steps": 10,
             "run_seconds": fraction * lease["max_seconds"], "measured_steps_per_s": 4.5}
            for lease in plan["leases"]]


def test_rounds_over_http_match_the_engine(server):
    twin = allocopt.Engine(CLUSTER, recompute_min_seconds=0.0)
    server.engine = allocopt.Engine(CLUSTER, recompute_min_seconds=0.0)
    for k in range(6):
        job = {"id": f"j{k}", "throughputs": {"v100": 5.0, "k80": 1.0 + k}, "scale_factor": 1 + k % 2}
        assert request(f"{server.url}/engine/jobs", "POST", job)[0] == 201
        twin.add_job(job["id"], job["throughputs"], job["scale_factor"])
    check = validator("round_plan")
    for index in range(4):
        body = {"round_seconds": 120.0} if index == 2 else {}
        status, plan = request(f"{server.url}/engine/rounds/next", "POST", body if index else None,
                               raw=None if index else b"")  # round 0: an empty body
        assert status == 200, plan
        check.validate(plan)
        expected = twin.next_round(body.get("round_seconds"))
        assert plan == json.loads(json.dumps(dataclasses.asdict(expected)))
        assert plan["round_index"] == index and plan["leases"]
        results = round_results(plan, fraction=0.5 if index == 1 else 1.0)
        status, out = request(f"{server.url}/engine/rounds/{index}/results", "POST", results)
        assert status == 200 and out == {"round_index": index, "recorded": len(results),
                                         "engine_version": server.engine.version}, out
        twin.record_round([JobRoundResult(r["job_id"], RoundOutcome.PREEMPTED, r["steps"], r["run_seconds"],
                                          r["measured_steps_per_s"]) for r in results])
    assert server.engine.to_json() == twin.to_json()
    leased = plan["leases"][0]
    assert server.engine.get_job(leased["job_id"])["throughputs"][leased["gpu_type"]] == 4.5


@pytest.mark.parametrize("path, body, status, field", [
    ("/engine/rounds/0/results", "RESULTS", 409, "index"),  # already recorded
    ("/engine/rounds/5/results", [], 409, "index"),
    ("/engine/rounds/x/results", [], 400, "index"),
    ("/engine/rounds/1/results", {"job_id": "a"}, 400, "body"),
    ("/engine/rounds/1/results", [3], 400, "results[0]"),
    ("/engine/rounds/1/results", [{"job_id": "a", "outcome": "done", "steps": 1, "run_seconds": 1.0}], 400,
     "results[0].outcome"),
    ("/engine/rounds/1/results", [{"job_id": "a", "outcome": "failed", "steps": -1, "run_seconds": 1.0}], 400,
     "results[0].steps"),
    ("/engine/rounds/1/results", [{"job_id": "a", "outcome": "failed", "steps": 1}], 400,
     "results[0].run_seconds"),
    ("/engine/rounds/1/results", [{"job_id": "a", "outcome": "failed", "steps": 1, "run_seconds": "1"}], 400,
     "results[0].run_seconds"),
    ("/engine/rounds/1/results", [{"job_id": "a", "outcome": "completed", "steps": 1, "run_seconds": 1.0,
                                   "measured_steps_per_s": -2.0}], 400, "results[0].measured_steps_per_s"),
    ("/engine/rounds/1/results", [{"job_id": ["a"], "outcome": "failed", "steps": 1, "run_seconds": 1.0}], 400,
     "results[0].job_id"),
    ("/engine/rounds/1/results", [{"job_id": "a", "outcome": "failed", "steps": 1, "run_seconds": 1.0,
                                   "colour": 1}], 400, "results[0].colour"),
    ("/engine/rounds/1/results", [{"job_id": "a", "outcome": "failed", "steps": 1, "run_seconds": 1.0}], 400,
     "results"),  # a waits: no lease in round 1
    ("/engine/rounds/next", {"round_seconds": 0}, 400, "round_seconds"),
    ("/engine/rounds/next", {"seconds": 60}, 400, "seconds"),
    ("/engine/rounds/next", [60], 400, "body"),
])
def test_bad_round_requests_get_4xx_and_change_nothing(server, path, body, status, field):
    server.engine = allocopt.Engine({"v100": 1})
    for job in ("a", "b"):
        assert request(f"{server.url}/engine/jobs", "POST", {"id": job, "throughputs": {"v100": 1.0}})[0] == 201
    plan = request(f"{server.url}/engine/rounds/next", "POST", {})[1]
    assert request(f"{server.url}/engine/rounds/0/results", "POST", round_results(plan))[0] == 200
    plan = request(f"{server.url}/engine/rounds/next", "POST", {})[1]
    assert [lease["job_id"] for lease in plan["leases"]] == ["b"] and plan["round_index"] == 1
    before = server.engine.to_json()
    code, out = request(f"{server.url}{path}", "POST", round_results(plan) if body == "RESULTS" else body)
    assert code == status and out["field"] == field and out["error"], out
    assert server.engine.to_json() == before
    assert request(f"{server.url}/engine/rounds/1/results", "POST", round_results(plan))[0] == 200


def test_rounds_need_an_engine():
    srv = AllocoptServer(("127.0.0.1", 0), quiet=True)
    thread = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        assert request(f"{srv.url}/engine/rounds/next", "POST", {})[0] == 409
        assert request(f"{srv.url}/engine/rounds/0/results", "POST", [])[0] == 409
        assert request(f"{srv.url}/engine/rounds/next")[0] == 405
    finally:
        srv.shutdown()
        srv.server_close()
