"""Reading input files and documents with typed errors that name the file and line.

Every reader of a user's file (problem JSON, engine state, job files, traces,
throughput tables) goes through these helpers, so that a missing, binary,
non-UTF-8, syntactically broken or absurdly nested file becomes a
:class:`~allocopt.errors.DataFileError` (``path, line N: what is wrong``), never
a ``UnicodeDecodeError``, ``RecursionError`` or parser traceback.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from typing import Any

from allocopt.errors import DataFileError

#: Deepest nesting of lists and objects accepted in a document (allocopt's own documents need 5).
MAX_DEPTH = 64


def read_text(path: str | os.PathLike, *, what: str = "the file", error: type[DataFileError] = DataFileError) -> str:
    """The UTF-8 text of ``path`` (a leading byte-order mark is dropped).

    Raises
    ------
    DataFileError
        (or its subclass ``error``) when the file cannot be read (``what`` names
        it in the message), holds NUL bytes (a binary file) or is not UTF-8
        (naming the line of the first bad byte).
    """
    try:
        with open(path, "rb") as fh:
            data = fh.read()
    except OSError as err:
        raise error(f"cannot read {what}: {err.strerror or err}", path=path) from None
    except ValueError:  # open() refuses a path with a NUL character
        raise error(f"cannot read {what}: its path holds a NUL character; pass a file path or a JSON document",
                    path=repr(str(path))) from None
    return decode(data, path, error=error)


def decode(data: bytes, path: Any, *, error: type[DataFileError] = DataFileError) -> str:
    """``data`` as UTF-8 text; DataFileError naming ``path`` and the line for binary or non-UTF-8 bytes."""
    nul = data.find(b"\0")
    if nul >= 0:
        raise error("binary data (a NUL byte); expected UTF-8 text", path=path, line=data.count(b"\n", 0, nul) + 1)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise error(f"not UTF-8 text (byte 0x{data[err.start]:02x} at offset {err.start}); save the file as UTF-8",
                    path=path, line=data.count(b"\n", 0, err.start) + 1) from None
    return text[1:] if text.startswith("\ufeff") else text


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number; write a finite number")


def parse_json(text: str, path: Any) -> Any:
    """The JSON document in ``text`` (read from ``path``), at most :data:`MAX_DEPTH` deep.

    ``NaN`` and ``Infinity`` (which Python accepts but JSON does not) are rejected.

    Raises
    ------
    DataFileError
        Naming the line of a syntax error, a bare NaN/Infinity, an integer too
        long to read, or a document nested deeper than :data:`MAX_DEPTH`.
    """
    try:
        document = json.loads(text, parse_constant=_reject_constant)
    except json.JSONDecodeError as err:
        raise DataFileError(f"invalid JSON at column {err.colno}: {err.msg}", path=path, line=err.lineno) from None
    except RecursionError:
        raise DataFileError(f"JSON nested too deeply (at most {MAX_DEPTH} levels)", path=path) from None
    except ValueError as err:  # NaN/Infinity, or an integer over Python's digit limit
        raise DataFileError(f"invalid JSON: {_first_line(err)}", path=path) from None
    check_depth(document, path)
    return document


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    if "integer string conversion" in text:
        return "an integer with too many digits (the limit is 4300)"
    return text.splitlines()[0] if text else type(err).__name__


def parse_yaml(text: str, path: Any) -> Any:
    """The YAML document in ``text`` (safe loader; needs PyYAML, the ``runtime`` extra).

    Raises
    ------
    DataFileError
        Naming the line of a syntax error (tabs in indentation included), or a
        document nested deeper than :data:`MAX_DEPTH`.
    """
    try:
        import yaml
    except ImportError:
        raise DataFileError("not JSON, and reading YAML needs PyYAML: pip install 'allocopt[runtime]'",
                            path=path) from None
    if _flow_depth(text) > MAX_DEPTH:  # PyYAML takes seconds, then recurses out, on deep [[[...
        raise DataFileError(f"YAML nested too deeply (at most {MAX_DEPTH} levels)", path=path)
    try:
        document = yaml.safe_load(text)
    except yaml.MarkedYAMLError as err:
        mark = err.problem_mark or err.context_mark
        line = mark.line + 1 if mark is not None else None
        problem = " ".join(filter(None, (err.context, err.problem))) or "syntax error"
        raise DataFileError(f"invalid YAML: {problem}", path=path, line=line) from None
    except RecursionError:
        raise DataFileError(f"YAML nested too deeply (at most {MAX_DEPTH} levels)", path=path) from None
    except (yaml.YAMLError, ValueError, OverflowError) as err:
        raise DataFileError(f"invalid YAML: {_first_line(err)}", path=path) from None
    check_depth(document, path)
    return document


_QUOTED = re.compile(r'"(?:\\.|[^"\\\n])*"|\'[^\'\n]*\'')
_BRACKETS = re.compile(r"[\[\]{}]")


def _flow_depth(text: str) -> int:
    """Deepest nesting of [ and { in ``text`` outside quoted strings (YAML's flow collections)."""
    depth = deepest = 0
    for match in _BRACKETS.finditer(_QUOTED.sub("", text)):
        depth = depth + 1 if match.group() in "[{" else max(depth - 1, 0)
        deepest = max(deepest, depth)
    return deepest


def check_depth(document: Any, path: Any, max_depth: int = MAX_DEPTH) -> None:
    """DataFileError when lists/objects in ``document`` nest deeper than ``max_depth``.

    Shared sub-objects (YAML aliases) are visited once, so an alias bomb costs
    time linear in the text.
    """
    seen: set[int] = set()
    stack: list[tuple[Any, int]] = [(document, 1)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, Mapping):
            children = list(node.keys()) + list(node.values())
        elif isinstance(node, (list, tuple)):
            children = list(node)
        else:
            continue
        if id(node) in seen:
            continue
        seen.add(id(node))
        if depth > max_depth:
            raise DataFileError(f"nested deeper than {max_depth} levels of lists and objects", path=path)
        stack.extend((child, depth + 1) for child in children)
