"""The ASGI application: routes, request bodies, the engine's thread, the solve pool, bearer-token auth.

Every request is answered with JSON (errors: ``{"error", "type", "field"}``).
Work runs off the event loop: ``POST /solve`` in a pool of ``solve_workers``
threads, and every ``/engine`` request in one engine thread, in arrival order,
so concurrent requests leave exactly the state of that sequential order. A pool
with ``max_queued`` requests waiting answers 503; a request still queued after
``solve_timeout_s`` is dropped (503, nothing done); a running solve stops at the
solver's ``time_limit_s``, which the service caps at ``solve_timeout_s``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import hmac
import json
import logging
import math
import re
from collections.abc import Callable, Hashable, Mapping, Sized
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any
from urllib.parse import unquote

from pydantic import TypeAdapter
from starlette.requests import ClientDisconnect, Request
from starlette.responses import HTMLResponse, Response
from starlette.types import Receive, Scope, Send

from allocopt import __version__
from allocopt.api import solve
from allocopt.backends import BACKENDS
from allocopt.cluster import Cluster
from allocopt.engine import Engine
from allocopt.errors import (AllocoptError, BackendNotInstalledError, DuplicateJobError, InvalidOptionError,
                             InvalidProblemError, LicenseError, NotOptimalError, SolverError, UnknownBackendError,
                             UnknownJobError, UnknownPolicyError)
from allocopt.formulations import get_policy
from allocopt.problem import Problem
from allocopt.jsonio import write_json
from allocopt.runtime.elastic import ElasticSpec, GoodputEngine, GoodputOptions, is_goodput_policy, load_job_profiles
from allocopt.runtime.executor import JobRoundResult, RoundOutcome, RoundPlan
from allocopt.schemas import SCHEMAS, load_schema
from allocopt.technique import TECHNIQUES
from allocopt.server import models
from allocopt.server.decode import RequestError, decode, validate
from allocopt.server.openapi import docs_html, openapi_document
from allocopt.server.options import ServiceOptions

logger = logging.getLogger(__name__)

_SOLVE_FIELDS = ("policy", "backend", "options")
#: Keywords of :func:`allocopt.solve` a request may give (``options``, ``solve_options``); the rest are policy options.
SOLVE_KEYWORDS = ("time_limit_s", "mip_gap", "threads", "best_effort", "partitions", "technique")
#: Keywords of :func:`allocopt.solve` closed to requests: they print on, or write files of, the server.
_SERVER_ONLY = ("verbose", "solver_options", "warm_start")
_ROUND_RESULTS = TypeAdapter(list[models.RoundResult])
_ELASTIC_RESULTS = TypeAdapter(list[models.ElasticRoundResult])
#: Options of a goodput policy's round planner (beside the policy's own and the solve keywords below).
_PLANNER_OPTIONS = {"backend": "highs", "packed_placement": False}
#: Solve keywords a goodput engine's ``policy_options`` may give.
_GOODPUT_KEYWORDS = ("time_limit_s", "mip_gap", "threads")
#: Bodies of refused uploads read and dropped (so the client reads the error, not a reset), as a multiple of the limit.
_DRAIN_FACTOR = 16


@dataclasses.dataclass(frozen=True)
class Operation:
    """One endpoint: ``method`` on ``path`` (OpenAPI template), its handler and where it runs.

    ``pool`` is ``"inline"`` (on the event loop: cheap, no body), ``"solve"`` or ``"engine"``;
    ``body`` is the request model (None: no body) and ``responses`` maps statuses to response models.
    """

    method: str
    path: str
    handler: Callable[..., tuple[int, Any]]
    pool: str
    summary: str
    body: Any = None
    responses: Mapping[int, Any] = dataclasses.field(default_factory=dict)
    public: bool = False

    @property
    def pattern(self) -> re.Pattern[str]:
        return re.compile(re.sub(r"\{[a-z_]+\}", "([^/]+)", self.path))


class Service:
    """The ASGI application of ``allocopt serve``.

    Parameters
    ----------
    engine : Engine or GoodputEngine, optional
        The engine: an :class:`Engine` for the ``/engine`` endpoints, or a
        :class:`~allocopt.runtime.elastic.GoodputEngine` (elastic jobs) for the ``/elastic`` endpoints;
        none until ``POST /engine`` or ``POST /elastic`` otherwise. The service holds one engine at a time.
    options : ServiceOptions, optional
        Limits and timeouts.
    state_path : str, optional
        Save the engine's state there (atomically) after every change.
    token : str, optional
        Require ``Authorization: Bearer <token>`` on every endpoint but the documentation
        (``/openapi.json``, ``/docs``, ``/schemas/...``).
    profiles : str or path, optional
        The application profiles elastic jobs may name (``application``), loaded when a job first names
        one; default: Sia's profiles shipped with allocopt.
    """

    def __init__(self, engine: Engine | GoodputEngine | None = None, *, options: ServiceOptions | None = None,
                 state_path: str | None = None, token: str | None = None, profiles: str | None = None):
        self.options = options or ServiceOptions()
        self.state_path = state_path
        self.profiles = profiles
        #: Job ids leased by the goodput engine's last planned round while it awaits results, else None.
        self._elastic_leased: set[Any] | None = None
        self._token = None if token is None else token.encode("utf-8")
        self._pools = {"solve": ThreadPoolExecutor(self.options.solve_workers, "allocopt-solve"),
                       "engine": ThreadPoolExecutor(1, "allocopt-engine")}
        self._in_flight = {"solve": 0, "engine": 0}
        self._engine: Engine | GoodputEngine | None = None
        self._health: tuple[int, int] | None = None
        self.engine = engine
        #: The server's open connections (set by the server); past ``max_connections`` requests get 503.
        self.connections: Sized = ()

    # ----- the engine -----------------------------------------------------------------------------------------
    @property
    def engine(self) -> Engine | GoodputEngine | None:
        """The engine of the ``/engine`` endpoints (an :class:`Engine`) or of the ``/elastic`` ones (a
        :class:`GoodputEngine`); its solves are capped at ``solve_timeout_s`` when it is set."""
        return self._engine

    @engine.setter
    def engine(self, engine: Engine | GoodputEngine | None) -> None:
        cap = self.options.solve_timeout_s
        if isinstance(engine, GoodputEngine):
            given = engine.options.policy_options
            limit = given.get("time_limit_s")
            if "sia_program" not in given and (not isinstance(limit, (int, float)) or not 0 < limit <= cap):
                engine.options = dataclasses.replace(engine.options, policy_options={**given, "time_limit_s": cap})
        elif engine is not None:
            limit = engine.solve_options.get("time_limit_s")
            if not isinstance(limit, (int, float)) or not 0 < limit <= cap:
                engine.solve_options = {**engine.solve_options, "time_limit_s": cap}
        self._engine = engine
        self._elastic_leased = None
        self._refresh_health()

    def _refresh_health(self) -> None:
        engine = self._engine
        self._health = None if engine is None else (
            (None, len(engine)) if isinstance(engine, GoodputEngine) else (engine.version, len(engine)))

    def _require_engine(self) -> Engine:
        if self._engine is None:
            raise RequestError(409, "no engine is configured; POST /engine with {\"cluster\": {\"gpus\": {...}}} "
                                    "or start the server with --cluster")
        if isinstance(self._engine, GoodputEngine):
            raise RequestError(409, f"the service's engine plans elastic jobs with goodput policy "
                                    f"{self._engine.policy!r}: its endpoints are under /elastic; POST /engine to "
                                    "replace it with an engine of rigid jobs")
        return self._engine

    def _require_goodput(self) -> GoodputEngine:
        if not isinstance(self._engine, GoodputEngine):
            what = "no engine is configured" if self._engine is None else \
                "the service's engine is an engine of rigid jobs (its endpoints are under /engine)"
            raise RequestError(409, f"{what}; POST /elastic with {{\"cluster\": {{\"gpus\": {{...}}}}, \"policy\": "
                                    "\"sia\"} or start the server with --policy sia --cluster ...")
        return self._engine

    def _saved(self, engine: Engine | GoodputEngine) -> None:
        if self.state_path is not None:
            if isinstance(engine, GoodputEngine):
                write_json(engine.to_json(), self.state_path)
            else:
                engine.save(self.state_path)

    def close(self) -> None:
        """Stop the worker threads (running work finishes; queued work is dropped)."""
        for pool in self._pools.values():
            pool.shutdown(wait=False, cancel_futures=True)

    # ----- ASGI -----------------------------------------------------------------------------------------------
    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        try:
            if len(self.connections) > self.options.max_connections:
                raise RequestError(503, f"the service has {len(self.connections)} open connections, over its "
                                        f"limit of {self.options.max_connections}; retry later",
                                   headers={"Retry-After": "1", "Connection": "close"})
            response = await self._respond(Request(scope, receive))
        except RequestError as err:
            response = _json_response(err.status, _error(err, "RequestError", err.field), err.headers)
        except ClientDisconnect:
            return
        except Exception as err:  # a bug: the service outlives it and says so in JSON
            logger.exception("internal error on %s %s", scope.get("method"), scope.get("path"))
            response = _json_response(500, _error(err, type(err).__name__, None, prefix="internal error: "))
        await response(scope, receive, send)

    async def _respond(self, request: Request) -> Response:
        raw_path = request.scope.get("raw_path") or request.scope["path"].encode()
        path = raw_path.decode("latin-1").split("?", 1)[0].rstrip("/") or "/"
        matches = [(op, m) for op in OPERATIONS if (m := op.pattern.fullmatch(path))]
        if not matches:
            raise RequestError(404, f"no endpoint {path}; see GET /openapi.json or /docs")
        allowed = sorted({op.method for op, _ in matches} | {"OPTIONS"}
                         | ({"HEAD"} if any(op.method == "GET" for op, _ in matches) else set()))
        method = request.method
        if method == "OPTIONS":
            return Response(status_code=204, headers={"Allow": ", ".join(allowed)})
        found = [(op, m) for op, m in matches if op.method == ("GET" if method == "HEAD" else method)]
        if not found:
            raise RequestError(405, f"{method} is not allowed on {path}; allowed: {', '.join(allowed)}",
                               headers={"Allow": ", ".join(allowed)})
        op, match = found[0]
        if not op.public:
            self._authorize(request)
        params = tuple(unquote(g) for g in match.groups())
        if op.pool == "inline":
            status, payload = op.handler(self, None, *params)
            return HTMLResponse(payload) if isinstance(payload, str) else _json_response(status, payload)
        self._admit(op.pool)
        try:
            raw = await self._read_body(request) if method in ("POST", "PUT", "PATCH") else b""
        except BaseException:
            self._release(op.pool)
            raise
        status, data = await self._run(op, raw, params)
        return Response(data, status_code=status, media_type="application/json")

    def _authorize(self, request: Request) -> None:
        if self._token is None:
            return
        scheme, _, given = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode("utf-8", "replace"),
                                                                 self._token):
            raise RequestError(401, "missing or wrong bearer token: send 'Authorization: Bearer <token>' with the "
                                    "token of the server's --token-file", field="Authorization",
                               headers={"WWW-Authenticate": 'Bearer realm="allocopt"'})

    def _admit(self, pool: str) -> None:
        workers = self.options.solve_workers if pool == "solve" else 1
        if self._in_flight[pool] >= workers + self.options.max_queued:
            raise RequestError(503, f"the service is busy ({self._in_flight[pool]} {pool} requests in progress); "
                                    "retry later", headers={"Retry-After": "1"})
        self._in_flight[pool] += 1

    def _release(self, pool: str) -> None:
        self._in_flight[pool] -= 1

    async def _read_body(self, request: Request) -> bytes:
        limit = self.options.max_body_bytes
        length = request.headers.get("content-length")
        declared = int(length) if length is not None and length.isdigit() else None
        too_large = RequestError(413, f"request body of {declared if declared is not None else 'more than ' + str(limit)}"
                                      f" bytes is over the limit of {limit} bytes", field="body",
                                 headers={"Connection": "close"})
        if declared is not None and declared > limit and (
                request.headers.get("expect", "").lower() == "100-continue" or declared > _DRAIN_FACTOR * limit):
            raise too_large  # the client has not sent the body, or it is too large to drain

        async def read() -> bytes:
            chunks, size = [], 0
            async for chunk in request.stream():
                size += len(chunk)
                if size <= limit:
                    chunks.append(chunk)
                elif size > _DRAIN_FACTOR * limit:
                    break
            if size > limit:
                raise too_large
            return b"".join(chunks)

        try:
            return await asyncio.wait_for(read(), self.options.body_timeout_s)
        except asyncio.TimeoutError:
            raise RequestError(408, f"the request body did not arrive within {self.options.body_timeout_s:g} s",
                               field="body", headers={"Connection": "close"}) from None

    async def _run(self, op: Operation, raw: bytes, params: tuple[str, ...]) -> tuple[int, bytes]:
        """Run ``op`` in its pool; its admission is released when the work ends, not when the request is answered."""
        loop = asyncio.get_running_loop()
        try:
            future: Future = self._pools[op.pool].submit(self._call, op, raw, params)
        except RuntimeError:  # shutting down
            self._release(op.pool)
            raise RequestError(503, "the service is shutting down", headers={"Connection": "close"}) from None
        def release(_: Future) -> None:
            if not loop.is_closed():
                loop.call_soon_threadsafe(self._release, op.pool)

        future.add_done_callback(release)
        wrapped = asyncio.wrap_future(future)
        try:
            return await asyncio.wait_for(asyncio.shield(wrapped), self.options.solve_timeout_s)
        except asyncio.TimeoutError:
            if future.cancel():
                raise RequestError(503, f"the request waited {self.options.solve_timeout_s:g} s for a worker and was "
                                        "dropped (nothing was done); retry later",
                                   headers={"Retry-After": "1"}) from None
        if op.pool == "engine":  # started: its effect on the engine is answered, however long it takes
            return await wrapped
        try:
            return await asyncio.wait_for(wrapped, self.options.solve_timeout_s)
        except asyncio.TimeoutError:
            raise RequestError(503, f"the solve did not finish within {self.options.solve_timeout_s:g} s (the "
                                    "service's --solve-timeout)", field=None) from None

    def _call(self, op: Operation, raw: bytes, params: tuple[str, ...]) -> tuple[int, bytes]:
        """Decode, validate and handle one request in a worker thread; the status and the JSON body."""
        try:
            root = "results" if op.handler in (Service.round_results, Service.elastic_round_results) else ""
            status, payload = op.handler(self, decode(raw, self.options, root), *params)
        except RequestError as err:
            status, payload = err.status, _error(err, "RequestError", err.field)
        except AllocoptError as err:
            status, payload = _status(err), _error(err, type(err).__name__,
                                                   getattr(err, "field", None) or _default_field(err))
        except Exception as err:  # a bug: the service outlives it and says so in JSON
            logger.exception("internal error on %s %s", op.method, op.path)
            status, payload = 500, _error(err, type(err).__name__, None, prefix="internal error: ")
        finally:
            if op.pool == "engine":
                self._refresh_health()
        try:
            return status, json.dumps(payload, allow_nan=False).encode("utf-8")
        except ValueError as err:  # a number out of range slipped through: refuse rather than send bare Infinity
            logger.error("response of %s %s is not finite JSON: %s", op.method, op.path, err)
            return 422, json.dumps(_error(err, "ValueError", None, prefix="the result is not finite (are the "
                                                                         "request's numbers in range?): ")).encode()

    # ----- limits ---------------------------------------------------------------------------------------------
    def _check_cluster(self, gpus: Mapping[str, int], where: str) -> None:
        if len(gpus) > self.options.max_gpu_types:
            raise RequestError(400, f"'{where}' has {len(gpus)} GPU types; the limit is {self.options.max_gpu_types}",
                               field=where)
        for gpu_type, count in gpus.items():
            if count > self.options.max_gpus_per_type:
                raise RequestError(400, f"'{where}.{gpu_type}' is {count} GPUs; the limit is "
                                        f"{self.options.max_gpus_per_type} per type", field=f"{where}.{gpu_type}")

    def _check_jobs(self, count: int, field: str | None) -> None:
        if count > self.options.max_jobs:
            raise RequestError(413, f"{count} jobs are over the limit of {self.options.max_jobs}", field=field)

    def _check_options(self, policy: str, options: Mapping[str, Any], field: str,
                       keywords: bool) -> dict[str, Any]:
        """Solve keywords and policy options of a request, typed and bounded; the time limit filled in."""
        pol = get_policy(policy)
        checked: dict[str, Any] = {}
        for name, value in options.items():
            where = f"{field}.{name}"
            if name in _SERVER_ONLY:
                raise RequestError(400, f"'{where}' cannot be set over HTTP", field=where)
            if name in SOLVE_KEYWORDS and keywords:
                checked[name] = self._solve_keyword(name, value, where)
            elif name in pol.options:
                checked[name] = _policy_option(pol.options[name], value, where)
            else:
                known = sorted(pol.options) + (list(SOLVE_KEYWORDS) if keywords else [])
                raise RequestError(400, f"unknown option {name!r} of policy {policy!r}; known: "
                                        f"{', '.join(known) or 'none'}", field=where)
        if keywords:
            checked.setdefault("time_limit_s", self.options.solve_timeout_s)
        return checked

    def _solve_keyword(self, name: str, value: Any, where: str) -> Any:
        number = isinstance(value, (int, float)) and not isinstance(value, bool)
        integer = isinstance(value, int) and not isinstance(value, bool)
        ok = {"time_limit_s": number and 0 < value <= self.options.solve_timeout_s,
              "mip_gap": number and 0 <= value <= 1,
              "threads": integer and 1 <= value <= self.options.max_solver_threads,
              "best_effort": isinstance(value, bool),
              "partitions": integer and 1 <= value <= self.options.max_jobs,
              "technique": isinstance(value, str) and value in TECHNIQUES}[name]
        if not ok:
            expected = {"time_limit_s": f"seconds in (0, {self.options.solve_timeout_s:g}]",
                        "mip_gap": "a number in [0, 1]", "threads": f"an integer in [1, {self.options.max_solver_threads}]",
                        "best_effort": "a boolean", "partitions": f"an integer in [1, {self.options.max_jobs}]",
                        "technique": f"one of {', '.join(TECHNIQUES)}"}[name]
            raise RequestError(400, f"'{where}' must be {expected}, got {json.dumps(value)}", field=where)
        return value

    # ----- endpoints (each takes the decoded body and the path parameters) -------------------------------------
    def health(self, body: Any) -> tuple[int, Any]:
        """Liveness, version and the engine's size (answered without waiting for the engine)."""
        health = self._health
        return 200, {"status": "ok", "allocopt_version": __version__, "engine": health is not None,
                     "engine_version": None if health is None else health[0],
                     "num_jobs": None if health is None else health[1]}

    def openapi(self, body: Any) -> tuple[int, Any]:
        """The OpenAPI 3.1 document of this service."""
        return 200, _documentation()[0]

    def docs(self, body: Any) -> tuple[int, str]:
        """A page of the endpoints (HTML, no scripts); the OpenAPI document is at /openapi.json."""
        return 200, _documentation()[1]

    def schema(self, body: Any, name: str) -> tuple[int, Any]:
        """One of the JSON Schemas (problem, allocation, round_plan, engine_state)."""
        if name not in SCHEMAS:
            raise RequestError(404, f"unknown schema {name!r}; schemas: {', '.join(SCHEMAS)}", field="name")
        return 200, load_schema(name)

    def solve(self, body: Any) -> tuple[int, Any]:
        """Solve a problem document with a policy; the allocation document. Stateless."""
        request = validate(_required(body), models.SolveRequest)
        self._check_jobs(len(request.jobs), "jobs")
        self._check_cluster(request.cluster.gpus, "cluster.gpus")
        clashes = sorted(set(request.options) & {"problem", "policy", "backend"})
        if clashes:
            raise RequestError(400, f"'options' must not contain {clashes[0]!r}; give it as a top-level field",
                               field=f"options.{clashes[0]}")
        options = self._check_options(request.policy, request.options, "options", keywords=True)
        problem = Problem.from_json({k: v for k, v in body.items() if k not in _SOLVE_FIELDS})
        return 200, solve(problem, request.policy, backend=request.backend, **options).to_json()

    def configure(self, body: Any) -> tuple[int, Any]:
        """(Re)configure the engine from ``{cluster, policy, ...}`` or restore a saved state document. 201."""
        document = _required(body)
        if isinstance(document, dict) and "format" in document:
            state = validate(document, models.EngineState)
            self._check_jobs(len(state.jobs), "jobs")
            self._check_cluster(state.cluster.gpus, "cluster.gpus")
            self._check_options(state.policy, state.policy_options or {}, "policy_options", keywords=False)
            self._check_options(state.policy, state.solve_options or {}, "solve_options", keywords=True)
            engine = Engine.from_json(document)
        else:
            config = validate(document, models.EngineConfig)
            self._check_cluster(config.cluster.gpus, "cluster.gpus")
            policy_options = self._check_options(config.policy, config.policy_options, "policy_options",
                                                 keywords=False)
            solve_options = self._check_options(config.policy, config.solve_options, "solve_options", keywords=True)
            engine = Engine(Cluster.from_dict(document["cluster"]), config.policy, config.backend,
                            policy_options=policy_options, solve_options=solve_options,
                            throughput_smoothing=config.throughput_smoothing)
        self.engine = engine
        self._saved(engine)
        return 201, engine.to_json()

    def state(self, body: Any) -> tuple[int, Any]:
        """The engine's state document."""
        return 200, self._require_engine().to_json()

    def list_jobs(self, body: Any) -> tuple[int, Any]:
        """Every job with its fields."""
        state = self._require_engine().to_json()
        return 200, {"jobs": state["jobs"], "engine_version": state["version"]}

    def get_job(self, body: Any, job: str) -> tuple[int, Any]:
        """One job (an id of digits also finds the integer id)."""
        engine = self._require_engine()
        return 200, engine.get_job(_job_id(engine, job))

    def add_job(self, body: Any) -> tuple[int, Any]:
        """Add a job. 201 with the job."""
        engine = self._require_engine()
        validate(_required(body), models.Job)
        self._check_jobs(len(engine) + 1, None)
        engine.add_job(body["id"], **{k: v for k, v in body.items() if k != "id"})
        self._saved(engine)
        return 201, engine.get_job(body["id"])

    def update_job(self, body: Any, job: str) -> tuple[int, Any]:
        """Change fields of a job (``throughputs`` updates only the types it names; null resets a field)."""
        engine = self._require_engine()
        validate(_required(body), models.JobPatch)
        job_id = _job_id(engine, job)
        engine.update_job(job_id, **body)
        self._saved(engine)
        return 200, engine.get_job(job_id)

    def remove_job(self, body: Any, job: str) -> tuple[int, Any]:
        """Remove a job."""
        engine = self._require_engine()
        job_id = _job_id(engine, job)
        engine.remove_job(job_id)
        self._saved(engine)
        return 200, {"removed": job_id, "engine_version": engine.version}

    def observe(self, body: Any, job: str) -> tuple[int, Any]:
        """A measured throughput of a job on a GPU type; the new estimate."""
        engine = self._require_engine()
        observation = validate(_required(body), models.Observation)
        value = engine.observe_throughput(_job_id(engine, job), observation.gpu_type, body["steps_per_s"])
        self._saved(engine)
        return 200, {"steps_per_s": value, "engine_version": engine.version}

    def set_capacity(self, body: Any, gpu_type: str) -> tuple[int, Any]:
        """GPUs of a type now (nodes joined or left); a new type is added."""
        engine = self._require_engine()
        capacity = validate(_required(body), models.Capacity)
        gpus = engine.cluster.to_dict()["gpus"]
        if gpu_type not in gpus and len(gpus) >= self.options.max_gpu_types:
            raise RequestError(400, f"the cluster has {len(gpus)} GPU types, the limit", field="gpu_type")
        if capacity.count > self.options.max_gpus_per_type:
            raise RequestError(400, f"'count' is {capacity.count} GPUs; the limit is {self.options.max_gpus_per_type} "
                                    "per type", field="count")
        engine.set_capacity(gpu_type, capacity.count, gpus_per_node=capacity.gpus_per_node)
        self._saved(engine)
        return 200, {"cluster": engine.cluster.to_dict(), "engine_version": engine.version}

    def allocation(self, body: Any) -> tuple[int, Any]:
        """The current allocation (solved again only if the engine changed) and the jobs that wait."""
        allocation = self._require_engine().allocate()
        return 200, {"engine_version": allocation.extras["engine_version"],
                     "waiting_jobs": allocation.extras["waiting_jobs"], "allocation": allocation.to_json()}

    def next_round(self, body: Any) -> tuple[int, Any]:
        """Plan the next round; an empty body is ``{}``."""
        engine = self._require_engine()
        request = validate({} if body is None else body, models.NextRound)
        plan = engine.next_round(request.round_seconds)
        self._saved(engine)
        return 200, dataclasses.asdict(plan)

    def round_results(self, body: Any, index: str) -> tuple[int, Any]:
        """What the jobs of round ``index`` (the last planned round) did; 409 for another round or a recorded one."""
        engine = self._require_engine()
        if not re.fullmatch(r"\d{1,18}", index):
            raise RequestError(400, f"round index must be a non-negative integer, got {index!r}", field="index")
        if not isinstance(body, list):
            raise RequestError(400, f"body must be a JSON list of job round results, got {json.dumps(body)[:80]}",
                               field="body")
        self._check_jobs(len(body), "results")
        validate(body, _ROUND_RESULTS, root="results")
        results = [JobRoundResult(r["job_id"], RoundOutcome(r["outcome"]), r["steps"], float(r["run_seconds"]),
                                  r.get("measured_steps_per_s"), r.get("restarted", False), r.get("message", ""))
                   for r in body]
        rounds = engine.to_json()["rounds"]
        last = rounds["round_index"] - 1
        if int(index) != last:
            raise RequestError(409, f"round {index} is not awaiting results; the last planned round is "
                                    f"{last if last >= 0 else 'none'}", field="index")
        if results and not rounds["pending"]:
            raise RequestError(409, f"round {index} has no leases awaiting results (already recorded?)",
                               field="index")
        engine.record_round(results)
        self._saved(engine)
        return 200, {"round_index": last, "recorded": len(results), "engine_version": engine.version}

    # ----- elastic jobs: the goodput engine (``/elastic``) ------------------------------------------------------
    def _goodput_options(self, policy: str, options: Mapping[str, Any], field: str) -> dict[str, Any]:
        """A goodput engine's ``policy_options``, typed and bounded; the time limit filled in."""
        if not is_goodput_policy(policy):
            from allocopt.runtime.elastic import goodput_policies

            raise RequestError(400, f"{policy!r} is not a goodput policy; goodput policies: "
                                    f"{', '.join(goodput_policies())} (POST /engine takes the others)", field="policy")
        try:
            known = dict(get_policy(policy).options)
        except AllocoptError:  # a planner registered by name only: its own options are not known
            known = {}
        checked: dict[str, Any] = {}
        for name, value in options.items():
            where = f"{field}.{name}"
            if name == "backend":
                if value not in (*BACKENDS, "auto"):
                    raise RequestError(400, f"'{where}' must be one of {', '.join((*BACKENDS, 'auto'))}, got "
                                            f"{json.dumps(value)}", field=where)
                checked[name] = value
            elif name in _PLANNER_OPTIONS:
                checked[name] = _policy_option(_PLANNER_OPTIONS[name], value, where)
            elif name in _GOODPUT_KEYWORDS:
                checked[name] = self._solve_keyword(name, value, where)
            elif name in known:
                checked[name] = _policy_option(known[name], value, where)
            else:
                names = sorted(known) + sorted(_PLANNER_OPTIONS) + list(_GOODPUT_KEYWORDS)
                raise RequestError(400, f"unknown option {name!r} of goodput policy {policy!r}; known: "
                                        f"{', '.join(names)}", field=where)
        checked.setdefault("time_limit_s", self.options.solve_timeout_s)
        return checked

    def _load_profiles(self, profiles: dict[tuple[str, str], Any], applications: set[str]) -> None:
        """Add to ``profiles`` those of ``applications`` it lacks (from the service's ``profiles`` directory,
        default Sia's shipped ones); an application without any is left for the engine to refuse."""
        missing = sorted(a for a in applications if not any(app == a for app, _ in profiles))
        if missing:
            profiles.update(load_job_profiles(self.profiles, missing))

    def _elastic_job(self, engine: GoodputEngine, job_id: Hashable, predict: bool) -> dict[str, Any]:
        """The job document of ``GET /elastic/jobs/{id}`` (``predict``: with the model's iteration times)."""
        state = engine.get_job(job_id)
        steps = []
        for gpu_type, points in engine.measurements(job_id).items():
            for (nodes, replicas, local), (compute, iteration, count) in points.items():
                predicted = engine.predicted_iter_time(job_id, gpu_type, nodes, replicas, local) if predict else None
                steps.append({"gpu_type": gpu_type, "num_nodes": nodes, "replicas": replicas, "local_bsz": local,
                              "compute_s": compute, "iter_s": iteration, "count": count,
                              "predicted_iter_s": predicted if predicted is not None and math.isfinite(predicted)
                              and predicted > 0 else None})
        grad = state["grad"]
        return {"id": job_id, **state["spec"], "gpu_types": state["gpu_types"], "throughputs": state["throughputs"],
                "batch": state["batch"], "gpu_ids": state["gpu_ids"], "restarts": state["restarts"],
                "samples_done": state["samples_done"],
                "gradient": None if grad is None else {"grad_sqr": grad[0], "grad_var": grad[1]},
                "step_times": steps}

    def _elastic_job_id(self, engine: GoodputEngine, text: str) -> Hashable:
        job_id = _job_id(engine, text)
        if job_id not in engine:
            raise RequestError(404, f"unknown elastic job {text!r}", field="job")
        return job_id

    def configure_elastic(self, body: Any) -> tuple[int, Any]:
        """(Re)configure the service with a goodput engine of elastic jobs, or restore its state document. 201."""
        document = _required(body)
        if isinstance(document, dict) and "format" in document:
            state = validate(document, models.GoodputEngineState)
            self._check_jobs(len(state.jobs), "jobs")
            self._check_cluster(state.cluster.gpus, "cluster.gpus")
            policy_options = self._goodput_options(state.policy, state.options.policy_options,
                                                   "options.policy_options")
            for k, job in enumerate(state.jobs):
                if job.spec.seed_profile is not None:
                    raise RequestError(400, "a seed profile (a file of the server) cannot be given over HTTP",
                                       field=f"jobs[{k}].spec.seed_profile")
                _check_spec(job.spec, f"jobs[{k}].spec.")
            document = {**document, "options": {**document["options"], "policy_options": policy_options}}
            profiles: dict[tuple[str, str], Any] = {}
            self._load_profiles(profiles, {j.spec.application for j in state.jobs if j.spec.application})
            engine = GoodputEngine.from_json(document, profiles)
        else:
            config = validate(document, models.ElasticConfig)
            self._check_cluster(config.cluster.gpus, "cluster.gpus")
            policy_options = self._goodput_options(config.policy, config.policy_options, "policy_options")
            engine = GoodputEngine(Cluster.from_dict(document["cluster"]), config.policy,
                                   round_seconds=config.round_seconds,
                                   options=GoodputOptions(policy_options, config.explore_types, config.explore_replicas,
                                                          config.batch_tolerance, config.max_nodes,
                                                          config.refit_budget_s))
        self.engine = engine
        self._saved(engine)
        return 201, engine.to_json()

    def elastic_state(self, body: Any) -> tuple[int, Any]:
        """The goodput engine's state document."""
        return 200, self._require_goodput().to_json()

    def list_elastic_jobs(self, body: Any) -> tuple[int, Any]:
        """Every elastic job (``predicted_iter_s`` null: GET one job for its model's predictions)."""
        engine = self._require_goodput()
        return 200, {"jobs": [self._elastic_job(engine, j, predict=False) for j in engine.job_ids],
                     "round_index": engine.round_index}

    def get_elastic_job(self, body: Any, job: str) -> tuple[int, Any]:
        """One elastic job: its spec, batch, GPUs, and its measured step times with what its model predicts."""
        engine = self._require_goodput()
        return 200, self._elastic_job(engine, self._elastic_job_id(engine, job), predict=True)

    def add_elastic_job(self, body: Any) -> tuple[int, Any]:
        """Add an elastic job. 201 with the job."""
        engine = self._require_goodput()
        job = validate(_required(body), models.ElasticJob)
        self._check_jobs(len(engine) + 1, None)
        if job.id in engine:
            raise RequestError(409, f"elastic job {job.id!r} already exists", field="id")
        if job.seed_profile is not None:
            raise RequestError(400, "a seed profile (a file of the server) cannot be given over HTTP; POST the job's "
                                    "step times to /elastic/jobs/{id}/step_time instead", field="seed_profile")
        _check_spec(job, "")
        types = engine.cluster.gpu_types
        for k, gpu_type in enumerate(job.gpu_types or ()):
            if gpu_type not in types:
                raise RequestError(400, f"'gpu_types[{k}]' is {gpu_type!r}, not a GPU type of the cluster "
                                        f"({', '.join(types)})", field=f"gpu_types[{k}]")
        if job.application is not None:
            self._load_profiles(engine.profiles, {job.application})
        spec = ElasticSpec(**job.model_dump(exclude={"id", "gpu_types"}))
        engine.add_job(job.id, spec, gpu_types=job.gpu_types)
        self._saved(engine)
        return 201, self._elastic_job(engine, job.id, predict=False)

    def remove_elastic_job(self, body: Any, job: str) -> tuple[int, Any]:
        """Remove an elastic job (finished or failed)."""
        engine = self._require_goodput()
        job_id = self._elastic_job_id(engine, job)
        engine.remove_job(job_id)
        self._saved(engine)
        return 200, {"removed": job_id, "round_index": engine.round_index}

    def elastic_step_time(self, body: Any, job: str) -> tuple[int, Any]:
        """A measured step time of an elastic job; the mean at its point (the job's model is refitted on next use)."""
        engine = self._require_goodput()
        job_id = self._elastic_job_id(engine, job)
        step = validate(_required(body), models.StepTime)
        allowed = engine.get_job(job_id)["gpu_types"]
        if step.gpu_type not in allowed:
            raise RequestError(400, f"'gpu_type' is {step.gpu_type!r}, not a GPU type job {job_id!r} may use "
                                    f"({', '.join(allowed)})", field="gpu_type")
        if step.num_nodes > step.replicas:
            raise RequestError(400, f"'num_nodes' is {step.num_nodes}, more than its {step.replicas} replicas",
                               field="num_nodes")
        if step.iter_s < step.compute_s:
            raise RequestError(400, f"'iter_s' is {step.iter_s:g}, less than compute_s ({step.compute_s:g}): an "
                                    "iteration is at least one micro-batch's compute", field="iter_s")
        engine.observe_step_time(job_id, step.gpu_type, step.num_nodes, step.replicas, step.local_bsz,
                                 float(step.compute_s), float(step.iter_s))
        compute, iteration, count = engine.measurements(job_id)[step.gpu_type][
            (step.num_nodes, step.replicas, step.local_bsz)]
        self._saved(engine)
        return 200, {"gpu_type": step.gpu_type, "num_nodes": step.num_nodes, "replicas": step.replicas,
                     "local_bsz": step.local_bsz, "compute_s": compute, "iter_s": iteration, "count": count}

    def elastic_gradient(self, body: Any, job: str) -> tuple[int, Any]:
        """An elastic job's gradient statistics (they set its statistical efficiency and learning-rate scale)."""
        engine = self._require_goodput()
        job_id = self._elastic_job_id(engine, job)
        grad = validate(_required(body), models.Gradient)
        if grad.grad_sqr == 0 and grad.grad_var == 0:
            raise RequestError(400, "'grad_sqr' and grad_var are both 0; report them once the job has measured them",
                               field="grad_sqr")
        engine.observe_gradient(job_id, float(grad.grad_sqr), float(grad.grad_var))
        self._saved(engine)
        return 200, {"grad_sqr": float(grad.grad_sqr), "grad_var": float(grad.grad_var)}

    def elastic_next_round(self, body: Any) -> tuple[int, Any]:
        """Plan the next round of elastic jobs: each lease carries the batch chosen for its allocation."""
        engine = self._require_goodput()
        validate({} if body is None else body, models.ElasticNextRound)
        plan = engine.next_round()
        self._elastic_leased = {lease.job_id for lease in plan.leases}
        self._saved(engine)
        return 200, dataclasses.asdict(RoundPlan(plan.round_index, plan.start_s, plan.round_seconds,
                                                 tuple(plan.leases), tuple(plan.stop)))

    def elastic_round_results(self, body: Any, index: str) -> tuple[int, Any]:
        """What the elastic jobs of round ``index`` (the last planned round) did; 409 for another round or a
        recorded one."""
        engine = self._require_goodput()
        if not re.fullmatch(r"\d{1,18}", index):
            raise RequestError(400, f"round index must be a non-negative integer, got {index!r}", field="index")
        if not isinstance(body, list):
            raise RequestError(400, f"body must be a JSON list of job round results, got {json.dumps(body)[:80]}",
                               field="body")
        self._check_jobs(len(body), "results")
        validate(body, _ELASTIC_RESULTS, root="results")
        last, leased = engine.round_index - 1, self._elastic_leased
        if int(index) != last or leased is None:
            state = "already recorded" if int(index) == last else \
                f"the last planned round is {last if last >= 0 else 'none'}"
            raise RequestError(409, f"round {index} is not awaiting results ({state})", field="index")
        seen: set[Any] = set()
        for k, r in enumerate(body):
            if r["job_id"] not in leased or r["job_id"] in seen:
                why = "appears twice" if r["job_id"] in seen else f"has no lease in round {index}"
                raise RequestError(400, f"job {r['job_id']!r} {why}", field=f"results[{k}].job_id")
            seen.add(r["job_id"])
        results = [JobRoundResult(r["job_id"], RoundOutcome(r["outcome"]), r["steps"], float(r["run_seconds"]),
                                  r.get("measured_steps_per_s"), r.get("restarted", False), r.get("message", ""),
                                  metrics={k: float(v) for k, v in (r.get("metrics") or {}).items() if v is not None})
                   for r in body]
        engine.record_round(results)
        self._elastic_leased = None
        self._saved(engine)
        return 200, {"round_index": last, "recorded": len(results)}


def _policy_option(default: Any, value: Any, where: str) -> Any:
    """``value`` of a policy option, of the type of its ``default`` (an int default: an integer >= 0, e.g. a seed)."""
    if isinstance(default, bool):
        ok, expected = isinstance(value, bool), "a boolean"
    elif isinstance(default, int):
        ok, expected = isinstance(value, int) and not isinstance(value, bool) and value >= 0, "an integer >= 0"
    elif isinstance(default, float):
        ok, expected = isinstance(value, (int, float)) and not isinstance(value, bool), "a number"
    elif isinstance(default, str):
        ok, expected = isinstance(value, str), "a string"
    else:  # no default to go by (None): the policy checks it
        ok, expected = True, ""
    if not ok:
        raise RequestError(400, f"'{where}' must be {expected}, got {json.dumps(value)}", field=where)
    return value


def _check_spec(spec: Any, prefix: str) -> None:
    """The limits of an elastic job's spec that involve two fields, and a non-empty application."""
    if spec.application is not None and not spec.application.strip():
        raise RequestError(400, f"'{prefix}application' must be a non-empty profile name or null, got "
                                f"{json.dumps(spec.application)}", field=f"{prefix}application")
    for lo, hi in (("batch_size", "max_batch_size"), ("min_local_bsz", "max_local_bsz"),
                   ("min_replicas", "max_replicas")):
        low, high = getattr(spec, lo), getattr(spec, hi)
        if low is not None and high is not None and low > high:
            raise RequestError(400, f"'{prefix}{hi}' must be at least {lo} ({low}), got {high}", field=prefix + hi)


def _required(body: Any) -> Any:
    if body is None:
        raise RequestError(400, "this endpoint needs a JSON request body", field="body")
    return body


def _job_id(engine: Engine, text: str) -> Hashable:
    """The engine's job id written as ``text`` in a path: the string, else the integer it spells."""
    if text not in engine and re.fullmatch(r"-?\d{1,18}", text) and int(text) in engine:
        return int(text)
    return text


def _status(err: AllocoptError) -> int:
    if isinstance(err, UnknownJobError):
        return 404
    if isinstance(err, DuplicateJobError):
        return 409
    if isinstance(err, (InvalidProblemError, InvalidOptionError, BackendNotInstalledError)):
        return 400
    if isinstance(err, (NotOptimalError, SolverError)):
        return 422
    if isinstance(err, LicenseError):
        return 503
    return 500


def _default_field(err: AllocoptError) -> str | None:
    """The request field an error without a ``field`` is about."""
    if isinstance(err, UnknownPolicyError):
        return "policy"
    if isinstance(err, (UnknownBackendError, BackendNotInstalledError)):
        return "backend"
    if isinstance(err, InvalidOptionError):
        return "options"
    return None


def _error(err: Exception, kind: str, field: str | None, prefix: str = "") -> dict[str, Any]:
    return {"error": f"{prefix}{err}", "type": kind, "field": field}


def _json_response(status: int, payload: Any, headers: Mapping[str, str] | None = None) -> Response:
    return Response(json.dumps(payload, allow_nan=False), status_code=status, headers=dict(headers or {}),
                    media_type="application/json")


_ERRORS = {400: models.Error, 404: models.Error, 409: models.Error, 413: models.Error, 422: models.Error}
OPERATIONS: tuple[Operation, ...] = (
    Operation("GET", "/health", Service.health, "inline", "Liveness, version and the engine's size",
              responses={200: models.Health}),
    Operation("GET", "/openapi.json", Service.openapi, "inline", "This OpenAPI document", public=True),
    Operation("GET", "/docs", Service.docs, "inline", "The endpoints as an HTML page", public=True),
    Operation("GET", "/schemas/{name}", Service.schema, "inline", "A JSON Schema: problem, allocation, "
              "round_plan or engine_state", public=True),
    Operation("POST", "/solve", Service.solve, "solve", "Solve a problem document (stateless)",
              models.SolveRequest, {200: models.Allocation, **_ERRORS}),
    Operation("GET", "/engine", Service.state, "engine", "The engine's state document",
              responses={200: models.EngineState, 409: models.Error}),
    Operation("POST", "/engine", Service.configure, "engine", "Configure the engine, or restore a state document",
              models.EngineConfig | models.EngineState, {201: models.EngineState, **_ERRORS}),
    Operation("GET", "/engine/jobs", Service.list_jobs, "engine", "Every job",
              responses={200: models.JobList, 409: models.Error}),
    Operation("POST", "/engine/jobs", Service.add_job, "engine", "Add a job", models.Job,
              {201: models.Job, **_ERRORS}),
    Operation("GET", "/engine/jobs/{job}", Service.get_job, "engine", "One job",
              responses={200: models.Job, 404: models.Error, 409: models.Error}),
    Operation("PATCH", "/engine/jobs/{job}", Service.update_job, "engine", "Change fields of a job",
              models.JobPatch, {200: models.Job, **_ERRORS}),
    Operation("DELETE", "/engine/jobs/{job}", Service.remove_job, "engine", "Remove a job",
              responses={200: models.Removed, 404: models.Error, 409: models.Error}),
    Operation("POST", "/engine/jobs/{job}/throughput", Service.observe, "engine", "A measured throughput",
              models.Observation, {200: models.Observed, **_ERRORS}),
    Operation("PUT", "/engine/capacity/{gpu_type}", Service.set_capacity, "engine",
              "GPUs of a type now (nodes joined or left)", models.Capacity, {200: models.ClusterChanged, **_ERRORS}),
    Operation("GET", "/engine/allocation", Service.allocation, "engine", "The current allocation",
              responses={200: models.EngineAllocation, 409: models.Error, 422: models.Error}),
    Operation("POST", "/engine/rounds/next", Service.next_round, "engine", "Plan the next round",
              models.NextRound, {200: models.RoundPlan, **_ERRORS}),
    Operation("POST", "/engine/rounds/{index}/results", Service.round_results, "engine",
              "What the jobs of the last planned round did", list[models.RoundResult],
              {200: models.RoundRecorded, **_ERRORS}),
    Operation("GET", "/elastic", Service.elastic_state, "engine", "The goodput engine's state document",
              responses={200: models.GoodputEngineState, 409: models.Error}),
    Operation("POST", "/elastic", Service.configure_elastic, "engine",
              "Configure a goodput engine of elastic jobs, or restore its state document",
              models.ElasticConfig | models.GoodputEngineState, {201: models.GoodputEngineState, **_ERRORS}),
    Operation("GET", "/elastic/jobs", Service.list_elastic_jobs, "engine", "Every elastic job",
              responses={200: models.ElasticJobList, 409: models.Error}),
    Operation("POST", "/elastic/jobs", Service.add_elastic_job, "engine", "Add an elastic job", models.ElasticJob,
              {201: models.ElasticJobState, **_ERRORS}),
    Operation("GET", "/elastic/jobs/{job}", Service.get_elastic_job, "engine",
              "One elastic job, with its measured and predicted step times",
              responses={200: models.ElasticJobState, 404: models.Error, 409: models.Error}),
    Operation("DELETE", "/elastic/jobs/{job}", Service.remove_elastic_job, "engine", "Remove an elastic job",
              responses={200: models.ElasticRemoved, 404: models.Error, 409: models.Error}),
    Operation("POST", "/elastic/jobs/{job}/step_time", Service.elastic_step_time, "engine", "A measured step time",
              models.StepTime, {200: models.StepTimeMean, **_ERRORS}),
    Operation("POST", "/elastic/jobs/{job}/gradient", Service.elastic_gradient, "engine",
              "Gradient statistics of a job", models.Gradient, {200: models.Gradient, **_ERRORS}),
    Operation("POST", "/elastic/rounds/next", Service.elastic_next_round, "engine",
              "Plan the next round of elastic jobs", models.ElasticNextRound, {200: models.RoundPlan, **_ERRORS}),
    Operation("POST", "/elastic/rounds/{index}/results", Service.elastic_round_results, "engine",
              "What the elastic jobs of the last planned round did", list[models.ElasticRoundResult],
              {200: models.ElasticRoundRecorded, **_ERRORS}),
)


@functools.lru_cache(maxsize=1)
def _documentation() -> tuple[dict[str, Any], str]:
    """The OpenAPI document of :data:`OPERATIONS` and its HTML page (built once, on first request)."""
    document = openapi_document(OPERATIONS)
    return document, docs_html(document)
