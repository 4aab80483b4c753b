"""The language-neutral interface: JSON Schemas, and the HTTP service on loopback with real HTTP (urllib)."""

from __future__ import annotations

import dataclasses
import http.client
import importlib.util
import json
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

import allocopt
from allocopt.runtime.executor import JobRoundResult, Lease, RoundOutcome, RoundPlan
from allocopt.schemas import SCHEMAS, load_schema
from allocopt.errors import InvalidOptionError
from allocopt.server import ServiceOptions

pytest.importorskip("uvicorn", reason="the service needs the 'service' extra (pip install 'allocopt[service]')")
from allocopt.server import models  # noqa: E402
from allocopt.server.app import OPERATIONS  # noqa: E402
from allocopt.server.http import AllocoptServer  # noqa: E402
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
    with AllocoptServer(("127.0.0.1", 0), allocopt.Engine(CLUSTER),
                        options=ServiceOptions(max_body_bytes=64 * 1024)) as srv:
        yield srv


def start_cli_server(*args: str) -> tuple[subprocess.Popen, str]:
    """``allocopt serve --port 0`` as a real subprocess; its process and base URL."""
    proc = subprocess.Popen([sys.executable, "-m", "allocopt", "serve", "--port", "0", "--quiet", *args],
                            stderr=subprocess.PIPE, text=True)
    line = proc.stderr.readline()
    if "serving on http://" not in line:  # stop it before reading the rest, or read() waits for ever
        proc.kill()
        pytest.fail("expected 'serving on' as the first line on stderr, got:\n" + line + proc.stderr.read())
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
    assert set(SCHEMAS) == {"problem", "allocation", "round_plan", "engine_state", "goodput_engine_state"}
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
    # the service's models accept the same documents
    models.Problem.model_validate(problem.to_json())
    models.Allocation.model_validate(allocopt.solve(problem, "max_min_fairness", space_sharing=True).to_json())
    models.RoundPlan.model_validate(json.loads(json.dumps(dataclasses.asdict(plan))))
    models.EngineState.model_validate(json.loads(json.dumps(busy_engine().to_json())))


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
    MODELS[name].model_validate(document)
    edit(document)
    assert not v.is_valid(document)
    with pytest.raises(ValueError):  # and so do the service's models
        MODELS[name].model_validate(document)


MODELS = {"problem": models.Problem, "allocation": models.Allocation, "round_plan": models.RoundPlan,
          "engine_state": models.EngineState, "goodput_engine_state": models.GoodputEngineState}


def _resolve(schema: dict, root: dict) -> tuple[dict, dict]:
    """Follow ``$ref``s (within a document, or to another allocopt schema file)."""
    while "$ref" in schema:
        target, _, pointer = schema["$ref"].partition("#")
        root = load_schema(target.removesuffix(".schema.json")) if target else root
        schema = root
        for part in pointer.strip("/").split("/"):
            schema = schema[part]
    return schema, root


def _types(schema: dict, root: dict) -> set[str]:
    schema, root = _resolve(schema, root)
    if "enum" in schema or "const" in schema:
        values = schema.get("enum", [schema.get("const")])
        return {"null" if v is None else "string" if isinstance(v, str) else "integer" for v in values}
    for key in ("anyOf", "oneOf"):
        if key in schema:
            return set().union(*(_types(s, root) for s in schema[key]))
    kind = schema.get("type", "any")
    return set(kind) if isinstance(kind, list) else {kind}


def _main(schema: dict, root: dict) -> tuple[dict, dict]:
    """The non-null branch of an ``X or null`` schema."""
    schema, root = _resolve(schema, root)
    branches = [s for s in schema.get("anyOf", []) if s.get("type") != "null"]
    return _resolve(branches[0], root) if len(branches) == 1 else (schema, root)


def assert_same_shape(model: dict, mroot: dict, schema: dict, sroot: dict, path: str) -> None:
    """The model's JSON Schema has the shipped schema's fields, required fields, types and bounds."""
    assert _types(model, mroot) == _types(schema, sroot), path
    model, mroot = _main(model, mroot)
    schema, sroot = _main(schema, sroot)
    if "enum" in schema:
        assert set(model["enum"]) == set(schema["enum"]), path
    for key in ("minimum", "exclusiveMinimum", "maximum", "minItems", "maxItems", "minProperties"):
        if key in schema:
            assert model.get(key) == schema[key], f"{path}: {key}"
    if "properties" in schema:
        assert set(model["properties"]) == set(schema["properties"]), path
        assert set(model.get("required", [])) == set(schema.get("required", [])), path
        closed = [s.get("additionalProperties", True) is False for s in (model, schema)]  # absent: allowed
        assert closed[0] == closed[1], path
        for name, sub in schema["properties"].items():
            assert_same_shape(model["properties"][name], mroot, sub, sroot, f"{path}.{name}")
    for key in ("additionalProperties", "items"):
        if isinstance(schema.get(key), dict):
            assert_same_shape(model[key], mroot, schema[key], sroot, f"{path}[{key}]")
    for k, sub in enumerate(schema.get("prefixItems", [])):
        assert_same_shape(model["prefixItems"][k], mroot, sub, sroot, f"{path}[{k}]")


@pytest.mark.parametrize("name", SCHEMAS)
def test_models_match_the_json_schemas(name):
    model = MODELS[name].model_json_schema()
    schema = load_schema(name)
    assert_same_shape(model, model, schema, schema, name)


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
    with AllocoptServer(("127.0.0.1", 0)) as srv:
        status, out = request(f"{srv.url}/engine/allocation")
        assert status == 409 and "POST /engine" in out["error"]
        assert request(f"{srv.url}/health")[1]["engine"] is False


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
    ("POST", "/engine/jobs", {"id": {"x": 1}, "throughputs": {"v100": 1.0}}, 400, "id"),
    ("POST", "/engine/jobs", {"id": "a", "throughputs": {"v100": 1.0}}, 409, "job_id"),
    ("PATCH", "/engine/jobs/zz", {"priority_weight": 2.0}, 404, "job_id"),
    ("PATCH", "/engine/jobs/a", {"priority_weight": 0}, 400, "priority_weight"),
    ("DELETE", "/engine/jobs/zz", None, 404, "job_id"),
    ("POST", "/engine/jobs/a/throughput", {"gpu_type": "v100"}, 400, "steps_per_s"),
    ("POST", "/engine/jobs/a/throughput", {"gpu_type": "tpu", "steps_per_s": 1.0}, 400, "gpu_type"),
    ("PUT", "/engine/capacity/v100", {"count": -2}, 400, "count"),
    ("PUT", "/engine/capacity/v100", {}, 400, "count"),
    ("POST", "/engine", {"cluster": {"gpus": {"v100": 1}}, "policy": "nope"}, 400, "policy"),
    ("POST", "/engine", {"policy": "max_min_fairness"}, 400, "cluster"),
    ("POST", "/solve", {**SMALL, "policy": "nope"}, 400, "policy"),
    ("POST", "/solve", {**SMALL, "backend": "nope"}, 400, "backend"),
    ("POST", "/solve", {**SMALL, "options": {"nope": 1}}, 400, "options.nope"),
    ("POST", "/solve", {**SMALL, "options": {"backend": "highs"}}, 400, "options.backend"),
    ("POST", "/solve", {**SMALL, "options": [1]}, 400, "options"),
    ("POST", "/solve", {**SMALL, "policy": 3}, 400, "policy"),
    ("POST", "/solve", {**SMALL, "policy": "fifo", "options": {"seed": -5}}, 400, "options.seed"),
    ("POST", "/engine", {"cluster": {"gpus": {"v100": 1}}, "policy": "fifo", "policy_options": {"seed": 1.5}}, 400,
     "policy_options.seed"),
    ("POST", "/solve", {"jobs": []}, 400, "cluster"),
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
    status, out = request(f"{server.url}/solve", "POST", raw=b" " * (server.options.max_body_bytes + 1))
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
    # the service caps every engine's solves at its --solve-timeout (time_limit_s)
    twin = allocopt.Engine(CLUSTER, recompute_min_seconds=0.0,
                           solve_options={"time_limit_s": server.options.solve_timeout_s})
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
    with AllocoptServer(("127.0.0.1", 0)) as srv:
        assert request(f"{srv.url}/engine/rounds/next", "POST", {})[0] == 409
        assert request(f"{srv.url}/engine/rounds/0/results", "POST", [])[0] == 409
        assert request(f"{srv.url}/engine/rounds/next")[0] == 405


# ----- the HTTP layer: OpenAPI, methods, keep-alive, bodies -------------------------------------------------------
def test_openapi_document_and_docs(server):
    status, document = request(f"{server.url}/openapi.json")
    assert status == 200 and document["openapi"].startswith("3.1")
    for op in OPERATIONS:
        assert op.method.lower() in document["paths"][op.path], (op.method, op.path)
    refs, stack = set(), [document]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            refs.update([node["$ref"]] if "$ref" in node else [])
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    components = document["components"]["schemas"]
    assert {"Problem", "Allocation", "EngineState", "RoundPlan", "Job", "Error"} <= set(components)
    assert all(ref.startswith("#/components/schemas/") and ref.rsplit("/", 1)[1] in components for ref in refs)
    solve_op = document["paths"]["/solve"]["post"]
    assert solve_op["requestBody"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/SolveRequest"}
    assert solve_op["responses"]["200"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/Allocation"}
    with urllib.request.urlopen(f"{server.url}/docs", timeout=30) as response:
        page = response.read().decode()
    assert response.headers["Content-Type"].startswith("text/html")
    assert all(op.path in page for op in OPERATIONS)


def test_head_options_and_unknown_methods_answer_json(server):
    connection = http.client.HTTPConnection(*server.server_address, timeout=30)
    connection.request("HEAD", "/health")
    response = connection.getresponse()
    assert response.status == 200 and response.read() == b""
    connection.request("OPTIONS", "/engine/jobs")
    response = connection.getresponse()
    assert response.status == 204 and response.read() == b""
    assert set(response.headers["Allow"].split(", ")) == {"GET", "HEAD", "POST", "OPTIONS"}
    for method in ("FOO", "TRACE", "PUT"):
        connection.request(method, "/health")
        response = connection.getresponse()
        out = json.loads(response.read())
        assert response.status == 405 and out["type"] and "allowed: GET" in out["error"], out
        assert response.headers["Content-Type"] == "application/json"
    connection.close()


def test_http11_keep_alive(server):
    connection = http.client.HTTPConnection(*server.server_address, timeout=30)
    sockets = set()
    for k in range(20):
        connection.request("POST", "/engine/jobs", body=json.dumps({"id": f"k{k}", "throughputs": {"v100": 1.0}}))
        response = connection.getresponse()
        assert response.status == 201 and response.version == 11 and not response.will_close
        response.read()
        sockets.add(id(connection.sock))
    assert len(sockets) == 1  # one TCP connection for every request
    connection.close()


def raw_exchange(address: tuple[str, int], data: bytes, wait_s: float = 10.0) -> bytes:
    """Send ``data`` on a new connection; everything the server sends back until it closes or goes quiet."""
    with socket.create_connection(address, timeout=wait_s) as conn:
        conn.sendall(data)
        chunks = []
        try:
            while chunk := conn.recv(65536):
                chunks.append(chunk)
                if b"\r\n\r\n" in b"".join(chunks):
                    conn.settimeout(0.5)
        except TimeoutError:
            pass
        return b"".join(chunks)


@pytest.mark.parametrize("framing", [b"", b"Content-Length: 0\r\n", b"Transfer-Encoding: chunked\r\n"])
def test_an_empty_rounds_next_body_means_an_empty_object(server, framing):
    """Issue 16: POST /engine/rounds/next with no body (no Content-Length, as curl -X POST sends) plans a round."""
    request(f"{server.url}/engine/jobs", "POST", {"id": "a", "throughputs": {"v100": 1.0}})
    body = b"0\r\n\r\n" if b"chunked" in framing else b""
    answer = raw_exchange(server.server_address, b"POST /engine/rounds/next HTTP/1.1\r\nHost: x\r\n" + framing +
                          b"Connection: close\r\n\r\n" + body)
    head, _, payload = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200"), answer
    plan = json.loads(payload)
    validator("round_plan").validate(plan)
    assert [lease["job_id"] for lease in plan["leases"]] == ["a"]


def test_solve_options_are_bounded(server):
    doc = {**SMALL, "options": {"time_limit_s": 10 * server.options.solve_timeout_s}}
    for options, field in [({"time_limit_s": 1e9}, "options.time_limit_s"),
                           ({"threads": server.options.max_solver_threads + 1}, "options.threads"),
                           ({"verbose": True}, "options.verbose"),
                           ({"solver_options": {"log_file": "x.log"}}, "options.solver_options"),
                           ({"heterogeneity_aware": "maybe"}, "options.heterogeneity_aware")]:
        status, out = request(f"{server.url}/solve", "POST", {**doc, "options": options})
        assert status == 400 and out["field"] == field, out
    status, out = request(f"{server.url}/engine", "POST", {"cluster": {"gpus": {"v100": 1}},
                                                           "solve_options": {"time_limit_s": 1e9}})
    assert status == 400 and out["field"] == "solve_options.time_limit_s", out


# ----- oversized work ------------------------------------------------------------------------------------------------
def big_problem(num_jobs: int) -> dict:
    return {"cluster": {"gpus": {"v100": 8, "k80": 8}},
            "jobs": [{"id": f"job-{k:07d}", "throughputs": {"v100": 1.0 + k % 7, "k80": 0.5}} for k in range(num_jobs)]}


DIGITS = "9" * 5000
OVERSIZED = [  # (method, path, body bytes, status, field)
    ("POST", "/solve", json.dumps(big_problem(51)).encode(), 413, "jobs"),
    ("POST", "/solve", json.dumps({"cluster": {"gpus": {"v100": 33_554_432}}, "jobs": []}).encode(), 400,
     "cluster.gpus.v100"),
    ("POST", "/engine", json.dumps({"cluster": {"gpus": {"v100": 33_554_432}}}).encode(), 400, "cluster.gpus.v100"),
    ("PUT", "/engine/capacity/v100", b'{"count": 33554432}', 400, "count"),
    ("PUT", "/engine/capacity/v100", b'{"count": 1e300}', 400, "count"),
    ("POST", "/solve", b"[" * 100_000 + b"]" * 100_000, 400, "body"),
    ("POST", "/solve", b'{"jobs": ' * 40 + b"[]" + b"}" * 40, 400, "jobs" + ".jobs" * 31),
    ("POST", "/engine/jobs", f'{{"id": "d", "throughputs": {{"v100": {DIGITS}}}}}'.encode(), 400, "throughputs.v100"),
    ("POST", "/engine/jobs", f'{{"id": {DIGITS}, "throughputs": {{"v100": 1}}}}'.encode(), 400, "id"),
    ("POST", "/engine/jobs", b'{"id": "n", "throughputs": {"v100": 1}, "num_steps_remaining": 1e300}', 400,
     "num_steps_remaining"),
    ("POST", "/engine/jobs", b'{"id": "n", "throughputs": {"v100": 1}, "scale_factor": 1e300}', 400, "scale_factor"),
    ("POST", "/engine/jobs", b'{"id": "n", "throughputs": {"v100": Infinity}}', 400, "throughputs.v100"),
    ("POST", "/engine/rounds/next", b'{"round_seconds": 1e308}', 400, "round_seconds"),
    ("POST", "/engine/rounds/next", b'{"round_seconds": NaN}', 400, "round_seconds"),
    ("POST", "/engine/rounds/0/results", json.dumps([{"job_id": "a", "outcome": "failed", "steps": 1,
                                                      "run_seconds": 1.0}] * 51).encode(), 413, "results"),
]


@pytest.fixture
def limited_server(tmp_path) -> Iterator[AllocoptServer]:
    """A server with a 50-job limit (default limits otherwise) saving its state to a file."""
    with AllocoptServer(("127.0.0.1", 0), allocopt.Engine(CLUSTER), options=ServiceOptions(max_jobs=50),
                        state_path=str(tmp_path / "state.json")) as srv:
        yield srv


def strict_json(path: Path) -> object:
    """The JSON in ``path``, refusing NaN and Infinity (which json.dumps writes by default)."""
    def refuse(token: str) -> None:
        raise ValueError(f"{path} holds {token}, which is not JSON")
    return json.loads(path.read_text(), parse_constant=refuse)


@pytest.mark.parametrize("method, path, body, status, field", OVERSIZED,
                         ids=[f"{m} {p} {f}"[:60] for m, p, _, _, f in OVERSIZED])
def test_oversized_work_gets_4xx_naming_the_field(limited_server, method, path, body, status, field):
    url = limited_server.url
    assert request(f"{url}/engine/jobs", "POST", {"id": "a", "throughputs": {"v100": 1.0}})[0] == 201
    before = limited_server.engine.to_json()
    code, out = request(f"{url}{path}", method, raw=body)
    assert code == status and out["field"] == field and out["error"], out
    assert limited_server.engine.to_json() == before
    assert strict_json(Path(limited_server.service.state_path)) == json.loads(json.dumps(before))
    assert request(f"{url}/health")[0] == 200


def test_a_15_mb_body_is_refused_before_any_work(limited_server):
    body = json.dumps(big_problem(230_000)).encode()
    assert len(body) > 14_800_000  # issue 14's probe: 108 s of CPU and 1.1 GB on the old server
    connection = http.client.HTTPConnection(*limited_server.server_address, timeout=60)
    connection.request("POST", "/solve", body=body)  # the server reads it to the end, so no reset
    response = connection.getresponse()
    out = json.loads(response.read())
    assert response.status == 413 and out["field"] == "body" and "limit" in out["error"]
    assert request(f"{limited_server.url}/health")[0] == 200


def test_the_engine_holds_at_most_max_jobs(limited_server):
    for k in range(50):
        assert request(f"{limited_server.url}/engine/jobs", "POST", {"id": k, "throughputs": {"v100": 1.0}})[0] == 201
    status, out = request(f"{limited_server.url}/engine/jobs", "POST", {"id": "one more", "throughputs": {"v100": 1.0}})
    assert status == 413 and "limit of 50" in out["error"]
    assert len(limited_server.engine) == 50


# ----- slow and idle clients ----------------------------------------------------------------------------------------
@pytest.fixture
def impatient_server() -> Iterator[AllocoptServer]:
    options = ServiceOptions(header_timeout_s=0.5, body_timeout_s=0.5, keep_alive_s=0.5)
    with AllocoptServer(("127.0.0.1", 0), allocopt.Engine(CLUSTER), options=options) as srv:
        yield srv


def closed_within(conn: socket.socket, seconds: float, trickle: bytes = b"") -> bool:
    """Whether the server closes ``conn`` within ``seconds``, while ``trickle`` is sent a byte every 0.1 s."""
    conn.settimeout(0.1)
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            if conn.recv(4096) == b"":
                return True
        except TimeoutError:
            pass
        except ConnectionResetError:
            return True
        if trickle:
            try:
                conn.sendall(trickle[:1])
            except (BrokenPipeError, ConnectionResetError):
                return True
            trickle = trickle[1:]
    return False


def test_slow_and_idle_clients_are_disconnected(impatient_server):
    address = impatient_server.server_address
    with socket.create_connection(address) as silent, socket.create_connection(address) as slowloris:
        slowloris.sendall(b"GET /health HTTP/1.1\r\n")
        # a request head sent a byte every 0.1 s never completes: the 0.5 s head deadline still applies
        assert closed_within(slowloris, 10, trickle=b"X-Padding: " + b"a" * 200)
        assert closed_within(silent, 10)  # connected, sent nothing
    assert request(f"{impatient_server.url}/health")[0] == 200
    # a body slower than the body deadline: 408, then the connection closes
    answer = raw_exchange(address, b"POST /engine/jobs HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"id\":")
    head, _, payload = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 408") and json.loads(payload)["field"] == "body", answer
    # an idle keep-alive connection closes after keep_alive_s
    connection = http.client.HTTPConnection(*address, timeout=30)
    connection.request("GET", "/health")
    assert connection.getresponse().read()
    assert closed_within(connection.sock, 10)


def load_module():
    hypothesis = pytest.importorskip("hypothesis")
    assert hypothesis
    spec = importlib.util.spec_from_file_location("http_load", Path(__file__).parents[1] / "benchmarks" / "http_load.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_64_clients_and_500_idle_connections():
    """No reset, no error, every idle connection kept, and the server's thread count does not grow with them."""
    http_load = load_module()
    if http_load.raise_fd_limit(2400) < 2400:
        pytest.skip("the open-file limit is under 2400")
    with http_load.ServerProcess("--cluster", json.dumps(CLUSTER), "--header-timeout", "300",
                                 "--keep-alive", "300") as server:
        warm = http_load.Client(server.url)  # solver threads exist before counting
        assert warm.json("POST", "/solve", {**SMALL, "options": {"threads": 1}})[0] == 200
        assert warm.json("GET", "/engine/allocation")[0] == 200
        warm.close()
        counts = http_load.load(server.url, clients=64, idle=500, requests_per_client=3, pid=server.process.pid)
        log = server.stop()
    statuses = {k: v for k, v in counts.items() if not k.startswith(("server threads", "idle closed"))}
    assert set(statuses) <= {"200", "201"}, counts
    assert sum(statuses.values()) == 64 * 3 * 5 + sum(1 for k in range(64) for r in range(3) if (k + r) % 3 == 0)
    assert counts["idle closed"] == 0, counts
    assert counts["server threads after"] <= counts["server threads before"] + 2 <= 40, counts
    assert "Traceback" not in log


def test_fuzzed_http_bodies_get_no_500(tmp_path):
    """Hypothesis-drawn bodies, methods and paths: every answer is JSON below 500, and no traceback is logged."""
    http_load = load_module()
    state = tmp_path / "state.json"
    with http_load.ServerProcess("--cluster", json.dumps(CLUSTER), "--max-jobs", "200", "--state", str(state)) as server:
        counts = http_load.fuzz(server.url, 300, time_budget_s=120, seed=0)
        status, health = http_load.Client(server.url).json("GET", "/health")
        log = server.stop()
    assert status == 200 and health["engine"], health
    assert all(k.isdigit() and (int(k) < 500 or k == "503") or k.startswith("skipped") for k in counts), counts
    assert sum(counts.values()) == 300, counts
    assert counts["400"] > 0 and counts["200"] + counts["201"] > 0, counts  # both sides were reached
    assert "Traceback" not in log, log[-3000:]
    strict_json(state)


# ----- bearer tokens ----------------------------------------------------------------------------------------------------
def test_bearer_token(tmp_path):
    with AllocoptServer(("127.0.0.1", 0), allocopt.Engine(CLUSTER), token="s3cret-token") as srv:
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "Basic s3cret-token"}):
            status, out = request(f"{srv.url}/engine", headers=headers)
            assert status == 401 and out["field"] == "Authorization", out
        status, out = request(f"{srv.url}/engine/jobs", "POST", {"id": "a", "throughputs": {"v100": 1.0}})
        assert status == 401 and len(srv.engine) == 0
        auth = {"Authorization": "Bearer s3cret-token"}
        assert request(f"{srv.url}/engine/jobs", "POST", {"id": "a", "throughputs": {"v100": 1.0}}, headers=auth)[0] == 201
        assert request(f"{srv.url}/health", headers=auth)[0] == 200
        for public in ("/openapi.json", "/schemas/problem"):  # the documentation is public
            assert request(f"{srv.url}{public}")[0] == 200
    token_file = tmp_path / "token"
    token_file.write_text("cli-token\n")
    proc, url = start_cli_server("--cluster", json.dumps(CLUSTER), "--token-file", str(token_file))
    try:
        assert request(f"{url}/health")[0] == 401
        assert request(f"{url}/health", headers={"Authorization": "Bearer cli-token"})[0] == 200
    finally:
        stop(proc)


def test_a_token_is_required_off_loopback(tmp_path):
    with pytest.raises(InvalidOptionError, match="token-file"):
        AllocoptServer(("0.0.0.0", 0))  # refused before anything is bound
    result = subprocess.run([sys.executable, "-m", "allocopt", "serve", "--host", "0.0.0.0", "--port", "0"],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and "--token-file" in result.stderr and "Traceback" not in result.stderr
    (tmp_path / "empty").write_text("\n")
    result = subprocess.run([sys.executable, "-m", "allocopt", "serve", "--token-file", str(tmp_path / "empty")],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and "token file" in result.stderr and "Traceback" not in result.stderr
    try:
        srv = AllocoptServer(("::1", 0))  # loopback needs no token, IPv6 as well
    except OSError:  # no IPv6 on this machine: the checks above stand
        return
    with srv:
        assert srv.url.startswith("http://[::1]:") and request(f"{srv.url}/health")[0] == 200


def test_solves_with_different_solver_threads_in_different_workers(server):
    """HiGHS's process-wide scheduler is rebuilt for another thread count; every worker thread keeps solving."""
    request(f"{server.url}/engine/jobs", "POST", {"id": "a", "throughputs": {"v100": 1.0}})

    def call(k: int) -> int:
        if k % 4 == 3:  # the engine thread solves with the engine's own options
            request(f"{server.url}/engine/jobs/a", "PATCH", {"priority_weight": 1.0 + k})
            return request(f"{server.url}/engine/allocation")[0]
        options = {"threads": min(1 + k % 2, server.options.max_solver_threads)} if k % 3 else {}
        return request(f"{server.url}/solve", "POST", {**SMALL, "options": options})[0]

    with ThreadPoolExecutor(max_workers=4) as pool:
        statuses = list(pool.map(call, range(40)))
    assert statuses == [200] * 40


def test_connections_over_the_limit_and_unparsable_requests_get_json():
    with AllocoptServer(("127.0.0.1", 0), options=ServiceOptions(max_connections=3)) as srv:
        idle = [socket.create_connection(srv.server_address) for _ in range(3)]
        answer = raw_exchange(srv.server_address, b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        head, _, payload = answer.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 503") and "limit of 3" in json.loads(payload)["error"], answer
        for conn in idle:
            conn.close()
        time.sleep(0.5)
        assert request(f"{srv.url}/health")[0] == 200
        for garbage in (b"NOT HTTP AT ALL\r\n\r\n", b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 20_000):
            head, _, payload = raw_exchange(srv.server_address, garbage).partition(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 400") and json.loads(payload)["type"] == "RequestError", head


def test_a_full_solve_pool_answers_503():
    """One solve worker, one queued request: a third solve is refused at once (503, Retry-After), not queued."""
    options = ServiceOptions(solve_workers=1, max_queued=1)
    big = {**big_problem(10_000), "options": {"threads": 1, "technique": "plain"}}  # seconds of HiGHS each
    with AllocoptServer(("127.0.0.1", 0), options=options) as srv, ThreadPoolExecutor(2) as pool:
        slow = [pool.submit(request, f"{srv.url}/solve", "POST", big) for _ in range(2)]
        deadline = time.monotonic() + 30  # both admitted (one solving, one waiting): the count the 503 reads
        while srv.service._in_flight["solve"] < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        connection = http.client.HTTPConnection(*srv.server_address, timeout=60)
        connection.request("POST", "/solve", body=json.dumps(SMALL))
        response = connection.getresponse()
        out = json.loads(response.read())
        assert not all(f.done() for f in slow), "the big solves finished too soon to fill the pool"
        assert response.status == 503 and response.headers["Retry-After"] and "busy" in out["error"], out
        assert [f.result()[0] for f in slow] == [200, 200]
        assert request(f"{srv.url}/solve", "POST", SMALL)[0] == 200


def test_serve_without_the_service_extra_says_what_to_install():
    code = ("import sys; sys.modules['uvicorn'] = None\n"  # as if uvicorn were not installed
            "from allocopt.cli import main; sys.exit(main(['serve', '--port', '0']))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and "allocopt[service]" in result.stderr and "Traceback" not in result.stderr
