"""Hierarchical weighted max-min fairness by water-filling (Gavel's
``max_min_fairness_water_filling``, ``_perf`` and ``_packed``).

Job ``i``'s normalized throughput is

.. math::

    n_i = \\frac{s_i \\, e_i}{p_i}, \\qquad
    e_i = \\sum_j T_{ij} X_{ij}, \\qquad p_i = \\frac{\\sum_j T_{ij} c_j}{\\sum_j c_j}

(with ``heterogeneity_aware=False``, ``n_i = s_i \\sum_j X_{ij}``: every
``T_ij`` is 1). A water level ``t`` rises; every *active* job gets its share
of it, and the jobs that hit a bottleneck are frozen at their level while the
others keep rising. Iteration ``k`` solves the *level LP*

.. math::

    t^*_k = \\max t \\quad \\text{s.t.} \\quad
    n_i \\ge b_i(t) = \\sigma_i (W_e t - F_e) \\;\\; \\text{active } i \\text{ of entity } e, \\qquad
    n_i \\ge \\lfloor (1 - \\delta) L_i \\rfloor \\;\\; \\text{frozen } i,

and the base constraints (:mod:`allocopt.formulations.base`). ``W_e`` is the
entity's weight, ``F_e`` the sum of the frozen levels ``L_i`` of its jobs, and
the share ``\\sigma_i`` is ``w_i / \\sum_{\\text{active } j \\in e} w_j`` under the
entity policy ``"fairness"`` and, under ``"fifo"``, 1 for the entity's oldest
active job (largest ``time_since_start``, ties in job order) and 0 for its
other active jobs. Without entities every job is an entity of weight ``w_i``,
so the constraint reads ``n_i >= w_i t``: plain weighted water-filling, whose
first level is :mod:`max_min_fairness <allocopt.formulations.max_min_fairness>`'s
objective. The result is the lexicographic max-min vector ``n``: for runs whose
LPs are solved exactly (small runs, Exact levels below) to the rounding of each
LP's answer to doubles, for the others but for the give ``delta`` of the frozen
levels and the bottleneck test's ``RISE`` (below).

Frozen levels give way. In later LPs a frozen job holds ``(1 - delta) L_i``
(``delta = GIVE_WAY = 5e-7``) rounded down to 24 significant bits, not ``L_i``,
and a job counts as a bottleneck when it cannot rise by ``RISE = 10^{-4}`` of
its target (at least ``10^{-6} u_i``; ``u_i`` at a share of 0) while the other
active jobs give way by ``delta`` shared among them (each by ``delta / (m - 1)`` of
its target, ``m`` active jobs: however many they are, together they free no
more than one frozen level's give). Without the give the lexicographic vector is
ill-conditioned on valid data: where a job reaches its level only with a
sliver of a type on which it runs up to ``10^6`` times slower, the last
digits of that level decide much of a later job's share. Solved in exact
rational arithmetic, one problem of the property suite's wide family gives a
job 0 where HiGHS's allocation, whose other levels are within a relative
``4 \\cdot 10^{-10}`` of the exact ones (its first ``2 \\cdot 10^{-10}`` lower),
gives it 60% of its ``u_i``; HiGHS, scipy and CBC, each within its ``10^{-9}`` tolerances,
ended up to ``u_i`` apart (and apart from the exact vector) on 11 of 5,000
such problems. With the give, the later levels use what the last
``5 \\cdot 10^{-7}`` of the frozen levels would cost, the rounding makes
frozen levels that differ in their last digits (``10^{-14}`` between the
backends) one number, and the bottleneck tests no longer turn on a rise of
``10^{-12}``. What it costs: each frozen job may end up to a relative
``5 \\cdot 10^{-7}`` below its level where a later job uses the room (measured:
later jobs then up to ``1.3 \\cdot 10^{-5} u_i`` above the give-free vector on a
moderate problem); the objective is the first level the allocation attains,
``t^*_1`` less at most that give. A last LP raises every job toward its level
by a common fraction ``lambda <= 1`` (``n_i >= lambda L_i``) where the room is
free, so the answer does not depend on where in the give a solver's point lay.

Bottlenecks. A job is a bottleneck when it cannot rise above its target
``b_i(t^*_k)`` (by ``RISE``) while every other job keeps its target (less the
give: the frozen ones their floors, the active ones their shares of ``delta``);
it is then frozen there. Freezing only bottlenecks is exact whenever it happens: later
iterations only raise the other targets, so a bottleneck can never rise
later, and a job left active loses nothing (at the next level it starts from
the same target). Two certificates, neither an equality test on levels:

* *Duals* (the level LP's own): a row with a positive dual ``y_i`` is tight in
  every optimum (complementary slackness), and raising its right-hand side
  lowers ``t*`` (weak duality), so the job cannot rise, whatever its current
  point shows within the solver's tolerances, where the others keep their
  targets exactly. Where they give way, the LP's optimum is concave in its
  right-hand sides, so the duals bound it: ``tau* - y_i rise_i + sum_j y_j
  give_j`` (row units); a positive dual certifies the job when that bound
  (with the others' give doubled, a margin for the duals' own noise) is below
  ``tau*``. Otherwise its job goes to the improvement LP: on an
  ill-conditioned level LP a dual of ``10^{-3}`` on one backend's vertex and 0
  on another's marked a job stuck that the others' give of ``5 \\cdot 10^{-7}``
  lets rise by 18% of its level (checked in exact rational arithmetic).
  Positive means above ``10^{-6}``
  in the LP's own units (its rows scaled by ``r_i``, ``t`` by ``t_unit``), well
  above the solvers' dual tolerance; not its share of ``t``'s weight, which
  for a job of level ``10^{-8} u_i`` beside jobs near ``u_j`` is far smaller
  and left it active, to be frozen later at a level the solver no longer
  resolved. The duals of the rows
  with a positive share weigh ``t``'s column to 1 (``sum_i y_i sigma_i W_e = 1``),
  so where neither certificate freezes a job, the one of largest dual weight is
  frozen: every level freezes one.
* *Improvement LP*, for the rows at their targets that the duals do not
  certify (degenerate rows, e.g. a ``fifo`` entity's jobs of share 0, and the
  rows above): it maximizes
  ``sum_i d_i`` subject to ``n_i >= b_i + epsilon r_i d_i``, ``0 <= d_i <= 1``, for
  those jobs, and the targets less the give and the floors of all others.
  Jobs it raises by more than ``RISE`` stay active; where it raises none, they
  are frozen too; it is re-solved on the rest a few times at most.

Before either, the level LP's own point proves some jobs able to rise by more
than ``RISE`` (idle time of theirs on a type with idle GPUs): they stay active
untested. Every
level freezes at least one job, so there are at most ``n_jobs`` levels; in
practice one LP per level, and an improvement LP where degenerate rows are
left.

Jobs at their own caps. Where a job's target reaches ``u_i`` (all its time on its
best type) that cap, not the cluster, sets its level, and on uncontended clusters
that is most jobs, one level each. Without entities, when a level freezes a job
at its cap, :meth:`_WaterFill.fill_caps` freezes the run of the next ones together
in about ``2 log2`` of its length LPs (probes of the lowest caps: 2, 4, 8, ...
jobs, then bisection), each job at ``u_i`` where the level of its cap is
feasible (levels one at a time froze such a job within ``RISE`` of it). On 2,048
distinct jobs of ``allocopt.bench.instances.uniform_problem``: 26 levels and 40
probes, where one level per job took about 2,000 LPs.

All LPs of a run share one template (same sparsity, other
coefficients, bounds and objective); on ``highs`` one HiGHS instance is
changed in place, so each LP goes on from the previous one's basis and
factorization (primal simplex: the previous point stays feasible), usually in
a few pivots; in runs of at least ``PRIMAL_FIRST`` columns without perturbing
its bounds (HiGHS's cleanup of the perturbation took a quarter of its time).

Numerics. The level is ``t = t_low + tau t_unit``, where ``t_low`` is the level
the current exactly feasible point already reaches, and every job's row is
divided by its natural magnitude ``r_i``: its target at ``t_low`` (or, for a job
whose target starts at 0, what ``t_low`` itself is worth to it), clipped to
``[10^{-6} u_i, u_i]`` where ``u_i`` is the most ``n_i`` can be; ``t_unit`` is the
rise that lifts the most sensitive job by its ``r_i``. Solver tolerances are so
relative to each job's own level whatever the throughputs and weights; scales
are kept while within a factor 4, so few coefficients change from one LP to
the next. Types a job does not fit on stay out of its row. On the backends that
run HiGHS (``highs``, ``scipy``, ``cvxpy``'s default) every LP is solved with
primal and dual feasibility tolerances of ``10^{-9}`` (HiGHS's default
``10^{-7}`` let a time fraction of ``-6 \\cdot 10^{-8}`` through, which coefficients
of up to ``10^6`` turned into a level ``10^{-4}`` too high), and where the tight
tolerances end in numerical trouble, with the solver's own. A level LP's (and
the last LP's) answer is then refined where its duals do not prove it within
``10^{-15}`` (relative) of the optimum: the same LP around the solver's point
``x``, zoomed ``2^{20}`` times (``x + dx / 2^{20}``, every bound and the objective
scaled alike, so the duals carry over, divided by ``2^{20}``), solved again, at most twice. The
solvers' ``10^{-9}`` then hold ``10^{-15}`` and better: a level LP that ill-conditioning
had left ``10^{-11}`` off (scipy) moved a later level by ``1.7 \\cdot 10^{-5} u_i``,
one proved within ``10^{-14}`` but not ``10^{-15}`` moved one by ``2.6 \\cdot 10^{-5} u_i``
(HiGHS against scipy and cvxpy, which refined theirs), and one CBC answered 35 times
too high at its default tolerances. (Cap probes are not refined: they decide at
``CAP_REACHED``, far above the tolerances.) Each LP's point is
clipped to its bounds and scaled into the capacity, so it is exactly feasible,
and targets and floors are capped at what it achieves: every LP has a
feasible point, with no margin needed. CBC (``pulp``) solves with its primal
and dual tolerances at ``10^{-9}``, and its values come from its binary
solution file (full doubles, not the 8 digits of its text file). Where a
solve still fails (an error, or a stop at a limit the caller did not set: CBC
stops "on iterations" where it cycles), on ``highs`` it is repeated from
scratch with dual simplex, then with HiGHS's dual simplex with independent
pricing (``simplex_strategy`` 2), then in a fresh HiGHS with its default
scaling and presolve (tight tolerances, then its own), then with its interior
point method; on the other backends (scipy's and cvxpy's HiGHS first without
presolve, as ``highs`` solves: its presolve called feasible level LPs
infeasible) with the solver's own tolerances, then on
the model equilibrated here (rows, then columns, divided by their largest
coefficient), then (scipy, cvxpy's HiGHS) with independent pricing and (scipy)
interior point, (CBC) with its primal simplex (not its barrier: one of its
iterations never ended on a 75-job wide level LP, past CBC's time and
iteration limits). These last retries have iteration limits (scipy's HiGHS
looped without end on one interior point solve). Independent pricing finishes
level LPs that HiGHS's serial dual and primal simplex and its interior point
method give up on (coefficients ``3 \\cdot 10^{-5}..10^6``). An LP that no
retry answers is solved by GLPK's exact simplex (Exact levels, below), before
any other fallback: CBC called level LPs of an 85-job wide run infeasible in
every setting. A level LP reported infeasible even so (it has a feasible
point: the floors are at most what the last point achieved, but that float
sum can exceed the exact one by a unit in the last place) is solved again
with the floors 8 units in the last place lower. If it fails even so, the rest
of the run divides every row by ``u_i`` (coefficients at most 1), and after
that the frozen levels give way by ``WIDER_GIVE_WAY = 10^{-5}`` for the rest
of the run.
Finally each job's time alone is trimmed so that ``n_i`` is its level.

Exact levels. Runs whose LPs have at most ``EXACT_MAX_COLUMNS = 1024`` columns (one per job and
type, one per job and ``t``: about 113 jobs on 8 types, 204 on 4) solve every LP with GLPK's exact
simplex (:mod:`allocopt.backends.glpk`: rational arithmetic on the model's doubles), whatever the
backend, and decide on its answers (exact optima and duals rounded to doubles) without the
tolerances above: a job stays active when it can rise by more than ``EXACT_RISE = 10^{-12}`` of its
target, a positive dual certifies a bottleneck, a cap probe must reach its cap within
``EXACT_RISE``, and frozen levels give way by ``EXACT_GIVE_WAY = 10^{-14}`` only (each answer is
rounded). Such a run returns the lexicographic max-min vector itself, and every backend the same
allocation. Checked against the test suite's own dense formulation with each LP solved exactly
(``dense_water_filling(..., exact=True)`` in ``tests/test_properties.py``, one LP per level and job):
within ``2.6 \\cdot 10^{-10} u_i`` on all 2,515 problems of at most 6 jobs among 5,000 of the property
suite (seed 5, both families, with and without entities; median ``10^{-14} u_i``;
heterogeneity-agnostic: within ``8 \\cdot 10^{-14} u_i`` on 283 such problems of seed 11), within
``4 \\cdot 10^{-8} u_i`` on the property suite's wide family at 12 jobs on 4 types (13
problems; most within ``10^{-12} u_i``) and ``5 \\cdot 10^{-6} u_i`` at 40 jobs on 8 types (8 problems;
6 within ``10^{-9} u_i``), where the tolerances above (the floating-point runs) end up to
``0.18 u_i`` and ``0.96 u_i`` from it. What remains is the vector's own sensitivity: there, levels
``10^{-12}`` apart (a job the reference's held targets let rise by ``10^{-12}``, which an exact
positive dual freezes here) became later levels ``3 \\cdot 10^{-7}`` apart. The
floating-point solvers, each within its tolerances, also disagreed among themselves (Limits,
below): on a fresh seed of the property suite's wide family they ended up to ``0.79 u_i`` apart on
6 of 5,000 problems. ``benchmarks/property_suite.py --seed 3 --policies
water_filling,water_filling/float`` (5,000 problems): highs, scipy, cvxpy and CBC agree on all
5,000 and with the exact reference on its 492 (one after a fix of the reference's own rounding);
with ``exact=False`` scipy, CBC and cvxpy disagreed with HiGHS on 8, 6 and 7. Exact answers rounded
to doubles can leave a later LP infeasible by a unit in the last place (a fixed ``tau`` or a floor a
rounding above its exact value): it is solved again with the level rows ``EXACT_SLACK = 10^{-12}``
lower (rows scaled to about 1). Exact LPs are not refined. Their time grows with the size faster
than the floating-point solvers' (the bits of the rationals): a whole run took a median of 0.02 s
at 12 jobs on 4 types, 0.1 s at 28 on 8 and 0.4 s at 55 on 8 (wide family; about what HiGHS took).
Between 512 and 1,024 columns (30 problems, 65-299 jobs on 2-8 types): wide family a median of 0.63 s
(max 8.9 s; HiGHS 0.31 s, max 6.5 s), where HiGHS's floating-point run ended more than
``10^{-5} u_i`` from the exact vector on 12 of 15 (up to ``0.6 u_i``), and scipy, CBC and cvxpy took
0.4-4.6 s; moderate family a median of 0.09 s (max 0.14 s; HiGHS 0.01 s), 4 of 15 more than
``10^{-5} u_i`` apart (up to ``10^{-4} u_i``). Between 1,024 and 2,048 columns (20 problems) the wide
family took a median of 5.8 s (max 16.5 s) and 3 of 10 runs reached the exact LPs' time limit, which is
why the default stops at 1,024. An LP that takes more
than ``EXACT_TIME_LIMIT_S = 10`` s is solved by the backend, as is the rest of the run, with the
tolerances above. ``exact=False`` solves every LP on the backend (as
larger runs do), ``exact=True`` exactly whatever the size. So a run's answer depends on its path on
data at the edges of the supported range (on the wide family, up to ``0.2 u_i`` at 12 jobs and
``u_i`` at 100 jobs on 8 types), hardly on moderate data (within ``10^{-4} u_i``; ``10^{-5} u_i`` at
the property suite's sizes, its dense check).

Limits. A level LP can itself be ill-conditioned: a violation of a row by
``10^{-8}`` (within a solver's tolerance) can raise ``t*`` by 10% and more,
where a frozen job's floor is held with a sliver of a slow type (checked in
exact rational arithmetic: optimum 57.7 where HiGHS, within ``10^{-8}``, found
113.9; 3.588 where CBC found 3.87 at ``10^{-9}`` and 126.5 at its default
tolerances). Refinement and the retries above answer such LPs to the digits
the data have; the wider give stays for an LP no retry finishes. This holds for the LPs
solved in floating point (``exact=False``, and runs above ``EXACT_MAX_COLUMNS``). Measured with
``benchmarks/property_suite.py`` (all of its wide family): ``scipy`` apart from
``highs`` by more than ``10^{-5} u_i`` on none of 5,000 problems with highspy 1.16 and scipy 1.17 (on 1
while refinement stopped at ``10^{-13}``; on that one, 2823835977, with highspy 1.8 and scipy 1.13 still:
``3.1 \\cdot 10^{-5} u_i``, two level LPs whose duals lean on the free level, which each round of
refinement moves by the same ``3.6 \\cdot 10^{-10}``), ``pulp`` and ``cvxpy`` on none of 2,000. CBC ended a former
failure (893998634) about ``u_i`` from the exact vector, where its dual simplex called feasible level and
improvement LPs infeasible and its primal simplex answered them wrongly; with the LPs it fails in every
setting solved exactly (one of 25 there) it ends ``5.0 \\cdot 10^{-5} u_i`` from the exact vector, where
HiGHS, scipy and cvxpy end too.
The former failures are pinned in ``tests/test_properties.py``, each
checked against an exact rational-arithmetic run of this definition.

Narayanan et al., "Heterogeneity-Aware Cluster Scheduling Policies for Deep
Learning Workloads", OSDI 2020 (Sec. 4.1, hierarchical policies).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import scipy.sparse as sp

from allocopt.backends import RawResult, SolveOptions, solve_model
from allocopt.backends.glpk import GlpkExactBackend
from allocopt.errors import InvalidOptionError, SolverError
from allocopt.formulations.base import AllocationModel, ModelSolver, Policy, PolicyResult, base_model, clean_matrix
from allocopt.formulations.job_types import group_rows
from allocopt.model import CompiledModel, LinExpr
from allocopt.problem import Problem
from allocopt.solution import Solution, Status

logger = logging.getLogger(__name__)

ENTITY_POLICIES = ("fairness", "fifo")
MIN_ROW_SCALE = 1e-6  # a job's row is divided by its level, or by at least this fraction of u_i
RESCALE = 4.0  # ... kept while within this factor of that (and so is the unit of t)
# a job rises (is no bottleneck) when it can rise by more than this fraction of its target (at least
# MIN_ROW_SCALE u_i; u_i at a share of 0); the give of the other jobs' levels, pooled, stays below it
# on ordinary problems (see Frozen levels in the module docstring)
RISE = 1e-4
DUAL_TOL = 1e-6  # a row certifies its job stuck when its dual (in the LP's units) exceeds this
IMPROVEMENT = 1e-3  # epsilon: the raise an improvement LP asks of a job, as a fraction of its row scale
GIVE_WAY = 5e-7  # frozen levels L_i hold in later LPs as n_i >= (1 - GIVE_WAY) L_i (see Frozen levels)
WIDER_GIVE_WAY = 1e-5  # ... and as n_i >= (1 - WIDER_GIVE_WAY) L_i where no solver finishes a level LP otherwise
RESTORE_TOL = 1e-9  # levels a point falls short of by more than this (relative) are restored
ZOOM = 2.0**20  # iterative refinement: the LP around a solver's point, its bounds and objective this much larger
REFINEMENTS = 2  # rounds of it at most per level LP, where the point is off by more than EXACT ...
EXACT = 1e-15  # (relative; the LP's rows and objective are scaled to about 1)
REFINED = 1e-13  # ... ending when a round moves the objective by at most this (relative)
DUAL_NOISE = 1e-13  # a reduced cost this small on a column with an infinite bound is rounding (_gap)
MAX_IMPROVEMENT_LPS = 3  # per level; the jobs still undecided then stay active (exact, only slower)
CAP_REACHED = 1e-8  # a cap probe succeeds when its level is within this (relative) of the probed cap

# HiGHS options of the LPs: simplex (its bases carry over from one LP to the next), without
# presolve (it removes little from these LPs), without HiGHS's own scaling (the rows are scaled
# here; scale factors HiGHS keeps from the first LP made later LPs changed in place stop short
# of their optimum: 1.64324 for 1.64344 on one problem), with tight tolerances (TOLERANCES).
SOLVER_DEFAULTS = {"solver": "simplex", "presolve": "off", "simplex_scale_strategy": 0,
                   "primal_feasibility_tolerance": 1e-9, "dual_feasibility_tolerance": 1e-9}
# The HiGHS of every backend but CBC (scipy's, cvxpy's default) holds the bounds and reduced costs to
# 1e-9, not its default 1e-7 (see Numerics in the module docstring).
TOLERANCES = {"primal_feasibility_tolerance": 1e-9, "dual_feasibility_tolerance": 1e-9}
CBC_TOLERANCES = {"options": ["primalTolerance 1e-9", "dualTolerance 1e-9"]}  # CBC's names for them
# A first (cold) LP of at least this many columns is solved with primal simplex: at 4,096 jobs x 8 types
# in 0.3-0.4 of the time of HiGHS's dual simplex. Smaller ones keep dual simplex, whose first vertex the
# pinned ill-conditioned problems of the property suite were checked with (on one of them primal simplex's
# vertex leaves a fifo job able to rise by RISE within the give, and a later level falls 300-fold).
PRIMAL_FIRST = 4096
# The LPs of such runs are also solved with primal simplex's bounds unperturbed: each starts from the
# previous one's basis, and HiGHS spent a quarter of its time cleaning up with dual simplex the
# infeasibilities that removing the perturbation left (2,048 distinct jobs x 8 types: 2.0 s -> 1.4 s; a
# 520-job problem of the property suite's wide family: 115 s -> 0.6 s). Smaller runs keep the
# perturbation, with which the pinned problems were checked (unperturbed, 2 of them end elsewhere).
PERTURBATION = "primal_simplex_bound_perturbation_multiplier"
# where a re-solve in place fails: first in place with the bounds perturbed where they were not (HiGHS's
# default), then from scratch with dual simplex (then _last_retries' first and a fresh HiGHS, see
# _HighsSession.solve); interior point or primal simplex there found other vertices, whose duals froze
# other jobs than the other backends did. Each retry: (options, from scratch).
RETRIES = (({PERTURBATION: 1.0}, False), ({"simplex_strategy": 1}, True))
HIGHS_OWN = {"simplex_strategy": 1, "simplex_iteration_limit": 2**31 - 1}  # HiGHS's defaults, restored after a retry
# Runs whose LPs have at most this many columns solve them in exact rational arithmetic (GLPK's exact
# simplex), whatever the backend: there the floating-point solvers, each within its tolerances, ended
# up to u_i apart on the property suite's wide family (see Exact levels in the module docstring). Its time
# grows faster with the size than theirs: up to here a median of 0.6 s per run on the wide family (HiGHS
# 0.3 s), past it 5.8 s, with exact LPs at their time limit in 3 of 10 runs.
EXACT_MAX_COLUMNS = 1024
EXACT_TIME_LIMIT_S = 10.0  # per LP; an LP that takes longer is solved by the backend
EXACT_SLACK = 1e-12  # (rows scaled to about 1) what an exact LP infeasible by rounding gives way
# Runs whose LPs are exact decide at these instead (see Exact levels in the module docstring): a job rises
# when it can rise by more than EXACT_RISE of its scale (and a cap probe succeeds within it), a positive dual
# certifies, and frozen levels give way by EXACT_GIVE_WAY only (the exact answers are rounded to doubles)
EXACT_RISE = 1e-12
EXACT_GIVE_WAY = 1e-14


def _last_retries(backend: str, size: int) -> tuple[dict[str, Any], ...]:
    """The last retries of a backend, for an LP of ``size`` rows and columns; where it runs HiGHS, its dual
    simplex with independent pricing (which finishes ill-conditioned level LPs its serial dual and
    primal simplex give up on), then its interior point method (with crossover). Each with an
    iteration limit: scipy's HiGHS 1.17 looped without end in one interior point solve."""
    limit = 20 * size + 1000
    return {"highs": ({"simplex_strategy": 2, "simplex_iteration_limit": limit},
                      {"solver": "ipm", "ipm_iteration_limit": 1000, "simplex_iteration_limit": limit}),
            # HiGHS's presolve behind scipy and cvxpy called feasible level LPs infeasible
            "scipy": ({"presolve": False}, {"simplex_strategy": 2, "maxiter": limit},
                      {"method": "highs-ipm", "maxiter": limit}),
            "cvxpy": ({"presolve": "off"}, {"simplex_strategy": 2, "simplex_iteration_limit": limit}),
            # CBC's dual simplex called feasible level LPs infeasible that its primal simplex solves. Not its
            # barrier: on a 75-job wide run one barrier iteration never ended, and CBC's time and iteration
            # limits do not stop it (the exact rescue, _Lps._rescue, takes what primal simplex leaves)
            "pulp": ({"options": [*CBC_TOLERANCES["options"], f"maxIterations {limit}", "primalSimplex"]},),
            }.get(backend, ())


NUMERICAL_TROUBLE = (Status.ERROR, Status.INFEASIBLE, Status.INFEASIBLE_OR_UNBOUNDED, Status.UNBOUNDED)


def _trouble(solution: Solution, solver: ModelSolver) -> bool:
    """Numerical trouble: a failed solve of an LP that has a feasible point, or one that stopped at a limit
    the caller did not set (CBC stops "on iterations" where it cycles)."""
    return solution.status in NUMERICAL_TROUBLE or (solution.status is Status.TIME_LIMIT
                                                   and solver.options.time_limit_s is None)


@dataclass(frozen=True)
class _Hierarchy:
    """Per-job entity data, with each job its own entity when the problem has none."""

    entity: np.ndarray  # (n_jobs,) int: entity index of each job
    entity_weights: np.ndarray  # (n_entities,) W_e
    job_weights: np.ndarray  # (n_jobs,) w_i
    fifo: np.ndarray  # (n_jobs,) bool: the job's entity uses "fifo"
    age_rank: np.ndarray  # (n_jobs,) int: 0 for the oldest job
    count: np.ndarray | None = None  # (n_jobs,): identical jobs each row stands for (job classes), None: 1

    @property
    def num_entities(self) -> int:
        return self.entity_weights.size

    def shares(self, active: np.ndarray) -> np.ndarray:
        """``sigma_i`` of every job (0 for frozen jobs), shape (n_jobs,)."""
        e = self.entity
        weights = self.job_weights if self.count is None else self.job_weights * self.count
        active_weight = np.bincount(e[active], weights[active], minlength=self.num_entities)
        fair = np.where(active, self.job_weights / np.where(active_weight > 0, active_weight, 1.0)[e], 0.0)
        oldest = np.full(self.num_entities, e.size)
        np.minimum.at(oldest, e[active], self.age_rank[active])
        first = active & (self.age_rank == oldest[e])
        return np.where(self.fifo, first.astype(np.float64), fair)

    def open_entities(self, jobs: np.ndarray) -> np.ndarray:
        """Bool per job: its entity has a job in the mask ``jobs``."""
        return (np.bincount(self.entity[jobs], minlength=self.num_entities) > 0)[self.entity]


def _hierarchy(problem: Problem, entity_policies: Mapping[Any, str] | None,
               count: np.ndarray | None = None) -> _Hierarchy:
    n = problem.num_jobs
    if problem.time_since_start is None:
        order = np.arange(n)
    else:
        order = np.lexsort((np.arange(n), -problem.time_since_start))
    age_rank = np.empty(n, dtype=np.int64)
    age_rank[order] = np.arange(n)
    policies = dict(entity_policies or {})
    if problem.entities is None:
        if policies:
            raise InvalidOptionError(f"entity_policies names entit(ies) {list(policies)[:5]} but the problem has "
                                     "no entities; pass Problem(entities=..., entity_weights=...)")
        # each job its own entity: a row of ``count`` jobs stands for as many entities, each as the row
        return _Hierarchy(np.arange(n), problem.priority_weights, np.ones(n), np.zeros(n, dtype=bool), age_rank)
    ids = {entity: k for k, entity in enumerate(problem.entity_ids)}
    fifo_entities = np.zeros(len(ids), dtype=bool)
    for entity, policy in policies.items():
        if entity not in ids:
            raise InvalidOptionError(f"entity_policies names unknown entity {entity!r}; the problem's entities "
                                     f"are {list(problem.entity_ids)[:10]}")
        if policy not in ENTITY_POLICIES:
            raise InvalidOptionError(f"entity_policies[{entity!r}] is {policy!r}; choose one of "
                                     f"{', '.join(map(repr, ENTITY_POLICIES))}")
        fifo_entities[ids[entity]] = policy == "fifo"
    return _Hierarchy(problem.entities, problem.entity_weights, problem.priority_weights,
                      fifo_entities[problem.entities], age_rank, count)


def first_level(problem: Problem, normalized: np.ndarray, entity_policies: Mapping[Any, str] | None = None
                ) -> float:
    """The first water level that the normalized throughputs ``n`` (shape (n_jobs,)) reach: the
    largest ``t`` with ``n_i >= sigma_i W_e t`` for every job (every job active); water-filling's
    objective, for checking an answer."""
    tree = _hierarchy(problem, entity_policies)
    slope = tree.shares(np.ones(problem.num_jobs, dtype=bool)) * tree.entity_weights[tree.entity]
    return float((normalized[slope > 0] / slope[slope > 0]).min())


def _most_rate(problem: Problem, heterogeneity_aware: bool, space_sharing: bool) -> np.ndarray:
    """Most ``n_i / s_i`` per GPU-second over the ways job ``i`` can run (alone on each
    type, and in each pair under space sharing), shape (n_jobs,)."""
    if not heterogeneity_aware:  # n_i = s_i * time_i: one unit of n per GPU-second, however the job runs
        return np.ones(problem.num_jobs)
    p = problem.proportional_throughputs
    most = np.where(problem.runnable, problem.throughputs / p[:, None], -np.inf).max(axis=1)
    if space_sharing:
        for member in (0, 1):
            job = problem.pairs[:, member]
            np.maximum.at(most, job, (problem.pair_throughput_array[:, :, member] / p[job][:, None]).max(axis=1))
    return most


def _round_down(values: np.ndarray) -> np.ndarray:
    """``values`` rounded down to 24 significant bits (float32's), a relative step of at most 1.2e-7:
    the frozen levels of two solvers that differ in their last digits become the same number."""
    single = values.astype(np.float32)
    single = np.where(single.astype(np.float64) > values, np.nextafter(single, np.float32(-np.inf)), single)
    return single.astype(np.float64)


def _equilibrated(model: CompiledModel) -> tuple[CompiledModel, np.ndarray, np.ndarray]:
    """``model`` with each row, then each column, divided by about its largest coefficient (a power of
    2, so exactly), and those row and column factors."""
    def power(largest: np.ndarray) -> np.ndarray:
        return np.exp2(np.round(np.log2(np.where(largest > 0, largest, 1.0))))

    A = abs(model.A)
    rows = power(A.max(axis=1).toarray().ravel())
    cols = power((sp.diags(1.0 / rows) @ A).max(axis=0).toarray().ravel())
    A = (sp.diags(1.0 / rows) @ model.A @ sp.diags(1.0 / cols)).tocsr()
    return replace(model, A=A, row_lb=model.row_lb / rows, row_ub=model.row_ub / rows, col_lb=model.col_lb * cols,
                   col_ub=model.col_ub * cols, c=model.c / cols), rows, cols


def _unscaled(solution: Solution, scaled: CompiledModel, rows: np.ndarray, cols: np.ndarray) -> Solution:
    """The solution of :func:`_equilibrated`'s model in the original model's columns and rows."""
    if solution.x is None:
        return solution
    x = solution.x / cols
    values = {name: x[c].reshape(shape) for name, (c, shape) in scaled.variables.items()}
    duals = {}
    if solution.duals:
        y = np.zeros(rows.size)
        for name, (r, _) in scaled.constraints.items():
            y[r] = solution.duals[name].ravel()
        y /= rows
        duals = {name: y[r].reshape(shape) for name, (r, shape) in scaled.constraints.items()}
    return replace(solution, x=x, values=values, duals=duals)


def _gap(model: CompiledModel, solution: Solution) -> float:
    """How far the solution may be from the optimum of ``model`` (a maximization), relative to its
    objective: the point's largest violation of a bound (rows and columns) plus the gap between its
    objective and the upper bound its duals prove (weak duality; ``inf`` without duals or where the duals
    lean on an infinite bound)."""
    x, y = solution.x, np.zeros(model.num_rows)
    if not solution.duals:
        return np.inf
    for name, (rows, _) in model.constraints.items():
        y[rows] = solution.duals[name].ravel()
    Ax = model.A @ x
    violation = max(float(np.max(np.maximum(model.row_lb - Ax, Ax - model.row_ub), initial=0.0)),
                    float(np.max(np.maximum(model.col_lb - x, x - model.col_ub), initial=0.0)))
    z = model.c - model.A.T @ y  # reduced costs

    def most(multiplier: np.ndarray, value: np.ndarray, lb: np.ndarray, ub: np.ndarray) -> np.ndarray:
        # the most multiplier * v can be over lb <= v <= ub; at the point's value where the bound it leans
        # on is infinite and the multiplier is rounding noise (a free column's reduced cost: 1e-16)
        bound = np.where(multiplier > 0, ub, lb)
        noise = np.abs(multiplier) <= DUAL_NOISE
        return np.where(np.isfinite(bound), multiplier * np.where(np.isfinite(bound), bound, 0.0),
                        np.where(noise, multiplier * value, np.inf))

    objective = float(model.c @ x)
    bound = float(most(y, Ax, model.row_lb, model.row_ub).sum() + most(z, x, model.col_lb, model.col_ub).sum())
    return (violation + max(bound - objective, 0.0)) / max(abs(objective), 1.0)


def _value(expr: LinExpr, x: np.ndarray) -> np.ndarray:
    """Numeric value of ``expr`` at the column values ``x``."""
    return expr.A @ x[:expr.A.shape[1]] + expr.const


def _failed(message: str, backend: str) -> Solution:
    """The Solution of a solve the backend gave up on (it raised ``message``)."""
    return Solution(status=Status.ERROR, message=message, objective=None, x=None, backend=backend,
                    raw_status=message, build_seconds=0.0, solve_seconds=0.0)


def _feasible_point(problem: Problem, base: AllocationModel, solution: Solution, use: np.ndarray
                    ) -> tuple[np.ndarray, np.ndarray]:
    """The solution's columns with ``X`` (and ``P``) clipped to their bounds and
    scaled down just enough to meet the time and capacity rows exactly, and the
    GPUs of each type it leaves idle."""
    x = solution.x.copy()
    blocks = [(base.X, problem.runnable.astype(np.float64), use)]  # use: GPUs per unit of each row's time
    if base.P is not None:
        blocks.append((base.P, 1.0, problem.scale_factors[problem.pairs[:, 0]]))
    gpus = np.zeros(problem.cluster.num_gpu_types)
    for var, ub, scale in blocks:
        values = np.clip(x[var.columns].reshape(var.shape), 0.0, ub)
        x[var.columns] = values.ravel()
        gpus += scale @ values
    capacity = problem.capacity.astype(np.float64)
    load = np.divide(gpus, capacity, out=np.zeros_like(gpus), where=capacity > 0)
    used = max(1.0, float(_value(base.time, x).max()), float(load.max()))
    for var, _, _ in blocks:
        x[var.columns] /= used
    return x, np.maximum(capacity - gpus / used, 0.0)


class WaterFilling(Policy):
    """Hierarchical water-filling max-min fairness (see the module docstring)."""
    name = "water_filling"
    options = {"heterogeneity_aware": True, "space_sharing": False, "entity_policies": None,
               "aggregate_job_types": False, "exact": None}
    # The LPs start from the bases of this solve's own previous LPs; a basis from an earlier
    # allocation's last LPs (most jobs frozen) is a poor start for the first ones.
    warm_starts = False

    def allocate(self, problem: Problem, solver: ModelSolver, *, heterogeneity_aware: bool = True,
                 space_sharing: bool = False, entity_policies: Mapping[Any, str] | None = None,
                 aggregate_job_types: bool = False, exact: bool | None = None) -> PolicyResult:
        """Water-fill; ``entity_policies`` maps entity ids to ``"fairness"`` (default) or ``"fifo"``;
        ``aggregate_job_types`` solves by job class (:func:`water_filling_by_job_class`); ``exact``:
        the LPs in exact rational arithmetic (None: where they have at most ``EXACT_MAX_COLUMNS``
        columns and ``swiglpk`` is importable, with a warning where not; False: never, True: always;
        see Exact levels in the module docstring)."""
        if exact not in (None, True, False):
            raise InvalidOptionError(f"water_filling: exact must be None, True or False, got {exact!r}")
        if entity_policies is not None and not isinstance(entity_policies, Mapping):
            raise InvalidOptionError("entity_policies must be a dict {entity: 'fairness' | 'fifo'}, got "
                                     f"{type(entity_policies).__name__}")
        if space_sharing and problem.pairs is None:
            raise InvalidOptionError("space_sharing=True needs Problem(pair_throughputs=...): the throughput "
                                     "of each pair of jobs that may share GPUs")
        if aggregate_job_types:
            if space_sharing:
                raise InvalidOptionError("water_filling: aggregate_job_types does not support space_sharing; "
                                         "solve per job (aggregate_job_types=False)")
            return water_filling_by_job_class(problem, solver, heterogeneity_aware, entity_policies, exact)
        return _WaterFill(problem, solver, _hierarchy(problem, entity_policies), heterogeneity_aware,
                          space_sharing, exact=exact).run()


def job_classes(problem: Problem, entity_policies: Mapping[Any, str] | None = None
                ) -> tuple[np.ndarray, np.ndarray]:
    """Interchangeable jobs for water-filling without space sharing: the same throughput row, scale
    factor, priority weight and entity (a ``fifo`` entity's jobs, ranked by age, are each their own
    class). Returns the class of each job (n_jobs,) and the first job of each class (increasing)."""
    tree = _hierarchy(problem, entity_policies)
    entity = tree.entity if problem.entities is not None else np.zeros(problem.num_jobs)
    age = np.where(tree.fifo, tree.age_rank, -1)
    return group_rows(np.column_stack([problem.throughputs, problem.scale_factors, problem.priority_weights,
                                       entity, age]))


def water_filling_by_job_class(problem: Problem, solver: ModelSolver, heterogeneity_aware: bool = True,
                               entity_policies: Mapping[Any, str] | None = None, exact: bool | None = None
                               ) -> PolicyResult:
    """Water-filling over job classes (:func:`job_classes`), each class's row copied to its jobs.

    Permuting interchangeable jobs maps the problem onto itself, and its level vector is unique,
    so it is symmetric: averaging an optimal allocation over each class gives every job of the
    class the same row and the same levels. The class model is the per-job one on one job per class
    (its normalization ``p_i`` and levels per job, as they depend on the job's row and the capacity
    only) with each class's GPUs and entity shares counted once per member. ``extras`` adds
    ``type_of_job`` (n_jobs,) and ``num_job_types``.
    """
    of_job, rows = job_classes(problem, entity_policies)
    count = np.bincount(of_job, minlength=rows.size).astype(np.float64)
    classes = problem.subset(rows)
    result = _WaterFill(classes, solver, _hierarchy(classes, entity_policies, count), heterogeneity_aware,
                        False, count, exact).run()
    extras = {**result.extras, "levels": result.extras["levels"][of_job], "type_of_job": of_job,
              "num_job_types": int(rows.size)}
    return PolicyResult(result.matrix[of_job], result.objective, result.status, None,
                        f"{result.message} ({rows.size} job classes)", extras)


@dataclass
class _Level:
    """One level LP's optimum."""

    t: float  # the water level t*
    tau: float  # t* in the LP's units
    target: np.ndarray  # b_i(t*), capped at what the point achieves (0 for frozen jobs)
    dual_share: np.ndarray  # each row's share of tau's dual weight (they sum to 1)
    dual: np.ndarray  # each row's dual: the fall of tau per unit of its right-hand side
    weight: np.ndarray  # tau's coefficients in the LP
    rhs: np.ndarray  # the LP's right-hand sides


class _Lps:
    """The level and improvement LPs of a run, all one template with the same sparsity: job ``i``'s row
    ``n_i / r_i - a_i tau - epsilon d_i >= rhs_i`` (``t = tau t_unit``), patched per solve. On ``highs`` one
    HiGHS instance is changed in place, so each LP starts from the previous one's basis and factorization;
    other backends solve each LP from scratch."""

    def __init__(self, problem: Problem, solver: ModelSolver, n_of: Callable[[AllocationModel], LinExpr],
                 space_sharing: bool, count: np.ndarray | None = None, exact: bool | None = None):
        self.solver = solver
        base = base_model(problem, name="water_filling", space_sharing=space_sharing, multiplicity=count)
        n = n_of(base)
        tau = base.model.add_variable("water_level", lb=-np.inf)
        d = base.model.add_variable("improvement", n.size, lb=0.0, ub=0.0)
        base.model.add_constraint("level", n - tau * np.ones(n.size) - d * IMPROVEMENT >= 0.0)
        base.model.maximize(tau)
        self.base, self.n = base, n
        self.template = model = base.model.compile()
        self.tau_col, self.d_cols = tau.columns.start, d.columns
        rows = model.constraints["level"][0]
        A = model.A
        self.entries = slice(A.indptr[rows.start], A.indptr[rows.stop])
        self.entry_job = np.repeat(np.arange(n.size), np.diff(A.indptr[rows.start:rows.stop + 1]))
        cols = A.indices[self.entries]
        self.on_tau = cols == self.tau_col
        self.on_d = (cols >= d.columns.start) & (cols < d.columns.stop)
        self.on_n = ~self.on_tau & ~self.on_d
        # columns fixed at 0 (a type a job does not fit on) keep out of the rows: their throughputs
        # only widen the coefficient range
        A.data[self.entries][self.on_n & (model.col_ub[cols] == 0)] = 0.0
        self.level_rows = rows
        self.refinements = 0  # zoomed LPs solved by refine
        cvxpy_highs = solver.options.solver_options.get("solver", "HIGHS") == "HIGHS"  # cvxpy's solver
        self.defaults = {"highs": SOLVER_DEFAULTS, "scipy": TOLERANCES, "cvxpy": TOLERANCES if cvxpy_highs else {},
                         "pulp": CBC_TOLERANCES}
        backend = solver.backend
        # by default exact where small, unless the caller's time limit is below an exact LP's
        limit = solver.options.time_limit_s
        if exact is None:
            exact = model.num_cols <= EXACT_MAX_COLUMNS and (limit is None or limit >= EXACT_TIME_LIMIT_S)
            missing = GlpkExactBackend.unavailable_reason() if exact else None
            if missing is not None:  # a core dependency, missing where allocopt runs from a path, not installed
                logger.warning("water_filling: %s; its LPs are solved in floating point, without exact levels",
                               missing)
                exact = False
        if exact:
            GlpkExactBackend.check_installed()
        self.exact = bool(exact)
        self.exact_solves = 0
        self.exact_too_slow = False  # an exact LP reached EXACT_TIME_LIMIT_S
        last = _last_retries(backend, model.num_rows + model.num_cols) if backend != "cvxpy" or cvxpy_highs else ()
        self.session = _HighsSession(solver, last) if backend == "highs" and not self.exact else None
        last = [({backend: {**self.defaults.get(backend, {}), **options}}, False) for options in last]
        # HiGHS without presolve (scipy, cvxpy) right after the tight tolerances, as the highs backend solves
        early = 1 if backend in ("scipy", "cvxpy") else 0
        self.attempts = [(self.defaults, False), *last[:early], ({}, False), (self.defaults, True), *last[early:]]

    def model(self, rows: np.ndarray, weight: np.ndarray, rhs: np.ndarray, tau: float | None,
              candidates: np.ndarray | None, raise_unit: np.ndarray | None = None) -> CompiledModel:
        """The level LP (``tau`` None: maximize it) or the improvement LP of the mask ``candidates`` with
        ``tau`` fixed, for row scales ``rows``, tau's coefficients ``weight`` and right-hand sides ``rhs``;
        ``d_i = 1`` raises job ``i`` by ``IMPROVEMENT raise_unit_i`` (default: its row scale)."""
        tpl = self.template
        data = tpl.A.data.copy()
        level = data[self.entries]
        level[self.on_n] /= rows[self.entry_job[self.on_n]]
        level[self.on_tau] = -weight[self.entry_job[self.on_tau]]
        if raise_unit is not None:  # the candidates' only (the others' d is 0): few changes in place
            raised = self.on_d & (candidates > 0)[self.entry_job]
            level[raised] = -IMPROVEMENT * (raise_unit / rows)[self.entry_job[raised]]
        data[self.entries] = level
        row_lb = tpl.row_lb.copy()
        row_lb[self.level_rows] = rhs
        col_lb, col_ub, c = tpl.col_lb.copy(), tpl.col_ub.copy(), np.zeros_like(tpl.c)
        if tau is None:
            c[self.tau_col] = 1.0
        else:
            col_lb[self.tau_col] = col_ub[self.tau_col] = tau
            col_ub[self.d_cols] = candidates
            c[self.d_cols] = 1.0
        A = sp.csr_matrix((data, tpl.A.indices, tpl.A.indptr), shape=tpl.A.shape)
        return replace(tpl, A=A, row_lb=row_lb, col_lb=col_lb, col_ub=col_ub, c=c)

    def solve(self, model: CompiledModel, refine: bool = False, dual: bool = False) -> Solution:
        """Solve ``model``, whatever the status; with ``refine``, an optimal point not proved within ``EXACT``
        of the optimum by its duals is refined (:meth:`refine`); ``dual``: on ``highs``, by dual simplex from
        the previous LP's basis (else primal simplex)."""
        solution = self._solve_once(model, dual)
        for _ in range(REFINEMENTS if refine and not self.exact else 0):
            if solution.status is not Status.OPTIMAL or solution.x is None or _gap(model, solution) <= EXACT:
                break
            refined = self.refine(model, solution)
            if refined is None:
                break
            step, solution = refined
            if step <= REFINED:
                break
        return solution

    def refine(self, model: CompiledModel, solution: Solution) -> tuple[float, Solution] | None:
        """One round of iterative refinement: the same LP around the solution's point ``x``, zoomed
        ``ZOOM`` times (``x + dx / ZOOM``, every bound and the objective scaled by ``ZOOM``), so the
        solver's tolerances hold ``ZOOM`` times tighter. Returns the change of the objective (relative)
        and the refined solution, or None where the zoomed LP is not solved to optimality."""
        self.refinements += 1
        x = solution.x
        Ax = model.A @ x
        zoomed = replace(model, row_lb=ZOOM * (model.row_lb - Ax), row_ub=ZOOM * (model.row_ub - Ax),
                         col_lb=ZOOM * (model.col_lb - x), col_ub=ZOOM * (model.col_ub - x), c=ZOOM * model.c,
                         offset=0.0)
        correction = self._solve_once(zoomed, rescue=False)  # the point stands where it fails
        if correction.status is not Status.OPTIMAL or correction.x is None:
            return None
        x = x + correction.x / ZOOM
        objective = float(model.c @ x) + model.offset
        # the zoomed LP's objective is ZOOM c on dx = ZOOM (x' - x) and its bounds ZOOM times the room:
        # its duals (objective per unit of a bound) are ZOOM times the LP's own
        values = {name: x[c].reshape(shape) for name, (c, shape) in model.variables.items()}
        duals = {name: y / ZOOM for name, y in correction.duals.items()} if correction.duals else correction.duals
        step = abs(objective - solution.objective) / max(abs(objective), 1e-300)
        return step, replace(correction, x=x, values=values, objective=objective, duals=duals)

    def basis(self) -> Any:
        """The basis of the HiGHS instance changed in place (``highs``), else None."""
        session = self.session
        return None if session is None or session.handle is None else session.handle.getBasis()

    def set_basis(self, basis: Any) -> None:
        """The next LP starts from ``basis`` (of :meth:`basis`; None: from the last LP's)."""
        if basis is not None and self.session.handle is not None:
            self.session.handle.setBasis(basis)

    def _solve_once(self, model: CompiledModel, dual: bool = False, rescue: bool = True) -> Solution:
        if self.exact:
            solution = self._exact(model)
            if solution.status is Status.OPTIMAL:
                return solution
            if solution.status is Status.TIME_LIMIT:  # the next LPs, alike, would take as long
                self.exact = False
                self.exact_too_slow = True
            logger.info("water_filling: GLPK's exact simplex did not solve an LP (%s); %s solves it%s",
                        solution.message, self.solver.backend, "" if self.exact else " and the rest of the run")
        if self.session is not None:
            solution = self.session.solve(model, dual)
        else:
            A = model.A.copy()
            A.eliminate_zeros()
            stripped = replace(model, A=A)
            # where the tight tolerances fail, the solver's own, then the model equilibrated here (HiGHS
            # behind scipy and cvxpy found optima on it that it missed on the model as it is), then the
            # backend's _last_retries
            for defaults, scaled in self.attempts:
                solution = self._solve(stripped, defaults, scaled)
                if not _trouble(solution, self.solver):
                    break
            solution = self.solver.record(solution)
        return self._rescue(model, solution) if rescue and _trouble(solution, self.solver) else solution

    def _rescue(self, model: CompiledModel, solution: Solution) -> Solution:
        """``model``, which the backend failed on in every setting, by GLPK's exact simplex where it has not
        tried and is installed; its solution where optimal, else ``solution``. Before the callers' own
        fallbacks (a level LP's rows scaled otherwise, wider give): the LP as it is, answered exactly."""
        if self.exact or self.exact_too_slow or not GlpkExactBackend.is_installed():
            return solution
        exact = self._exact(model)
        logger.info("water_filling: %s did not solve an LP (%s); GLPK's exact simplex: %s",
                    self.solver.backend, solution.message, exact.message)
        return exact if exact.status is Status.OPTIMAL else solution

    def _exact(self, model: CompiledModel) -> Solution:
        """``model`` by GLPK's exact simplex (recorded where optimal)."""
        options = SolveOptions(time_limit_s=EXACT_TIME_LIMIT_S, verbose=self.solver.options.verbose)
        solution = GlpkExactBackend().solve(model, options)
        if solution.status is Status.INFEASIBLE:
            # the levels, floors and fixed tau the rows hold are exact optima rounded to doubles, a unit
            # in the last place above them at times: once more with the level rows EXACT_SLACK lower
            row_lb = model.row_lb.copy()
            row_lb[self.level_rows] -= EXACT_SLACK
            solution = GlpkExactBackend().solve(replace(model, row_lb=row_lb), options)
        if solution.status is Status.OPTIMAL:
            self.exact_solves += 1
            self.solver.record(solution)
        return solution

    def _solve(self, model: CompiledModel, defaults: Mapping[str, Any], scaled: bool) -> Solution:
        rows = cols = None
        if scaled:
            model, rows, cols = _equilibrated(model)
        try:
            solution = solve_model(model, self.solver.backend, self.solver.options, defaults)
        except (SolverError, ValueError) as err:  # the solver gave up on the model (cvxpy raises
            return _failed(str(err), self.solver.backend)  # ValueError for an unknown status)
        return solution if rows is None else _unscaled(solution, model, rows, cols)


class _HighsSession:
    """One HiGHS instance whose model is changed in place between solves (``highs`` backend)."""

    def __init__(self, solver: ModelSolver, last_retries: tuple[dict[str, Any], ...]):
        from allocopt.backends.highs import HighsBackend

        self.solver, self.backend = solver, HighsBackend()
        self.options = replace(solver.options, solver_options={**SOLVER_DEFAULTS, **solver.options.solver_options})
        self.fresh_options = replace(solver.options, solver_options={**TOLERANCES, **solver.options.solver_options})
        self.retries = (*RETRIES, (last_retries[0], True))
        self.ipm_options = replace(solver.options, solver_options={**TOLERANCES, **last_retries[1],
                                                                   **solver.options.solver_options})
        self.handle: Any = None
        self.last: CompiledModel | None = None

    def solve(self, model: CompiledModel, dual: bool = False) -> Solution:
        """Solve ``model`` (a maximization), changing the previous one in place (``dual``: by dual simplex)."""
        t0 = time.perf_counter()
        low = replace(model, c=-model.c, sense="min")  # HiGHS gets the minimization form
        if self.last is not None:
            self._change(low)
            if dual and "simplex_strategy" not in self.options.solver_options:
                self.handle.setOptionValue("simplex_strategy", 1)
        else:
            large = low.num_cols >= PRIMAL_FIRST
            if large:
                self.options = replace(self.options, solver_options={PERTURBATION: 0.0,
                                                                     **self.options.solver_options})
            self.handle = self.backend.build(low, self.options)
            if large and "simplex_strategy" not in self.options.solver_options:
                self.handle.setOptionValue("simplex_strategy", 4)
        self.last = low
        t1 = time.perf_counter()
        raw = self._run(low)
        for retry, from_scratch in self.retries if raw.status is not Status.OPTIMAL else ():
            # numerical trouble: again, with other settings and algorithms
            if set(retry) & set(self.solver.options.solver_options) or retry.get(PERTURBATION) == \
                    self.options.solver_options.get(PERTURBATION, 1.0):
                continue  # not where the caller chose that option, nor the setting the LP already had
            if from_scratch:
                self.handle.clearSolver()
            self._set(retry)
            raw = self._run(low)
            self._set({key: self.options.solver_options.get(key, HIGHS_OWN.get(key)) for key in retry})
            if raw.status is Status.OPTIMAL:
                break
        t2 = time.perf_counter()
        if raw.status is not Status.OPTIMAL:  # last, a fresh HiGHS with its own defaults (scaling, presolve)
            self.last = None  # and the next solve starts afresh too
            # tight tolerances, then its own, then interior point (with crossover: HiGHS's simplex fails in
            # every setting on some ill-conditioned level LPs its interior point method solves exactly)
            for options in (self.fresh_options, self.solver.options, self.ipm_options):
                try:
                    solution = self.backend.solve(model, options)
                except SolverError as err:
                    solution = _failed(str(err), "highs")
                if not _trouble(solution, self.solver):
                    break
            return self.solver.record(solution)
        return self.solver.record(self.backend._to_solution(model, raw, t1 - t0, t2 - t1))

    def _set(self, options: Mapping[str, Any]) -> None:
        for key, value in options.items():
            self.handle.setOptionValue(key, value)

    def _run(self, model: CompiledModel) -> RawResult:
        try:
            return self.backend.run(self.handle, model, self.options)
        except SolverError as err:
            return RawResult(Status.ERROR, raw_status=str(err))

    def _change(self, new: CompiledModel) -> None:
        h, old = self.handle, self.last
        A = new.A
        changed = np.flatnonzero(A.data != old.A.data)
        rows = np.searchsorted(A.indptr, changed, side="right") - 1
        for row, col, value in zip(rows.tolist(), A.indices[changed].tolist(), A.data[changed].tolist()):
            h.changeCoeff(row, col, value)  # (HiGHS has no call for many coefficients at once)
        rows = np.flatnonzero((new.row_lb != old.row_lb) | (new.row_ub != old.row_ub))
        if rows.size:
            if hasattr(h, "changeRowsBounds"):
                h.changeRowsBounds(rows.size, rows.astype(np.int32), new.row_lb[rows], new.row_ub[rows])
            else:  # older highspy has no batch call for row bounds
                for row in rows.tolist():
                    h.changeRowBounds(row, float(new.row_lb[row]), float(new.row_ub[row]))
        cols = np.flatnonzero((new.col_lb != old.col_lb) | (new.col_ub != old.col_ub))
        if cols.size:
            h.changeColsBounds(cols.size, cols.astype(np.int32), new.col_lb[cols], new.col_ub[cols])
        cols = np.flatnonzero(new.c != old.c)
        if cols.size:
            h.changeColsCost(cols.size, cols.astype(np.int32), new.c[cols])
        # a changed model keeps its basis: primal simplex goes on from a point that is still feasible
        if "simplex_strategy" not in self.options.solver_options:
            h.setOptionValue("simplex_strategy", 4)


class _WaterFill:
    """The state of one water-filling run: frozen jobs, their levels, and the last exactly feasible point."""

    def __init__(self, problem: Problem, solver: ModelSolver, tree: _Hierarchy, heterogeneity_aware: bool,
                 space_sharing: bool, count: np.ndarray | None = None, exact: bool | None = None):
        self.problem, self.solver, self.tree = problem, solver, tree
        self.heterogeneity_aware = heterogeneity_aware
        n_jobs, s = problem.num_jobs, problem.scale_factors.astype(np.float64)
        self.scale = s / problem.proportional_throughputs if heterogeneity_aware else s
        self.alone = self.scale[:, None] * (problem.throughputs if heterogeneity_aware else problem.runnable)
        self.most = s * _most_rate(problem, heterogeneity_aware, space_sharing)  # u_i
        self.frozen = np.zeros(n_jobs, dtype=bool)
        self.level = np.zeros(n_jobs)  # L_i of frozen jobs, in units of n
        self.floor = np.zeros(n_jobs)  # what frozen jobs hold in later LPs: (1 - give_way) L_i, or less
        self.iterations = 0
        self.cap_probes = 0  # level LPs of fill_caps
        self.cap_misses = self.cap_skips = 0  # fill_caps runs ended at their first probe in a row; chances to skip
        self.solves_before = solver.num_solves
        # an exactly feasible start: every job gets the same fraction of every type
        self.use = s if count is None else s * count  # GPUs per unit of a row's time (its jobs together)
        fraction = problem.capacity / max(float(problem.capacity.sum()), float(self.use.sum()))
        self.achieved = (self.alone * problem.runnable) @ fraction
        self.lps = _Lps(problem, solver, self._n_of, space_sharing, count, exact)
        # EXACT_GIVE_WAY while the LPs are exact, else GIVE_WAY (WIDER_GIVE_WAY after numerical trouble)
        self.give_way = EXACT_GIVE_WAY if self.lps.exact else GIVE_WAY
        self.rows: np.ndarray | None = None  # r_i
        self.plain_rows = False  # r_i = u_i (after numerical trouble)
        self.t_unit = np.inf
        self.last: tuple[Solution, np.ndarray] | None = None

    @property
    def rise(self) -> float:
        """What a job must be able to rise by (relative to its scale) to stay active."""
        return EXACT_RISE if self.lps.exact else RISE

    @property
    def dual_tol(self) -> float:
        """A row's dual above this certifies its job stuck."""
        return 0.0 if self.lps.exact else DUAL_TOL

    @property
    def cap_reached(self) -> float:
        """A cap probe succeeds when its level is within this (relative) of the probed cap."""
        return EXACT_RISE if self.lps.exact else CAP_REACHED

    def _n_of(self, base: AllocationModel) -> LinExpr:
        return (base.throughput if self.heterogeneity_aware else base.time) * self.scale

    def _point(self, solution: Solution) -> np.ndarray:
        """The solution's exactly feasible point; records it, what it achieves and what it leaves idle."""
        base = self.lps.base
        x, self.idle_gpus = _feasible_point(self.problem, base, solution, self.use)
        self.achieved = _value(self.lps.n, x)
        self.idle_time = np.maximum(1.0 - _value(base.time, x), 0.0)
        self.last = solution, x
        return x

    def rising(self, scale: np.ndarray) -> np.ndarray:
        """Jobs the current point proves able to rise by more than :attr:`rise` of their ``scale``
        with nothing else changed: idle time of theirs on a type with idle GPUs."""
        problem = self.problem
        room = np.minimum(self.idle_gpus[None, :] / self.use[:, None], self.idle_time[:, None])
        gain = (self.alone * np.where(problem.runnable, room, 0.0)).max(axis=1)
        return gain > self.rise * scale

    # ----- one level ------------------------------------------------------------------
    def level_lp(self, slope: np.ndarray, offset: np.ndarray, positive: np.ndarray, refine: bool = True
                 ) -> _Level | None:
        """Solve the level LP (None if it stopped short of optimal under ``best_effort``), with ``refine``
        as :meth:`_Lps.solve`."""
        # t = t_low + tau t_unit, where the current point reaches t_low: row i reads
        # n_i / r_i - (slope_i t_unit / r_i) tau >= b_i(t_low) / r_i. The unit of t and the row scales
        # follow the level within a factor RESCALE, so few coefficients change from one LP to the next.
        t_low = float(((self.achieved + offset)[positive] / slope[positive]).min())
        low_target = np.where(positive, slope * t_low - offset, 0.0)
        # a job's scale: its target, or what the level itself is worth to it (a target starting at 0)
        wanted = np.where(self.frozen, self.level,
                          np.where(positive, np.maximum(low_target, slope * t_low), self.most))
        wanted = np.clip(wanted, (1.0 if self.plain_rows else MIN_ROW_SCALE) * self.most, self.most)
        if self.rows is None:
            self.rows = wanted
        self.rows = np.where((wanted > RESCALE * self.rows) | (self.rows > RESCALE * wanted), wanted, self.rows)
        rows = self.rows
        # t's unit: the rise that lifts the most sensitive job by its row scale (tau's coefficients <= 1)
        unit = float((rows[positive] / slope[positive]).min())
        if not 1 / RESCALE <= unit / self.t_unit <= RESCALE:
            self.t_unit = unit
        weight = np.where(positive, slope * self.t_unit / rows, 0.0)
        rhs = np.where(self.frozen, self.floor, low_target) / rows
        model = self.lps.model(rows, weight, rhs, None, None)
        solution = self.lps.solve(model, refine=refine)
        if solution.status is Status.INFEASIBLE and self.frozen.any():
            # the floors are at most what the last point achieved, but that float sum can exceed what
            # is achievable by a few units in the last place (an LP infeasible by 6e-17 in exact
            # arithmetic, which scipy's HiGHS reported so): once more with them 8 units lower
            floor = self.floor * (1.0 - 8 * np.finfo(float).eps)
            model = self.lps.model(rows, weight, np.where(self.frozen, floor, low_target) / rows, None, None)
            solution = self.lps.solve(model, refine=refine)
            if not _trouble(solution, self.solver):
                self.floor = floor
        if _trouble(solution, self.solver) and not self.plain_rows:
            # rows scaled by their targets can be too badly conditioned (targets far below u_i):
            # rows scaled by u_i instead, coefficients at most 1, for the rest of the run
            self.plain_rows = True
            return self.level_lp(slope, offset, positive, refine)
        if _trouble(solution, self.solver) and self.give_way < WIDER_GIVE_WAY and self.frozen.any():
            # still no answer (the frozen levels can leave a sliver of room only): they give way more,
            # for the rest of the run
            self.give_way = WIDER_GIVE_WAY
            self.floor = np.minimum(self.floor, (1.0 - WIDER_GIVE_WAY) * self.level)
            return self.level_lp(slope, offset, positive, refine)
        solution = self.solver.check(solution, f"water_filling level LP of iteration {self.iterations}")
        self._point(solution)
        if solution.status is not Status.OPTIMAL:  # best_effort: stop here
            return None
        tau = float(solution.values["water_level"])
        t = t_low + tau * self.t_unit
        dual = -solution.duals["level"]
        dual_share = dual * weight
        target = np.where(positive, np.minimum(np.maximum(low_target + slope * self.t_unit * tau, 0.0),
                                               self.achieved), 0.0)
        return _Level(t, tau, target, dual_share, dual, weight, rhs)

    def active_give(self, active: np.ndarray) -> float:
        """What each active job gives way by (relative to its target) while another is tested for a rise:
        ``give_way`` shared among the other active jobs, so that however many they are, together they
        free no more than one frozen level's give (rows of job classes count each of their jobs)."""
        jobs = float(active.sum() if self.tree.count is None else self.tree.count[active].sum())
        return self.give_way / max(jobs - 1.0, 1.0)

    def stuck(self, level: _Level, jobs: np.ndarray, scale: np.ndarray) -> np.ndarray:
        """The jobs of the mask ``jobs`` unable to rise above their targets by :attr:`rise` of their ``scale``
        while every other active job keeps its target and every frozen one its floor, less the give
        (improvement LPs, see the module docstring)."""
        candidates = jobs.copy()
        for _ in range(MAX_IMPROVEMENT_LPS):
            # the other active jobs give way (active_give)
            others = ~self.frozen & ~candidates
            rhs = level.rhs - np.where(others, self.active_give(~self.frozen) * level.target / self.rows, 0.0)
            model = self.lps.model(self.rows, level.weight, rhs, level.tau, candidates.astype(np.float64), scale)
            solution = self.lps.solve(model)
            if solution.status is not Status.OPTIMAL:  # no conclusion: the jobs stay active
                break
            raised = solution.values["improvement"] * IMPROVEMENT > self.rise
            if not (candidates & raised).any():
                return candidates
            candidates &= ~raised
            if not candidates.any():
                break
        return np.zeros_like(jobs)

    # ----- the whole run ---------------------------------------------------------------
    def run(self) -> PolicyResult:
        tree, first_level = self.tree, None
        while not self.frozen.all():
            self.iterations += 1
            if self.give_way < GIVE_WAY and not self.lps.exact:  # the exact LPs stopped at their time limit
                self.give_way = GIVE_WAY
                self.floor = np.minimum(self.floor, _round_down((1.0 - GIVE_WAY) * self.level))
            active = ~self.frozen
            share = tree.shares(active)
            positive = active & (share > 0)
            frozen_levels = self.level if tree.count is None else self.level * tree.count
            held = np.bincount(tree.entity[self.frozen], frozen_levels[self.frozen], minlength=tree.num_entities)
            slope, offset = share * tree.entity_weights[tree.entity], share * held[tree.entity]
            if first_level is None:
                self.first_slope = np.where(positive, slope, 0.0)
            level = self.level_lp(slope, offset, positive)
            if level is None:
                return self.result(first_level, "stopped")
            first_level = level.t if first_level is None else first_level
            target = level.target
            # what a rise is measured against: the target (at least MIN_ROW_SCALE u_i), u_i at a share of 0
            scale = np.clip(np.where(positive, target, self.most), MIN_ROW_SCALE * self.most, self.most)
            # a row with a positive dual is tight in every optimum, and its job cannot rise by `rise` even
            # where the other active jobs give way when the duals say so: the LP's optimum is concave in
            # its right-hand sides, so it is at most tau* - dual_i rise_i + sum_{j != i} dual_j give_j
            rise = self.rise * scale / self.rows
            give = np.where(active, self.active_give(active) * target / self.rows * level.dual, 0.0)
            certain = active & (level.dual > self.dual_tol) & (level.dual * rise > 2.0 * (give.sum() - give))
            tight = active & (self.achieved <= target + self.rise * scale) & ~self.rising(scale)
            undecided = (tight | (active & (level.dual > self.dual_tol))) & ~certain
            if undecided.any():
                certain |= self.stuck(level, undecided, scale)
            if not certain.any():  # the row of largest dual weight holds t up: tight in every optimum
                certain[np.flatnonzero(positive)[np.argmax(level.dual_share[positive])]] = True
            self._freeze(certain, target)
            capped = certain & (target >= (1.0 - self.cap_reached) * self.most)
            if self.problem.entities is None and capped.any():
                if self.cap_skips:
                    self.cap_skips -= 1
                else:
                    self.fill_caps()
        self.restore()
        return self.result(first_level, "done")

    def _freeze(self, jobs: np.ndarray, target: np.ndarray) -> None:
        """Freeze the jobs of the mask ``jobs`` at their ``target``."""
        self.level[jobs] = target[jobs]
        given = (1.0 - self.give_way) * target[jobs]
        self.floor[jobs] = given if self.lps.exact else _round_down(given)
        self.frozen |= jobs
        # the floors the current point holds (all but solver noise), so every LP has a feasible point
        self.floor[self.frozen] = np.minimum(self.floor[self.frozen], self.achieved[self.frozen])

    def fill_caps(self) -> None:
        """Freeze, in a few LPs, the run of active jobs whose own caps ``u_i`` set the next levels (without
        entities: each job's target is ``w_i t``, so its cap is the level ``c_i = u_i / w_i``).

        Where the level ``c`` is feasible with every active job at ``min(w_i t, u_i)``, each job of cap at most
        ``c`` holds ``u_i`` in the lexicographic max-min vector (were one below, the feasible vector
        ``min(w_i c, u_i)`` would raise it at the cost only of jobs above level ``c``), so it is frozen there.
        A probe of the ``m`` lowest caps tests that level for ``c_m``:
        a level LP from the current level ``t_0`` in which those jobs' targets follow the chord of
        ``min(w_i t, u_i)`` from ``t_0`` to ``c_m`` (below it in between, ``u_i`` at ``c_m``), so it reaches ``c_m``
        exactly when the level is feasible, and where it stops short its level bounds the run: no cap above
        it is feasible. Probes of ``m`` = 2, 4, 8, ... jobs, then of every job up to the last failed probe's
        bound (halving the interval where the bound does not). A failed probe leaves the run as it was."""
        weight = self.tree.entity_weights[self.tree.entity]
        jobs = np.flatnonzero(~self.frozen)
        order = jobs[np.argsort(self.most[jobs] / weight[jobs], kind="stable")]
        caps = self.most[order] / weight[order]
        n = order.size
        done, step, failed = 0, 2, n + 1  # order[:done] frozen at their caps; the probe of order[:failed] fails
        halve = False  # the last failed probe's bound did not halve its interval
        while done < n:
            if failed > n:
                m = min(done + step, n)
            else:
                m = (done + failed) // 2 if halve else failed - 1
            if m <= done:
                break
            level = self._cap_probe(order[done:m], float(caps[m - 1]))
            if level is None:
                done, step = m, 2 * step
                continue
            reached = int(np.searchsorted(caps[done:m], level * (1.0 + self.cap_reached), side="right"))
            bound = min(m, done + reached + 1)
            halve = 2 * (bound - done) > m - done
            failed = bound
        # a run that ended at its first probe: the next runs are likely short too, so skip as many
        # chances as such runs have ended in a row (1, 2, 3, ...), and start again after a success
        self.cap_misses = self.cap_misses + 1 if done == 0 else 0
        self.cap_skips = self.cap_misses

    def _cap_probe(self, candidates: np.ndarray, cap: float) -> float | None:
        """One probe of :meth:`fill_caps`: freezes ``candidates`` at their caps where the level ``cap`` is feasible
        (returns None), else returns the probe's level."""
        self.cap_probes += 1
        active = ~self.frozen
        mask = np.zeros_like(active)
        mask[candidates] = True
        weight = self.tree.entity_weights[self.tree.entity]
        start = float((self.achieved[active] / weight[active]).min())  # t_0: the level the point reaches
        held = mask & (self.most / weight <= start)  # the point holds them at their caps already (as cap)
        if held.any():
            self._freeze(held, np.minimum(self.most, self.achieved))
            mask &= ~held
            candidates = np.flatnonzero(mask)
            active = ~self.frozen
            if not mask.any():
                return None
        slope = np.where(active, weight, 0.0)
        slope[candidates] = (self.most[candidates] - weight[candidates] * start) / (cap - start)
        offset = np.where(mask, (slope - weight) * start, 0.0)
        saved = self.last, self.achieved, self.idle_gpus, self.idle_time
        basis = self.lps.basis()
        # unrefined: the probe decides at CAP_REACHED, far above the solver's tolerances, and a job it
        # freezes holds its cap, known exactly, less the give
        level = self.level_lp(slope, offset, active, refine=False)
        if level is not None and level.t >= (1.0 - self.cap_reached) * cap:
            self._freeze(mask, level.target)
            return None
        self.last, self.achieved, self.idle_gpus, self.idle_time = saved
        self.lps.set_basis(basis)  # the next LP starts from the basis before the probe
        return -np.inf if level is None else level.t

    def restore(self) -> None:
        """Where the point holds jobs below their levels (within the give) and the room is free, one more
        LP raises them all by a common fraction: max lambda <= 1 with ``n_i >= lambda L_i`` for every job, so
        the answer does not depend on where in the give a solver's point lies."""
        if not (self.achieved < self.level * (1.0 - RESTORE_TOL)).any():
            return
        model = self.lps.model(self.rows, self.level / self.rows, np.zeros_like(self.rows), None, None)
        col_ub = model.col_ub.copy()
        col_ub[self.lps.tau_col] = 1.0
        # dual simplex: from the last level LP's basis it took a fifth of primal simplex's time (2,048 jobs)
        solution = self.lps.solve(replace(model, col_ub=col_ub), refine=True, dual=True)
        if solution.status is Status.OPTIMAL:  # otherwise the last level LP's point stands
            self._point(solution)

    def result(self, first_level: float | None, how: str) -> PolicyResult:
        solution, x = self.last
        base = self.lps.base
        X = x[base.X.columns].reshape(base.X.shape)
        if how == "done":  # trim each job's time alone down to its level
            excess, own = self.achieved - self.level, (self.alone * X).sum(axis=1)
            X = X * (1.0 - np.clip(np.divide(excess, own, out=np.zeros_like(own), where=own > 0), 0.0, 1.0)
                     )[:, None]
            status, message = Status.OPTIMAL, f"Optimal water-filling allocation: {self.iterations} levels."
        else:
            status = solution.status
            message = f"{solution.message} (water-filling stopped at iteration {self.iterations})"
        P = None if base.P is None else clean_matrix(x[base.P.columns].reshape(base.P.shape))
        levels = np.minimum(self.level, self.achieved) if how == "done" else self.level  # what X attains
        if how == "done":  # the first level X attains: t*_1, less the give of its jobs' levels
            first = self.first_slope > 0
            first_level = min(first_level, float((levels[first] / self.first_slope[first]).min()))
        extras = {"levels": levels / self.problem.priority_weights, "num_iterations": self.iterations,
                  "num_cap_probes": self.cap_probes, "num_refinements": self.lps.refinements,
                  "num_lp_solves": self.solver.num_solves - self.solves_before,
                  "num_exact_lp_solves": self.lps.exact_solves}
        return PolicyResult(clean_matrix(X), first_level, status, P, message, extras)
