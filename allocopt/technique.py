"""Which exact technique solves a policy's model fastest, chosen from cheap statistics.

:func:`allocopt.solve` takes ``technique="auto"`` by default and records the
choice and its reason in ``Allocation.extras["technique"]`` and
``extras["technique_reason"]``. Every technique reaches the same optimum:

``plain``
    the policy's LP as written (HiGHS: interior point with crossover on large LPs).
``closed_form``
    an optimum read off the data and certified by a dual bound
    (:mod:`allocopt.formulations.closed_forms`): max-min fairness when the
    job with the lowest best-type throughput decides the optimum (the
    per-job time limit binds, not capacity), max throughput when every job
    fits on its best type. When the certificate fails, the LP is solved.
``aggregate_job_types``
    one LP row per job type (:mod:`allocopt.formulations.job_types`), when
    jobs repeat (jobs drawn from a throughput table); for water-filling, its
    LPs over job classes (:func:`~allocopt.formulations.water_filling.water_filling_by_job_class`).
``price_decomposition``
    prices on the GPU types, then a small LP over the jobs they leave
    undecided (:mod:`allocopt.formulations.price_decomposition`; max throughput:
    :mod:`allocopt.formulations.throughput_prices`), for many distinct jobs and
    few types; falls back to the plain LP when it does not certify quickly.
``column_generation``
    pair columns priced by the duals (space sharing with distinct jobs).
``relaxation_first`` / ``whole_milp`` / ``dynamic_programming``
    Sia's MILP by GPU prices and fixing, whole, or by dynamic programming
    over the GPUs in use of each type (small clusters).
``milp`` / ``genetic``
    Pollux's objective (``p < 0``) as an exact MILP over shapes and nodes, or
    Pollux's own NSGA-II search (:mod:`allocopt.formulations.pollux_genetic`, needs pymoo).

``auto`` rules, in order: technique options the caller set explicitly are
kept; for ``water_filling``, ``aggregate_job_types`` (by job class) when there
are at most half as many classes as jobs and no space sharing, else ``plain``; a certified closed form; ``aggregate_job_types`` when there are at most
half as many job types as jobs; ``price_decomposition`` for at least
:data:`PRICE_DECOMPOSITION_MIN_JOBS` distinct jobs on at most
:data:`PRICE_DECOMPOSITION_MAX_TYPES` types, unless a warm start from a plain
solve is given (its simplex basis makes the plain LP the faster re-solve);
for max throughput (after the closed form and job types, without deadlines),
``price_decomposition`` from the same size (from a warm start's GPU prices when
it carries them);
``column_generation`` under space sharing with more than
:data:`COLUMN_GENERATION_MIN_PAIRS` pairs; else ``plain``. For ``sia``,
``dynamic_programming`` up to :data:`DYNAMIC_PROGRAMMING_MAX_WORK` states
times entries (the rounds Sia's simulator gives on its 64-GPU cluster), else
``relaxation_first``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from allocopt.errors import InvalidOptionError
from allocopt.formulations.base import PolicyResult
from allocopt.goodput_problem import GoodputProblem
from allocopt.problem import Problem

#: Technique names :func:`allocopt.solve` accepts, and the policies each applies to.
TECHNIQUES: Mapping[str, tuple[str, ...]] = {
    "auto": (),
    "plain": ("max_min_fairness", "max_throughput", "water_filling"),
    "closed_form": ("max_min_fairness", "max_throughput"),
    "aggregate_job_types": ("max_min_fairness", "max_throughput", "water_filling"),
    "price_decomposition": ("max_min_fairness", "max_throughput"),
    "column_generation": ("max_min_fairness",),
    "relaxation_first": ("sia",),
    "whole_milp": ("sia",),
    "dynamic_programming": ("sia",),
    "milp": ("pollux",),
    "genetic": ("pollux",),
}
#: Policy options that select a technique (an explicit value keeps ``auto`` from choosing; ``gavel_program``:
#: Gavel's own cvxpy LP, :mod:`allocopt.formulations.gavel_programs`).
TECHNIQUE_OPTIONS = ("aggregate_job_types", "price_decomposition", "column_generation", "relaxation_first",
                     "dynamic_programming", "gavel_program", "genetic")
#: ``auto`` takes price decomposition from this many distinct jobs up (below, the plain LP is as fast).
PRICE_DECOMPOSITION_MIN_JOBS = 1024
PRICE_DECOMPOSITION_MAX_TYPES = 32
COLUMN_GENERATION_MIN_PAIRS = 20_000
#: ``auto`` solves Sia's MILP by dynamic programming up to this many states times entries (Sia's 64-GPU
#: cluster, 10,625 states, and its simulator's rounds of up to ~20 jobs: ~2 million; a few ms).
DYNAMIC_PROGRAMMING_MAX_WORK = 10_000_000


@dataclass
class Choice:
    """A technique, the policy options that select it, why, and a certified closed-form result if any."""

    technique: str
    options: dict[str, Any] = field(default_factory=dict)
    reason: str = ""
    result: PolicyResult | None = None


def _options_for(technique: str, policy_options: Mapping[str, Any]) -> dict[str, Any]:
    """Policy options that select ``technique`` (the others' switched off); ``policy_options``
    holds every option of the policy (defaults included)."""
    options = {name: name == technique for name in TECHNIQUE_OPTIONS
               if name in policy_options and name != "relaxation_first"}
    if "relaxation_first" in policy_options:
        options["relaxation_first"] = technique != "whole_milp"
    return options


def choose(problem: Any, policy: str, policy_options: Mapping[str, Any], explicit: Mapping[str, Any],
           technique: str = "auto", warm_start: Any = None) -> Choice:
    """The technique for ``policy`` on ``problem``.

    ``policy_options`` are the policy's options with defaults, ``explicit``
    those the caller passed; ``warm_start`` the Allocation given as warm start.
    Raises InvalidOptionError for an unknown technique or one that does not
    apply to the policy or its options.
    """
    if technique not in TECHNIQUES:
        raise InvalidOptionError(f"unknown technique {technique!r}; choose one of {', '.join(TECHNIQUES)}")
    if technique != "auto":
        if policy not in TECHNIQUES[technique]:
            raise InvalidOptionError(f"technique {technique!r} applies to {', '.join(TECHNIQUES[technique])}, "
                                     f"not {policy!r}; use technique='auto' or 'plain'")
        clash = sorted(k for k in explicit if k in TECHNIQUE_OPTIONS)
        if clash:
            raise InvalidOptionError(f"technique={technique!r} and the option(s) {clash} both pick a technique; "
                                     "give one of them")
        choice = Choice(technique, _options_for(technique, policy_options), "asked for by name")
        if technique == "closed_form":
            choice = _closed_form(problem, policy, policy_options) or Choice(
                "plain", _options_for("plain", policy_options),
                "closed_form asked for, but its certificate does not hold on this problem: solved the LP")
        return choice
    given = sorted(k for k in explicit if k in TECHNIQUE_OPTIONS)
    if given:
        return Choice("explicit", {}, f"technique option(s) {', '.join(given)} given")
    if policy == "sia":
        from allocopt.formulations.sia import state_space

        work = state_space(problem) * int(problem.valid.sum()) if isinstance(problem, GoodputProblem) else None
        if work is not None and work <= DYNAMIC_PROGRAMMING_MAX_WORK:
            return Choice("dynamic_programming", _options_for("dynamic_programming", policy_options),
                          f"Sia's MILP on a small cluster: dynamic programming over its {state_space(problem):,} "
                          "counts of GPUs in use")
        return Choice("relaxation_first", {}, "Sia's MILP: GPU prices, then a MILP over the undecided entries")
    if policy == "pollux":
        return Choice("milp", _options_for("milp", policy_options),
                      "Pollux's objective for p < 0: an exact MILP over shapes and nodes (the genetic search "
                      "only on request)")
    if policy == "water_filling" and isinstance(problem, Problem):
        return _water_filling(problem, policy_options)
    if policy not in ("max_min_fairness", "max_throughput") or not isinstance(problem, Problem):
        return Choice("plain", {}, f"{policy} has one technique")
    closed = _closed_form(problem, policy, policy_options)
    if closed is not None:
        return closed
    from allocopt.formulations.job_types import job_type_groups

    space_sharing = bool(policy_options.get("space_sharing"))
    n, k = problem.num_jobs, problem.cluster.num_gpu_types
    deadlines = policy == "max_throughput" and problem.slos is not None and bool(np.isfinite(problem.slos).any())
    types = n if deadlines else int(job_type_groups(problem, space_sharing=space_sharing)[1].size)
    if types <= n / 2:
        return Choice("aggregate_job_types", _options_for("aggregate_job_types", policy_options),
                      f"{n} jobs fall into {types} job types")
    priced = _throughput_prices(problem, policy, policy_options, warm_start)
    if priced is not None:
        return priced
    warm_plain = warm_start is not None and getattr(warm_start, "extras", {}).get("technique") == "plain"
    if policy == "max_min_fairness" and not space_sharing:
        pricing = n >= PRICE_DECOMPOSITION_MIN_JOBS and k <= PRICE_DECOMPOSITION_MAX_TYPES
        hints = warm_start.warm_start.hints if warm_start is not None and warm_start.warm_start else {}
        if pricing and len(hints.get("prices", ())) == k:
            # a few cutting-plane steps from the previous prices and a small LP: 2-3x faster than the
            # warm simplex after throughput or capacity changes, where the basis needs a pivot per job
            return Choice("price_decomposition", _options_for("price_decomposition", policy_options),
                          f"warm start: price decomposition from the previous GPU prices ({n} distinct jobs "
                          f"on {k} GPU types)")
        if warm_plain:
            return Choice("plain", _options_for("plain", policy_options),
                          "warm start from a plain solve: its simplex basis makes the LP a few pivots")
        if pricing:
            return Choice("price_decomposition", _options_for("price_decomposition", policy_options),
                          f"{n} distinct jobs on {k} GPU types, capacity contended")
    if (policy == "max_min_fairness" and space_sharing and problem.pairs is not None
            and problem.pairs.shape[0] > COLUMN_GENERATION_MIN_PAIRS):
        return Choice("column_generation", _options_for("column_generation", policy_options),
                      f"{problem.pairs.shape[0]} pairs of distinct jobs")
    return Choice("plain", _options_for("plain", policy_options), f"{n} distinct jobs, {k} GPU types")


def _throughput_prices(problem: Any, policy: str, options: Mapping[str, Any], warm_start: Any) -> Choice | None:
    """Price decomposition for max throughput without deadlines or space sharing over at least
    :data:`PRICE_DECOMPOSITION_MIN_JOBS` jobs on at most :data:`PRICE_DECOMPOSITION_MAX_TYPES` types,
    from a warm start's prices when it has them; None otherwise. Cold, 1,024-65,536 distinct jobs x 8
    types on every bench family: 2.6-74x faster than the plain LP (same objective). From the previous
    prices after an arrival, a departure, new throughputs or a capacity change: one cutting-plane step
    and one or two small LPs, where the warm simplex refactorizes the whole basis (2,048 jobs x 8
    types: 9-26 ms against 25-37 ms)."""
    if policy != "max_throughput" or not isinstance(problem, Problem) or options.get("space_sharing"):
        return None
    if (problem.slos is not None and bool(np.isfinite(problem.slos).any())) or (
            options.get("normalize_by_cost") and problem.costs is None):
        return None
    n, k = problem.num_jobs, problem.cluster.num_gpu_types
    if n < PRICE_DECOMPOSITION_MIN_JOBS or k > PRICE_DECOMPOSITION_MAX_TYPES:
        return None
    hints = warm_start.warm_start.hints if warm_start is not None and warm_start.warm_start else {}
    why = ("warm start: price decomposition from the previous GPU prices" if len(hints.get("prices", ())) == k
           else "price decomposition")
    return Choice("price_decomposition", _options_for("price_decomposition", options),
                  f"{why} ({n} distinct jobs on {k} GPU types)")


def _water_filling(problem: Problem, options: Mapping[str, Any]) -> Choice:
    """Water-filling by job class where at most half as many classes as jobs, else per job."""
    n = problem.num_jobs
    if options.get("space_sharing"):
        return Choice("plain", _options_for("plain", options), "water-filling with space sharing: per job")
    if not isinstance(options.get("entity_policies") or {}, Mapping):  # the policy reports it
        return Choice("plain", _options_for("plain", options), "water-filling per job")
    from allocopt.formulations.water_filling import job_classes

    classes = int(job_classes(problem, options.get("entity_policies"))[1].size) if n else 0
    if classes <= n / 2:
        return Choice("aggregate_job_types", _options_for("aggregate_job_types", options),
                      f"{n} jobs fall into {classes} classes (same throughputs, scale factor, weight, entity): "
                      "water-filling over classes")
    return Choice("plain", _options_for("plain", options), f"{n} jobs in {classes} classes: water-filling per job")


def _closed_form(problem: Any, policy: str, options: Mapping[str, Any]) -> Choice | None:
    """A certified closed-form optimum as a Choice, or None."""
    if not isinstance(problem, Problem) or options.get("space_sharing"):
        return None
    from allocopt.formulations.closed_forms import max_min_fairness_closed_form, max_throughput_closed_form

    if policy == "max_min_fairness":
        from allocopt.formulations.max_min_fairness import normalized_coefficients

        a = normalized_coefficients(problem, bool(options.get("heterogeneity_aware", True))) * problem.runnable
        result = max_min_fairness_closed_form(problem, a)
        why = "the per-job time limit decides the optimum: every job reaches the lowest best-type level"
    elif policy == "max_throughput":
        has_deadline = problem.slos is not None and bool(np.isfinite(problem.slos).any())
        if has_deadline or (options.get("normalize_by_cost") and problem.costs is None):
            return None
        value = problem.throughputs / (problem.costs if options.get("normalize_by_cost") else 1.0)
        result = max_throughput_closed_form(problem, value * problem.runnable)
        why = "every job fits on its best GPU type"
    else:
        return None
    return None if result is None else Choice("closed_form", {}, why + " (certified by the dual bound)", result)


def technique_extras(choice: Choice, extras: Mapping[str, Any]) -> dict[str, str]:
    """``technique`` and ``technique_reason`` for a result's extras (a price decomposition that
    did not certify and fell back to the plain LP is reported as ``plain``)."""
    fallback = extras.get("price_decomposition")
    if choice.technique == "price_decomposition" and isinstance(fallback, Mapping) and not fallback.get("certified"):
        return {"technique": "plain",
                "technique_reason": f"{choice.reason}; price decomposition did not certify quickly: solved the LP"}
    return {"technique": choice.technique, "technique_reason": choice.reason}
