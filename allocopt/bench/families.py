"""``allocopt bench --families``: every technique on every instance family, against the plain
LP and the cvxpy baseline in the same run.

For each size, family (:data:`allocopt.bench.instances.FAMILIES`) and LP policy whose technique
``auto`` chooses (:data:`DEFAULT_FAMILY_POLICIES`: max-min fairness and max throughput; water-filling
when asked for), then the anchors' own instances (POP's figure 2: space-sharing max-min fairness;
Sia's scale workloads: a fresh and a steady-state round), the plain technique runs first, then every
other technique, then the cvxpy baseline (in a child process bounded by time and memory,
:mod:`allocopt.bench.bounded`). Each row goes to ``on_row`` as soon as it is measured. A
row whose time exceeds the plain technique's by more than :data:`SLOWDOWN_TOLERANCE` is
flagged ``SLOWER``; objectives are compared with the plain technique's (1e-6 relative).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from allocopt.bench import instances
from allocopt.bench.runner import History, run_baseline
from allocopt.bench.suite import POLICIES, Instance
from allocopt.bench.timing import OBJECTIVE_RTOL, Measurement, time_allocopt
from allocopt.errors import InvalidOptionError
from allocopt.technique import TECHNIQUES as SOLVE_TECHNIQUES

#: A technique more than this much slower than the plain LP (ratio - 1) is flagged.
SLOWDOWN_TOLERANCE = 0.10
DEFAULT_SIZES = (4096, 16384, 65536)
#: Techniques per bench policy, the reference first: the plain LP; for space sharing job types (the
#: pairwise LP over all pairs of POP's instance has 6.3M columns); for Sia the whole MILP at zero gap.
_LP_TECHNIQUES = (("plain", {"technique": "plain"}), ("auto", {}),
                  ("closed_form", {"technique": "closed_form"}),
                  ("aggregate_job_types", {"technique": "aggregate_job_types"}),
                  ("price_decomposition", {"technique": "price_decomposition"}))
FAMILY_TECHNIQUES: dict[str, tuple[tuple[str, dict[str, Any]], ...]] = {
    "max_min_fairness": _LP_TECHNIQUES,
    "max_throughput": _LP_TECHNIQUES,
    "water_filling": (("plain", {"technique": "plain"}), ("auto", {}),
                      ("aggregate_job_types", {"technique": "aggregate_job_types"})),
    "mmf_space_sharing": (("aggregate_job_types", {"technique": "aggregate_job_types"}), ("auto", {}),
                          ("column_generation", {"technique": "column_generation"})),
    "sia": (("whole_milp", {"technique": "whole_milp", "mip_gap": 0.0}), ("auto", {})),
}
#: The policies ``--policies`` may run on the families: the LP policies among whose techniques ``auto``
#: chooses (:mod:`allocopt.technique`; min makespan and finish-time fairness have one when solved cold).
FAMILY_POLICIES = tuple(p for p in SOLVE_TECHNIQUES["plain"] if p in FAMILY_TECHNIQUES)
#: Those run by default. Water-filling is asked for by name: on the families' distinct jobs it solves a few
#: LPs per level (25 s at 16,384 jobs), and its time limit bounds each LP, not the run.
DEFAULT_FAMILY_POLICIES = ("max_min_fairness", "max_throughput")
#: Row fields, in the order of the CSV.
FAMILY_FIELDS = ("policy", "family", "n_jobs", "technique", "chosen", "status", "total_s", "objective",
                 "vs_reference", "reference", "objective_rel_diff", "baseline_status", "baseline_total_s",
                 "vs_cvxpy", "flag", "description")


def anchor_instances(seed: int) -> list[tuple[str, str, Instance]]:
    """(family, bench policy, instance) of the anchors' own benchmarks."""
    pop = instances.pop_figure2_problem(2048, seed)
    out = [("pop_figure2", "mmf_space_sharing",
            Instance(pop, {}, f"POP figure 2: 2,048 jobs, {pop.pairs.shape[0]} pairs, 512 each of v100, p100, k80"))]
    rounds, source = instances.sia_rounds(5120, seed, data_dir=instances.data_dir())
    for name in ("first", "steady"):
        out.append((f"sia_scale_{name}", "sia", Instance(rounds[name], {}, f"Sia scale_32x, {name} round: 5,120 "
                                                                           f"jobs on 2,048 GPUs ({source})")))
    return out


def family_policies(names: Sequence[str] | None) -> list[str]:
    """``names`` (None: :data:`DEFAULT_FAMILY_POLICIES`) checked; InvalidOptionError naming the ones that run."""
    if names is None:
        return list(DEFAULT_FAMILY_POLICIES)
    unknown = [name for name in names if name not in FAMILY_POLICIES]
    if unknown or not names:
        raise InvalidOptionError(f"--policies with --families: {unknown or list(names)} not run on the families; "
                                 f"choose from {', '.join(FAMILY_POLICIES)} (the LP policies whose technique auto "
                                 "chooses)")
    return list(names)


def run_families(families: Sequence[str], sizes: Sequence[int], *, policies: Sequence[str] | None = None,
                 techniques: Sequence[str] | None = None, seed: int = 0, repeat: int = 1, baseline: bool = True,
                 baseline_time_limit_s: float = 60.0, max_seconds: float = 120.0, anchors: bool = True,
                 on_row: Callable[[dict[str, Any]], None] = lambda row: None,
                 on_cell: Callable[[list[dict[str, Any]]], None] = lambda rows: None) -> list[dict[str, Any]]:
    """Measure every technique of each policy (:func:`family_policies`; of ``techniques`` when given, the
    reference always) on each family and size (and the anchors); the rows. Each row (and each baseline's)
    goes to ``on_row`` when measured, each cell's rows, compared with its baseline, to ``on_cell``."""
    rows: list[dict[str, Any]] = []
    histories: dict[tuple[str, str, str], History] = {}
    cells: list[tuple[str, str, int, Callable[[], Instance]]] = []
    last: dict[tuple[str, int], Instance] = {}  # the family's instance at a size, for its consecutive policies

    def family_instance(family: str, n: int) -> Instance:
        if (family, n) not in last:
            last.clear()
            description, generate = instances.FAMILIES[family]
            last[family, n] = Instance(generate(n, seed), {}, description)
        return last[family, n]

    for n in sorted(sizes):
        for family in families:
            cells.extend((family, policy, n, lambda f=family, n=n: family_instance(f, n))
                         for policy in family_policies(policies))
    if anchors:
        for family, policy, instance in anchor_instances(seed):
            cells.append((family, policy, instance.problem.num_jobs, lambda i=instance: i))
    for family, policy, n, make in cells:
        first = len(rows)
        instance = make()
        spec = POLICIES[policy]
        reference: Measurement | None = None
        for index, (technique, options) in enumerate(FAMILY_TECHNIQUES[policy]):
            if index and techniques is not None and technique not in techniques:
                continue
            history = histories.setdefault((policy, family, technique), History())
            predicted = history.predict(n)
            if predicted is not None and predicted[0] > max_seconds:
                m = Measurement(status=f"skipped: predicted {predicted[0]:.3g} s > --max-seconds {max_seconds:g}")
            else:
                m = time_allocopt(instance.problem, spec.policy, repeat=repeat, time_limit_s=max_seconds,
                                  options={**spec.options, **instance.options, **options})
                if m.ok:
                    history.points.append((n, m.total_s, False))
            if index == 0:
                reference = m
            rows.append(_row(family, policy, n, technique, m, reference, FAMILY_TECHNIQUES[policy][0][0],
                             instance.description))
            on_row(rows[-1])
        if baseline:
            base = run_baseline(spec, instance, n, histories.setdefault((policy, family, "cvxpy"), History()),
                                baseline_time_limit_s, repeat)
            for row in rows[first:]:
                row.update(baseline_status=base.status, baseline_total_s=base.total_s)
                if row["status"] == "ok" and base.total_s:
                    row["vs_cvxpy"] = base.total_s / row["total_s"]
            on_row({"family": family, "policy": policy, "n_jobs": n, "technique": "cvxpy",
                    "status": base.status, "total_s": base.total_s, "objective": base.objective,
                    "description": instance.description})
        on_cell(rows[first:])
    return rows


def _row(family: str, policy: str, n: int, technique: str, m: Measurement, reference: Measurement | None,
         reference_name: str, description: str) -> dict[str, Any]:
    row: dict[str, Any] = dict.fromkeys(FAMILY_FIELDS)
    row.update(family=family, policy=policy, n_jobs=n, technique=technique, status=m.status, total_s=m.total_s,
               objective=m.objective, reference=reference_name, description=description)
    if m.ok and m.values is not None:
        row["chosen"] = m.values.extras.get("technique")
    if m.ok and reference is not None and reference.ok:
        row["vs_reference"] = m.total_s / reference.total_s
        diff = abs(m.objective - reference.objective) / max(abs(reference.objective), 1e-12)
        row["objective_rel_diff"] = diff
        flags = []
        if row["vs_reference"] > 1.0 + SLOWDOWN_TOLERANCE and technique != reference_name:
            flags.append("SLOWER")
        if diff > OBJECTIVE_RTOL:
            flags.append("OBJECTIVE DIFFERS")
        row["flag"] = " ".join(flags)
    return row
