"""Properties over random problems (Hypothesis), for every policy x backend that supports it.

Problems come in two families: *moderate* (throughputs 0.1..10 steps/s, weights
0.5..4) and *wide* (the edges of the supported numeric range: each job's scale
log-uniform over 1e-3..1e6 steps/s and its types up to 1e6 times slower, so
throughputs span 1e-9..1e6; 20% zeros; weights 1e-3..1e3), both with mixed scale
factors and optionally entities with fairness and fifo policies. Checked:

* every policy solves on every backend, the answer passes allocopt's own check
  (:mod:`allocopt.verify`) and the base constraints;
* backends agree with HiGHS on the objective (and water-filling on every level), water-filling
  twice: as it runs by default (small runs solve their LPs exactly, whatever the backend) and with
  ``exact=False`` (``water_filling/float``: every LP on the backend);
* on small moderate problems, the answer agrees with a dense formulation written
  here from the definitions (``scipy.optimize.linprog``, one LP per job and
  level for water-filling), not with the models the package builds; water-filling's
  exact levels, on both families, with the lexicographic max-min vector computed
  here with every LP in rational arithmetic (GLPK's exact simplex);
* adding a GPU never lowers the max-min level; water-filling's first level is
  max-min fairness's objective, every job gets at least its max-min share, and
  its sorted levels are lexicographically at least max-min's.

Runs derandomized and without an example database, so CI is reproducible;
``benchmarks/property_suite.py`` runs the same checks over thousands of problems.
"""

from __future__ import annotations

import importlib.metadata

import numpy as np
import pytest
from conftest import ALL_BACKENDS, assert_feasible
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from scipy.optimize import linprog

import allocopt
from allocopt import Cluster, Problem
from allocopt.errors import InvalidProblemError, LicenseError
from allocopt.formulations.water_filling import GIVE_WAY, RISE

PROPERTY = settings(max_examples=20, deadline=None, derandomize=True, database=None, print_blob=True,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])

#: policy -> options, and whether every backend solves it in a few LPs
POLICIES = {
    "max_min_fairness": {},
    "max_min_fairness/plain": {"heterogeneity_aware": False},
    "max_throughput": {},
    "water_filling": {},  # small problems: exact levels (GLPK's exact simplex), whatever the backend
    "water_filling/float": {"exact": False},  # every LP on the backend
    "min_makespan": {},
    "finish_time_fairness": {},
}
#: relative agreement with HiGHS: CBC (through PuLP) holds tolerances of 1e-7 outside water-filling
AGREEMENT = {"highs": 1e-6, "scipy": 1e-6, "cvxpy": 1e-6, "gurobi": 1e-6, "pulp": 1e-4}


# ----- problems --------------------------------------------------------------------------------
def make_problem(seed: int, n_jobs: int, n_types: int, wide: bool, entities: bool
                 ) -> tuple[Problem, dict[str, str] | None]:
    """A seeded random problem (see the module docstring) and its water-filling entity policies."""
    rng = np.random.default_rng(seed)
    capacity = rng.integers(1, 9, n_types)
    capacity[0] = 8  # every job fits on type 0
    if wide:  # every job its own scale in 1e-3..1e6, its types up to 1e6 slower than that
        T = np.exp(rng.uniform(np.log(1e-3), np.log(1e6), (n_jobs, 1)) - rng.uniform(0, np.log(1e6), (n_jobs, n_types)))
    else:
        T = rng.uniform(0.1, 10.0, (n_jobs, n_types))
    T[:, 1:][rng.random((n_jobs, n_types - 1)) < 0.2] = 0.0
    w_lo, w_hi = (1e-3, 1e3) if wide else (0.5, 4.0)
    kwargs = dict(scale_factors=rng.choice([1, 1, 2, 4, 8], n_jobs),
                  priority_weights=np.exp(rng.uniform(np.log(w_lo), np.log(w_hi), n_jobs)),
                  num_steps_remaining=rng.uniform(1e3, 1e5, n_jobs),
                  time_since_start=rng.uniform(0.0, 1e4, n_jobs))
    policies = None
    if entities:
        labels = [f"e{v}" for v in rng.integers(0, 3, n_jobs)]
        names = sorted(set(labels))
        kwargs.update(entities=labels,
                      entity_weights={e: float(np.exp(rng.uniform(np.log(w_lo), np.log(w_hi)))) for e in names})
        policies = {e: str(rng.choice(["fairness", "fifo"])) for e in names}
    cluster = Cluster({f"t{j}": int(c) for j, c in enumerate(capacity)})
    return Problem(T, cluster, **kwargs), policies


def solve(problem: Problem, policy: str, backend: str, entity_policies: dict | None) -> allocopt.Allocation:
    """``policy`` (a key of POLICIES) on ``backend``; skips where Gurobi's license cannot take the model."""
    name, options = policy.split("/")[0], dict(POLICIES[policy])
    if name == "water_filling":
        options["entity_policies"] = entity_policies
    try:
        return allocopt.solve(problem, name, backend=backend, **options)
    except LicenseError as err:
        pytest.skip(f"gurobi: {err}")


def normalized(alloc: allocopt.Allocation, heterogeneity_aware: bool = True) -> np.ndarray:
    """``n_i = s_i e_i / p_i`` (or ``s_i`` times the time share)."""
    share = alloc.normalized_throughput if heterogeneity_aware else alloc.time_fraction
    return share * alloc.problem.scale_factors


# ----- an independent dense formulation --------------------------------------------------------
def rates(problem: Problem, heterogeneity_aware: bool = True) -> np.ndarray:
    """``a_ij``: job i's normalized throughput per unit of time on type j (0 where it does not fit)."""
    T, cap = problem.throughputs, problem.capacity.astype(float)
    s = problem.scale_factors.astype(float)
    fits = (T > 0) & (s[:, None] <= cap[None, :])
    if not heterogeneity_aware:
        return np.where(fits, s[:, None], 0.0)
    p = T @ cap / cap.sum()
    return np.where(fits, s[:, None] * T / p[:, None], 0.0)


class Dense:
    """Columns ``X`` (row-major, n x k) then one extra column; base rows as dense ``A_ub x <= b_ub``."""

    def __init__(self, problem: Problem, a: np.ndarray):
        n, k = a.shape
        self.n, self.k, self.a = n, k, a
        rows = [np.kron(np.eye(n)[i], np.ones(k)) for i in range(n)]
        rows += [np.kron(problem.scale_factors.astype(float), np.eye(k)[j]) for j in range(k)]
        self.A = np.hstack([np.array(rows), np.zeros((n + k, 1))])
        self.b = np.concatenate([np.ones(n), problem.capacity.astype(float)])
        self.bounds = [(0, None) if a[i, j] > 0 else (0, 0) for i in range(n) for j in range(k)]

    def n_row(self, i: int, t: float = 0.0) -> np.ndarray:
        """``-n_i + t * extra`` as a row."""
        row = np.zeros(self.n * self.k + 1)
        row[i * self.k:(i + 1) * self.k] = -self.a[i]
        row[-1] = t
        return row

    def solve(self, c: np.ndarray, rows: list[np.ndarray], rhs: list[float], extra=(None, None)) -> float:
        """min c x over the base rows, ``rows x <= rhs``, the columns' bounds and ``extra``'s; returns -min."""
        res = linprog(c, A_ub=np.vstack([self.A, *rows]), b_ub=np.concatenate([self.b, rhs]),
                      bounds=self.bounds + [extra], method="highs",
                      options={"primal_feasibility_tolerance": 1e-10, "dual_feasibility_tolerance": 1e-10})
        assert res.status == 0, res.message
        return -res.fun


class ExactDense(Dense):
    """:class:`Dense` with each LP solved in rational arithmetic (GLPK's ``glp_exact``, through
    ``swiglpk``). ``glp_exact`` replaces a non-integral double by a nearby small fraction, so each row and
    the objective are first multiplied by a power of two that makes all their values integers."""

    def solve(self, c: np.ndarray, rows: list[np.ndarray], rhs: list[float], extra=(None, None)) -> float:
        import swiglpk as glp

        A, b = np.vstack([self.A, *rows]), np.concatenate([self.b, rhs])

        def exponent(values: np.ndarray) -> np.ndarray:  # m 2^e, 0.5 <= |m| < 1: m 2^53 is an integer
            return np.where(values != 0, 53 - np.frexp(values)[1], 0)

        row_exp = np.maximum(exponent(A).max(axis=1), exponent(b)).clip(min=0)
        obj_exp = int(exponent(c).max().clip(min=0))
        A, b, c = np.ldexp(A, row_exp[:, None]), np.ldexp(b, row_exp), np.ldexp(c, obj_exp)
        assert all(np.all(v == np.floor(v)) for v in (A, b, c))
        lp = glp.glp_create_prob()
        try:
            glp.glp_term_out(glp.GLP_OFF)
            m, n = A.shape
            glp.glp_add_rows(lp, m)
            glp.glp_add_cols(lp, n)
            for i in range(m):
                glp.glp_set_row_bnds(lp, i + 1, glp.GLP_UP, 0.0, float(b[i]))
            for j, (lo, hi) in enumerate([*self.bounds, extra]):
                kind = (glp.GLP_FR if lo is None and hi is None else glp.GLP_LO if hi is None
                        else glp.GLP_FX if lo == hi else glp.GLP_DB)
                glp.glp_set_col_bnds(lp, j + 1, kind, float(lo or 0), float(hi or 0))
                glp.glp_set_obj_coef(lp, j + 1, float(c[j]))
            rows_, cols_ = np.nonzero(A)
            ia, ja, ar = glp.intArray(rows_.size + 1), glp.intArray(rows_.size + 1), glp.doubleArray(rows_.size + 1)
            for k, (i, j) in enumerate(zip(rows_.tolist(), cols_.tolist()), 1):
                ia[k], ja[k], ar[k] = i + 1, j + 1, float(A[i, j])
            glp.glp_load_matrix(lp, rows_.size, ia, ja, ar)
            parm = glp.glp_smcp()
            glp.glp_init_smcp(parm)
            parm.msg_lev = glp.GLP_MSG_OFF
            glp.glp_adv_basis(lp, 0)
            assert glp.glp_exact(lp, parm) == 0 and glp.glp_get_status(lp) == glp.GLP_OPT
            return -glp.glp_get_obj_val(lp) / 2.0**obj_exp
        finally:
            glp.glp_delete_prob(lp)


def dense_max_min(problem: Problem, heterogeneity_aware: bool = True) -> float:
    """max t s.t. n_i >= w_i t."""
    lp = Dense(problem, rates(problem, heterogeneity_aware))
    c = np.zeros(lp.n * lp.k + 1)
    c[-1] = -1.0
    return lp.solve(c, [lp.n_row(i, w) for i, w in enumerate(problem.priority_weights)], [0.0] * lp.n)


def dense_max_throughput(problem: Problem) -> float:
    """max sum_ij T_ij X_ij."""
    lp = Dense(problem, rates(problem))
    c = np.concatenate([-(problem.throughputs * (lp.a > 0)).ravel(), [0.0]])
    return lp.solve(c, [], [], (0, 0))


def floor_of(level: np.ndarray) -> np.ndarray:
    """What a frozen level holds in later levels: ``(1 - GIVE_WAY) L`` rounded down to 24 significant bits."""
    given = (1.0 - GIVE_WAY) * level
    single = given.astype(np.float32)
    return np.where(single > given, np.nextafter(single, np.float32(0)), single).astype(np.float64)


def dense_water_filling(problem: Problem, entity_policies: dict | None, exact: bool = False,
                        heterogeneity_aware: bool = True) -> np.ndarray:
    """Levels ``n_i`` by progressive filling with water-filling's give (see
    :mod:`allocopt.formulations.water_filling`): per level max t with every frozen job at its floor
    (:func:`floor_of`), then one LP per active job (the most it can get while the other active jobs
    keep their targets less ``GIVE_WAY`` shared among them); jobs that cannot rise by ``RISE`` of their
    target (``u_i`` at a share of 0, at least ``1e-6 u_i``) freeze.

    ``exact``: the lexicographic max-min levels themselves, as water-filling's exact runs decide them:
    every LP in rational arithmetic (:class:`ExactDense`), floors and targets held ``1e-14`` of the
    terms they come from below them (the exact answers are rounded to doubles), and a job freezes when
    it cannot rise by ``1e-12`` of its target."""
    a = rates(problem, heterogeneity_aware)
    lp = (ExactDense if exact else Dense)(problem, a)
    slack, rise = (1e-14, 1e-12) if exact else (None, RISE)
    n, u = lp.n, a.max(axis=1)
    w = problem.priority_weights
    if problem.entities is None:
        entity, W, job_w, fifo = np.arange(n), w, np.ones(n), np.zeros(n, dtype=bool)
    else:
        entity, W, job_w = problem.entities, problem.entity_weights, w
        fifo = np.array([(entity_policies or {}).get(problem.entity_ids[e]) == "fifo" for e in entity])
    age = problem.time_since_start
    frozen, level = np.zeros(n, dtype=bool), np.zeros(n)
    size = np.zeros(n)  # the largest term a level was computed from (w t, less the entity's frozen levels)
    while not frozen.all():
        sigma = np.zeros(n)
        for e in set(entity[~frozen].tolist()):
            members = np.flatnonzero(~frozen & (entity == e))
            if fifo[members[0]]:
                sigma[members[np.lexsort((members, -age[members]))[0]]] = 1.0
            else:
                sigma[members] = job_w[members] / job_w[members].sum()
        held = np.array([level[frozen & (entity == entity[i])].sum() for i in range(n)])
        slope, offset = sigma * W[entity], sigma * held
        c = np.zeros(n * lp.k + 1)
        c[-1] = -1.0
        rows = [lp.n_row(i, 0.0 if frozen[i] else slope[i]) for i in range(n)]
        floor = level - slack * size if exact else floor_of(level)
        t = lp.solve(c, rows, np.where(frozen, -floor, offset).tolist())
        target = np.where(frozen, level, np.maximum(slope * t - offset, 0.0))
        scale = np.clip(np.where(sigma > 0, target, u), 1e-6 * u, u)
        gain = np.full(n, np.inf)
        give = GIVE_WAY / max((~frozen).sum() - 1, 1)  # the give of each other active job
        for i in np.flatnonzero(~frozen):
            if exact:  # less what rounding w t - F may have added
                held = np.where(frozen, floor, target - slack * slope * t)
            else:
                held = np.where(frozen, floor, (1 - give) * target)
                held[i] = target[i] * (1 - 1e-7)  # linprog's t is within HiGHS's default tolerance
            most = lp.solve(lp.n_row(i), [lp.n_row(j) for j in range(n)], (-held).tolist(), (0, 0))
            gain[i] = (most - target[i]) / scale[i]
        stuck = gain <= rise
        if not stuck.any():  # the job that gains least
            stuck[np.argmin(gain)] = True
        level[stuck], size[stuck] = target[stuck], (slope * t)[stuck]
        frozen |= stuck
    return level


# ----- properties -----------------------------------------------------------------------------
PROBLEMS = dict(seed=st.integers(0, 2**32 - 1), n_jobs=st.integers(1, 7), n_types=st.integers(1, 3),
                wide=st.booleans(), entities=st.booleans())


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("backend", ALL_BACKENDS)
@PROPERTY
@given(**PROBLEMS)
def test_every_backend_solves_feasibly_and_agrees(policy, backend, seed, n_jobs, n_types, wide, entities):
    if backend == "gurobi":  # size-limited license: tiny problems only
        n_jobs = min(n_jobs, 3)
    problem, entity_policies = make_problem(seed, n_jobs, n_types, wide, entities)
    alloc = solve(problem, policy, backend, entity_policies)
    assert alloc.status is allocopt.Status.OPTIMAL
    assert_feasible(alloc)
    if backend == "highs":
        return
    reference = solve(problem, policy, "highs", entity_policies)
    tol = AGREEMENT[backend]
    assert alloc.objective == pytest.approx(reference.objective, rel=tol, abs=1e-12), policy
    if policy.startswith("water_filling"):
        u = rates(problem).max(axis=1)
        np.testing.assert_array_less(np.abs(normalized(alloc) - normalized(reference)), 10 * tol * u + 1e-12)


@pytest.mark.parametrize("policy", ["max_min_fairness", "max_min_fairness/plain", "max_throughput", "water_filling",
                                    "water_filling/float"])
@settings(PROPERTY, max_examples=40)
@given(seed=st.integers(0, 2**32 - 1), n_jobs=st.integers(1, 6), n_types=st.integers(1, 3), wide=st.booleans(),
       entities=st.booleans())
def test_agrees_with_dense_formulation(policy, seed, n_jobs, n_types, wide, entities):
    """Small problems, against the dense formulations above; both families for water-filling's exact levels
    (the lexicographic max-min vector itself), the moderate one elsewhere."""
    wide = wide and policy == "water_filling"
    problem, entity_policies = make_problem(seed, n_jobs, n_types, wide, entities)
    alloc = solve(problem, policy, "highs", entity_policies)
    if policy == "max_throughput":
        assert alloc.objective == pytest.approx(dense_max_throughput(problem), rel=1e-7)
    elif policy.startswith("water_filling"):
        exact = policy == "water_filling"
        assert alloc.extras["num_exact_lp_solves"] == (alloc.extras["num_lp_solves"] if exact else 0)
        expected = dense_water_filling(problem, entity_policies, exact=exact)
        u = rates(problem).max(axis=1)
        np.testing.assert_array_less(np.abs(normalized(alloc) - expected), (1e-8 if exact else 1e-5) * u)
        np.testing.assert_allclose(alloc.extras["levels"] * problem.priority_weights, normalized(alloc),
                                   rtol=1e-7, atol=1e-12)
    else:
        aware = policy == "max_min_fairness"
        assert alloc.objective == pytest.approx(dense_max_min(problem, aware), rel=1e-7)


@settings(PROPERTY, max_examples=30)
@given(seed=st.integers(0, 2**32 - 1), n_jobs=st.integers(1, 6), n_types=st.integers(1, 3), wide=st.booleans(),
       entities=st.booleans())
def test_exact_agnostic_levels_agree_with_dense_formulation(seed, n_jobs, n_types, wide, entities):
    """Gavel's heterogeneity-agnostic water-filling (levels in time shares): also the exact vector."""
    problem, entity_policies = make_problem(seed, n_jobs, n_types, wide, entities)
    alloc = allocopt.solve(problem, "water_filling", entity_policies=entity_policies, heterogeneity_aware=False)
    expected = dense_water_filling(problem, entity_policies, exact=True, heterogeneity_aware=False)
    np.testing.assert_array_less(np.abs(normalized(alloc, False) - expected),
                                 1e-8 * rates(problem, False).max(axis=1))


@pytest.mark.parametrize("seed, n_jobs", [(7, 12), (1, 12), (2205713150, 11)])
def test_exact_levels_are_the_lexicographic_max_min_vector(seed, n_jobs):
    """Wide problems on which the floating-point runs' tolerances (RISE, the give) end 2e-3..0.18 u_i
    from the exact vector: the default run is that vector."""
    problem, _ = make_problem(seed, n_jobs, 4, True, False)
    alloc = allocopt.solve(problem, "water_filling")
    assert alloc.extras["num_exact_lp_solves"] == alloc.extras["num_lp_solves"] and alloc.backend == "glpk-exact"
    expected = dense_water_filling(problem, None, exact=True)
    np.testing.assert_array_less(np.abs(normalized(alloc) - expected), 1e-7 * rates(problem).max(axis=1))


@settings(PROPERTY, max_examples=30)
@given(**PROBLEMS, added_type=st.integers(0, 2))
def test_more_capacity_never_lowers_the_max_min_level(seed, n_jobs, n_types, wide, entities, added_type):
    """One more GPU of any type (least attained service: the objective does not depend on the
    capacity), or every type doubled (the proportional throughputs ``p_i`` stay the same)."""
    problem, _ = make_problem(seed, n_jobs, n_types, wide, entities)
    gpus = dict(zip(problem.gpu_types, problem.capacity.tolist()))

    def grown(capacity: dict) -> Problem:
        return Problem(problem.throughputs, Cluster(capacity), scale_factors=problem.scale_factors,
                       priority_weights=problem.priority_weights)

    one_more = dict(gpus, **{problem.gpu_types[added_type % n_types]: gpus[problem.gpu_types[added_type % n_types]] + 1})
    for bigger, aware in ((grown(one_more), False), (grown({t: 2 * c for t, c in gpus.items()}), True)):
        before = allocopt.solve(problem, "max_min_fairness", heterogeneity_aware=aware).objective
        after = allocopt.solve(bigger, "max_min_fairness", heterogeneity_aware=aware).objective
        assert after >= before * (1 - 1e-7)


@settings(PROPERTY, max_examples=40)
@given(**PROBLEMS)
def test_water_filling_refines_max_min(seed, n_jobs, n_types, wide, entities):
    problem, _ = make_problem(seed, n_jobs, n_types, wide, False)
    fill = allocopt.solve(problem, "water_filling")
    max_min = allocopt.solve(problem, "max_min_fairness")
    assert fill.objective == pytest.approx(max_min.objective, rel=1e-6)
    u = rates(problem).max(axis=1)
    share_fill, share_max_min = normalized(fill), normalized(max_min)
    assert np.all(share_fill >= max_min.objective * problem.priority_weights - 1e-6 * u)
    # leximin: the sorted weighted levels are lexicographically at least max-min's
    a = np.sort(share_fill / problem.priority_weights)
    b = np.sort(share_max_min / problem.priority_weights)
    tol = 1e-6 * np.max(u / problem.priority_weights)
    first = np.flatnonzero(np.abs(a - b) > tol)
    assert first.size == 0 or a[first[0]] > b[first[0]]


@pytest.mark.parametrize("field, kwargs, match", [
    ("throughputs", dict(throughputs=[[1e300, 1.0], [3.0, 1.0]]), "between 1e-09 and 1e.09 steps/s"),
    ("throughputs", dict(throughputs=[[5e-324, 1.0], [3.0, 1.0]]), "between 1e-09 and 1e.09 steps/s"),
    ("priority_weights", dict(priority_weights=[1e10, 1.0]), "priority weights between 0.001 and 1000"),
    ("priority_weights", dict(priority_weights=[1e-300, 1.0]), "priority weights between 0.001 and 1000"),
    ("entity_weights", dict(entities=["a", "b"], entity_weights={"a": 1e4}), "entity weights between"),
    ("pair_throughputs", dict(pair_throughputs={(0, 1): {"x": (1e12, 1.0), "y": (0.0, 0.0)}}), "between 1e-09"),
    ("throughputs", dict(throughputs=[[1e4, 1e-3], [3.0, 1.0]]), "range from 0.001 to 10000 .* factor of at most 1e.06"),
])
def test_out_of_range_inputs_name_field_and_range(field, kwargs, match):
    kwargs = {"throughputs": [[1.0, 2.0], [3.0, 1.0]], **kwargs}
    with pytest.raises(InvalidProblemError, match=match) as err:
        Problem(kwargs.pop("throughputs"), Cluster({"x": 2, "y": 1}), **kwargs)
    assert err.value.field == field


#: water-filling problems (seed, n_jobs, n_types, entities; all wide) that failed the long run of
#: benchmarks/property_suite.py, and the backends they failed on: levels 1e-8 of u_i or less that
#: the share of t's dual weight did not certify (a wrong level, refused by allocopt.verify), time
#: fractions of -6e-8 inside HiGHS's default tolerance that raised a frozen level, and the
#: in-place HiGHS and its fresh fallback ending apart. From 818416593 on: frozen levels whose last
#: digits decided later levels (before frozen levels gave way, see the water_filling module), CBC's
#: 8-digit text solutions, a bottleneck test whose unit lagged the level, HiGHS failing on a level LP
#: that scipy's fresh solve of the equilibrated model finds
#: From 3554623596 on (and 1952007597, 1107929440, which failed with other solver builds): level LPs
#: answered 1e-11 off (scipy; a later level moved by 1.7e-5 u_i), 35 times too high (CBC at its own
#: tolerances) or not at all (HiGHS's serial simplex and interior point, in every setting), now refined
#: and retried with HiGHS's independent pricing (see Numerics in the water_filling module); and a positive
#: dual on one backend's vertex of a degenerate level LP that froze a job the others' give lets rise (now
#: certified only with the give); from 3401246001 on, level LPs HiGHS's presolve (behind scipy) and CBC's
#: dual simplex called infeasible, and one infeasible by 6e-17 in exact arithmetic (its floors capped at a
#: float sum). Each of them was checked against an exact rational-arithmetic run of
#: the module's definition: every backend within 2e-6 u_i of it. The last, 2823835977: HiGHS's level LP
#: proved within 1e-14 but not 1e-15 and left unrefined put a later level 2.6e-5 u_i from scipy's and
#: cvxpy's (refinement now goes on to 1e-15; the three then agree within 1.3e-9 u_i with highspy 1.16 and
#: scipy 1.17). With highspy 1.8 and scipy 1.13 (CI's lowest versions) they stay 3.1e-5 u_i apart: two level
#: LPs whose duals lean on the free level, which refinement moves by the same 3.6e-10 each round.
OLD_HIGHS = tuple(int(part) for part in importlib.metadata.version("highspy").split(".")[:2]) < (1, 10)
FORMER_FAILURES = [
    (3035033774, 6, 2, False, ("scipy", "cvxpy", "pulp")),
    (3098919986, 12, 4, False, ("scipy", "cvxpy")),
    (3376630834, 9, 4, False, ("scipy", "cvxpy", "pulp")),
    (1974467056, 7, 4, True, ("scipy",)),
    (1830416320, 12, 4, True, ("scipy",)),
    (1399287560, 9, 4, True, ("scipy",)),
    (3059076842, 8, 4, False, ("scipy",)),
    (3131033932, 10, 4, False, ("scipy",)),
    (2325979416, 6, 3, True, ("scipy",)),
    (3673247597, 6, 3, True, ("scipy",)),
    (504740853, 11, 4, True, ("scipy",)),
    (137138583, 11, 3, True, ("pulp",)),
    (4147922603, 9, 2, False, ("pulp",)),
    (891513679, 12, 3, False, ("pulp",)),
    (818416593, 11, 4, True, ("scipy", "cvxpy", "pulp")),
    (2124636615, 12, 4, False, ("scipy", "cvxpy", "pulp")),
    (2622289002, 11, 3, False, ("scipy", "pulp")),
    (939914375, 12, 3, True, ("scipy", "pulp")),
    (2606151118, 11, 3, True, ("scipy", "pulp")),
    (2611943363, 12, 4, False, ("scipy", "pulp")),
    (1952007597, 10, 4, True, ("scipy", "pulp", "cvxpy")),
    (893998634, 11, 4, True, ("scipy",)),
    (1107929440, 10, 4, True, ("scipy", "pulp", "cvxpy")),
    (1825281979, 12, 3, True, ("scipy",)),
    (3769096479, 10, 2, False, ("scipy", "cvxpy")),
    (3554623596, 11, 4, False, ("scipy", "pulp", "cvxpy")),
    (1162589010, 11, 2, True, ("scipy", "pulp", "cvxpy")),
    (3597194623, 12, 4, False, ("scipy", "pulp", "cvxpy")),
    (3651012596, 9, 3, False, ("scipy", "pulp", "cvxpy")),
    (3401246001, 10, 4, True, ("scipy", "pulp", "cvxpy")),
    (813808327, 10, 3, False, ("scipy", "cvxpy")),
    (1635843515, 11, 3, True, ("scipy", "cvxpy")),
    (2823835977, 12, 4, False, ("scipy", "cvxpy")),
]


@pytest.mark.parametrize("policy", ["water_filling/float", "water_filling"])
@pytest.mark.parametrize("seed, n_jobs, n_types, entities, backends", FORMER_FAILURES)
def test_former_failures_of_the_long_run(seed, n_jobs, n_types, entities, backends, policy, request):
    if OLD_HIGHS and seed == 2823835977 and policy == "water_filling/float":
        request.applymarker(pytest.mark.xfail(
            reason="known: with highspy < 1.10 (and its scipy) the backends' own LPs stay 3.1e-5 u_i apart here"))
    problem, entity_policies = make_problem(seed, n_jobs, n_types, True, entities)
    reference = solve(problem, policy, "highs", entity_policies)
    assert reference.status is allocopt.Status.OPTIMAL
    assert_feasible(reference)
    u = rates(problem).max(axis=1)
    for backend in backends:
        alloc = solve(problem, policy, backend, entity_policies)
        assert alloc.status is allocopt.Status.OPTIMAL, backend
        assert_feasible(alloc)
        tol = AGREEMENT[backend]
        assert alloc.objective == pytest.approx(reference.objective, rel=tol, abs=1e-12), backend
        np.testing.assert_array_less(np.abs(normalized(alloc) - normalized(reference)), 10 * tol * u + 1e-12)


@pytest.mark.parametrize("seed, wide", [(2776604340, False), (1390648662, True)])
def test_cap_probe_of_a_job_whose_cap_the_point_reaches(seed, wide):
    """Two jobs on one type: the job the probe tests sits at its cap in the current point as far as
    ``u_i / w_i`` tells, though ``u_i <= t_0 w_i`` said otherwise (a division by zero before)."""
    problem, _ = make_problem(seed, 2, 1, wide, False)
    reference = solve(problem, "water_filling", "highs", None)
    for backend in ("highs", "scipy"):
        alloc = solve(problem, "water_filling", backend, None)
        assert alloc.status is allocopt.Status.OPTIMAL, backend
        assert_feasible(alloc)
        u = rates(problem).max(axis=1)
        np.testing.assert_array_less(np.abs(normalized(alloc) - normalized(reference)), 1e-5 * u + 1e-12)


@pytest.mark.parametrize("policy", ["water_filling/float", "water_filling"])
def test_cbc_on_the_former_failure_893998634(policy):
    """CBC's own LPs ended this run about u_i from the exact vector, called optimal, until the LPs CBC fails
    in every setting were solved exactly before any other fallback."""
    problem, entity_policies = make_problem(893998634, 11, 4, True, True)
    reference = solve(problem, "water_filling", "highs", entity_policies)
    alloc = solve(problem, policy, "pulp", entity_policies)
    u = rates(problem).max(axis=1)
    # an honest answer: either not called optimal, or within the agreement the pinned cases ask of pulp
    assert alloc.status is not allocopt.Status.OPTIMAL or np.all(
        np.abs(normalized(alloc) - normalized(reference)) < 10 * AGREEMENT["pulp"] * u + 1e-12)


@pytest.mark.parametrize("seed, n_jobs, entities", [(2890125195, 5, False), (3745046670, 4, True)])
def test_former_max_throughput_failures_on_cbc(seed, n_jobs, entities):
    """CBC at its default dual tolerance left a job of 9e-4 steps/s idle beside jobs of 3e3 steps/s."""
    problem, _ = make_problem(seed, n_jobs, 2, True, entities)
    alloc = solve(problem, "max_throughput", "pulp", None)
    assert alloc.status is allocopt.Status.OPTIMAL
    assert alloc.objective == pytest.approx(dense_max_throughput(problem), rel=AGREEMENT["pulp"])


@pytest.mark.parametrize("backend", ALL_BACKENDS)
@pytest.mark.parametrize("weights", [[1e3, 1e-3], [1e-3, 1e3, 1.0]])
def test_weights_a_million_apart_keep_every_job(backend, weights):
    """The edge of the weight range: the light job still gets its (tiny) share, and the level is exact."""
    n = len(weights)
    problem = Problem(np.array([[1.0, 2.0], [3.0, 1.0], [2.0, 2.0]][:n]), Cluster({"x": 2, "y": 1}),
                      priority_weights=weights)
    for policy in ("max_min_fairness", "water_filling"):
        alloc = solve(problem, policy, backend, None)
        assert alloc.objective == pytest.approx(dense_max_min(problem), rel=1e-6)
        assert np.all(alloc.fair_share_ratio >= alloc.objective * (1 - 1e-6))


def test_the_check_refuses_answers_that_disagree_with_their_allocation():
    """allocopt.verify, on answers altered after the solve: a wrong objective, an overfull cluster."""
    import dataclasses

    from allocopt.errors import NotOptimalError
    from allocopt.verify import checked

    problem = Problem([[40.0, 10.0], [12.0, 4.0], [100.0, 50.0]], Cluster({"v100": 1, "k80": 1}))
    alloc = allocopt.solve(problem, "max_min_fairness")
    assert checked(alloc, {}, best_effort=False) is alloc
    wrong = dataclasses.replace(alloc, objective=alloc.objective * (1 + 1e-4))
    with pytest.raises(NotOptimalError, match="reported objective .* is not the .* the allocation attains"):
        checked(wrong, {}, best_effort=False)
    assert checked(wrong, {}, best_effort=True).status is allocopt.Status.APPROXIMATE
    overfull = dataclasses.replace(alloc, matrix=np.array([[0.5, 0.0], [0.5, 0.0], [0.1, 0.5]]))
    with pytest.raises(NotOptimalError, match="GPUs of type 'v100' are in use, more than its 1"):
        checked(overfull, {}, best_effort=False)
    assert checked(overfull, {}, best_effort=True).status is allocopt.Status.ERROR
