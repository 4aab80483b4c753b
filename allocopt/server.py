"""A small HTTP JSON service for schedulers written in other languages (``allocopt serve``).

Built on the standard library's :class:`http.server.ThreadingHTTPServer`: no
extra dependency. Requests and responses are JSON objects (UTF-8); the
documents follow the JSON Schemas in :mod:`allocopt.schemas` (also served at
``GET /schemas/{name}``).

Endpoints
---------
``GET /health``
    ``{"status": "ok", "allocopt_version", "engine": bool, "engine_version", "num_jobs"}``.
``POST /solve``
    Body: a problem document (the input of ``allocopt solve``, schema
    ``problem``) plus optional ``"policy"`` (default ``"max_min_fairness"``),
    ``"backend"`` (default ``"highs"``) and ``"options"`` (an object of policy
    options and :func:`allocopt.solve` keywords, e.g. ``{"threads": 1}``).
    Returns the allocation document (schema ``allocation``). Stateless.
``GET /schemas/{name}``
    The JSON Schema ``problem``, ``allocation`` or ``round_plan``.
``POST /engine``
    (Re)configure the engine: ``{"cluster": {"gpus": {...}}, "policy", "backend",
    "policy_options", "solve_options", "throughput_smoothing"}``, or an engine
    state document (as ``GET /engine`` returns) to restore. 201 with the state.
``GET /engine``
    The engine's state document (:meth:`allocopt.Engine.to_json`).
``GET /engine/jobs``, ``GET /engine/jobs/{id}``
    ``{"jobs": [job, ...]}`` or one job object (as in the problem document).
``POST /engine/jobs``
    Add a job: ``{"id", "throughputs": {gpu_type: steps_per_s}, "scale_factor", ...}``
    (the problem document's job fields). 201 with the job.
``PATCH /engine/jobs/{id}``
    Change fields of a job (``throughputs`` updates only the types it names;
    ``null`` resets a field). 200 with the job.
``DELETE /engine/jobs/{id}``
    Remove a job. 200 ``{"removed": id, "engine_version"}``.
``POST /engine/jobs/{id}/throughput``
    A measured throughput ``{"gpu_type", "steps_per_s"}``; 200 ``{"steps_per_s": estimate}``.
``PUT /engine/capacity/{gpu_type}``
    ``{"count": n}`` (optionally ``"gpus_per_node"``): nodes joined or left; a new type is added.
    200 with the cluster.
``GET /engine/allocation``
    ``{"engine_version", "waiting_jobs", "allocation": <allocation document>}``;
    solved again only when the engine changed.
``POST /engine/rounds/next``
    Plan the next round (:meth:`allocopt.Engine.next_round`); body ``{}`` or
    ``{"round_seconds": s}`` (an empty body counts as ``{}``). 200 with the round
    plan document (schema ``round_plan``).
``POST /engine/rounds/{index}/results``
    What the jobs of round ``index`` (the last planned round) did
    (:meth:`allocopt.Engine.record_round`): a list of ``{"job_id", "outcome":
    "completed" | "preempted" | "failed", "steps", "run_seconds",
    "measured_steps_per_s"?, "restarted"?, "message"?}``. 200
    ``{"round_index", "recorded", "engine_version"}``; 409 for another round or
    a round whose results were already recorded.

A job id in a path is the id as a string; an id of digits also finds the
integer id. Mutations answer with ``"engine_version"`` where useful.

Errors
------
Every error is ``{"error": message, "type": error class, "field": name or null}``
with status 400 (malformed JSON, a missing or invalid field: ``field`` names
it, e.g. ``"throughputs.v100"``), 404 (unknown route or job), 405 (method not
allowed), 409 (duplicate job id, no engine configured, or results for a round not
awaiting them), 411 (no
Content-Length), 413 (body over the size limit), 422 (the solver did not prove
optimality, e.g. infeasible deadlines) or 500 (solver failure or internal
error). A rejected request leaves the engine unchanged; the server keeps serving.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
import sys
import threading
import traceback
from collections.abc import Callable, Hashable, Mapping
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import unquote, urlsplit

from allocopt import __version__
from allocopt.api import solve
from allocopt.cluster import Cluster
from allocopt.engine import JOB_FIELDS, Engine
from allocopt.errors import (AllocoptError, BackendNotInstalledError, DuplicateJobError, InvalidOptionError,
                             InvalidProblemError, NotOptimalError, UnknownBackendError, UnknownJobError,
                             UnknownPolicyError)
from allocopt.problem import Problem
from allocopt.runtime.executor import JobRoundResult, RoundOutcome
from allocopt.schemas import SCHEMAS, load_schema

#: Default limit on request bodies, in bytes.
DEFAULT_MAX_BODY_BYTES = 16 * 2**20

_SOLVE_FIELDS = ("policy", "backend", "options")
_RESULT_FIELDS = {"job_id", "outcome", "steps", "run_seconds", "measured_steps_per_s", "restarted", "message"}


class RequestError(Exception):
    """A request the service rejects: HTTP ``status``, and the offending ``field`` if any."""

    def __init__(self, status: int, message: str, *, field: str | None = None):
        super().__init__(message)
        self.status = status
        self.field = field


class AllocoptServer(ThreadingHTTPServer):
    """The HTTP service: one thread per request, one shared :class:`~allocopt.Engine`.

    Parameters
    ----------
    address : (str, int)
        Host and port; port 0 picks a free one (see ``server_address``).
    engine : Engine, optional
        The engine the ``/engine`` endpoints act on; none until ``POST /engine`` otherwise.
    max_body_bytes : int, default 16 MiB
        Larger request bodies get 413.
    state_path : str, optional
        Save the engine's state there (atomically) after every change.
    quiet : bool, default False
        Do not log requests to stderr.
    """

    daemon_threads = True

    def __init__(self, address: tuple[str, int], engine: Engine | None = None, *,
                 max_body_bytes: int = DEFAULT_MAX_BODY_BYTES, state_path: str | None = None,
                 quiet: bool = False):
        super().__init__(address, _Handler)
        self.engine = engine
        self.max_body_bytes = max_body_bytes
        self.state_path = state_path
        self.quiet = quiet
        self._engine_lock = threading.Lock()
        self._rounds_lock = threading.Lock()  # planning and recording a round are atomic with the index check

    @property
    def url(self) -> str:
        """``http://host:port`` of the listening socket."""
        host, port = self.server_address[:2]
        return f"http://{host}:{port}"

    # ----- endpoints (each takes the decoded body and the path parameters) ------------------
    def health(self, body: Any) -> tuple[int, Any]:
        """GET /health: liveness, version and the engine's size."""
        engine = self.engine
        return 200, {"status": "ok", "allocopt_version": __version__, "engine": engine is not None,
                     "engine_version": None if engine is None else engine.version,
                     "num_jobs": None if engine is None else len(engine)}

    def solve(self, body: Any) -> tuple[int, Any]:
        """POST /solve: a problem document (plus ``policy``, ``backend``, ``options``) to an allocation document."""
        document = _object(body, "body")
        policy = _typed(document.get("policy", "max_min_fairness"), str, "policy", "a string")
        backend = _typed(document.get("backend", "highs"), str, "backend", "a string")
        options = _object(document.get("options", {}), "options")
        clashes = sorted(set(options) & {"problem", "policy", "backend"})
        if clashes:
            raise RequestError(400, f"'options' must not contain {clashes[0]!r}; give it as a top-level field",
                               field=f"options.{clashes[0]}")
        problem = Problem.from_json({k: v for k, v in document.items() if k not in _SOLVE_FIELDS})
        return 200, solve(problem, policy, backend=backend, **options).to_json()

    def schema(self, body: Any, name: str) -> tuple[int, Any]:
        """GET /schemas/NAME: one of the JSON Schemas."""
        if name not in SCHEMAS:
            raise RequestError(404, f"unknown schema {name!r}; schemas: {', '.join(SCHEMAS)}", field="name")
        return 200, load_schema(name)

    def configure(self, body: Any) -> tuple[int, Any]:
        """POST /engine: a new engine from ``{cluster, policy, ...}`` or from a saved state document."""
        document = _object(body, "body")
        if "format" in document:
            engine = Engine.from_json(document)
        else:
            known = {"cluster", "policy", "backend", "policy_options", "solve_options", "throughput_smoothing"}
            _no_unknown(document, known)
            if "cluster" not in document:
                raise RequestError(400, "missing required field 'cluster' ({\"gpus\": {gpu_type: count}})",
                                   field="cluster")
            engine = Engine(Cluster.from_dict(_object(document["cluster"], "cluster")),
                            document.get("policy", "max_min_fairness"), document.get("backend", "highs"),
                            policy_options=_object(document.get("policy_options", {}), "policy_options"),
                            solve_options=_object(document.get("solve_options", {}), "solve_options"),
                            throughput_smoothing=document.get("throughput_smoothing", 1.0))
        with self._engine_lock:
            self.engine = engine
        self._saved(engine)
        return 201, engine.to_json()

    def state(self, body: Any) -> tuple[int, Any]:
        """GET /engine: the engine's state document."""
        return 200, self._engine().to_json()

    def list_jobs(self, body: Any) -> tuple[int, Any]:
        """GET /engine/jobs: every job with its fields."""
        state = self._engine().to_json()
        return 200, {"jobs": state["jobs"], "engine_version": state["version"]}

    def get_job(self, body: Any, job: str) -> tuple[int, Any]:
        """GET /engine/jobs/ID: one job."""
        engine = self._engine()
        return 200, engine.get_job(_job_id(engine, job))

    def add_job(self, body: Any) -> tuple[int, Any]:
        """POST /engine/jobs: add a job."""
        engine, document = self._engine(), _object(body, "body")
        _no_unknown(document, {"id", "throughputs", *JOB_FIELDS})
        for name in ("id", "throughputs"):
            if name not in document:
                raise RequestError(400, f"missing required field {name!r}", field=name)
        engine.add_job(document["id"], **{k: v for k, v in document.items() if k != "id"})
        self._saved(engine)
        return 201, engine.get_job(document["id"])

    def update_job(self, body: Any, job: str) -> tuple[int, Any]:
        """PATCH /engine/jobs/ID: change a job's fields."""
        engine, document = self._engine(), _object(body, "body")
        _no_unknown(document, {"throughputs", *JOB_FIELDS})
        job_id = _job_id(engine, job)
        engine.update_job(job_id, **document)
        self._saved(engine)
        return 200, engine.get_job(job_id)

    def remove_job(self, body: Any, job: str) -> tuple[int, Any]:
        """DELETE /engine/jobs/ID: remove a job."""
        engine = self._engine()
        job_id = _job_id(engine, job)
        engine.remove_job(job_id)
        self._saved(engine)
        return 200, {"removed": job_id, "engine_version": engine.version}

    def observe(self, body: Any, job: str) -> tuple[int, Any]:
        engine, document = self._engine(), _object(body, "body")
        _no_unknown(document, {"gpu_type", "steps_per_s"})
        for name in ("gpu_type", "steps_per_s"):
            if name not in document:
                raise RequestError(400, f"missing required field {name!r}", field=name)
        value = engine.observe_throughput(_job_id(engine, job), document["gpu_type"], document["steps_per_s"])
        self._saved(engine)
        return 200, {"steps_per_s": value, "engine_version": engine.version}

    def set_capacity(self, body: Any, gpu_type: str) -> tuple[int, Any]:
        """PUT /engine/capacity/TYPE: GPUs of a type (nodes join or leave)."""
        engine, document = self._engine(), _object(body, "body")
        _no_unknown(document, {"count", "gpus_per_node"})
        if "count" not in document:
            raise RequestError(400, "missing required field 'count'", field="count")
        engine.set_capacity(gpu_type, document["count"], gpus_per_node=document.get("gpus_per_node"))
        self._saved(engine)
        return 200, {"cluster": engine.cluster.to_dict(), "engine_version": engine.version}

    def allocation(self, body: Any) -> tuple[int, Any]:
        """GET /engine/allocation: the current allocation (solved again only if something changed)."""
        allocation = self._engine().allocate()
        return 200, {"engine_version": allocation.extras["engine_version"],
                     "waiting_jobs": allocation.extras["waiting_jobs"], "allocation": allocation.to_json()}

    def next_round(self, body: Any) -> tuple[int, Any]:
        """POST /engine/rounds/next: the next round's leases."""
        engine = self._engine()
        document = {} if body is None else _object(body, "body")
        _no_unknown(document, {"round_seconds"})
        seconds = document.get("round_seconds")
        if seconds is not None and (isinstance(seconds, bool) or not isinstance(seconds, (int, float))
                                    or not 0 < seconds < math.inf):
            raise RequestError(400, f"'round_seconds' must be a positive number, got {json.dumps(seconds)}",
                               field="round_seconds")
        with self._rounds_lock:
            plan = engine.next_round(seconds)
        self._saved(engine)
        return 200, dataclasses.asdict(plan)

    def round_results(self, body: Any, index: str) -> tuple[int, Any]:
        """POST /engine/rounds/N/results: credit round N's run times."""
        engine = self._engine()
        if not re.fullmatch(r"\d+", index):
            raise RequestError(400, f"round index must be a non-negative integer, got {index!r}", field="index")
        if not isinstance(body, list):
            raise RequestError(400, f"body must be a JSON list of job round results, got {json.dumps(body)}",
                               field="body")
        results = [_round_result(item, f"results[{k}]") for k, item in enumerate(body)]
        with self._rounds_lock:
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

    # ----- helpers ---------------------------------------------------------------------------------
    def _engine(self) -> Engine:
        engine = self.engine
        if engine is None:
            raise RequestError(409, "no engine is configured; POST /engine with {\"cluster\": {\"gpus\": {...}}} "
                                    "or start the server with --cluster")
        return engine

    def _saved(self, engine: Engine) -> None:
        if self.state_path is not None:
            with self._engine_lock:
                engine.save(self.state_path)


_ROUTES: list[tuple[re.Pattern[str], dict[str, Callable[..., tuple[int, Any]]]]] = [
    (re.compile(p), routes) for p, routes in [
        (r"/health", {"GET": AllocoptServer.health}),
        (r"/solve", {"POST": AllocoptServer.solve}),
        (r"/schemas/([^/]+)", {"GET": AllocoptServer.schema}),
        (r"/engine", {"GET": AllocoptServer.state, "POST": AllocoptServer.configure}),
        (r"/engine/jobs", {"GET": AllocoptServer.list_jobs, "POST": AllocoptServer.add_job}),
        (r"/engine/jobs/([^/]+)", {"GET": AllocoptServer.get_job, "PATCH": AllocoptServer.update_job,
                                   "DELETE": AllocoptServer.remove_job}),
        (r"/engine/jobs/([^/]+)/throughput", {"POST": AllocoptServer.observe}),
        (r"/engine/capacity/([^/]+)", {"PUT": AllocoptServer.set_capacity}),
        (r"/engine/allocation", {"GET": AllocoptServer.allocation}),
        (r"/engine/rounds/next", {"POST": AllocoptServer.next_round}),
        (r"/engine/rounds/([^/]+)/results", {"POST": AllocoptServer.round_results}),
    ]]


class _Handler(BaseHTTPRequestHandler):
    server: AllocoptServer
    server_version = f"allocopt/{__version__}"

    def do_GET(self) -> None:
        self._handle("GET")

    def do_POST(self) -> None:
        self._handle("POST")

    def do_PUT(self) -> None:
        self._handle("PUT")

    def do_PATCH(self) -> None:
        self._handle("PATCH")

    def do_DELETE(self) -> None:
        self._handle("DELETE")

    def log_message(self, format: str, *args: Any) -> None:
        if not self.server.quiet:
            super().log_message(format, *args)

    def _handle(self, method: str) -> None:
        try:
            endpoint, params = self._route(method)
            body = self._body() if method in ("POST", "PUT", "PATCH") else None
            status, payload = endpoint(self.server, body, *params)
        except RequestError as err:
            status, payload = err.status, _error(err, err.field)
        except AllocoptError as err:
            status, payload = _status(err), _error(err, getattr(err, "field", None) or _default_field(err))
        except Exception as err:  # the service must outlive any bug a request triggers
            traceback.print_exc(file=sys.stderr)
            status, payload = 500, {"error": f"internal error: {err}", "type": type(err).__name__, "field": None}
        self._send(status, payload)

    def _route(self, method: str) -> tuple[Callable[..., tuple[int, Any]], tuple[str, ...]]:
        path = urlsplit(self.path).path.rstrip("/") or "/"
        for pattern, routes in _ROUTES:
            match = pattern.fullmatch(path)
            if match:
                if method not in routes:
                    raise RequestError(405, f"{method} is not allowed on {path}; allowed: {', '.join(routes)}")
                return routes[method], tuple(unquote(g) for g in match.groups())
        raise RequestError(404, f"no endpoint {path}; see the allocopt.server documentation")

    def _body(self) -> Any:
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            self.close_connection = True
            raise RequestError(411, "chunked request bodies are not supported; send a Content-Length")
        length = self.headers.get("Content-Length")
        if length is None or not length.strip().isdigit():
            self.close_connection = True
            raise RequestError(411, "a request body needs a valid Content-Length header")
        size = int(length)
        if size > self.server.max_body_bytes:
            self.close_connection = True
            raise RequestError(413, f"request body of {size} bytes is over the limit of "
                                    f"{self.server.max_body_bytes} bytes", field="body")
        if size == 0:
            return None
        data = self.rfile.read(size)
        try:
            return json.loads(data.decode("utf-8"))
        except UnicodeDecodeError as err:
            raise RequestError(400, f"request body is not UTF-8: {err}", field="body") from None
        except json.JSONDecodeError as err:
            raise RequestError(400, f"malformed JSON at line {err.lineno}, column {err.colno}: {err.msg}",
                               field="body") from None

    def _send(self, status: int, payload: Any) -> None:
        try:
            data = json.dumps(payload).encode("utf-8")
        except (TypeError, ValueError) as err:
            status, data = 500, json.dumps({"error": f"response is not JSON-serializable: {err}",
                                            "type": type(err).__name__, "field": None}).encode("utf-8")
        try:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):  # the client went away
            self.close_connection = True


def _status(err: AllocoptError) -> int:
    if isinstance(err, UnknownJobError):
        return HTTPStatus.NOT_FOUND
    if isinstance(err, DuplicateJobError):
        return HTTPStatus.CONFLICT
    if isinstance(err, (InvalidProblemError, InvalidOptionError, BackendNotInstalledError)):
        return HTTPStatus.BAD_REQUEST
    if isinstance(err, NotOptimalError):
        return HTTPStatus.UNPROCESSABLE_ENTITY
    return HTTPStatus.INTERNAL_SERVER_ERROR


def _default_field(err: AllocoptError) -> str | None:
    """The request field an error without a ``field`` is about."""
    if isinstance(err, UnknownPolicyError):
        return "policy"
    if isinstance(err, (UnknownBackendError, BackendNotInstalledError)):
        return "backend"
    if isinstance(err, InvalidOptionError):
        return "options"
    return None


def _error(err: Exception, field: str | None) -> dict[str, Any]:
    return {"error": str(err), "type": type(err).__name__, "field": field}


def _typed(value: Any, kind: type, field: str, expected: str) -> Any:
    if not isinstance(value, kind):
        raise RequestError(400, f"'{field}' must be {expected}, got {json.dumps(value)}", field=field)
    return value


def _object(value: Any, field: str) -> dict[str, Any]:
    return _typed(value, dict, field, "a JSON object")


def _no_unknown(document: Mapping[str, Any], known: set[str]) -> None:
    unknown = sorted(set(document) - known)
    if unknown:
        raise RequestError(400, f"unknown field {unknown[0]!r}; known fields: {', '.join(sorted(known))}",
                           field=unknown[0])


def _round_result(item: Any, where: str) -> JobRoundResult:
    """A :class:`JobRoundResult` from its JSON object; ``where`` prefixes the field names in errors."""
    document = _object(item, where)
    unknown = sorted(set(document) - _RESULT_FIELDS)
    if unknown:
        raise RequestError(400, f"unknown field {unknown[0]!r} in {where}; known fields: "
                                f"{', '.join(sorted(_RESULT_FIELDS))}", field=f"{where}.{unknown[0]}")
    for name in ("job_id", "outcome", "steps", "run_seconds"):
        if name not in document:
            raise RequestError(400, f"missing required field {name!r} in {where}", field=f"{where}.{name}")
    job_id = document["job_id"]
    if isinstance(job_id, bool) or not isinstance(job_id, (str, int)):
        raise RequestError(400, f"'{where}.job_id' must be a string or an integer, got {json.dumps(job_id)}",
                           field=f"{where}.job_id")
    outcomes = [o.value for o in RoundOutcome]
    if document["outcome"] not in outcomes:
        raise RequestError(400, f"'{where}.outcome' must be one of {outcomes}, got {json.dumps(document['outcome'])}",
                           field=f"{where}.outcome")
    steps = document["steps"]
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 0:
        raise RequestError(400, f"'{where}.steps' must be an integer >= 0, got {json.dumps(steps)}",
                           field=f"{where}.steps")
    numbers = {name: document.get(name) for name in ("run_seconds", "measured_steps_per_s")}
    for name, value in numbers.items():
        if value is None and name == "measured_steps_per_s":
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < math.inf:
            raise RequestError(400, f"'{where}.{name}' must be a finite number >= 0, got {json.dumps(value)}",
                               field=f"{where}.{name}")
    restarted = _typed(document.get("restarted", False), bool, f"{where}.restarted", "a boolean")
    message = _typed(document.get("message", ""), str, f"{where}.message", "a string")
    return JobRoundResult(job_id, RoundOutcome(document["outcome"]), steps, float(numbers["run_seconds"]),
                          numbers["measured_steps_per_s"], restarted, message)


def _job_id(engine: Engine, text: str) -> Hashable:
    """The engine's job id written as ``text`` in a path: the string, else the integer it spells."""
    if text not in engine and re.fullmatch(r"-?\d+", text) and int(text) in engine:
        return int(text)
    return text


def serve(host: str = "127.0.0.1", port: int = 8000, engine: Engine | None = None, **kwargs: Any) -> None:
    """Run the service until interrupted (see :class:`AllocoptServer` for ``kwargs``)."""
    with AllocoptServer((host, port), engine, **kwargs) as server:
        print(f"allocopt: serving on {server.url}", file=sys.stderr, flush=True)
        try:
            server.serve_forever()
        except KeyboardInterrupt:
            pass
