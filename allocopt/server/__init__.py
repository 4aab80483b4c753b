"""The HTTP JSON service for schedulers written in other languages (``allocopt serve``).

Needs the ``service`` extra (``pip install 'allocopt[service]'``: Starlette,
uvicorn, pydantic). Requests and responses are JSON (UTF-8) over HTTP/1.1 with
keep-alive; the documents follow the JSON Schemas in :mod:`allocopt.schemas`
(served at ``GET /schemas/{name}``), and ``GET /openapi.json`` describes every
endpoint (``GET /docs`` as a page). docs/how-to/http-service.md is the reference.

Endpoints
---------
``GET /health``; ``POST /solve`` (a problem document plus ``policy``,
``backend``, ``options``; stateless); the engine: ``POST|GET /engine``,
``GET|POST /engine/jobs``, ``GET|PATCH|DELETE /engine/jobs/{id}``,
``POST /engine/jobs/{id}/throughput``, ``PUT /engine/capacity/{gpu_type}``,
``GET /engine/allocation``, ``POST /engine/rounds/next`` (an empty body is
``{}``), ``POST /engine/rounds/{index}/results``; the goodput engine of elastic
jobs (``allocopt serve --policy sia``): ``POST|GET /elastic``, ``GET|POST
/elastic/jobs``, ``GET|DELETE /elastic/jobs/{id}``, ``POST
/elastic/jobs/{id}/step_time``, ``POST /elastic/jobs/{id}/gradient``, ``POST
/elastic/rounds/next``, ``POST /elastic/rounds/{index}/results``. The service
holds one engine, of either kind; the other kind's endpoints answer 409. A job
id in a path is the id as a string; an id of digits also finds the integer id.

Errors
------
Every error is ``{"error": message, "type": error class, "field": name or null}``:
400 (malformed JSON or a missing, invalid or out-of-limit field, e.g.
``"throughputs.v100"``), 401 (missing or wrong bearer token), 404 (unknown
route or job), 405 (method not allowed), 408 (body sent too slowly), 409
(duplicate job id, no engine configured, or results for a round not awaiting
them), 413 (body or job count over the limit), 422 (the solver did not prove
optimality, or failed on the problem), 503 (busy, or a solve over the time
limit). A rejected request leaves the engine unchanged.

Limits and timeouts are :class:`ServiceOptions` (``allocopt serve --help``).
"""

from __future__ import annotations

from typing import Any

from allocopt.errors import BackendNotInstalledError
from allocopt.server.options import ServiceOptions

__all__ = ["AllocoptServer", "ServiceOptions", "serve"]

_EXTRA = {"starlette", "uvicorn", "pydantic", "pydantic_core", "h11", "anyio"}  # what 'service' installs


def serve(host: str = "127.0.0.1", port: int = 8000, engine: Any = None, **kwargs: Any) -> None:
    """Run the service until interrupted (see :class:`allocopt.server.http.AllocoptServer` for ``kwargs``).

    Raises
    ------
    BackendNotInstalledError
        When the ``service`` extra is not installed.
    """
    try:
        from allocopt.server.http import serve as run
    except ImportError as err:
        if (err.name or "").partition(".")[0] not in _EXTRA:
            raise
        raise BackendNotInstalledError(f"allocopt serve needs the 'service' extra ({err.name} is missing): "
                                       "pip install 'allocopt[service]'") from None
    run(host, port, engine, **kwargs)


def __getattr__(name: str) -> Any:
    """``AllocoptServer`` from :mod:`allocopt.server.http`, imported on first use (it needs the extra)."""
    if name == "AllocoptServer":
        from allocopt.server.http import AllocoptServer
        return AllocoptServer
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
