"""HiGHS through highspy: the embedded default backend.

The whole model goes to HiGHS in one ``passModel`` call straight from the CSR
arrays (no copy per element). https://ergo-code.github.io/HiGHS/
"""

from __future__ import annotations

import os
import threading
from contextlib import contextmanager
from collections.abc import Callable
from typing import Any

import numpy as np

from allocopt.backends.base import Backend, RawResult, SolveOptions
from allocopt.errors import InvalidOptionError, SolverError
from allocopt.model import CompiledModel
from allocopt.solution import Basis, BasisStatus, Status

_STATUS_NAMES = {
    "kOptimal": Status.OPTIMAL,
    "kInfeasible": Status.INFEASIBLE,
    "kUnbounded": Status.UNBOUNDED,
    "kUnboundedOrInfeasible": Status.INFEASIBLE_OR_UNBOUNDED,
    "kTimeLimit": Status.TIME_LIMIT,
    "kIterationLimit": Status.TIME_LIMIT,
    "kSolutionLimit": Status.TIME_LIMIT,
    "kInterrupt": Status.TIME_LIMIT,
}


# HiGHS's default dual simplex is slow on the large, degenerate allocation LPs: its
# interior-point solver (with crossover, so vertex solutions and duals are unchanged)
# was 2x faster at 8,192 columns and over 14x at 131,072 (max-min fairness, 8 GPU
# types, 2 cores). solver_options={"solver": ...} overrides this.
IPM_MIN_COLUMNS = 5_000


class _Scheduler:
    """HiGHS's thread scheduler is process-wide and fixed by the first ``run``: a
    later run that asks for another ``threads`` value fails ("Not Set"). Runs that
    want the current size share it; a run that wants another size waits until no
    run is active, then rebuilds the scheduler (``resetGlobalScheduler``). A rebuild
    leaves every other thread that ran HiGHS before it failing ("Not Set") until that
    thread calls ``resetGlobalScheduler`` itself: each does so once, before its next run."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._threads: int | None = None  # the size the scheduler was built with; None before the first run
        self._active = 0
        self._generation = 0  # rebuilds for a new size so far
        self._local = threading.local()  # .generation: the rebuild this thread last ran under

    @contextmanager
    def size(self, threads: int):
        import highspy

        with self._cond:
            def stale() -> bool:
                return getattr(self._local, "generation", self._generation) != self._generation

            while (self._threads not in (None, threads) or stale()) and self._active:
                self._cond.wait()
            if self._threads not in (None, threads):
                highspy.Highs.resetGlobalScheduler(True)
                self._generation += 1
            elif stale():
                highspy.Highs.resetGlobalScheduler(True)
            self._local.generation = self._generation
            self._threads = threads
            self._active += 1
        try:
            yield
        finally:
            with self._cond:
                self._active -= 1
                self._cond.notify_all()


_SCHEDULER = _Scheduler()
_BANNER_LOCK = threading.Lock()
_banner_shown = False


def new_highs(verbose: bool = False) -> Any:
    """A ``highspy.Highs``; the first one of a process is made with file descriptor 1
    pointed at /dev/null unless ``verbose``, because HiGHS >= 1.16 writes its
    copyright banner to stdout from the constructor, before any option can be set."""
    import highspy

    global _banner_shown
    with _BANNER_LOCK:
        if _banner_shown or verbose:
            _banner_shown = True
            return highspy.Highs()
        _banner_shown = True
        saved = os.dup(1)
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            try:
                os.dup2(devnull, 1)
                return highspy.Highs()
            finally:
                os.dup2(saved, 1)
                os.close(devnull)
        finally:
            os.close(saved)


def run_highs(h: Any, threads: int = 0) -> Any:
    """``h.run()`` on a scheduler of ``threads`` threads (0: HiGHS's default); returns its status."""
    with _SCHEDULER.size(threads):
        return h.run()


@contextmanager
def highspy_guard(threads: int = 0, verbose: bool = False):
    """For code that drives highspy itself (cvxpy's HIGHS interface): the banner
    kept off stdout and the shared scheduler sized to ``threads`` while inside."""
    new_highs(verbose)
    with _SCHEDULER.size(threads):
        yield


def _basis_codes() -> np.ndarray:
    """``HighsBasisStatus`` members indexed by their code (an object array, for gathering)."""
    import highspy

    return np.array(sorted(highspy.HighsBasisStatus.__members__.values(), key=int), dtype=object)


def _final_basis(h: Any, model: CompiledModel, x: np.ndarray, sol: Any, info: Any) -> Callable[[], Basis | None]:
    """A reader of the optimal basis of the LP ``h`` solved (None when HiGHS has none to give).

    ``getBasis().col_status`` hands the statuses over as a list of enum objects, one Python
    object per column (13 ms at 16,000 columns); ``getBasicVariables`` gives the basic set as an
    int array, and a nonbasic column or row sits at the bound its value is at."""
    import highspy

    def basis_from(basic: np.ndarray | None) -> Basis | None:
        if basic is None:
            return None
        cols = _at_bound(x, model.col_lb, model.col_ub)
        rows = _at_bound(np.asarray(sol.row_value, dtype=np.float64), model.row_lb, model.row_ub)
        cols[basic[basic >= 0]] = BasisStatus.BASIC
        rows[-1 - basic[basic < 0]] = BasisStatus.BASIC
        return Basis(cols, rows)

    def basic_variables() -> np.ndarray | None:
        status, basic = h.getBasicVariables()
        return basic if status == highspy.HighsStatus.kOk and basic.shape == (model.num_rows,) else None

    # getBasicVariables reads the simplex solver's own data, which is this LP's when the simplex solved
    # it as given (no presolve, no interior point: every warm start): 0.2 ms. After an interior-point
    # solve whose crossover needed no simplex it read data HiGHS never set up (a segmentation fault in
    # highspy 1.16): there HiGHS's basis is handed back first, which it factorizes (5 ms at 2,049 x 8,
    # against 100s of ms for the solve). After a presolved simplex solve (small LPs) the statuses are
    # read from a copy of the basis when a warm start asks for them: no solver is kept alive.
    fast = hasattr(h, "getBasicVariables")  # (not in highspy 1.8: the statuses come from the copy there)
    if fast and (info.ipm_iteration_count == 0 and info.pdlp_iteration_count == 0
                 and h.getModelPresolveStatus() == highspy.HighsPresolveStatus.kNotPresolved):
        basic = basic_variables()
        return lambda: basis_from(basic)
    if fast and info.ipm_iteration_count > 0 and h.setBasis(h.getBasis()) == highspy.HighsStatus.kOk:
        basic = basic_variables()
        return lambda: basis_from(basic)
    copy = h.getBasis()
    return lambda: Basis(np.array([s.value for s in copy.col_status], dtype=np.int8),
                         np.array([s.value for s in copy.row_status], dtype=np.int8))


def _at_bound(value: np.ndarray, lb: np.ndarray, ub: np.ndarray) -> np.ndarray:
    """The nonbasic status of each value: at its lower bound, or its upper when nearer (or the
    only finite one), or free at zero."""
    upper = np.isfinite(ub) & (~np.isfinite(lb) | (ub - value < value - lb))
    return np.where(upper, BasisStatus.UPPER,
                    np.where(np.isfinite(lb), BasisStatus.LOWER, BasisStatus.ZERO)).astype(np.int8)


class HighsBackend(Backend):
    """HiGHS through highspy (see the module docstring)."""
    name = "highs"
    required_modules = ("highspy",)
    install_hint = "pip install highspy"
    supports_warm_start = True

    def build(self, model: CompiledModel, options: SolveOptions) -> Any:
        import highspy

        h = new_highs(options.verbose)
        h.setOptionValue("output_flag", bool(options.verbose))
        settings: dict[str, Any] = {}
        if options.time_limit_s is not None:
            settings["time_limit"] = float(options.time_limit_s)
        if options.mip_gap is not None:
            settings["mip_rel_gap"] = float(options.mip_gap)
        if options.threads is not None:
            settings["threads"] = int(options.threads)
        if not model.is_mip and model.num_cols >= IPM_MIN_COLUMNS:
            settings["solver"] = "ipm"
        settings.update(options.solver_options)
        for key, value in settings.items():
            if h.setOptionValue(key, value) != highspy.HighsStatus.kOk:
                raise InvalidOptionError(f"HiGHS rejected option {key}={value!r}; see "
                                         "https://ergo-code.github.io/HiGHS/dev/options/definitions/")
        # The array overload of passModel reads the numpy buffers directly; filling a
        # HighsLp's attributes converts them element by element (3x slower at 10^5 columns).
        status = h.passModel(
            model.num_cols, model.num_rows, model.matrix.nnz, int(highspy.MatrixFormat.kRowwise),
            int(highspy.ObjSense.kMinimize), model.offset, model.c, model.col_lb, model.col_ub,
            model.row_lb, model.row_ub, model.matrix.indptr.astype(np.int32),
            model.matrix.indices.astype(np.int32), model.matrix.data, model.integrality.astype(np.int32))  # 1 = HighsVarType.kInteger
        if status == highspy.HighsStatus.kError:
            raise SolverError("HiGHS rejected the model (passModel returned an error); "
                              "check for NaN coefficients or inconsistent bounds")
        return h

    def set_basis(self, handle: Any, model: CompiledModel, basis: Basis, options: SolveOptions) -> None:
        import highspy

        codes = _basis_codes()
        hb = highspy.HighsBasis()
        # HighsBasis takes only lists of its enum: gathered from a table, not converted one by one
        hb.col_status = codes[basis.col_status].tolist()
        hb.row_status = codes[basis.row_status].tolist()
        hb.valid = True
        # repair_basis made the count right; a singular basis is repaired by HiGHS's factorization
        # in run. An "alien" basis would be factorized here once more (7 ms at 2,049 x 8).
        hb.alien = False
        if handle.setBasis(hb) != highspy.HighsStatus.kOk:
            raise SolverError("HiGHS rejected the warm-start basis; solve without warm_start")
        # A basis is only used by the simplex solver. Devex pricing, because the exact dual
        # steepest-edge weights HiGHS computes for a non-slack start cost one solve per row
        # (2,049 jobs x 8 types: 76 ms against 13 ms for the whole warm re-solve).
        for key, value in (("solver", "simplex"), ("simplex_dual_edge_weight_strategy", 1)):
            if key not in options.solver_options:
                handle.setOptionValue(key, value)

    def run(self, handle: Any, model: CompiledModel, options: SolveOptions) -> RawResult:
        import highspy

        h = handle
        threads = int(options.solver_options.get("threads", options.threads or 0))
        run_status = run_highs(h, threads)
        fallback = ""
        if (not model.is_mip and h.getModelStatus() == highspy.HighsModelStatus.kUnknown
                and str(options.solver_options.get("run_crossover", "")).lower() == "off"):
            # HiGHS before 1.10 ends some interior-point solves without crossover "Unknown" with a point
            # short of its tolerances; crossover turns it into an optimal vertex
            h.setOptionValue("run_crossover", "on")
            run_status = run_highs(h, threads)
            fallback = "; interior point without crossover ended Unknown, solved again with crossover"
        if run_status == highspy.HighsStatus.kError and h.getModelStatus() not in (
                highspy.HighsModelStatus.kInfeasible, highspy.HighsModelStatus.kUnbounded):
            raise SolverError(f"HiGHS failed: {h.modelStatusToString(h.getModelStatus())}")
        model_status = h.getModelStatus()
        native = model_status.name
        status = _STATUS_NAMES.get(native, Status.ERROR)
        info = h.getInfo()
        result = RawResult(status=status, raw_status=f"{native} ({h.modelStatusToString(model_status)}){fallback}")
        if info.primal_solution_status == 2 or status is Status.OPTIMAL:  # 2 = kSolutionStatusFeasible
            sol = h.getSolution()
            result.x = np.asarray(sol.col_value, dtype=np.float64)
            if not model.is_mip and sol.dual_valid:
                result.row_duals = np.asarray(sol.row_dual, dtype=np.float64)
        if model.is_mip and result.x is not None:
            result.mip_gap = float(info.mip_gap)
        if not model.is_mip:
            result.simplex_iterations = int(info.simplex_iteration_count)
            if info.basis_validity == 1 and result.x is not None:  # kBasisValidityValid
                result.basis = _final_basis(h, model, result.x, sol, info)
        return result
