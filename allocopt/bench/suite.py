"""What the benchmark suite runs: policies, instance kinds, techniques, families and the targets.

Everything here is data. A new switchable technique (a policy option that
changes how the same optimum is reached) is one :class:`Technique` line in
:data:`TECHNIQUES`, as ``price_decomposition`` is.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from allocopt.bench import instances
from allocopt.errors import InvalidOptionError


@dataclass(frozen=True)
class Instance:
    """A generated problem, the policy options it needs, and a one-line description."""

    problem: Any
    options: Mapping[str, Any]
    description: str


def gavel_instance(policy: BenchPolicy, kind: str, n_jobs: int, n_gpu_types: int, seed: int) -> Instance:
    """Random distinct jobs, jobs drawn from Gavel's table (with every pair under space sharing), or an
    instance of a family (:data:`allocopt.bench.instances.FAMILIES`, its own GPU types)."""
    if kind in instances.FAMILIES and kind not in INSTANCE_KINDS:
        description, generate = instances.FAMILIES[kind]
        return Instance(generate(n_jobs, seed), {}, f"{n_jobs} jobs, {description}")
    if kind == "table":
        space_sharing = bool(policy.options.get("space_sharing"))
        problem = instances.table_problem(n_jobs, n_gpu_types, seed, space_sharing=space_sharing)
        pairs = f", {problem.pairs.shape[0]} pairs" if space_sharing else ""
        return Instance(problem, {}, f"{n_jobs} jobs from Gavel's table{pairs}")
    return Instance(instances.random_problem(n_jobs, n_gpu_types, seed), {}, f"{n_jobs} distinct random jobs")


def water_filling_instance(policy: BenchPolicy, kind: str, n_jobs: int, n_gpu_types: int, seed: int) -> Instance:
    """Random jobs in 8 entities, and the entities' policies as the ``entity_policies`` option."""
    problem, policies = instances.water_filling_problem(n_jobs, n_gpu_types, seed=seed)
    return Instance(problem, {"entity_policies": policies},
                    f"{n_jobs} jobs in {len(problem.entity_ids)} entities (fifo and fairness)")


def sia_instance(policy: BenchPolicy, kind: str, n_jobs: int, n_gpu_types: int, seed: int) -> Instance:
    """The first Sia round of ``n_jobs`` jobs on saturn scaled to them (``kind="steady"``: the next round,
    most jobs with a previous configuration), from Sia's scale workloads when ``$ALLOCOPT_SHARED_DATA``
    holds them."""
    steady = kind == "steady"
    rounds, source = instances.sia_rounds(n_jobs, seed, steady=steady, data_dir=instances.data_dir())
    problem = rounds["steady" if steady else "first"]
    return Instance(problem, {}, f"{n_jobs} jobs ({source}), {int(problem.cluster.capacity.sum())} GPUs, "
                                 f"{problem.num_configurations} configurations")


@dataclass(frozen=True)
class BenchPolicy:
    """A benchmarked policy: the allocopt policy and fixed options, the instance kinds it runs on
    (``random`` and/or ``table``), the largest instance it is run at, and what its baseline is."""

    name: str
    policy: str
    instances: tuple[str, ...]
    baseline: str
    options: Mapping[str, Any] = field(default_factory=dict)
    gpu_types: tuple[int, ...] | None = None  # the numbers of GPU types it runs on; None: any
    max_jobs: int | None = None  # None: any size
    generator: Callable[[BenchPolicy, str, int, int, int], Instance] = field(
        default=gavel_instance, repr=False)  # (policy, kind, jobs, types, seed) -> Instance

    def unsupported(self, kind: str, n_gpu_types: int) -> str | None:
        """Why this policy does not run on ``kind`` instances with ``n_gpu_types`` types, or None."""
        if kind not in self.instances:
            return f"{self.name} runs on {' and '.join(self.instances)} instances, not {kind}"
        if self.gpu_types is not None and n_gpu_types not in self.gpu_types:
            return f"{self.name} runs on {' or '.join(map(str, self.gpu_types))} GPU types, not {n_gpu_types}"
        if kind == "table" and n_gpu_types > len(instances.GAVEL_GPU_TYPES):
            return (f"{self.name} on table instances runs on at most {len(instances.GAVEL_GPU_TYPES)} GPU types "
                    f"(Gavel's table measures {', '.join(instances.GAVEL_GPU_TYPES)}), not {n_gpu_types}")
        return None

    def instance(self, kind: str, n_jobs: int, n_gpu_types: int, seed: int) -> Instance:
        """The seeded instance of this policy for ``kind`` at ``n_jobs`` x ``n_gpu_types``."""
        return self.generator(self, kind, n_jobs, n_gpu_types, seed)


@dataclass(frozen=True)
class Technique:
    """A switchable technique: policy options that reach the same optimum another way."""

    name: str
    options: Mapping[str, Any]
    policies: tuple[str, ...]  # BenchPolicy names it applies to; () for every policy


ALL: tuple[str, ...] = ()

#: Techniques, in the order they are run. ``auto`` is ``allocopt.solve``'s default (it picks one of the
#: others from the problem), ``plain`` the policy's model as written.
TECHNIQUES: tuple[Technique, ...] = (
    Technique("auto", {}, ALL),
    Technique("plain", {"technique": "plain"}, ("max_min_fairness", "max_throughput", "mmf_space_sharing")),
    Technique("closed_form", {"technique": "closed_form"}, ("max_min_fairness", "max_throughput")),
    Technique("aggregate_job_types", {"aggregate_job_types": True},
              ("max_min_fairness", "max_throughput", "mmf_space_sharing")),
    Technique("column_generation", {"column_generation": True}, ("mmf_space_sharing",)),
    Technique("price_decomposition", {"price_decomposition": True}, ("max_min_fairness",)),
    Technique("whole_milp", {"technique": "whole_milp", "mip_gap": 0.0}, ("sia",)),  # exact, as auto is
)

#: The benchmarked policies, by name.
POLICIES: Mapping[str, BenchPolicy] = MappingProxyType({p.name: p for p in (
    BenchPolicy("max_min_fairness", "max_min_fairness", ("random", "table"), "Gavel max_min_fairness_perf"),
    BenchPolicy("max_throughput", "max_throughput", ("random", "table"), "Gavel max_sum_throughput_perf"),
    BenchPolicy("min_makespan", "min_makespan", ("random",), "one LP: max theta, e_i >= r_i theta"),
    BenchPolicy("water_filling", "water_filling", ("random",), "Gavel WaterFillingAlgorithm (LP + MILP)",
                generator=water_filling_instance),
    BenchPolicy("mmf_space_sharing", "max_min_fairness", ("table",), "Gavel MaxMinFairnessPolicyWithPacking",
                options={"space_sharing": True}, max_jobs=2048),
    BenchPolicy("sia", "sia", ("random",), "Sia's MILP (presolve off, as allocopt)", gpu_types=(3,),
                generator=sia_instance),
    BenchPolicy("finish_time_fairness", "finish_time_fairness", ("random",),
                "Gavel finish_time_fairness_perf (SOCP, CLARABEL)"),
)})

INSTANCE_KINDS = ("random", "table")

#: ``solver_options`` per allocopt backend: the cvxpy backend runs HiGHS, like the baselines (cvxpy's own
#: default is GUROBI whenever gurobipy is installed, whose pip license caps models at 2,000 variables).
BACKEND_SOLVER_OPTIONS: Mapping[str, Mapping[str, Any]] = MappingProxyType({"cvxpy": {"solver": "HIGHS"}})


def techniques_for(policy: str, names: tuple[str, ...] | None = None) -> list[Technique]:
    """The techniques that apply to ``policy`` (of ``names`` when given, else all)."""
    return [t for t in TECHNIQUES if (not t.policies or policy in t.policies) and (names is None or t.name in names)]


def get_policy(name: str) -> BenchPolicy:
    """The benchmarked policy called ``name``; InvalidOptionError naming the known ones otherwise."""
    try:
        return POLICIES[name]
    except KeyError:
        raise InvalidOptionError(f"--policies: unknown benchmark policy {name!r}; choose from "
                                 f"{', '.join(POLICIES)}") from None


@dataclass(frozen=True)
class Target:
    """A speed target: ``policy`` on ``kind`` at ``n_jobs`` x ``n_gpu_types`` on highs end to end
    (``Allocation.timings.total_s``, instance generation excluded) within ``limit_s`` with ``allocopt.solve``'s
    defaults (technique ``auto``); its other techniques, but ``exclude`` (technique -> why it is not
    run), are measured next to it."""

    name: str
    policy: str
    kind: str
    n_jobs: int
    n_gpu_types: int
    limit_s: float
    exclude: Mapping[str, str] = field(default_factory=dict)

    def techniques(self) -> list[Technique]:
        """The techniques the target is measured with (all of its policy's but ``exclude``)."""
        return [t for t in techniques_for(self.policy) if t.name not in self.exclude]


_NO_TYPES = "every job is its own type: nothing to aggregate"
TARGETS: tuple[Target, ...] = (
    *(Target(f"max-min fairness, 65,536 jobs, 8 types, family {family}", "max_min_fairness", family, 65536, 8, 2.0,
             {"aggregate_job_types": _NO_TYPES, "closed_form": "auto tries it first"})
      for family in ("uniform", "oversubscribed", "undersubscribed", "random")),
    Target("max-min fairness, 65,536 jobs, 3 types of 2, 64 and 512 GPUs", "max_min_fairness", "unequal", 65536, 3,
           2.0, {"aggregate_job_types": _NO_TYPES, "closed_form": "auto tries it first"}),
    Target("max-min fairness, 100,000 jobs from the 26-model table, 3 types", "max_min_fairness", "table",
           100000, 3, 0.5, {"plain": "the per-job LP is not meant for this target (job types repeat)",
                            "price_decomposition": "auto aggregates job types first",
                            "closed_form": "auto tries it first"}),
    Target("space-sharing max-min fairness, 2,048 single-GPU jobs, all pairs, 3 types, exact", "mmf_space_sharing",
           "table", 2048, 3, 10.0, {"plain": "the pairwise LP over all 2,096,128 pairs has 6.3M columns"}),
    Target("water-filling, 2,048 jobs, 8 entities", "water_filling", "random", 2048, 3, 2.0),
    Target("sia, 5,120 jobs on 2,048 GPUs, fresh round", "sia", "random", 5120, 3, 0.5),
    Target("sia, 5,120 jobs on 2,048 GPUs, steady-state round", "sia", "steady", 5120, 3, 0.5),
)
