"""The service's OpenAPI 3.1 document (``GET /openapi.json``) and its HTML page (``GET /docs``), from the route table
(:data:`allocopt.server.app.OPERATIONS`, passed in: this module does not import the app)."""

from __future__ import annotations

import html
import re
from collections.abc import Iterable
from http import HTTPStatus
from typing import Any

from pydantic import BaseModel, TypeAdapter

from allocopt import __version__
from allocopt.server import models

_REF = "#/components/schemas/{model}"


def openapi_document(operations: Iterable[Any]) -> dict[str, Any]:
    """The OpenAPI 3.1 document of ``operations`` (the app's route table), with the request and response
    models as components."""
    components: dict[str, Any] = {}

    def schema_of(kind: Any) -> dict[str, Any]:
        schema = TypeAdapter(kind).json_schema(ref_template=_REF)
        components.update(schema.pop("$defs", {}))
        if isinstance(kind, type) and issubclass(kind, BaseModel):
            components[kind.__name__] = schema
            return {"$ref": _REF.format(model=kind.__name__)}
        return schema

    def response(status: int, kind: Any) -> dict[str, Any]:
        return {"description": HTTPStatus(status).phrase, "content": {"application/json": {"schema": schema_of(kind)}}}

    for document in (models.Problem, models.Allocation, models.RoundPlan, models.EngineState,
                     models.GoodputEngineState):
        schema_of(document)  # the documents of allocopt.schemas, whether or not an endpoint names them
    paths: dict[str, dict[str, Any]] = {}
    for op in operations:
        operation: dict[str, Any] = {"summary": op.summary, "operationId": op.handler.__name__,
                                     "description": op.handler.__doc__ or op.summary}
        names = re.findall(r"\{([a-z_]+)\}", op.path)
        if names:
            operation["parameters"] = [{"name": n, "in": "path", "required": True, "schema": {"type": "string"}}
                                       for n in names]
        if op.body is not None:
            operation["requestBody"] = {"required": not op.path.endswith("/rounds/next"),
                                        "content": {"application/json": {"schema": schema_of(op.body)}}}
        responses = {str(status): response(status, kind) for status, kind in op.responses.items()}
        responses.setdefault("200", {"description": "OK"})
        responses["default"] = response(400, models.Error) | {"description": "An error (see the error statuses)"}
        operation["responses"] = responses
        operation["security"] = [] if op.public else [{}, {"bearer": []}]
        paths.setdefault(op.path, {})[op.method.lower()] = operation
    return {
        "openapi": "3.1.0",
        "info": {"title": "allocopt service", "version": __version__,
                 "description": "Allocation of heterogeneous GPU clusters among jobs: a stateless solve and a "
                                "shared allocation engine, of rigid jobs (/engine) or of elastic jobs under a "
                                "goodput policy (/elastic). Errors are {\"error\", \"type\", \"field\"}. With "
                                "--token-file, every endpoint but the documentation needs a bearer token."},
        "paths": paths,
        "components": {"schemas": dict(sorted(components.items())),
                       "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}}},
    }


def docs_html(document: dict[str, Any]) -> str:
    """An HTML page (no scripts, works offline) listing the endpoints of an :func:`openapi_document`."""
    rows = []
    for path, operations in document["paths"].items():
        for method, op in operations.items():
            body = op.get("requestBody", {}).get("content", {}).get("application/json", {}).get("schema", {})
            statuses = ", ".join(s for s in op["responses"] if s != "default")
            rows.append(f"<tr><td><code>{method.upper()}</code></td><td><code>{html.escape(path)}</code></td>"
                        f"<td>{html.escape(op['summary'])}</td><td>{html.escape(_name(body))}</td>"
                        f"<td>{statuses}</td></tr>")
    return ("<!doctype html><html><head><meta charset='utf-8'><title>allocopt service</title></head><body>"
            f"<h1>allocopt service {html.escape(__version__)}</h1>"
            f"<p>{html.escape(document['info']['description'])}</p>"
            "<p>The machine-readable description is <a href='/openapi.json'>/openapi.json</a> (OpenAPI 3.1); "
            "the documents' JSON Schemas are under <code>/schemas/</code>.</p>"
            "<table border='1' cellpadding='4'><tr><th>Method</th><th>Path</th><th>What</th><th>Body</th>"
            f"<th>Statuses</th></tr>{''.join(rows)}</table></body></html>")


def _name(schema: dict[str, Any]) -> str:
    if "$ref" in schema:
        return schema["$ref"].rsplit("/", 1)[-1]
    for key in ("anyOf", "oneOf"):
        if key in schema:
            return " or ".join(_name(s) for s in schema[key])
    if schema.get("type") == "array":
        return f"list of {_name(schema.get('items', {}))}"
    return ""
