"""The Gavel drop-in adapter: Gavel's argument lists in, Gavel's nested dicts out."""

from __future__ import annotations

import numpy as np
import pytest

from allocopt.adapters import gavel
from allocopt.errors import AllocoptWarning, UnknownPolicyError

THROUGHPUTS = {"a": {"v100": 40.0, "k80": 10.0}, ("b", 1): {"v100": 12.0, "k80": 4.0},
               7: {"v100": 100.0, "k80": 50.0}}
ONES = {job: 1 for job in THROUGHPUTS}
SPEC = {"v100": 1, "k80": 1}


def test_max_min_fairness_perf_matches_classic_example():
    alloc = gavel.get_policy("max_min_fairness_perf").get_allocation(THROUGHPUTS, ONES, ONES, SPEC)
    assert set(alloc) == set(THROUGHPUTS)
    assert alloc["a"] == pytest.approx({"v100": 5 / 11, "k80": 0.0}, abs=1e-6)
    assert alloc[7] == pytest.approx({"v100": 1 / 11, "k80": 10 / 11}, abs=1e-6)


def test_keyword_arguments_and_empty_input():
    policy = gavel.get_policy("max_sum_throughput_perf")
    alloc = policy.get_allocation(unflattened_throughputs=THROUGHPUTS, scale_factors=ONES, cluster_spec=SPEC)
    assert alloc[7]["v100"] == pytest.approx(1.0)
    assert policy.get_allocation({}, {}, SPEC) is None
    with pytest.raises(TypeError, match="unexpected argument 'priority_weights'"):
        policy.get_allocation(THROUGHPUTS, ONES, SPEC, priority_weights=ONES)


def test_agnostic_max_min_fairness_equalizes_time():
    alloc = gavel.get_policy("max_min_fairness").get_allocation(THROUGHPUTS, ONES, ONES, SPEC)
    time = {job: sum(fractions.values()) for job, fractions in alloc.items()}
    assert all(t == pytest.approx(2 / 3, abs=1e-6) for t in time.values())


def test_cost_and_slo_policies():
    costs = {"v100": 3.0, "k80": 0.5}
    alloc = gavel.get_policy("max_sum_throughput_normalized_by_cost_perf").get_allocation(
        THROUGHPUTS, ONES, SPEC, costs)
    assert alloc[7]["k80"] == pytest.approx(1.0)  # 50 / 0.5 beats 100 / 3
    policy = gavel.get_policy("max_sum_throughput_normalized_by_cost_perf_SLOs")
    met = policy.get_allocation(THROUGHPUTS, ONES, SPEC, costs, SLOs={"a": 100.0},
                                num_steps_remaining={"a": 2000.0, "gone": 5.0})
    assert 40 * met["a"]["v100"] + 10 * met["a"]["k80"] >= 20.0 - 1e-6
    with pytest.warns(AllocoptWarning, match="cannot be met"):
        missed = policy.get_allocation(THROUGHPUTS, ONES, SPEC, costs, SLOs={"a": 10.0},
                                       num_steps_remaining={"a": 2000.0})
    assert sum(missed["a"].values()) == pytest.approx(1.0)  # best it can do: all its time on the v100


def test_isolated_and_unknown_name():
    alloc = gavel.get_policy("isolated").get_allocation(THROUGHPUTS, ONES, SPEC)
    assert all(f == pytest.approx(1 / 3) for fractions in alloc.values() for f in fractions.values())
    with pytest.raises(UnknownPolicyError, match="unknown Gavel policy 'max_min_fun'"):
        gavel.get_policy("max_min_fun")


def test_matches_gavel_style_cvxpy_formulation():
    """Same objective as the policy written the way Gavel writes it (one cvxpy expression tree)."""
    cp = pytest.importorskip("cvxpy")
    rng = np.random.default_rng(3)
    jobs = [f"job{i}" for i in range(12)]
    types = ["k80", "p100", "v100"]
    spec = {"k80": 4, "p100": 3, "v100": 2}
    T = rng.uniform(1, 20, size=(12, 3))
    scale = rng.choice([1, 2], size=12)
    weights = rng.choice([1.0, 2.0], size=12)
    tput = {j: dict(zip(types, row)) for j, row in zip(jobs, T)}
    alloc = gavel.get_policy("max_min_fairness_perf", solver="highs").get_allocation(
        tput, dict(zip(jobs, scale)), dict(zip(jobs, weights)), spec)
    X = np.array([[alloc[j][t] for t in types] for j in jobs])

    c = np.array([spec[t] for t in types], dtype=float)
    prop = T @ (c / c.sum())
    coef = T * (scale / (weights * prop))[:, None]
    x = cp.Variable(T.shape)
    prob = cp.Problem(cp.Maximize(cp.min(cp.sum(cp.multiply(coef, x), axis=1))),
                      [x >= 0, cp.sum(x, axis=1) <= 1, cp.sum(cp.multiply(scale[:, None], x), axis=0) <= c])
    prob.solve(solver="CLARABEL")
    ours = (coef * X).sum(axis=1).min()
    assert ours == pytest.approx(prob.value, rel=1e-5)


def test_cvxpy_solver_names_route_to_cvxpy_backend():
    pytest.importorskip("cvxpy")
    alloc = gavel.get_policy("max_min_fairness_perf", solver="CLARABEL").get_allocation(THROUGHPUTS, ONES, ONES, SPEC)
    assert alloc["a"]["v100"] == pytest.approx(5 / 11, abs=1e-5)


def test_makespan_and_finish_time_fairness_names():
    steps = {"a": 4000.0, ("b", 1): 1200.0, 7: 10_000.0}
    started = {"a": 0.0, ("b", 1): 0.0, 7: 0.0}
    perf = gavel.get_policy("min_total_duration_perf").get_allocation(THROUGHPUTS, ONES, steps, SPEC)
    agnostic = gavel.get_policy("min_total_duration").get_allocation(THROUGHPUTS, ONES, steps, SPEC)

    def makespan(alloc):
        return max(steps[j] / sum(THROUGHPUTS[j][t] * f for t, f in alloc[j].items()) for j in steps)
    assert makespan(perf) <= makespan(agnostic) + 1e-6
    ftf = gavel.get_policy("finish_time_fairness_perf").get_allocation(
        THROUGHPUTS, ONES, ONES, started, {**steps, "gone": 5.0}, SPEC)
    assert set(ftf) == set(THROUGHPUTS)
    assert all(sum(f.values()) <= 1 + 1e-6 for f in ftf.values())
    with pytest.raises(Exception, match=r"num_steps_remaining has no entry for job\(s\) \[7\]"):
        gavel.get_policy("finish_time_fairness").get_allocation(
            THROUGHPUTS, ONES, ONES, started, {"a": 1.0, ("b", 1): 1.0}, SPEC)


def test_packed_and_baseline_names():
    tput = {"a": {"v100": 10.0, "k80": 4.0}, "b": {"v100": 10.0, "k80": 4.0}, "c": {"v100": 10.0, "k80": 4.0},
            ("a", "b"): {"v100": [9.0, 9.0], "k80": [3.5, 3.5]}}
    ones = {"a": 1, "b": 1, "c": 1}
    spec = {"v100": 1, "k80": 0}
    packed = gavel.get_policy("max_min_fairness_packed").get_allocation(tput, ones, ones, spec)
    assert set(packed) == {"a", "b", "c", ("a", "b")}
    plain = gavel.get_policy("max_min_fairness_perf").get_allocation(
        {k: v for k, v in tput.items() if k != ("a", "b")}, ones, ones, spec)
    # sharing lets a and b run together: everyone gets more than a third of the V100's time-equivalent
    assert 9.0 * packed[("a", "b")]["v100"] + 10 * packed["a"]["v100"] > 10 * plain["a"]["v100"] + 1e-6
    fifo = gavel.get_policy("fifo_perf").get_allocation(tput, ones, {"v100": 1, "k80": 1})
    assert fifo["a"] == {"v100": 1.0, "k80": 0.0} and fifo["b"] == {"v100": 0.0, "k80": 1.0}
    gandiva = gavel.get_policy("gandiva").get_allocation(tput, ones, spec)
    assert gandiva[("a", "b")]["v100"] > 0
    singles = {k: v for k, v in tput.items() if k != ("a", "b")}
    args = (ones, {"a": 3.0, "b": 2.0, "c": 1.0}, {"a": 100.0, "b": 100.0, "c": 100.0}, {"v100": 1, "k80": 1})
    # Gavel's AlloXPolicy (alpha 1.0) at c4fa400 on these inputs: b on the V100, c on the K80, a queued;
    # with alpha 0.3 only the two oldest are matched and c waits
    allox = gavel.get_policy("allox").get_allocation(singles, *args)
    assert allox == {"a": {"v100": 0.0, "k80": 0.0}, "b": {"v100": 1.0, "k80": 0.0}, "c": {"v100": 0.0, "k80": 1.0}}
    allox = gavel.get_policy("allox_alpha=0.3").get_allocation(singles, *args)
    assert allox["b"] == {"v100": 1.0, "k80": 0.0} and allox["c"] == {"v100": 0.0, "k80": 0.0}


def test_water_filling_names_reproduce_the_hierarchical_closed_form():
    """3 entities (weights 1, 2, 3) of 6 single-GPU jobs, 9 GPUs, throughputs 1, fifo inside entities."""
    jobs = [(e, k) for e in range(3) for k in range(6)]
    tput = {j: {"k80": 1.0, "p100": 1.0, "v100": 1.0} for j in jobs}
    ones = {j: 1 for j in jobs}
    mapping = {e: [(e, k) for k in range(6)] for e in range(3)}
    policy = gavel.get_policy("max_min_fairness_water_filling_perf",
                              priority_reweighting_policies={0: "fifo", 1: "fifo", 2: "fifo"})
    alloc = policy.get_allocation(tput, ones, ones, {"k80": 3, "p100": 3, "v100": 3},
                                  entity_weights={0: 1.0, 1: 2.0, 2: 3.0}, entity_to_job_mapping=mapping)
    shares = [[sum(alloc[(e, k)].values()) for k in range(6)] for e in range(3)]
    np.testing.assert_allclose(shares, [[1, 0.5, 0, 0, 0, 0], [1, 1, 1, 0, 0, 0], [1, 1, 1, 1, 0.5, 0]], atol=1e-6)
    with pytest.raises(TypeError, match="only applies to the water-filling"):
        gavel.get_policy("max_min_fairness", priority_reweighting_policies={0: "fifo"})


@pytest.mark.parametrize("name", sorted(gavel.POLICY_NAMES))
def test_every_gavel_name_returns_a_feasible_allocation(name):
    jobs = ["j0", "j1", "j2", "j3"]
    rows = [[4.0, 2.0, 1.0], [6.0, 3.0, 1.5], [3.0, 2.5, 1.0], [8.0, 4.0, 2.0]]
    tput = {j: dict(zip(["v100", "p100", "k80"], r)) for j, r in zip(jobs, rows)}
    tput[("j0", "j1")] = {"v100": [3.0, 4.0], "p100": [1.5, 2.0], "k80": [0.0, 0.0]}
    spec = {"v100": 1, "p100": 1, "k80": 1}
    ones = {j: 1 for j in jobs}
    values = {"unflattened_throughputs": tput, "scale_factors": ones, "unflattened_priority_weights": ones,
              "cluster_spec": spec, "instance_costs": {"v100": 3.0, "p100": 1.5, "k80": 0.5},
              "SLOs": {"j0": 1e6}, "num_steps_remaining": {j: 1000.0 for j in jobs},
              "times_since_start": {"j0": 30.0, "j1": 20.0, "j2": 10.0, "j3": 0.0},
              "entity_weights": {"a": 1.0, "b": 2.0}, "entity_to_job_mapping": {"a": ["j0", "j1"], "b": ["j2", "j3"]}}
    _, signature, _ = gavel.POLICY_NAMES[name]
    args = [values[p] for p in gavel.SIGNATURES[signature] if p in values]
    alloc = gavel.get_policy(name).get_allocation(*args)
    packed = gavel.POLICY_NAMES[name][2].get("space_sharing") or name == "gandiva"
    assert set(alloc) == set(tput) if packed else set(alloc) == set(jobs)
    time = {j: sum(alloc[j].values()) for j in jobs}
    for key, fractions in alloc.items():
        if isinstance(key, tuple):
            for j in key:
                time[j] += sum(fractions.values())
    assert all(t <= 1 + 1e-6 for t in time.values()), time
    for t in spec:
        assert sum(fractions[t] for fractions in alloc.values()) <= spec[t] + 1e-6
