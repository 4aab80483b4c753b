"""Optimus's rounds in allocopt's simulator: the ``optimus`` policy decides, Sia's job side runs.

:class:`OptimusPlanner` is :class:`~allocopt.mechanism.sia_rounds.SiaPlanner`
with another decision each round: each job's goodput in every configuration
(from its goodput model, fitted to its application's profile, or with
``learn_throughputs`` to the step times it has measured itself, as Optimus
fits its speed model online), its remaining work (samples left), and the
``optimus`` policy (:mod:`allocopt.formulations.optimus`: a worker each,
shortest remaining time first, then the largest cut of remaining time per added
GPU). Placement, restarts and progress are SiaPlanner's.

``speed_model="optimus"`` plans with Optimus's own three-parameter model
instead (:func:`~allocopt.throughput.optimus_speed.fit_optimus_speed`, fitted
per job and GPU type to the job's goodput over that type's configurations);
jobs still progress at their true rate.
"""

from __future__ import annotations

import time
from collections.abc import Hashable, Mapping
from typing import Any

import numpy as np

from allocopt.errors import InvalidOptionError
from allocopt.mechanism.sia_round_plan import SiaJobState, SiaRoundPlan, plan_round
from allocopt.mechanism.sia_rounds import SiaPlanner
from allocopt.mechanism.state import SimulationState
from allocopt.throughput.optimus_speed import fit_optimus_speed
from allocopt.throughput.profiles import ApplicationProfile

#: Options of SiaPlanner that belong to Sia's policy, not to its job side.
SIA_POLICY_OPTIONS = ("p", "lambda_n", "lambda_a", "sia_program", "sia_threads", "utility_decimals", "utility_clip",
                      "prefer_later", "relaxation_first", "dynamic_programming")


class OptimusPlanner(SiaPlanner):
    """Optimus's rounds (module docstring) as the simulator's ``RoundPlanner``.

    Parameters
    ----------
    state : SimulationState
    profiles : mapping of (application, gpu type) to ApplicationProfile
    round_seconds : float, default 60
    speed_model : {"goodput", "optimus"}, default "goodput"
        What the policy plans with: the goodput models' values, or Optimus's model fitted to them.
    **options
        SiaPlanner's options of the job side (``learn_throughputs``, ``explore_replicas``,
        ``max_nodes``, ``slowdowns``, ``restore_s``, ``round_grid``, ``sia_stepping``, ``batch_sizes``,
        ``cap_policy_batch``, ``packed_placement``, ``fidelity``, ``faithful_to_sia``, ``backend``).

    Raises
    ------
    InvalidOptionError
        For an option of Sia's policy (``p``, ``lambda_n``, ...) or an unknown ``speed_model``.
    """

    def __init__(self, state: SimulationState, profiles: Mapping[tuple[str, str], ApplicationProfile], *,
                 round_seconds: float = 60.0, speed_model: str = "goodput", **options: Any):
        sia_only = sorted(set(options) & set(SIA_POLICY_OPTIONS))
        if sia_only:
            raise InvalidOptionError(f"optimus has no option(s) {sia_only}: they are options of Sia's policy")
        if speed_model not in ("goodput", "optimus"):
            raise InvalidOptionError(f"optimus: speed_model must be 'goodput' or 'optimus', got {speed_model!r}")
        super().__init__(state, profiles, round_seconds=round_seconds, **options)
        self.speed_model = speed_model
        for name in SIA_POLICY_OPTIONS:  # SiaPlanner's defaults and its fidelity's settings for Sia's MILP
            self.options.pop(name, None)

    def _decide(self, jobs: list[SiaJobState], models: list, epochs: Mapping[Hashable, int], now_s: float,
                round_index: int) -> SiaRoundPlan:
        goodput = self._goodput_matrix(jobs, models, epochs)
        if self.speed_model == "optimus":
            goodput = self._fitted(goodput)
        remaining = np.array([max(job.total - job.progress, 1e-9) for job in jobs])
        started = time.perf_counter()
        plan = plan_round(jobs, self.cluster, self.configurations, goodput, self._gpu_ids, round_index=round_index,
                          start_s=now_s, round_seconds=self.round_seconds, policy="optimus", remaining=remaining,
                          **self.options)
        if jobs:
            self.solve_seconds.append(time.perf_counter() - started)
        return plan

    def _fitted(self, goodput: np.ndarray) -> np.ndarray:
        """Each job's goodput on each type replaced by Optimus's model fitted to it (0 stays 0)."""
        configs = self.configurations
        out = np.zeros_like(goodput)
        for t in range(self.cluster.num_gpu_types):
            cols = np.flatnonzero(configs.gpu_type == t)
            gpus = configs.num_gpus[cols]
            for i in range(goodput.shape[0]):
                row = goodput[i, cols]
                known = row > 0
                if known.any():
                    model = fit_optimus_speed(gpus[known], row[known])
                    out[i, cols[known]] = model.speed(gpus[known])
        return out


__all__ = ["OptimusPlanner"]
