"""One convention for JSON files: ``from_json(source)`` and ``to_json(path=None)``.

Every class with a JSON form (:class:`~allocopt.Problem`,
:class:`~allocopt.Allocation`, :class:`~allocopt.GoodputProblem`,
:class:`~allocopt.Engine`, :class:`~allocopt.throughput.ThroughputTable`,
:class:`~allocopt.mechanism.SimulationResult`) follows it:

- ``to_json()`` returns the document (JSON-ready dicts and lists);
  ``to_json(path)`` writes it to ``path`` (atomically) and returns None.
- ``from_json(source)`` takes the document itself (a dict or list, as
  ``to_json()`` returns it) or a path (``str`` or ``os.PathLike``) to a JSON
  file holding it. ``Allocation.from_json(source, problem)`` also takes the
  problem the allocation was solved for (its document holds only the fractions).
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from allocopt.documents import parse_json, read_text
from allocopt.errors import InvalidProblemError

#: What ``from_json`` accepts: a document, or the path of a JSON file.
JsonSource = Any


def is_path(source: Any) -> bool:
    """True for a file path (``str`` or ``os.PathLike``), False for a document."""
    return isinstance(source, (str, os.PathLike))


def read_json(source: JsonSource, *, what: str) -> Any:
    """The document ``source`` is, or the one in the JSON file at path ``source``.

    Raises
    ------
    DataFileError
        A path that cannot be read or holds invalid JSON (naming the line).
    InvalidProblemError
        ``source`` is neither a document (mapping or list) nor a path.
    """
    if not is_path(source):
        if isinstance(source, (Mapping, Sequence)) and not isinstance(source, (bytes, bytearray)):
            return source
        raise InvalidProblemError(f"{what}: expected a JSON document (dict or list) or the path of a JSON file, "
                                  f"got {type(source).__name__}", field="document")
    return parse_json(read_text(source, what=f"the {what} file"), source)


def write_json(document: Any, path: str | os.PathLike[str], *, indent: int | None = 1) -> None:
    """Write ``document`` to ``path`` as JSON, atomically (a reader never sees a partial file)."""
    text = json.dumps(document, indent=indent) + "\n"
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    try:
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def document_or_write(document: Any, path: str | os.PathLike[str] | None) -> Any:
    """``document`` when ``path`` is None; else write it there and return None (``to_json``'s convention)."""
    if path is None:
        return document
    write_json(document, path)
    return None


__all__ = ["JsonSource", "document_or_write", "is_path", "read_json", "write_json"]
