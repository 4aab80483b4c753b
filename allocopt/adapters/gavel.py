"""Drop-in replacement for Gavel's policy objects, for Gavel's unmodified scheduler.

``get_policy(name, solver=None, seed=None, priority_reweighting_policies=None)``
has the signature of Gavel's ``utils.get_policy`` and returns an object whose
``name`` is the name of Gavel's policy class (``MaxMinFairness_Perf``,
``FinishTimeFairness_Packing``, ``AlloX_Perf``, ...: Gavel's ``scheduler.py``
picks the argument list, packing and worker-type shuffling from it) and whose
``get_allocation`` takes that class's argument list (nested dicts keyed by job
id and worker type) and returns ``{job_id: {worker_type: fraction}}``,
computed by :func:`allocopt.solve`. The module also exports Gavel's class
names with their constructors (``MaxMinFairnessPolicyWithPerf(solver)``,
``GandivaPolicy(seed=None)``, ``AlloXPolicy(alpha=1.0)``, ...), so a shim
``policies`` package can stand in for Gavel's (``benchmarks/conformance_gavel.py``).

Public methods: ``get_allocation``, ``name``,
``get_allocation_using_job_type_throughputs`` (``MaxMinFairness_Packing``) and
``get_throughputs`` (the isolated share's throughputs, as Gavel's
``IsolatedPolicy``). Gavel's model-building helpers (``flatten``,
``unflatten``, ``get_base_constraints``, ``get_allocation_helper``,
``convert_job_type_allocation``) build its cvxpy expressions and have no
counterpart. Measured against Gavel's own tests and simulator: see
``docs/how-to/reproduce-gavel.md``.

Job ids may be any hashable (Gavel's ``JobIdPair`` included). Packing policies
and ``gandiva`` read pairs from the same throughputs dict: a key that is a
2-tuple of job ids or a Gavel ``JobIdPair`` whose values are ``[tput_a, tput_b]``
per worker type; their time fractions come back under the same key.

``solver``: an allocopt backend name (``"highs"``, ``"gurobi"``, ...) or a cvxpy
solver name as Gavel passes them (``"ECOS"``, ``"SCS"``, ``"HIGHS"``, ...), which runs
through the ``cvxpy`` backend with that solver; ``"GUROBI"`` uses the native
Gurobi backend. None means ``"highs"`` (Gavel's default is ECOS). With a cvxpy
solver, finish-time fairness is one conic program, as Gavel solves it, written
as Gavel's code writes it (``method="conic_gavel"``; ``method="conic"`` for
``finish_time_fairness_packed``), so ECOS returns Gavel's point of a
degenerate optimum to the last bit; with an LP backend it is a bisection over
LPs. Likewise ``max_min_fairness``, ``max_min_fairness_perf``,
``max_sum_throughput_perf``, ``max_sum_throughput_normalized_by_cost_perf``
and, with ``faithful_bisection=True``, ``min_total_duration`` and
``min_total_duration_perf`` with a cvxpy solver are Gavel's LPs as Gavel
writes them (``gavel_program=True``).
``"highs"`` solves Gavel's LP policies (max-min fairness, max-sum throughput,
finish-time fairness, min total duration: :data:`CENTRAL_POINT_POLICIES`)
with HiGHS's interior point without crossover (:data:`HIGHS_IPM`,
``solver_options={"solver": "ipm", "run_crossover": "off"}``; ``"highs-ipm"``
forces it for every policy): where an LP has many optima it returns a point
inside the optimal face, as ECOS does, where dual simplex (``"highs-simplex"``,
and HiGHS's default for the other policies) returns a vertex, and Gavel's
mechanism turns different optima into different JCTs. In Gavel's simulator on
its 92 physical-cluster cases this brought the adapter with HiGHS within 1% of
Gavel with ECOS on 68 cases against 51 with dual simplex (within 5%: 79
against 78); see ``docs/how-to/reproduce-gavel.md``. ``last_allocation.extras["solver_path"]``
records the choice.

State kept between calls, as Gavel's policies keep it
------------------------------------------------------
* ``finish_time_fairness*``: each job's cumulative isolated time
  (``_cumulative_isolated_time``) grows by the steps it made since the previous
  call divided by its isolated throughput at that call; it is the job's
  ``Problem.time_isolated``. An empty call forgets the previous call (not the
  cumulative times), as Gavel does.
* ``allox``: a job that held a whole GPU keeps it until it leaves; only the
  other jobs are matched, to the GPUs left (Gavel's ``_prev_allocation``).
* ``fifo`` (Gavel's base mode): a job keeps its worker type until it
  completes; a completed job's GPUs go first to the head of the queue.
  ``fifo_perf`` and ``fifo_packed`` recompute every call, as Gavel does.
* ``gandiva``: pairs, once formed, stay until a member leaves or the pair's
  normalized throughput (summed over worker types) falls below 1; jobs left
  unpaired are paired at random with Python's ``random.Random(seed)``, drawn
  exactly as Gavel draws them, so a seed reproduces Gavel's pairing.

Differences from Gavel, by design (allocopt's documented semantics)
-------------------------------------------------------------------
* Jobs never get time on a GPU type where their throughput is 0 (Gavel's
  isolated and Gandiva shares and its agnostic policies may give it; its
  mechanism then never runs the job there). ``faithful_agnostic=True`` plans
  the agnostic policies (``max_min_fairness``, ``finish_time_fairness``,
  ``min_total_duration``) as Gavel's do, on every type at the V100 speed.
* ``fifo``: Gavel's base mode draws a random worker type but then uses the
  last available type in name order (a bug: the variable it draws is never
  read); the adapter assigns a type drawn at random among those with room,
  seeded from ``seed``. Pass ``FIFOPolicy(faithful_type_choice=True)`` for
  Gavel's behaviour. Gavel also hands a completed job's GPUs to the queue's head
  before subtracting the GPUs of running jobs with higher ids, so it can assign
  more GPUs of a type than exist (an over-commit); the adapter subtracts every
  running job first, except with ``faithful_type_choice=True``.
* ``*_SLOs``: when SLOs cannot all be met the policy minimizes the total
  deadline shortfall (with a warning) instead of silently dropping every SLO.
* ``min_total_duration*`` is one exact LP instead of a bisection that stops
  within 5% (``faithful_bisection=True``, or ``MinTotalDurationPolicyWithPerf(solver,
  faithful_bisection=True)``, runs Gavel's bisection); water-filling detects bottlenecks exactly instead of with a MILP
  and a 1.0001 slack.
* ``seed=None`` means seed 0 for ``gandiva`` and ``fifo`` (Gavel draws an
  unseeded generator): the adapter is deterministic.
* ``max_min_fairness_packed`` solves jobs of different scale factors (Gavel's
  fails: its per-job constraint reshape assumes every job has as many pairs).
* Gavel's ``FinishTimeFairnessPolicyWithPerf`` returns the isolated
  allocation when its solver fails; the adapter warns and returns the
  solver's answer (:class:`~allocopt.errors.AllocoptWarning`).
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping

from allocopt.errors import UnknownPolicyError
from allocopt.formulations.gavel_policies import (CENTRAL_POINT_POLICIES, GAVEL_CLASS_NAMES, HIGHS_IPM,
                                                  HIGHS_IPM_REASON, POLICY_NAMES, SIGNATURES, STATEFUL_POLICIES,
                                                  Allocation, GavelPolicy, gavel_agnostic_throughputs,
                                                  highs_options_for)

__all__ = ["CENTRAL_POINT_POLICIES", "GAVEL_CLASSES", "GAVEL_CLASS_NAMES", "HIGHS_IPM", "HIGHS_IPM_REASON",
           "POLICY_NAMES", "SIGNATURES", "STATEFUL_POLICIES", "Allocation", "GavelPolicy", "gavel_agnostic_throughputs",
           "get_policy", "highs_options_for"]


def get_policy(policy_name: str, solver: str | None = None, seed: int | None = None,
               priority_reweighting_policies: Mapping[Hashable, str] | None = None) -> GavelPolicy:
    """The allocopt implementation of Gavel's policy ``policy_name``, with the signature
    of Gavel's ``utils.get_policy``; ``allox_alpha=A`` sets AlloX's alpha as Gavel's does."""
    alpha = None
    if policy_name.startswith("allox_alpha="):
        try:
            alpha = float(policy_name.split("allox_alpha=", 1)[1])
        except ValueError:
            raise UnknownPolicyError(f"unknown Gavel policy {policy_name!r}: allox_alpha= needs a number") from None
        policy_name = "allox"
    if policy_name not in POLICY_NAMES:
        raise UnknownPolicyError(f"unknown Gavel policy {policy_name!r}; allocopt implements "
                                 f"{', '.join(sorted(POLICY_NAMES))}")
    return GavelPolicy(policy_name, solver, seed, priority_reweighting_policies, alpha=alpha)


def _gavel_class(class_name: str, policy_name: str, params: str) -> type:
    """A subclass of :class:`GavelPolicy` with Gavel's class name and constructor."""
    constructors = {
        "solver": lambda self, solver=None: GavelPolicy.__init__(self, policy_name, solver),
        "none": lambda self: GavelPolicy.__init__(self, policy_name),
        "seed": lambda self, seed=None: GavelPolicy.__init__(self, policy_name, seed=seed),
        "allox": lambda self, alpha=1.0: GavelPolicy.__init__(self, policy_name, alpha=alpha),
        "fifo": lambda self, mode="base", seed=None, packing_threshold=1.5, faithful_type_choice=False: (
            GavelPolicy.__init__(self, {"base": "fifo", "perf": "fifo_perf", "packing": "fifo_packed"}[mode],
                                 seed=seed, faithful_type_choice=faithful_type_choice,
                                 packing_threshold=packing_threshold if mode == "packing" else None)),
        "duration": lambda self, solver=None, faithful_bisection=False: GavelPolicy.__init__(
            self, policy_name, solver, faithful_bisection=faithful_bisection),
        "agnostic": lambda self, solver=None, faithful_agnostic=False: GavelPolicy.__init__(
            self, policy_name, solver, faithful_agnostic=faithful_agnostic),
        "fifo_perf": lambda self, packing=False: GavelPolicy.__init__(self, policy_name),
        "fifo_packing": lambda self, packing_threshold=1.5: GavelPolicy.__init__(
            self, policy_name, packing_threshold=packing_threshold),
        "water_filling": lambda self, priority_reweighting_policies=None: GavelPolicy.__init__(
            self, policy_name, priority_reweighting_policies=priority_reweighting_policies),
    }
    doc = f"Gavel's ``{class_name}`` (policy ``{policy_name}``), computed by allocopt."
    return type(class_name, (GavelPolicy,), {"__init__": constructors[params], "__doc__": doc,
                                             "__module__": __name__})


# Gavel's class names and constructors (``policies/*.py``), for shims standing in for Gavel's package
GAVEL_CLASSES: dict[str, tuple[str, str, str]] = {  # class -> (Gavel module, policy name, constructor)
    "AlloXPolicy": ("allox", "allox", "allox"),
    "FIFOPolicy": ("fifo", "fifo", "fifo"),
    "FIFOPolicyWithPerf": ("fifo", "fifo_perf", "fifo_perf"),
    "FIFOPolicyWithPacking": ("fifo", "fifo_packed", "fifo_packing"),
    "FinishTimeFairnessPolicy": ("finish_time_fairness", "finish_time_fairness", "agnostic"),
    "FinishTimeFairnessPolicyWithPerf": ("finish_time_fairness", "finish_time_fairness_perf", "solver"),
    "FinishTimeFairnessPolicyWithPacking": ("finish_time_fairness", "finish_time_fairness_packed", "solver"),
    "GandivaPolicy": ("gandiva", "gandiva", "seed"),
    "IsolatedPolicy": ("isolated", "isolated", "none"),
    "MaxMinFairnessPolicy": ("max_min_fairness", "max_min_fairness", "agnostic"),
    "MaxMinFairnessPolicyWithPerf": ("max_min_fairness", "max_min_fairness_perf", "solver"),
    "MaxMinFairnessPolicyWithPacking": ("max_min_fairness", "max_min_fairness_packed", "solver"),
    "MaxMinFairnessWaterFillingPolicy": ("max_min_fairness_water_filling", "max_min_fairness_water_filling",
                                         "water_filling"),
    "MaxMinFairnessWaterFillingPolicyWithPerf": ("max_min_fairness_water_filling",
                                                 "max_min_fairness_water_filling_perf", "water_filling"),
    "MaxMinFairnessWaterFillingPolicyWithPacking": ("max_min_fairness_water_filling",
                                                    "max_min_fairness_water_filling_packed", "water_filling"),
    "ThroughputSumWithPerf": ("max_sum_throughput", "max_sum_throughput_perf", "solver"),
    "ThroughputNormalizedByCostSumWithPerf": ("max_sum_throughput", "max_sum_throughput_normalized_by_cost_perf",
                                              "solver"),
    "ThroughputNormalizedByCostSumWithPerfSLOs": ("max_sum_throughput",
                                                  "max_sum_throughput_normalized_by_cost_perf_SLOs", "solver"),
    "ThroughputNormalizedByCostSumWithPackingSLOs": ("max_sum_throughput",
                                                     "max_sum_throughput_normalized_by_cost_packed_SLOs", "solver"),
    "MinTotalDurationPolicy": ("min_total_duration", "min_total_duration", "duration"),
    "MinTotalDurationPolicyWithPerf": ("min_total_duration", "min_total_duration_perf", "duration"),
    "MinTotalDurationPolicyWithPacking": ("min_total_duration", "min_total_duration_packed", "duration"),
}
globals().update({name: _gavel_class(name, policy, params) for name, (_, policy, params) in GAVEL_CLASSES.items()})
