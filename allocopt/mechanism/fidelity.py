"""Fidelity profiles: the switches that make allocopt's simulator follow another system's simulator.

allocopt's simulator has its own model of a cluster (:data:`FIDELITY_PROFILES` ``"allocopt"``, every
switch off). Reproducing Gavel's or Sia's published numbers needs that system's own choices instead,
some of them accidents of its code (a job planned on a GPU type where it cannot run, profiles read
with the system's rounding, a calibrated slowdown). A :class:`Fidelity` groups those choices as
named fields; each preset turns on the fields of one system:

========== ==========================================================================================
``allocopt`` allocopt's own model (the default)
``gavel``    Gavel's simulator (``scheduler.py``, ``simulate_scheduler_with_trace.py``): its
             accounting, its solver paths and its policies' planning rules, for Gavel's policy
             names (``gavel:NAME``)
``sia``      Sia's simulator (``siasosp23/artifacts``, ``sia-simulator``): its job model (throughput
             learning, epoch-wise batch-size choice), calibration, placement and MILP rounding
========== ==========================================================================================

:func:`allocopt.simulate` and ``allocopt simulate --fidelity NAME`` take a preset name, a
:class:`Fidelity`, or a mapping ``{"profile": NAME, FIELD: VALUE, ...}`` that overrides fields of a
preset; ``Fidelity.preset("sia", packed_placement=False)`` does the same in Python.
``docs/explanation/fidelity.md`` says what each field changes and by how much.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields, replace
from typing import Any

from allocopt.errors import InvalidOptionError


@dataclass(frozen=True)
class Fidelity:
    """Which simulator's modelling choices a simulation follows; every field off is allocopt's model.

    Attributes
    ----------
    profile : str
        The preset these fields started from (``"allocopt"``, ``"gavel"``, ``"sia"``); informational.

    Gavel's simulator (policies over an :class:`allocopt.Problem`):

    pair_finishes_at_lease_end : bool
        A co-located job is recorded finished when its pair's lease ends, not when its steps are done
        (:class:`~allocopt.mechanism.priority.MechanismOptions`).
    running_type_totals : bool
        Gavel's per-type running totals of received time (:class:`~allocopt.mechanism.priority.MechanismOptions`).
    agnostic_on_every_type : bool
        Gavel's heterogeneity-agnostic policies (``gavel:max_min_fairness``, ``gavel:finish_time_fairness``,
        ``gavel:min_total_duration``) plan every GPU type at the job's V100 speed, also a type where the
        job cannot run (that time is lost); allocopt never plans such time. The policy option
        ``faithful_agnostic``.
    gavel_programs : bool
        With the cvxpy backend, Gavel's LPs and its finish-time-fairness conic program written as Gavel
        writes them (``gavel_program=True``, ``method="conic_gavel"``), so a solver such as ECOS returns
        Gavel's point of a degenerate optimum.
    min_total_duration_bisection : bool
        ``min_total_duration*``: Gavel's bisection over feasibility LPs, which stops within 5%
        (``min_makespan``'s ``method="bisection"``), instead of allocopt's exact LP.
    fifo_type_choice : bool
        ``gavel:fifo``: Gavel's worker-type choice (the last type with room in name order, and its
        over-commit), not a seeded random type among those with room.
    highs_interior_point : bool
        With the HiGHS backend, Gavel's LP policies are solved by HiGHS's interior point without
        crossover, a point inside the optimal face as ECOS returns, not dual simplex's vertex.

    Sia's simulator (policy ``sia`` on a Sia workload with profiles):

    sia_profile_numbers : bool
        Read profile directories as Sia's simulator reads them
        (:func:`~allocopt.throughput.profiles.load_profiles` ``sia_numbers=True``).
    sia_node_cap : bool
        Sia's simulator's cap on the nodes one configuration may span
        (:data:`~allocopt.mechanism.sia_rounds.SIA_SIMULATOR_MAX_NODES`).
    explore_replicas, learn_throughputs, round_grid, sia_stepping, cap_policy_batch, packed_placement : bool
        The :class:`~allocopt.mechanism.sia_rounds.SiaPlanner` options of those names.
    sia_slowdowns : bool
        Sia's simulator's calibration slowdowns (:data:`~allocopt.mechanism.sia_rounds.SIA_SIMULATOR_SLOWDOWNS`).
    sia_restore_times : bool
        Sia's simulator's restart costs (:data:`~allocopt.mechanism.sia_rounds.SIA_SIMULATOR_RESTORE_S`).
    sia_milp_rounding : bool
        Sia's MILP's utility rounding, clip and tie-break (``utility_decimals=2, utility_clip=3000,
        prefer_later=True``).
    sia_virtual_nodes : bool
        Policy ``pollux`` as Sia's simulator runs it (``pollux_unaware.py``): the policy sees every node
        split into nodes of the smallest node's GPU count (``virtual_node_gpus`` of
        :class:`~allocopt.mechanism.pollux_rounds.PolluxPlanner`); jobs still run on the real nodes.
    sia_unaware_job_model : bool
        Policy ``pollux`` with Sia's heterogeneity-unaware jobs (``Job(h_unaware=True)`` of Sia's
        ``job.py``, as its ``multi_simulator_unaware.py`` builds them): each job has one throughput
        model, fitted to every step time it measured whatever the GPU type (the first measurement of a
        (nodes, GPUs, micro-batch) point kept), and the policy's speedups take the batch-size limits
        of the ``aws`` application (:data:`~allocopt.mechanism.pollux_rounds.SIA_UNAWARE_REFERENCE_TYPE`),
        not the requested batch size (``unaware_job_model`` of
        :class:`~allocopt.mechanism.pollux_rounds.PolluxPlanner`). Off: a model per (job, GPU type), the
        policy's speedups from the first type the job measured.
    """

    profile: str = "allocopt"
    # Gavel's simulator
    pair_finishes_at_lease_end: bool = False
    running_type_totals: bool = False
    agnostic_on_every_type: bool = False
    gavel_programs: bool = False
    min_total_duration_bisection: bool = False
    fifo_type_choice: bool = False
    highs_interior_point: bool = False
    # Sia's simulator
    sia_profile_numbers: bool = False
    sia_node_cap: bool = False
    explore_replicas: bool = False
    learn_throughputs: bool = False
    round_grid: bool = False
    sia_stepping: bool = False
    cap_policy_batch: bool = False
    packed_placement: bool = False
    sia_slowdowns: bool = False
    sia_restore_times: bool = False
    sia_milp_rounding: bool = False
    sia_virtual_nodes: bool = False
    sia_unaware_job_model: bool = False

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name == "profile":
                if not isinstance(value, str):
                    raise InvalidOptionError(f"Fidelity.profile must be a string, got {value!r}")
            elif not isinstance(value, bool):
                raise InvalidOptionError(f"Fidelity.{f.name} must be True or False, got {value!r}")

    @classmethod
    def preset(cls, name: str, **overrides: Any) -> Fidelity:
        """The preset ``name`` (a key of :data:`FIDELITY_PROFILES`) with ``overrides`` of its fields."""
        if name not in FIDELITY_PROFILES:
            raise InvalidOptionError(f"unknown fidelity profile {name!r}; profiles: {', '.join(FIDELITY_PROFILES)}")
        return FIDELITY_PROFILES[name].replace(**overrides)

    def replace(self, **changes: Any) -> Fidelity:
        """A copy with ``changes``; an unknown field name raises :class:`~allocopt.errors.InvalidOptionError`."""
        names = {f.name for f in fields(self)}
        unknown = sorted(set(changes) - names)
        if unknown:
            raise InvalidOptionError(f"unknown fidelity field(s) {', '.join(unknown)}; fields: "
                                     f"{', '.join(sorted(names - {'profile'}))}")
        return replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        """The fields as a plain dict (``profile`` first)."""
        return asdict(self)

    @property
    def gavel(self) -> bool:
        """Whether any of Gavel's switches is on."""
        return any(getattr(self, name) for name in _GAVEL_FIELDS)

    @property
    def sia(self) -> bool:
        """Whether any of Sia's switches is on."""
        return any(getattr(self, name) for name in _SIA_FIELDS)


_GAVEL_FIELDS = ("pair_finishes_at_lease_end", "running_type_totals", "agnostic_on_every_type", "gavel_programs",
                 "min_total_duration_bisection", "fifo_type_choice", "highs_interior_point")
_SIA_FIELDS = ("sia_profile_numbers", "sia_node_cap", "explore_replicas", "learn_throughputs", "round_grid",
               "sia_stepping", "cap_policy_batch", "packed_placement", "sia_slowdowns", "sia_restore_times",
               "sia_milp_rounding", "sia_virtual_nodes", "sia_unaware_job_model")

#: The presets by name: allocopt's own model, Gavel's simulator, Sia's simulator.
FIDELITY_PROFILES: dict[str, Fidelity] = {
    "allocopt": Fidelity(),
    "gavel": Fidelity("gavel", **dict.fromkeys(_GAVEL_FIELDS, True)),
    "sia": Fidelity("sia", **dict.fromkeys(_SIA_FIELDS, True)),
}


def resolve_fidelity(value: Fidelity | str | Mapping[str, Any] | None, default: str = "allocopt") -> Fidelity:
    """A :class:`Fidelity` from a preset name, a Fidelity, a mapping ``{"profile": NAME, FIELD: VALUE}``
    (fields of preset NAME overridden; NAME defaults to ``default``), or None (preset ``default``)."""
    if value is None:
        return FIDELITY_PROFILES[default]
    if isinstance(value, Fidelity):
        return value
    if isinstance(value, str):
        return Fidelity.preset(value)
    if isinstance(value, Mapping):
        changes = dict(value)
        name = changes.pop("profile", default)
        if not isinstance(name, str):
            raise InvalidOptionError(f"fidelity profile must be a preset name, got {name!r}")
        return Fidelity.preset(name, **changes)
    raise InvalidOptionError(f"fidelity must be a preset name ({', '.join(FIDELITY_PROFILES)}), a Fidelity or a "
                             f"mapping of its fields, got {type(value).__name__}")


__all__ = ["FIDELITY_PROFILES", "Fidelity", "resolve_fidelity"]
