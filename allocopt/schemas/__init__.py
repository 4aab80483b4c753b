"""JSON Schemas (draft 2020-12) of allocopt's language-neutral documents.

``problem``: the input of ``allocopt solve`` and ``POST /solve``
(:meth:`allocopt.Problem.to_json`); ``allocation``: their output
(:meth:`allocopt.Allocation.to_json`); ``round_plan``: one round of the
mechanism (:class:`allocopt.runtime.executor.RoundPlan`'s fields);
``engine_state``: what :meth:`allocopt.Engine.save` writes;
``goodput_engine_state``: what :meth:`allocopt.runtime.elastic.GoodputEngine.to_json`
writes (elastic jobs under a goodput policy). Schemas refer to
each other by relative ``$ref`` (``problem.schema.json#/$defs/job``), resolved
against their ``$id``s under https://allocopt.dev/schemas/.
"""

from __future__ import annotations

import json
from importlib import resources
from typing import Any

from allocopt.errors import InvalidOptionError

SCHEMAS = ("problem", "allocation", "round_plan", "engine_state", "goodput_engine_state")


def load_schema(name: str) -> dict[str, Any]:
    """The JSON Schema called ``name`` (one of :data:`SCHEMAS`) as a dict."""
    if name not in SCHEMAS:
        raise InvalidOptionError(f"unknown schema {name!r}; choose one of {', '.join(SCHEMAS)}")
    return json.loads(resources.files(__name__).joinpath(f"{name}.schema.json").read_text(encoding="utf-8"))
