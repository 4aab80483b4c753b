"""Packages whose public names are imported on first use (PEP 562), so that importing a package pays only
for the modules a program uses."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping
from typing import Any


def attach(package: str, exports: Mapping[str, str], names: list[str]
           ) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``__getattr__`` and ``__dir__`` for ``package``: a name of ``exports`` (name -> module) is imported
    from its module on first access and cached in the package; ``names`` is what ``dir()`` lists."""
    namespace = sys.modules[package].__dict__

    def __getattr__(name: str) -> Any:
        if name in exports:
            value = getattr(importlib.import_module(exports[name]), name)
            namespace[name] = value
            return value
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    def __dir__() -> list[str]:
        return names

    return __getattr__, __dir__
