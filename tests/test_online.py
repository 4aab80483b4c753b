"""ThroughputEstimator: EMA updates, priors (own, table, learned ratio, default), state, errors."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

import allocopt
from allocopt.errors import InvalidProblemError
from allocopt.throughput import ThroughputEstimator, ThroughputTable

TYPES = ["k80", "p100", "v100"]


@pytest.fixture(scope="module")
def table() -> ThroughputTable:
    return ThroughputTable.gavel()


def estimator(**options) -> ThroughputEstimator:
    est = ThroughputEstimator(None, TYPES, **options)
    for job in ("a", "b", "c"):
        est.add_job(job)
    return est


# ----- exponential moving average --------------------------------------------------------------
@pytest.mark.parametrize("smoothing, values, expected", [
    (0.5, [10.0, 20.0, 40.0], [10.0, 15.0, 27.5]),  # first sets it, then 0.5 old + 0.5 new
    (0.25, [8.0, 4.0, 4.0], [8.0, 7.0, 6.25]),
    (1.0, [3.0, 9.0, 1.0], [3.0, 9.0, 1.0]),  # keep only the latest
])
def test_ema_sequence(smoothing, values, expected):
    est = estimator(smoothing=smoothing)
    for x, want in zip(values, expected):
        est.observe("a", "v100", x)
        assert est.estimate("a", "v100") == pytest.approx(want, rel=1e-15)
    assert est.observation_counts(["a"], ["v100"])[0, 0] == len(values)


def test_weight_counts_as_repeated_measurements():
    est = estimator(smoothing=0.5)
    est.observe("a", "k80", 10.0)
    est.observe("a", "k80", 20.0, weight=2.0)  # a = 1 - 0.5 ** 2 = 0.75
    assert est.estimate("a", "k80") == pytest.approx(0.25 * 10.0 + 0.75 * 20.0)
    est.observe("b", "k80", 10.0)
    est.observe_many(["b", "b"], "k80", [20.0, 20.0])
    assert est.estimate("b", "k80") == pytest.approx(est.estimate("a", "k80"))
    est.observe("c", "k80", 10.0)
    est.observe("c", "k80", 20.0, weight=0.5)  # a = 1 - sqrt(0.5)
    assert est.estimate("c", "k80") == pytest.approx(10.0 + (1 - math.sqrt(0.5)) * 10.0)


def test_observe_many_equals_observing_in_order():
    rng = np.random.default_rng(0)
    n = 400
    jobs = rng.choice(["a", "b", "c"], n).tolist()
    gpus = rng.choice(TYPES, n).tolist()
    values = rng.uniform(0.0, 50.0, n)
    weights = rng.uniform(0.1, 3.0, n)
    batch, one_by_one = estimator(smoothing=0.3), estimator(smoothing=0.3)
    batch.observe_many(jobs, gpus, values, weights=weights)
    for job, gpu, x, w in zip(jobs, gpus, values.tolist(), weights.tolist()):
        one_by_one.observe(job, gpu, x, weight=w)
    np.testing.assert_allclose(batch.matrix(), one_by_one.matrix(), rtol=1e-12)
    np.testing.assert_array_equal(batch.observation_counts(), one_by_one.observation_counts())


def test_measured_mask_and_selection():
    est = estimator()
    est.observe_many(["a", "b"], ["p100", "k80"], [1.0, 2.0])
    np.testing.assert_array_equal(est.measured_mask(), [[False, True, False], [True, False, False],
                                                        [False, False, False]])
    np.testing.assert_array_equal(est.measured_mask(["b"], ["v100", "k80"]), [[False, True]])


# ----- priors ----------------------------------------------------------------------------------------
def test_table_prior(table):
    est = ThroughputEstimator(table, ["v100", "k80", "h100"], default_steps_per_s={"h100": 50.0})
    est.add_job("j", model="LM (batch size 5)", scale_factor=2)
    np.testing.assert_array_equal(est.matrix(["j"]), [[table.throughput("LM (batch size 5)", 2, "v100"),
                                                       table.throughput("LM (batch size 5)", 2, "k80"), 50.0]])
    est.observe("j", "v100", 100.0)
    assert est.estimate("j", "v100") == 100.0
    assert est.estimate("j", "k80") == table.throughput("LM (batch size 5)", 2, "k80")  # not rescaled


def test_own_prior_overrides_the_table(table):
    est = ThroughputEstimator(table, TYPES)
    est.add_job("m", model="A3C", prior={"k80": 1.0})
    est.add_job("v", model="A3C", prior=[np.nan, 2.0, 3.0])
    np.testing.assert_array_equal(est.matrix(), [[1.0, table.throughput("A3C", 1, "p100"),
                                                  table.throughput("A3C", 1, "v100")],
                                                 [table.throughput("A3C", 1, "k80"), 2.0, 3.0]])


def test_learned_ratio_prior():
    est = estimator()
    est.add_job("d")
    est.observe_many(["a", "a", "b", "b", "c"], ["k80", "v100", "k80", "v100", "k80"], [1.0, 3.0, 2.0, 24.0, 2.0])
    # ratios v100 / k80: 3 and 12; median of the logs of two values: geometric mean 6
    assert est.learned_ratios()[0, 2] == pytest.approx(6.0)
    assert est.estimate("c", "v100") == pytest.approx(12.0)
    assert est.learned_ratios()[2, 0] == pytest.approx(1 / 6)
    assert np.isnan(est.learned_ratios()[0, 1])  # nobody measured on both k80 and p100
    with pytest.raises(InvalidProblemError, match="job 'a' has no measurement on 'p100' and no prior") as info:
        est.matrix()
    assert info.value.field == "prior" and info.value.job == "a"
    with pytest.raises(InvalidProblemError, match="job 'd' has no measurement on 'k80'"):
        est.estimate("d", "k80")


def test_learned_ratio_uses_every_measured_type():
    est = estimator()
    est.observe_many(["a", "a", "b", "b"], ["k80", "v100", "p100", "v100"], [1.0, 4.0, 1.0, 2.0])
    est.observe_many(["c", "c"], ["k80", "p100"], [1.0, 3.0])
    # from k80: 1 * 4; from p100: 3 * 2; geometric mean
    assert est.estimate("c", "v100") == pytest.approx(math.sqrt(4.0 * 6.0))


def test_ratio_needs_enough_jobs_and_positive_throughputs():
    est = estimator(min_ratio_jobs=2, default_steps_per_s=7.0)
    est.observe_many(["a", "a", "c"], ["k80", "v100", "k80"], [1.0, 3.0, 2.0])
    assert est.estimate("c", "v100") == 7.0  # one job is not enough: default
    est.observe_many(["b", "b"], ["k80", "v100"], [0.0, 5.0])  # zero on k80: no ratio from b
    assert est.estimate("c", "v100") == 7.0
    est.observe("b", "k80", 2.0, weight=50)  # now positive (EMA of 0 and 2 with a ~ 1)
    assert est.estimate("c", "v100") == pytest.approx(2.0 * math.sqrt(3.0 * 5.0 / est.estimate("b", "k80")))


def test_default_prior_per_type():
    est = ThroughputEstimator(None, TYPES, default_steps_per_s={"k80": 1.0, "v100": 4.0})
    est.add_job(7)
    with pytest.raises(InvalidProblemError, match="job 7 has no measurement on 'p100'"):
        est.matrix()
    np.testing.assert_array_equal(est.matrix([7], ["v100", "k80"]), [[4.0, 1.0]])


def test_estimates_feed_a_problem(table):
    est = ThroughputEstimator(table, TYPES)
    for i, model in enumerate(["A3C", "CycleGAN", "LM (batch size 5)"]):
        est.add_job(f"job-{i}", model=model)
    est.observe("job-1", "v100", 3.0)
    cluster = allocopt.Cluster({"v100": 2, "k80": 2})
    problem = allocopt.Problem(est.matrix(gpu_types=cluster.gpu_types), cluster, job_ids=est.job_ids)
    assert problem.throughputs[1, 0] == 3.0 and allocopt.solve(problem, "max_min_fairness").success


def test_remove_job():
    est = estimator(default_steps_per_s=1.0)
    est.observe_many(["a", "a", "b", "c", "c"], ["k80", "v100", "k80", "k80", "p100"], [1.0, 3.0, 2.0, 5.0, 6.0])
    assert est.estimate("b", "v100") == pytest.approx(6.0)
    est.remove_job("a")
    assert est.job_ids == ("c", "b") and len(est) == 2 and "a" not in est
    assert est.estimate("b", "v100") == 1.0  # a's ratio is gone
    np.testing.assert_array_equal(est.matrix(["c"]), [[5.0, 6.0, 1.0]])
    est.add_job("a")
    assert not est.measured_mask(["a"]).any()
    with pytest.raises(InvalidProblemError, match="unknown job 'zz'"):
        est.remove_job("zz")


# ----- state -----------------------------------------------------------------------------------------
def test_state_round_trip(table):
    est = ThroughputEstimator(table, TYPES, smoothing=0.3, default_steps_per_s={"p100": 2.0})
    est.add_job("x", model="A3C")
    est.add_job(5, prior={"k80": 0.5})
    est.add_job("y")
    est.observe_many(["x", "x", 5, 5, "y"], ["k80", "v100", "k80", "k80", "k80"], [1.0, 2.0, 3.0, 4.0, 9.0])
    state = json.loads(json.dumps(est.state_dict()))
    again = ThroughputEstimator.from_state(state)
    assert again.job_ids == est.job_ids and again.gpu_types == est.gpu_types and again.smoothing == 0.3
    np.testing.assert_array_equal(again.matrix(), est.matrix())
    np.testing.assert_array_equal(again.observation_counts(), est.observation_counts())
    for e in (est, again):
        e.observe("y", "k80", 1.0)
        e.remove_job("x")
    np.testing.assert_array_equal(again.matrix(gpu_types=["k80", "p100"]), est.matrix(gpu_types=["k80", "p100"]))
    assert again.job_ids == est.job_ids == ("y", 5)
    with pytest.raises(InvalidProblemError, match="unknown model 'A3"):  # no table given on restore: ...
        ThroughputEstimator.from_state(state, table).add_job("z", model="A3")  # ... only for new jobs


def test_state_errors():
    est = estimator()
    est.add_job(("tuple", 1))
    with pytest.raises(InvalidProblemError, match="cannot be saved as JSON"):
        est.state_dict()
    state = estimator().state_dict()
    del state["jobs"][0]["prior"]
    with pytest.raises(InvalidProblemError, match="malformed estimator state"):
        ThroughputEstimator.from_state(state)
    state = estimator().state_dict()
    state["jobs"][0]["observations"] = [1, 0, 0]  # an observation without an estimate
    with pytest.raises(InvalidProblemError, match="malformed state of job 'a'"):
        ThroughputEstimator.from_state(state)


# ----- errors ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("call, field, message", [
    (lambda e: e.observe("zz", "k80", 1.0), "job_id", "unknown job 'zz'; register it with add_job"),
    (lambda e: e.observe("a", "h100", 1.0), "gpu_type", r"unknown GPU type 'h100'; the estimator has"),
    (lambda e: e.observe("a", "k80", -1.0), "steps_per_s", "measured throughput of job 'a' on 'k80' is -1.0"),
    (lambda e: e.observe("a", "k80", float("nan")), "steps_per_s", "is nan"),
    (lambda e: e.observe("a", "k80", float("inf")), "steps_per_s", "is inf"),
    (lambda e: e.observe("a", "k80", 1.0, weight=0.0), "weight", "weight of the measurement of job 'a' is 0.0"),
    (lambda e: e.observe("a", "k80", "fast"), "steps_per_s", "steps_per_s must be a number"),
    (lambda e: e.observe_many(["a", "b"], ["k80"], [1.0, 2.0]), "gpu_type", "gpu_types has 1 entries, expected 2"),
    (lambda e: e.observe_many(["a", "b"], "k80", [1.0, 2.0, 3.0]), "steps_per_s", "must be a number or 2"),
    (lambda e: e.add_job("a"), "job_id", "job 'a' is already registered"),
    (lambda e: e.add_job("n", scale_factor=0), "scale_factor", "give an integer >= 1"),
    (lambda e: e.add_job("n", prior={"h100": 1.0}), "prior", r"unknown GPU type\(s\) \['h100'\]"),
    (lambda e: e.add_job("n", prior={"k80": -1.0}), "prior", "give finite steps/s >= 0"),
    (lambda e: e.add_job(["unhashable"]), "job_id", "is not hashable"),
    (lambda e: e.matrix(["a", "zz"]), "job_id", "unknown job 'zz'"),
])
def test_errors(call, field, message):
    est = estimator(default_steps_per_s=1.0)
    with pytest.raises(InvalidProblemError, match=message) as info:
        call(est)
    assert info.value.field == field


def test_failed_batch_changes_nothing():
    est = estimator()
    with pytest.raises(InvalidProblemError):
        est.observe_many(["a", "b"], ["k80", "k80"], [1.0, -1.0])
    assert not est.measured_mask().any()


@pytest.mark.parametrize("options, message", [
    ({"smoothing": 0.0}, r"smoothing must be in \(0, 1\]"),
    ({"smoothing": 1.5}, r"smoothing must be in \(0, 1\]"),
    ({"min_ratio_jobs": 0}, "min_ratio_jobs must be an integer >= 1"),
    ({"default_steps_per_s": -1.0}, "default_steps_per_s has"),
    ({"default_steps_per_s": {"h100": 1.0}}, r"unknown GPU type\(s\) \['h100'\]"),
])
def test_bad_options(options, message):
    with pytest.raises(InvalidProblemError, match=message):
        ThroughputEstimator(None, TYPES, **options)


def test_table_model_errors(table):
    est = ThroughputEstimator(table, TYPES)
    with pytest.raises(InvalidProblemError, match="unknown model 'Resnet'"):
        est.add_job("j", model="Resnet")
    with pytest.raises(InvalidProblemError, match="has no measurement at scale_factor=2"):
        est.add_job("j", model="A3C", scale_factor=2)
    assert "j" not in est
    with pytest.raises(InvalidProblemError, match="gpu_types must be distinct"):
        ThroughputEstimator(table, ["k80", "k80"])
    with pytest.raises(InvalidProblemError, match="table must be a ThroughputTable"):
        ThroughputEstimator({"k80": 1.0}, TYPES)
