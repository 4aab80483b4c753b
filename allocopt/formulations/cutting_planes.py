"""Box-step cutting planes: minimize a convex function of ``k`` nonnegative prices from its values and subgradients.

Both price searches use it: price decomposition's (max-min fairness, prices of GPU
time) and the Sia MILP's (Lagrangian bound, prices of GPUs). Each step minimizes the
cutting-plane model ``max_l f(x_l) + g_l . (x - x_l)`` inside a box of half-width
``delta`` around the best point (one small HiGHS LP in ``k + 1`` variables, cuts
added as rows); a step that achieves a tenth of the predicted decrease moves the
center (and doubles the box when it achieved half on the box's edge), a null step
halves the box.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np


class CuttingPlaneModel:
    """``min z`` over ``(x, z)`` with ``x >= 0`` (``x <= upper`` where given) and one row per cut; the LP of
    each box step. ``add_row`` adds a linear row of ``x`` (for example a budget ``sum x <= B``)."""

    def __init__(self, k: int, upper: np.ndarray | None = None):
        from allocopt.backends.highs import new_highs

        self.k = k
        self.highs = h = new_highs()
        h.setOptionValue("output_flag", False)
        h.addVars(k + 1, np.zeros(k + 1), np.r_[np.full(k, np.inf) if upper is None else upper, np.inf])
        h.changeColBounds(k, -np.inf, np.inf)
        h.changeColCost(k, 1.0)
        self._idx = np.arange(k + 1, dtype=np.int32)
        self._rows = 0

    def add_row(self, lower: float, upper: float, coefficients: np.ndarray) -> int:
        """A row ``lower <= coefficients . x <= upper``; its index (for :meth:`set_row_bounds`)."""
        self.highs.addRow(lower, upper, self.k, self._idx[:self.k], np.asarray(coefficients, dtype=np.float64))
        self._rows += 1
        return self._rows - 1

    def set_row_bounds(self, row: int, lower: float, upper: float) -> None:
        self.highs.changeRowBounds(row, lower, upper)

    def add_cut(self, x: np.ndarray, value: float, subgradient: np.ndarray) -> None:
        """``z >= value + subgradient . (x' - x)``."""
        self.highs.addRow(value - subgradient @ x, np.inf, self.k + 1, self._idx, np.r_[-subgradient, 1.0])
        self._rows += 1

    def minimize(self, lo: np.ndarray, hi: np.ndarray) -> tuple[np.ndarray, float]:
        """The model's minimizer inside the box ``lo <= x <= hi`` and its predicted value."""
        from allocopt.backends.highs import run_highs

        self.highs.changeColsBounds(self.k, self._idx[:self.k], lo, hi)
        run_highs(self.highs)
        solution = np.asarray(self.highs.getSolution().col_value)
        return solution[:self.k], float(solution[self.k])


@dataclass
class BoxStepResult:
    center: np.ndarray  # the best point found
    best: float  # f there (an upper bound on the minimum)
    lower: float  # the largest model minimum seen with the box inactive (a lower bound; -inf if none)
    evaluations: int  # calls of f


def box_step_minimize(evaluate: Callable[[np.ndarray], tuple[float, np.ndarray]], model: CuttingPlaneModel,
                      center: np.ndarray, delta: float, *, rtol: float, atol: float = 0.0, max_evaluations: int,
                      grow_when_flat_on_box: bool = False) -> BoxStepResult:
    """Minimize ``evaluate(x) -> (f(x), subgradient)`` from ``center`` with a first box half-width ``delta``.

    Stops when the model predicts a decrease below ``rtol * |best| + atol`` inside the box — or, with
    ``grow_when_flat_on_box``, only once the box is inactive there (the box doubles instead) — or after
    ``max_evaluations`` calls of ``evaluate``.
    """
    def cut(x: np.ndarray) -> float:
        value, subgradient = evaluate(x)
        model.add_cut(x, value, subgradient)
        return value

    center = np.asarray(center, dtype=np.float64)
    best, lower, evaluations = cut(center), -np.inf, 1
    while evaluations < max_evaluations:
        lo, hi = np.maximum(center - delta, 0.0), center + delta
        x, predicted = model.minimize(lo, hi)
        eps = 1e-12 * delta
        on_box = bool(np.any(x >= hi - eps) or np.any((x <= lo + eps) & (lo > 0)))
        if not on_box:
            lower = max(lower, predicted)  # the model's global minimum: below f's
        if best - predicted <= rtol * abs(best) + atol:
            if not (grow_when_flat_on_box and on_box):
                break
            delta *= 2.0
            continue
        value = cut(x)
        evaluations += 1
        if value <= best - 0.1 * (best - predicted):
            if value <= best - 0.5 * (best - predicted) and on_box:
                delta *= 2.0
            center, best = x, value
        else:
            delta *= 0.5
    return BoxStepResult(center, best, lower, evaluations)
