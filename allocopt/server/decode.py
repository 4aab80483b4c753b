"""Request bodies to validated documents: bounded JSON decoding, model validation, field-naming errors."""

from __future__ import annotations

import json
import math
from typing import Any

from pydantic import BaseModel, TypeAdapter, ValidationError

from allocopt.server.options import ServiceOptions


class RequestError(Exception):
    """A request the service rejects: HTTP ``status``, and the offending ``field`` if any."""

    def __init__(self, status: int, message: str, *, field: str | None = None, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status = status
        self.field = field
        self.headers = headers or {}


class _Oversized:
    """A number of a JSON body over the limits, kept in place so its field can be named."""

    __slots__ = ("text",)

    def __init__(self, text: str):
        self.text = text


def decode(raw: bytes, options: ServiceOptions, root: str = "") -> Any:
    """The JSON value of ``raw`` (None when empty), within ``options``' depth and number limits.

    ``root`` names the body in field paths (``""``: fields are named from the top, e.g. ``jobs[0].id``).

    Raises
    ------
    RequestError
        400 for text that is not UTF-8 JSON, nesting over ``max_depth``, an integer over
        ``max_int_digits`` digits, or a number over ``max_number`` or not finite (NaN, Infinity).
    """
    if not raw.strip():
        return None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise RequestError(400, f"request body is not UTF-8: {err}", field="body") from None

    def parse_int(digits: str) -> int | _Oversized:
        if len(digits.lstrip("-")) > options.max_int_digits:
            return _Oversized(digits)
        value = int(digits)
        return value if abs(value) <= options.max_number else _Oversized(digits)

    def parse_float(digits: str) -> float | _Oversized:
        value = float(digits)
        return value if math.isfinite(value) and abs(value) <= options.max_number else _Oversized(digits)

    try:
        document = json.loads(text, parse_int=parse_int, parse_float=parse_float, parse_constant=_Oversized)
    except RecursionError:
        raise RequestError(400, f"request body is nested deeper than the limit of {options.max_depth}",
                           field="body") from None
    except json.JSONDecodeError as err:
        raise RequestError(400, f"malformed JSON at line {err.lineno}, column {err.colno}: {err.msg}",
                           field="body") from None
    _check(document, options, root)
    return document


def _check(document: Any, options: ServiceOptions, root: str) -> None:
    """Raise a :class:`RequestError` naming the first value over the depth or number limits."""
    stack = [(document, root, 1)]
    while stack:
        value, path, depth = stack.pop()
        if isinstance(value, (dict, list)):
            if depth > options.max_depth:
                raise RequestError(400, f"{path or 'body'} is nested deeper than the limit of {options.max_depth}",
                                   field=path or "body")
            items = value.items() if isinstance(value, dict) else enumerate(value)
            children = [(v, _join(path, k), depth + 1) for k, v in items]
            stack.extend(reversed(children))
        elif isinstance(value, _Oversized):
            digits = value.text.lstrip("-")
            limit = (f"integers have at most {options.max_int_digits} digits"
                     if digits.isdigit() and len(digits) > options.max_int_digits
                     else f"numbers are finite and at most {options.max_number:g} in magnitude")
            shown = value.text if len(value.text) <= 40 else value.text[:20] + "..." + value.text[-10:]
            raise RequestError(400, f"{path or 'body'} is {shown}; {limit}", field=path or "body")


def _join(path: str, key: str | int) -> str:
    if isinstance(key, int):
        return f"{path}[{key}]"
    return f"{path}.{key}" if path else str(key)


def field_path(loc: tuple[str | int, ...], root: str = "") -> str:
    """A pydantic error location as a field path: ``("jobs", 0, "id")`` -> ``jobs[0].id``."""
    path = root
    for key in loc:
        path = _join(path, key)
    return path or "body"


def validate(document: Any, model: type[BaseModel] | TypeAdapter, root: str = "") -> Any:
    """Validate ``document`` against ``model`` (a model class or a TypeAdapter); return the validated value.

    Raises
    ------
    RequestError
        400 naming the first offending field (``throughputs.v100``, ``results[0].outcome``).
    """
    try:
        if isinstance(model, TypeAdapter):
            return model.validate_python(document)
        return model.model_validate(document)
    except ValidationError as err:
        raise _request_error(err.errors(include_url=False), root) from None


def _request_error(errors: list[dict[str, Any]], root: str) -> RequestError:
    error = errors[0]
    loc = tuple(error["loc"])
    kind, field = error["type"], field_path(loc, root)
    if kind == "extra_forbidden":
        where = field_path(loc[:-1], root) if loc[:-1] else ""
        message = f"unknown field {loc[-1]!r}" + (f" in {where}" if where else "")
    elif kind == "missing":
        where = field_path(loc[:-1], root) if loc[:-1] else ""
        message = f"missing required field {loc[-1]!r}" + (f" in {where}" if where else "")
    else:
        detail = error["msg"][0].lower() + error["msg"][1:]
        if detail.startswith("value error, "):
            detail = detail[len("value error, "):]
        message = f"'{field}' {detail}, got {_shown(error.get('input'))}"
    return RequestError(400, message, field=field)


def _shown(value: Any) -> str:
    try:
        text = json.dumps(value)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= 80 else text[:60] + "..." + text[-10:]
