"""Optional dependencies (the extras in pyproject.toml): check one before the work that needs it."""

from __future__ import annotations

import importlib.util

from allocopt.errors import BackendNotInstalledError


def require_extra(module: str, extra: str, what: str) -> None:
    """Raise :class:`~allocopt.errors.BackendNotInstalledError` unless ``module`` can be imported.

    ``what`` names the feature that needs it; the message says which extra installs it
    (``pip install 'allocopt[EXTRA]'``). The check does not import the module.
    """
    if importlib.util.find_spec(module) is None:
        raise BackendNotInstalledError(f"{what} needs {module}, which is not installed: "
                                       f"pip install 'allocopt[{extra}]' (or pip install {module})")


__all__ = ["require_extra"]
