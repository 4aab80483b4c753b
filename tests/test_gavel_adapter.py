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


def test_with_ecos_the_adapter_returns_gavels_point_to_the_last_bit():
    """With a cvxpy solver the adapter writes max-min fairness and finish-time fairness as Gavel's code writes
    them (gavel_program, conic_gavel): ECOS returns the point of the program written here Gavel's way (jobs
    and types in name order, Gavel's arithmetic, constraints x >= 0, GPUs per type, time per job), bit for
    bit. Gavel's mechanism orders equal shares by those bits (docs/how-to/reproduce-gavel.md)."""
    cp = pytest.importorskip("cvxpy")
    if "ECOS" not in cp.installed_solvers():
        pytest.skip("cvxpy has no ECOS (pip install ecos)")
    rng = np.random.default_rng(5)
    jobs, types = list(range(8)), ["k80", "p100", "v100"]
    spec = {"k80": 3, "p100": 2, "v100": 2}
    T = rng.uniform(1, 20, size=(8, 3))
    scale = rng.choice([1, 2], size=8)
    tput = {j: dict(zip(types, row)) for j, row in zip(jobs, T.tolist())}
    sf, ones = dict(zip(jobs, scale.tolist())), dict.fromkeys(jobs, 1.0)
    S = np.repeat(scale.astype(float)[:, None], 3, axis=1)
    c = np.array([spec[t] for t in types])

    def gavel_way(objective, x):
        cp.Problem(objective, [x >= 0, cp.sum(cp.multiply(S, x), axis=0) <= c, cp.sum(x, axis=1) <= 1]).solve("ECOS")
        return x.value.clip(0.0, 1.0)

    share = np.array([[spec[t] / 8 for t in types] for _ in jobs])
    share = share / np.sum(share, axis=1).max()
    weights = np.multiply(np.array([1.0 / 1.0] * 8).reshape((8, 1)), 1.0 / np.sum(T * share, axis=1).reshape((8, 1)))
    x = cp.Variable((8, 3))
    expected = gavel_way(cp.Maximize(cp.min(cp.sum(cp.multiply(np.multiply(T * weights, S), x), axis=1))), x)
    alloc = gavel.get_policy("max_min_fairness_perf", solver="ECOS").get_allocation(tput, sf, ones, spec)
    np.testing.assert_array_equal(np.array([[alloc[j][t] for t in types] for j in jobs]), expected)

    steps = dict(zip(jobs, rng.uniform(1_000, 50_000, size=8).tolist()))
    started = dict(zip(jobs, rng.uniform(0, 3_000, size=8).tolist()))
    alloc = gavel.get_policy("finish_time_fairness_perf", solver="ECOS").get_allocation(tput, sf, ones, started,
                                                                                        steps, spec)
    iso = np.array([[spec[t] / 8 for t in types] for _ in jobs]) / S  # Gavel's isolated share, then its steps/s
    iso = (T * (iso / np.maximum(iso.sum(axis=1), 1.0)[:, None])).sum(axis=1)
    x = cp.Variable((8, 3))
    ratios = [(started[j] + steps[j] * cp.inv_pos(cp.sum(cp.multiply(T[j], x[j])))) / (0.0 + steps[j] / iso[j])
              for j in jobs]
    expected = gavel_way(cp.Minimize(cp.maximum(*ratios)), x)
    np.testing.assert_array_equal(np.array([[alloc[j][t] for t in types] for j in jobs]), expected)


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


# --- Behaviours verified against Gavel's own policies (github.com/stanford-futuredata/gavel at c4fa400,
# run with ECOS); the expected values below were measured from Gavel's code. ---

GAVEL_TEST_TPUT = {0: {"v100": 2.0, "p100": 1.0, "k80": 0.5}, 1: {"v100": 3.0, "p100": 2.0, "k80": 1.0}}


def test_gavel_class_names_signature_and_constructors():
    assert gavel.get_policy("max_min_fairness_perf", solver="ECOS", seed=0).name == "MaxMinFairness_Perf"
    expected = {"max_min_fairness": "MaxMinFairness", "finish_time_fairness_perf": "FinishTimeFairness_Perf",
                "min_total_duration_perf": "MinTotalDuration_Perf", "gandiva": "Gandiva_Packing",
                "max_sum_throughput_normalized_by_cost_perf_SLOs": "ThroughputNormalizedByCostSum_PerfSLOs",
                "max_sum_throughput_perf": "ThroughputSumWithPerf", "allox": "AlloX_Perf", "fifo_packed": "FIFO_Packing",
                "max_min_fairness_water_filling_packed": "MaxMinFairnessWaterFilling_Packing"}
    for key, name in expected.items():
        assert gavel.get_policy(key, None, 1, None).name == name
    assert set(gavel.GAVEL_CLASS_NAMES) == set(gavel.POLICY_NAMES)
    assert gavel.MaxMinFairnessPolicyWithPacking("ECOS").name == "MaxMinFairness_Packing"
    assert gavel.FIFOPolicy(mode="perf").policy_name == "fifo_perf"
    assert gavel.AlloXPolicy(alpha=0.5).name == "AlloX_Perf"
    assert gavel.IsolatedPolicy().name == "Isolated"
    with pytest.raises(UnknownPolicyError, match="allox_alpha= needs a number"):
        gavel.get_policy("allox_alpha=x")


def test_finish_time_fairness_accumulates_isolated_time_like_gavel():
    """Gavel's test_finish_time_fairness_with_perf call sequence: on the second call each job's
    cumulative isolated time is (300 - 200) / (11/12) and (500 - 300) / (5/3) s, max rho 0.40278."""
    policy = gavel.FinishTimeFairnessPolicyWithPerf(solver=None)
    ones, zeros = {0: 1, 1: 1}, {0: 0, 1: 0}
    spec = {"v100": 1, "p100": 2, "k80": 3}
    first = policy.get_allocation(GAVEL_TEST_TPUT, ones, ones, zeros, {0: 300, 1: 500}, spec)
    assert first[0] == pytest.approx({"v100": 0.41935, "p100": 0.58065, "k80": 0.0}, abs=1e-4)
    second = policy.get_allocation(GAVEL_TEST_TPUT, ones, ones, zeros, {0: 200, 1: 300}, spec)
    assert policy._cumulative_isolated_time == pytest.approx({0: 1200 / 11, 1: 120.0})
    assert second[0] == pytest.approx({"v100": 0.51724, "p100": 0.48276, "k80": 0.0}, abs=1e-4)
    assert second[1] == pytest.approx({"v100": 0.48276, "p100": 0.51724, "k80": 0.0}, abs=1e-4)
    isolated = {0: 11 / 12, 1: 5 / 3}
    steps = {0: 200, 1: 300}
    rho = max((steps[j] / sum(GAVEL_TEST_TPUT[j][t] * second[j][t] for t in spec))
              / (policy._cumulative_isolated_time[j] + steps[j] / isolated[j]) for j in steps)
    assert rho == pytest.approx(0.402778, abs=1e-5)
    # an empty call forgets the previous call, not the cumulative times (as Gavel does)
    assert policy.get_allocation({}, {}, {}, {}, {}, spec) is None
    policy.get_allocation(GAVEL_TEST_TPUT, ones, ones, zeros, {0: 100, 1: 100}, spec)
    assert policy._cumulative_isolated_time == pytest.approx({0: 1200 / 11, 1: 120.0})


def test_agnostic_finish_time_fairness_accumulates_at_v100_speed():
    policy = gavel.get_policy("finish_time_fairness", solver="highs")
    ones, zeros = {0: 1, 1: 1}, {0: 0, 1: 0}
    spec = {"v100": 1, "p100": 2, "k80": 3}
    policy.get_allocation(GAVEL_TEST_TPUT, ones, ones, zeros, {0: 300, 1: 500}, spec)
    alloc = policy.get_allocation(GAVEL_TEST_TPUT, ones, ones, zeros, {0: 200, 1: 300}, spec)
    assert policy._cumulative_isolated_time == pytest.approx({0: 50.0, 1: 200 / 3})
    # rho at V100 speed on every type: Gavel's optimum 2/3
    rho = max((s / (GAVEL_TEST_TPUT[j]["v100"] * sum(alloc[j].values())))
              / (policy._cumulative_isolated_time[j] + s / (GAVEL_TEST_TPUT[j]["v100"]))
              for j, s in {0: 200, 1: 300}.items())
    assert rho == pytest.approx(2 / 3, abs=1e-6)


def test_allox_keeps_running_jobs_gpus_like_gavel():
    """Gavel's test_allox call sequence; the allocations are Gavel's, call for call."""
    policy = gavel.get_policy("allox")
    spec = {"v100": 2, "p100": 1, "k80": 3}
    tput = {0: {"v100": 2.0, "p100": 1.0, "k80": 0.5}, 1: {"v100": 3.0, "p100": 2.0, "k80": 1.0},
            2: {"v100": 4.0, "p100": 3.0, "k80": 2.0}, 3: {"v100": 1.0, "p100": 1.0, "k80": 1.0}}
    first = policy.get_allocation(tput, dict.fromkeys(tput, 1), dict.fromkeys(tput, 0),
                                  {0: 300, 1: 500, 2: 1000, 3: 500}, spec)
    v100, p100, k80 = ({"v100": 1.0, "p100": 0.0, "k80": 0.0}, {"v100": 0.0, "p100": 1.0, "k80": 0.0},
                       {"v100": 0.0, "p100": 0.0, "k80": 1.0})
    assert first == {0: v100, 1: v100, 2: p100, 3: k80}
    tput = {j: tput[j] for j in (1, 2, 3)} | {4: {"v100": 4.0, "p100": 2.0, "k80": 1.0}}
    second = policy.get_allocation(tput, dict.fromkeys(tput, 1), {1: 200, 2: 200, 3: 200, 4: 0},
                                   {1: 100, 2: 800, 3: 400, 4: 100}, spec)
    # job 2 keeps its P100 and job 3 its K80 although a fresh matching would move them
    assert second == {1: v100, 2: p100, 3: k80, 4: v100}
    fresh = gavel.get_policy("allox").get_allocation(tput, dict.fromkeys(tput, 1), {1: 200, 2: 200, 3: 200, 4: 0},
                                                     {1: 100, 2: 800, 3: 400, 4: 100}, spec)
    assert fresh != second


def test_gandiva_pairs_with_gavels_seeded_rng():
    """Five jobs on one V100 and one K80: Gavel's GandivaPolicy(seed) forms these pairs (measured at
    c4fa400); a pair with a departed member is dissolved and its partner re-paired."""
    def tputs(jobs):
        tput = {i: {"v100": 1.0 + i, "k80": 0.5 + i} for i in jobs}
        for i in jobs:
            for j in jobs:
                if i < j:
                    tput[(i, j)] = {"v100": [0.8 + i, 0.7 + j],
                                    "k80": [0.4 + i, 0.3 + j] if (i + j) % 3 else [0.1, 0.1]}
        return tput

    spec = {"v100": 1, "k80": 1}
    for seed, pairs in ((0, {(0, 1), (2, 4)}), (7, {(0, 4), (1, 2)})):
        policy = gavel.get_policy("gandiva", seed=seed)
        for jobs in ((0, 1, 2, 3, 4), (0, 1, 2, 3, 4), (0, 1, 2, 4)):
            alloc = policy.get_allocation(tputs(jobs), dict.fromkeys(jobs, 1), spec)
        running = {key for key, fractions in alloc.items() if sum(fractions.values()) > 0}
        assert {key for key in running if isinstance(key, tuple)} == pairs
        # the two pairs share the two GPUs evenly
        for key in running:
            assert alloc[key] == pytest.approx({"v100": 1 / 2, "k80": 1 / 2})


def test_gandiva_re_pairs_when_a_pair_stops_gaining():
    """Gavel's test_gandiva: on the third call the pair's normalized throughput (1/2 + 1/3) drops below
    1, the pair is dissolved and -- with only two jobs -- formed again: the pair keeps the V100."""
    policy = gavel.GandivaPolicy()
    ones = {0: 1, 1: 1}
    alloc = policy.get_allocation({0: {"v100": 2.0, "p100": 1.0, "k80": 0.5}, 1: {"v100": 3.0, "p100": 2.0, "k80": 1.0},
                                   (0, 1): {"v100": (2.0, 3.0), "p100": (1.0, 2.0), "k80": (0.5, 1.0)}},
                                  ones, {"v100": 1, "p100": 1, "k80": 1})
    assert alloc[0] == pytest.approx(dict.fromkeys(("v100", "p100", "k80"), 1 / 3)) and sum(alloc[(0, 1)].values()) == 0
    alloc = policy.get_allocation({0: {"v100": 2.0}, 1: {"v100": 3.0}, (0, 1): {"v100": (2.0, 3.0)}}, ones, {"v100": 1})
    assert alloc == {0: {"v100": 0.0}, 1: {"v100": 0.0}, (0, 1): {"v100": 1.0}}
    alloc = policy.get_allocation({0: {"v100": 2.0}, 1: {"v100": 3.0}, (0, 1): {"v100": (1.0, 1.0)}}, ones, {"v100": 1})
    assert alloc == {0: {"v100": 0.0}, 1: {"v100": 0.0}, (0, 1): {"v100": 1.0}}


def test_fifo_keeps_assignments_and_gavels_type_choice_on_request():
    spec = {"v100": 2, "p100": 2, "k80": 2}
    row = {"v100": 3.0, "p100": 2.0, "k80": 1.0}

    def run(policy):
        jobs, seen = list(range(8)), []
        for call in range(3):
            alloc = policy.get_allocation({j: row for j in jobs}, dict.fromkeys(jobs, 1), spec)
            seen.append({j: next((t for t, f in alloc[j].items() if f), None) for j in jobs})
            jobs = [j for j in jobs if j not in (call, call + 3)]
        return seen

    seen = run(gavel.FIFOPolicy(seed=3))
    for before, after in zip(seen, seen[1:]):  # a running job keeps its type until it completes
        assert all(after[j] == before[j] for j in after if before[j] is not None)
    assert all(t is not None for t in seen[1].values())  # completed jobs' GPUs went to the queue
    # Gavel's FIFOPolicy(seed=3) at c4fa400, call for call (its type choice ignores its random draw)
    assert run(gavel.FIFOPolicy(seed=3, faithful_type_choice=True)) == [
        {0: "v100", 1: "v100", 2: "p100", 3: "p100", 4: "k80", 5: "k80", 6: None, 7: None},
        {1: "v100", 2: "p100", 4: "k80", 5: "k80", 6: "v100", 7: "p100"},
        {2: "p100", 5: "k80", 6: "v100", 7: "p100"}]


def test_job_type_throughputs_method_matches_gavel():
    """Gavel's test_max_min_fairness_with_packing_using_job_type_throughputs: Gavel (ECOS) gives both jobs
    half the V100 and half the P100, no packing (normalized levels 1.5 and 7.5 steps/s)."""
    tput = {("A", 1): {"v100": {None: 2.0, ("A", 1): 0.0, ("B", 1): 1.0}, "p100": {None: 1.0, ("A", 1): 0.0, ("B", 1): 0.5},
                       "k80": {None: 0.5, ("A", 1): 0.0, ("B", 1): 0.25}},
            ("B", 1): {"v100": {None: 10.0, ("A", 1): 5.0, ("B", 1): 0.0}, "p100": {None: 5.0, ("A", 1): 2.5, ("B", 1): 0.0},
                       "k80": {None: 2.5, ("A", 1): 1.25, ("B", 1): 0.0}}}
    policy = gavel.MaxMinFairnessPolicyWithPacking("highs")
    alloc = policy.get_allocation_using_job_type_throughputs(
        tput, {0: ("A", 1), 1: ("B", 1)}, {0: 1, 1: 1}, {0: 1, 1: 1}, {"v100": 1, "p100": 1, "k80": 1})
    assert set(alloc) == {0, 1, (0, 1)}
    level = {j: sum(tput[k][t][None] * alloc[j][t] for t in alloc[j]) for j, k in ((0, ("A", 1)), (1, ("B", 1)))}
    level[0] += sum(tput[("A", 1)][t][("B", 1)] * alloc[(0, 1)][t] for t in alloc[(0, 1)])
    level[1] += sum(tput[("B", 1)][t][("A", 1)] * alloc[(0, 1)][t] for t in alloc[(0, 1)])
    # Gavel's levels; normalized by the proportional throughputs (7/6 and 35/6) both are 9/7
    assert level == pytest.approx({0: 1.5, 1: 7.5}, abs=1e-6)
    with pytest.raises(TypeError, match="no get_allocation_using_job_type_throughputs"):
        gavel.get_policy("max_min_fairness_perf").get_allocation_using_job_type_throughputs(
            tput, {0: ("A", 1)}, {0: 1}, {0: 1}, {"v100": 1})


def test_isolated_get_throughputs_and_gavels_isolated_test():
    """Gavel's test_isolated: the smallest time-equivalent share of max-min fairness equals the
    isolated policy's, over Gavel's scale factors and clusters."""
    isolated, mmf = gavel.IsolatedPolicy(), gavel.MaxMinFairnessPolicy("highs")
    for scale in ({0: 1, 1: 1}, {0: 2, 1: 1}, {0: 2, 1: 2}, {0: 4, 1: 1}):
        for spec in ({"v100": 4, "p100": 4, "k80": 4}, {"v100": 4, "p100": 8, "k80": 6}):
            a = isolated.get_allocation(GAVEL_TEST_TPUT, scale, spec)
            b = mmf.get_allocation(GAVEL_TEST_TPUT, scale, {0: 1, 1: 1}, spec)
            share = [[sum(x[j].values()) * scale[j] for j in (0, 1)] for x in (a, b)]
            assert min(share[0]) == pytest.approx(min(share[1]), abs=1e-6)
    T = np.array([[2.0, 1.0], [3.0, 2.0]])
    got = isolated.get_throughputs(T, ([0, 1], ["v100", "p100"]), {0: 1, 1: 2}, {"v100": 2, "p100": 2})
    np.testing.assert_allclose(got, [[1.5], [2.5]])  # shares [1, 1] / 2 (row sum 2) and [1, 1] / 2 (scale 2)


def test_fifo_head_that_fits_nowhere_blocks_the_queue_and_packed_without_pairs():
    """Found running Gavel's simulator on artifact_evaluation.trace: a 2-GPU job at the head of the
    queue when one GPU per type is free waits (and so does everyone behind it); a packing policy
    called with no pair left solves the plain policy."""
    policy = gavel.get_policy("fifo", seed=0)
    spec = {"v100": 2, "p100": 1, "k80": 1}
    row = {"v100": 3.0, "p100": 2.0, "k80": 1.0}
    first = policy.get_allocation({0: row, 1: row}, {0: 2, 1: 1}, spec)
    assert sum(first[0].values()) == 1.0 and first[0]["v100"] == 1.0
    second = policy.get_allocation({0: row, 1: row, 2: row, 3: row}, {0: 2, 1: 1, 2: 2, 3: 1}, spec)
    assert second[0] == first[0] and second[1] == first[1]
    assert sum(second[2].values()) == 0 and sum(second[3].values()) == 0  # job 3 would fit but may not jump ahead
    alone = gavel.get_policy("max_min_fairness_packed").get_allocation({0: row}, {0: 1}, {0: 1}, spec)
    assert sum(alone[0].values()) == pytest.approx(1.0)


# Four jobs whose V100 and P100 throughputs differ by the same 2 steps/s: every split of the four
# jobs over the two V100s and two P100s maximizes the total throughput (a degenerate LP).
_DEGENERATE_TYPES = ["k80", "p100", "v100"]
_DEGENERATE_SPEC = {"k80": 2, "p100": 2, "v100": 2}
_DEGENERATE_JOBS = [f"j{i}" for i in range(4)]


def _degenerate_throughputs(mult: float = 1.0) -> np.ndarray:
    return np.array([[1.0 + i, 2.0 + i, 4.0 + i] for i in range(4)]) * mult


def _max_sum_throughput(solver: str, T: np.ndarray) -> np.ndarray:
    tput = {j: dict(zip(_DEGENERATE_TYPES, row)) for j, row in zip(_DEGENERATE_JOBS, T)}
    alloc = gavel.get_policy("max_sum_throughput_perf", solver=solver).get_allocation(
        tput, {j: 1 for j in _DEGENERATE_JOBS}, _DEGENERATE_SPEC)
    return np.array([[alloc[j][t] for t in _DEGENERATE_TYPES] for j in _DEGENERATE_JOBS])


def test_highs_returns_a_point_inside_the_optimal_face_on_gavels_lps():
    """highs-simplex: an optimal vertex (each job on one type); highs (the default: HiGHS's interior
    point without crossover on Gavel's LP policies) and highs-ipm: every job shares the V100s and
    P100s, as an interior-point solver (Gavel's ECOS) answers; the reason is in the extras."""
    T = _degenerate_throughputs()
    vertex = _max_sum_throughput("highs-simplex", T)
    for solver in (None, "highs", "highs-ipm", "HIGHS_IPM"):
        inside = _max_sum_throughput(solver, T)
        assert (T * vertex).sum() == pytest.approx((T * inside).sum(), rel=1e-6)
        assert (inside[:, 1:] > 0.3).all() and (inside[:, 1:] < 0.7).all()
        assert inside[:, 0] == pytest.approx(0.0, abs=1e-6)
    assert np.isin(np.round(vertex, 6), (0.0, 1.0)).all()
    policy = gavel.get_policy("max_min_fairness")
    assert policy.last_allocation is None
    assert policy.get_allocation(THROUGHPUTS, ONES, ONES, SPEC) is not None
    assert "interior point without crossover" in policy.last_allocation.extras["solver_path"]
    assert policy.last_allocation.status.value == "optimal"
    for solver in ("highs-simplex", "highs-ipm"):  # chosen by the caller: no reason to give
        explicit = gavel.get_policy("max_min_fairness", solver=solver)
        explicit.get_allocation(THROUGHPUTS, ONES, ONES, SPEC)
        assert "solver_path" not in explicit.last_allocation.extras
    assert gavel.highs_options_for("allox") == {}  # AlloX's matching keeps HiGHS's vertex
    assert gavel.highs_options_for("finish_time_fairness") == gavel.HIGHS_IPM


@pytest.mark.parametrize("mult", [1.0, 100.0])
def test_interior_point_solver_returns_gavels_point_of_a_degenerate_optimum(mult):
    """With an interior-point solver the adapter returns the point Gavel's own cvxpy model
    returns (objective not rescaled while its coefficients are within 1e-3..1e3), so Gavel's
    simulator driven by the adapter with ECOS reproduces Gavel's run exactly."""
    cp = pytest.importorskip("cvxpy")
    T = _degenerate_throughputs(mult)
    ours = _max_sum_throughput("CLARABEL", T)
    c = np.array([_DEGENERATE_SPEC[t] for t in _DEGENERATE_TYPES], dtype=float)
    x = cp.Variable(T.shape)  # Gavel's ThroughputNormalizedByCostSum_PerfSLOs without costs or SLOs
    cp.Problem(cp.Maximize(cp.sum(cp.sum(cp.multiply(T, x), axis=1))),
               [x >= 0, cp.sum(x, axis=0) <= c, cp.sum(x, axis=1) <= 1]).solve(solver="CLARABEL")
    assert np.abs(ours - x.value).max() < 1e-6


def test_min_total_duration_faithful_bisection():
    """faithful_bisection=True: Gavel's search (no better than the exact LP, within 5% of it); the
    class takes it next to Gavel's ``solver`` argument; other policies reject it."""
    steps = {"a": 40_000.0, ("b", 1): 12_000.0, 7: 900_000.0}
    exact = gavel.MinTotalDurationPolicyWithPerf("highs").get_allocation(THROUGHPUTS, ONES, steps, SPEC)
    searched = gavel.MinTotalDurationPolicyWithPerf("highs", faithful_bisection=True).get_allocation(
        THROUGHPUTS, ONES, steps, SPEC)

    def makespan(alloc):
        return max(steps[j] / sum(THROUGHPUTS[j][t] * alloc[j][t] for t in SPEC) for j in steps)

    assert makespan(exact) <= makespan(searched) * (1 + 1e-7)
    assert makespan(searched) <= 1.05 * makespan(exact)
    with pytest.raises(TypeError, match="faithful_bisection only applies"):
        gavel.GavelPolicy("max_min_fairness_perf", faithful_bisection=True)


def test_fifo_never_over_commits_unless_faithful():
    """Gavel's base FIFO gives a completed job's GPUs to the queue's head before subtracting the GPUs of
    running jobs with higher ids (job 2 then gets all 4 P100s while job 1 keeps 2); the adapter waits."""
    spec, scale = {"p100": 4}, {0: 2, 1: 2, 2: 4}
    tput = {job: {"p100": 1.0} for job in scale}
    for faithful, expected in ((False, {1: 1.0, 2: 0.0}), (True, {1: 1.0, 2: 1.0})):
        policy = gavel.FIFOPolicy(faithful_type_choice=faithful)
        first = policy.get_allocation(tput, scale, spec)
        assert [first[job]["p100"] for job in (0, 1, 2)] == [1.0, 1.0, 0.0]
        second = policy.get_allocation({job: tput[job] for job in (1, 2)}, scale, spec)
        assert {job: second[job]["p100"] for job in (1, 2)} == expected


def test_agnostic_policies_plan_zero_throughput_types_only_when_faithful():
    """Gavel's agnostic policies plan every type at the V100 speed, also where the job cannot run
    (throughput 0); allocopt's never give time there; faithful_agnostic=True does as Gavel."""
    # jobs 0 and 2 cannot run on the K80: allocopt shares the V100 between them (level 1/2); Gavel's
    # agnostic LP sees two GPUs for three jobs (level 2/3) and gives jobs 0 and 2 K80 time
    tput = {0: {"v100": 10.0, "k80": 0.0}, 1: {"v100": 10.0, "k80": 5.0}, 2: {"v100": 8.0, "k80": 0.0}}
    ones, spec = {0: 1, 1: 1, 2: 1}, {"v100": 1, "k80": 1}
    steps, started = {0: 1000.0, 1: 1000.0, 2: 1000.0}, {0: 0.0, 1: 0.0, 2: 0.0}
    for name, args in (("MaxMinFairnessPolicy", (tput, ones, ones, spec)),
                       ("FinishTimeFairnessPolicy", (tput, ones, ones, started, steps, spec))):
        ours = getattr(gavel, name)("highs").get_allocation(*args)
        assert ours[0]["k80"] == pytest.approx(0.0, abs=1e-7) and ours[2]["k80"] == pytest.approx(0.0, abs=1e-7)
        faithful = getattr(gavel, name)("highs", faithful_agnostic=True).get_allocation(*args)
        assert faithful[0]["k80"] + faithful[2]["k80"] > 0.3
        assert sum(faithful[j]["v100"] + faithful[j]["k80"] for j in tput) == pytest.approx(2.0, abs=1e-6)
    with pytest.raises(TypeError, match="faithful_agnostic only applies"):
        gavel.GavelPolicy("max_min_fairness_perf", faithful_agnostic=True)
