"""Table cells shared by the conformance scripts (``conformance_gavel.py``, ``conformance_sia.py``)."""

from __future__ import annotations


def cell(result: dict, key: str, width: int, digits: int = 1, missing: str = "-") -> str:
    """``result[key]`` right-aligned in ``width`` with ``digits`` decimals, or ``missing``."""
    return f"{result[key]:>{width}.{digits}f}" if key in result else f"{missing:>{width}}"


def ratio(result: dict, base: dict) -> str:
    """The average JCT of ``result`` over ``base``'s, or "-" when either is missing."""
    if "average_jct_s" not in result or "average_jct_s" not in base:
        return f"{'-':>7}"
    return f"{result['average_jct_s'] / base['average_jct_s']:>7.4f}"
