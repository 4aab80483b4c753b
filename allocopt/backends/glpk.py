"""GLPK's exact simplex (``glp_exact``, rational arithmetic with GMP) through ``swiglpk``, for LPs.

Not one of the selectable backends: water-filling solves the LPs of its small runs here
(:mod:`allocopt.formulations.water_filling`), where floating-point solvers, each within its
tolerances, end up far apart. GLPK's floating-point simplex finds a basis first; its exact
simplex then goes on from it in rational arithmetic over the model's coefficients (every double is
a rational), so the basis it ends on is optimal exactly and the values it reports are the exact
ones rounded to doubles. Its time grows with the model faster than a floating-point solver's (the
bits of the rationals), so callers keep it to small models and set a time limit.
https://www.gnu.org/software/glpk/ (glpk.pdf, ``glp_exact``)
"""

from __future__ import annotations

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

        lp = glp.glp_create_prob()
        glp.glp_set_obj_dir(lp, glp.GLP_MIN)
        m, n = model.num_rows, model.num_cols
        glp.glp_add_rows(lp, max(m, 1))  # glp_exact fails on a model without rows: a free empty row then
        glp.glp_add_cols(lp, n)
        for i, (kind, lo, hi) in enumerate(_bounds(model.row_lb, model.row_ub), 1):
            glp.glp_set_row_bnds(lp, i, kind, lo, hi)
        for j, (kind, lo, hi) in enumerate(_bounds(model.col_lb, model.col_ub), 1):
            glp.glp_set_col_bnds(lp, j, kind, lo, hi)
        for j in np.flatnonzero(model.c):
            glp.glp_set_obj_coef(lp, int(j) + 1, float(model.c[j]))
        A = sp.coo_matrix(model.A)
        if A.nnz:  # GLPK's arrays are 1-based: element 0 is unused
            rows, cols, values = glp.intArray(A.nnz + 1), glp.intArray(A.nnz + 1), glp.doubleArray(A.nnz + 1)
            # element by element (the models here are small): swiglpk 5.0's as_intArray did not hold the list here
            for k, (i, j, v) in enumerate(zip((A.row + 1).tolist(), (A.col + 1).tolist(), A.data.tolist()), 1):
                rows[k], cols[k], values[k] = i, j, v
            glp.glp_load_matrix(lp, A.nnz, rows, cols, values)
        return lp

    def run(self, handle: Any, model: CompiledModel, options: SolveOptions) -> RawResult:
        import swiglpk as glp

        lp = handle
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
            return RawResult(Status.OPTIMAL, raw_status=raw + " (optimal, exact)", x=x, row_duals=y)
        finally:
            glp.glp_delete_prob(lp)


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
