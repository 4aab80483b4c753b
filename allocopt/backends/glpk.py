"""GLPK's exact simplex (``glp_exact``, rational arithmetic with GMP) through ``swiglpk``, for LPs.

Not one of the selectable backends: water-filling solves the LPs of its small runs here
(:mod:`allocopt.formulations.water_filling`), where floating-point solvers, each within its
tolerances, end up far apart. GLPK's floating-point simplex finds a basis first; its exact
simplex then goes on from it in rational arithmetic, so the basis it ends on is optimal exactly
and the values it reports are the exact ones rounded to doubles. Its time grows with the model
faster than a floating-point solver's (the bits of the rationals), so callers keep it to small
models and set a time limit.

``glp_exact`` reads an integral double as it is but replaces any other by a nearby fraction of
small denominator, up to ``1e-9`` of it (``set_d_eps`` in GLPK's ``glpapi07.c``): 0.3333333333
becomes 1/3. That is as far from the model as a floating-point solver's tolerances, and an
ill-conditioned LP moves with it. So the model GLPK gets is scaled by powers of two (exactly)
until every coefficient and bound is an integer: each column by the least power that makes its
finite bounds integral, then each row, and the objective, by the least that makes theirs integral
(:class:`_Integral`); the answers are scaled back, again exactly.
https://www.gnu.org/software/glpk/ (glpk.pdf, ``glp_exact``)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import scipy.sparse as sp

from allocopt.backends.base import Backend, RawResult, SolveOptions
from allocopt.model import CompiledModel
from allocopt.solution import Status

FLOAT_ITERATIONS = 10  # per row and column: the most iterations of the floating-point simplex before the exact one


class GlpkExactBackend(Backend):
    """GLPK's floating-point simplex, then its exact simplex from that basis (see the module docstring)."""

    name = "glpk-exact"
    required_modules = ("swiglpk",)
    install_hint = "pip install swiglpk"
    supports_integer = False

    def build(self, model: CompiledModel, options: SolveOptions) -> Any:
        import swiglpk as glp

        integral = _Integral.of(model)
        if integral is None:
            return None
        glp.glp_term_out(glp.GLP_ON if options.verbose else glp.GLP_OFF)
        lp = glp.glp_create_prob()
        glp.glp_set_obj_dir(lp, glp.GLP_MIN)
        glp.glp_add_rows(lp, max(model.num_rows, 1))  # glp_exact fails on a model without rows: a free empty row
        glp.glp_add_cols(lp, model.num_cols)
        for i, (kind, lo, hi) in enumerate(_bounds(integral.row_lb, integral.row_ub), 1):
            glp.glp_set_row_bnds(lp, i, kind, lo, hi)
        for j, (kind, lo, hi) in enumerate(_bounds(integral.col_lb, integral.col_ub), 1):
            glp.glp_set_col_bnds(lp, j, kind, lo, hi)
        for j in np.flatnonzero(integral.c):
            glp.glp_set_obj_coef(lp, int(j) + 1, float(integral.c[j]))
        A = integral.A
        if A.nnz:  # GLPK's arrays are 1-based: element 0 is unused
            rows, cols, values = glp.intArray(A.nnz + 1), glp.intArray(A.nnz + 1), glp.doubleArray(A.nnz + 1)
            # element by element (the models here are small): swiglpk 5.0's as_intArray did not hold the list here
            for k, (i, j, v) in enumerate(zip((A.row + 1).tolist(), (A.col + 1).tolist(), A.data.tolist()), 1):
                rows[k], cols[k], values[k] = i, j, v
            glp.glp_load_matrix(lp, A.nnz, rows, cols, values)
        glp.glp_scale_prob(lp, glp.GLP_SF_AUTO)  # for the floating-point simplex only: glp_exact ignores it
        return lp, integral

    def run(self, handle: Any, model: CompiledModel, options: SolveOptions) -> RawResult:
        import swiglpk as glp

        if handle is None:
            return RawResult(Status.ERROR, raw_status="the model's values span too many powers of two to be "
                                                      "made integral in doubles")
        lp, integral = handle
        try:
            parm = glp.glp_smcp()
            glp.glp_init_smcp(parm)
            parm.msg_lev = glp.GLP_MSG_ALL if options.verbose else glp.GLP_MSG_OFF
            if options.time_limit_s is not None:
                parm.tm_lim = max(1, int(1000 * options.time_limit_s))
            glp.glp_term_out(glp.GLP_ON if options.verbose else glp.GLP_OFF)
            glp.glp_adv_basis(lp, 0)
            # a starting basis; its status does not matter. Its iterations are limited: on an ill-conditioned
            # level LP of water-filling (50 jobs x 4 types, coefficients 7e-5..1e6) it never ended, where
            # the exact simplex took 0.02 s from the advanced basis
            parm.it_lim = FLOAT_ITERATIONS * (model.num_rows + model.num_cols)
            glp.glp_simplex(lp, parm)
            parm.it_lim = 2**31 - 1
            code = glp.glp_exact(lp, parm)
            status = glp.glp_get_status(lp)
            raw = f"glp_exact returned {code}, status {status}"
            if code == glp.GLP_ETMLIM:
                return RawResult(Status.TIME_LIMIT, raw_status=raw + " (time limit)")
            if code != 0:
                return RawResult(Status.ERROR, raw_status=raw)
            if status == glp.GLP_NOFEAS:
                return RawResult(Status.INFEASIBLE, raw_status=raw + " (infeasible)")
            if status == glp.GLP_UNBND:
                return RawResult(Status.UNBOUNDED, raw_status=raw + " (unbounded)")
            if status != glp.GLP_OPT:
                return RawResult(Status.ERROR, raw_status=raw)
            x = np.fromiter((glp.glp_get_col_prim(lp, j) for j in range(1, model.num_cols + 1)), float,
                            model.num_cols)
            y = np.fromiter((glp.glp_get_row_dual(lp, i) for i in range(1, model.num_rows + 1)), float,
                            model.num_rows)
            x, y = integral.unscaled(x, y)
            return RawResult(Status.OPTIMAL, raw_status=raw + " (optimal, exact)", x=x, row_duals=y)
        finally:
            glp.glp_delete_prob(lp)


@dataclass(frozen=True)
class _Integral:
    """A model scaled by powers of two until every value is an integer: column ``j`` by ``2**col_exp[j]``
    (its bounds integral), then row ``i`` by ``2**row_exp[i]`` and the objective by ``2**obj_exp`` (their
    coefficients and bounds integral). Exact: only exponents change."""

    A: sp.coo_matrix
    row_lb: np.ndarray
    row_ub: np.ndarray
    col_lb: np.ndarray
    col_ub: np.ndarray
    c: np.ndarray
    col_exp: np.ndarray
    row_exp: np.ndarray
    obj_exp: int

    @classmethod
    def of(cls, model: CompiledModel) -> _Integral | None:
        """``model`` made integral; None where a value would overflow (or underflow)."""
        A = sp.coo_matrix(model.A)
        col_exp = np.maximum(_needed(model.col_lb), _needed(model.col_ub)).clip(min=0)
        row_exp = np.maximum(_needed(model.row_lb), _needed(model.row_ub))
        np.maximum.at(row_exp, A.row, _needed(np.ldexp(A.data, -col_exp[A.col])))
        row_exp = row_exp.clip(min=0)
        obj_exp = int(max(_needed(np.ldexp(model.c, -col_exp)).max(initial=0), 0))
        with np.errstate(over="ignore"):  # an overflow is found below
            data = np.ldexp(A.data, row_exp[A.row] - col_exp[A.col])
            scaled = cls(sp.coo_matrix((data, (A.row, A.col)), shape=A.shape),
                         np.ldexp(model.row_lb, row_exp), np.ldexp(model.row_ub, row_exp),
                         np.ldexp(model.col_lb, col_exp), np.ldexp(model.col_ub, col_exp),
                         np.ldexp(model.c, obj_exp - col_exp), col_exp, row_exp, obj_exp)
        pairs = ((scaled.A.data, A.data), (scaled.row_lb, model.row_lb), (scaled.row_ub, model.row_ub),
                 (scaled.col_lb, model.col_lb), (scaled.col_ub, model.col_ub), (scaled.c, model.c))
        kept = all(np.array_equal(np.isinf(a), np.isinf(b)) and np.array_equal(a == 0, b == 0) for a, b in pairs)
        return scaled if kept else None

    def unscaled(self, x: np.ndarray, row_duals: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The scaled model's column values and row duals in the model's own units."""
        return np.ldexp(x, -self.col_exp), np.ldexp(row_duals, self.row_exp - self.obj_exp)


def _needed(values: np.ndarray) -> np.ndarray:
    """Per value, a ``k`` with ``value * 2**k`` an integer (not always the least): a double is ``m 2**e``
    with ``0.5 <= |m| < 1`` and ``m 2**53`` an integer. Zero and infinite values need none."""
    _, exponent = np.frexp(np.where(np.isfinite(values), values, 0.0))
    return np.where(np.isfinite(values) & (values != 0), 53 - exponent, np.iinfo(np.int64).min // 2).astype(np.int64)


def _bounds(lo: np.ndarray, hi: np.ndarray) -> list[tuple[int, float, float]]:
    """GLPK's (type, lower, upper) of each pair of bounds."""
    import swiglpk as glp

    out = []
    for a, b in zip(lo.tolist(), hi.tolist()):
        if a == b:
            out.append((glp.GLP_FX, a, b))
        elif a == -np.inf:
            out.append((glp.GLP_FR, 0.0, 0.0) if b == np.inf else (glp.GLP_UP, 0.0, b))
        else:
            out.append((glp.GLP_LO, a, 0.0) if b == np.inf else (glp.GLP_DB, a, b))
    return out
