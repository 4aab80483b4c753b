"""ThroughputTable: the shipped Gavel data, lookups, sampling and user records."""

from __future__ import annotations

import numpy as np
import pytest

import allocopt
from allocopt.errors import InvalidProblemError
from allocopt.throughput import DEFAULT_SCALE_FACTOR_PROBS, ThroughputTable

GAVEL_CLUSTER = allocopt.Cluster({"v100": 36, "p100": 36, "k80": 36})


@pytest.fixture(scope="module")
def table() -> ThroughputTable:
    return ThroughputTable.gavel()


def test_gavel_table_loads(table):
    assert table.gpu_types == ("k80", "p100", "v100")
    assert len(table.models) == 26 and len(table) == 83
    assert table.throughputs_steps_per_s.shape == (83, 3)
    assert (table.throughputs_steps_per_s >= 0).all()
    assert table.scale_factors("A3C") == (1,)
    assert table.scale_factors("LM (batch size 5)") == (1, 2, 4, 8)


def test_lookups(table):
    model = "ResNet-18 (batch size 16)"
    assert table.throughput(model, 1, "k80") == 4.795294551566172  # Gavel's measurement, copied unchanged
    np.testing.assert_array_equal(table.row(model, 1, ["v100", "k80"]),
                                  [table.throughput(model, 1, "v100"), table.throughput(model, 1, "k80")])
    np.testing.assert_array_equal(table.row(model, 4), [table.throughput(model, 4, t) for t in table.gpu_types])
    assert table.throughput("ResNet-50 (batch size 128)", 2, "k80") == 0.0  # out of memory


@pytest.mark.parametrize("call, field, message", [
    (lambda t: t.throughput("ResNet-18", 1, "k80"), "model", r"unknown model 'ResNet-18'; did you mean "
                                                             r"'ResNet-18 \(batch size 16\)'"),
    (lambda t: t.scale_factors("BERT"), "model", r"unknown model 'BERT'; see ThroughputTable.models"),
    (lambda t: t.row("A3C", 2), "scale_factor", r"model 'A3C' has no measurement at scale_factor=2; "
                                                r"measured scale factors: 1"),
    (lambda t: t.throughput("A3C", 1, "a100"), "gpu_type", r"unknown GPU type\(s\) \['a100'\]"),
    (lambda t: t.sample_problem(allocopt.Cluster({"h100": 8}), 5, seed=0), "gpu_type", r"\['h100'\]"),
])
def test_unknown_names_raise_typed_errors(table, call, field, message):
    with pytest.raises(InvalidProblemError, match=message) as info:
        call(table)
    assert info.value.field == field


def test_table_is_immutable(table):
    with pytest.raises(ValueError):
        table.throughputs_steps_per_s[0, 0] = 1.0
    with pytest.raises(AttributeError):
        table.gpu_types = ("a100",)


def test_sample_problem_is_deterministic_given_the_seed(table):
    a = table.sample_problem(GAVEL_CLUSTER, 50, seed=3)
    b = table.sample_problem(GAVEL_CLUSTER, 50, seed=3)
    c = table.sample_problem(GAVEL_CLUSTER, 50, seed=4)
    assert a.job_ids == b.job_ids == tuple(f"job-{i:03d}" for i in range(50))
    np.testing.assert_array_equal(a.throughputs, b.throughputs)
    np.testing.assert_array_equal(a.scale_factors, b.scale_factors)
    assert not np.array_equal(a.throughputs, c.throughputs)


def test_sample_problem_jobs_are_the_sampled_job_types(table):
    jobs = table.sample_jobs(GAVEL_CLUSTER, 40, seed=11)
    problem = table.sample_problem(GAVEL_CLUSTER, 40, seed=11)
    assert problem.scale_factors.tolist() == [s for _, s in jobs]
    np.testing.assert_array_equal(problem.throughputs, [table.row(m, s, GAVEL_CLUSTER.gpu_types) for m, s in jobs])


@pytest.mark.parametrize("gpus", [{"v100": 36, "p100": 36, "k80": 36}, {"v100": 1, "p100": 4, "k80": 2},
                                  {"k80": 8}])
def test_sampled_jobs_fit_the_cluster(table, gpus):
    cluster = allocopt.Cluster(gpus)
    problem = table.sample_problem(cluster, 300, seed=0)
    assert problem.runnable.any(axis=1).all()  # positive throughput on a type with enough GPUs
    assert (problem.throughputs >= 0).all() and (problem.throughputs.max(axis=1) > 0).all()
    assert problem.scale_factors.max() <= cluster.capacity.max()
    assert set(problem.scale_factors.tolist()) <= set(DEFAULT_SCALE_FACTOR_PROBS)
    alloc = allocopt.solve(problem, "max_min_fairness")
    assert alloc.success and (alloc.gpus_used <= cluster.capacity + 1e-6).all()


def test_sampled_jobs_follow_the_distributions(table):
    problem = table.sample_problem(GAVEL_CLUSTER, 6000, seed=1, priority_weights={1: 0.75, 4: 0.25})
    jobs = table.sample_jobs(GAVEL_CLUSTER, 6000, seed=1)
    models = [m for m, _ in jobs]
    # models are uniform; multi-GPU scale factors only come from the models measured at them
    counts = np.array([models.count(m) for m in table.models])
    assert counts.min() > 0.7 * len(jobs) / len(table.models)
    multi = {m for m in table.models if len(table.scale_factors(m)) > 1}
    assert all(s == 1 for m, s in jobs if m not in multi)
    scales = [s for m, s in jobs if m in multi]
    for s, p in DEFAULT_SCALE_FACTOR_PROBS.items():
        assert scales.count(s) / len(scales) == pytest.approx(p, abs=0.03)
    assert np.mean(problem.priority_weights == 4.0) == pytest.approx(0.25, abs=0.03)


def test_sampling_options_are_validated(table):
    with pytest.raises(InvalidProblemError, match="no entry of the table fits"):
        table.sample_problem(GAVEL_CLUSTER, 5, seed=0, scale_factor_probs={16: 1.0})
    with pytest.raises(InvalidProblemError, match="scale_factor_probs keys must be positive integers"):
        table.sample_problem(GAVEL_CLUSTER, 5, seed=0, scale_factor_probs={1.5: 1.0})
    with pytest.raises(InvalidProblemError, match="priority_weights values must be finite"):
        table.sample_problem(GAVEL_CLUSTER, 5, seed=0, priority_weights={1: -0.5})
    with pytest.raises(InvalidProblemError, match="n_jobs must be a non-negative integer"):
        table.sample_problem(GAVEL_CLUSTER, -1, seed=0)
    assert table.sample_problem(GAVEL_CLUSTER, 0, seed=0).num_jobs == 0


def test_problem_from_job_types(table):
    cluster = allocopt.Cluster({"v100": 8, "k80": 8})
    problem = table.problem([("A3C", 1), ("LM (batch size 10)", 8)], cluster, job_ids=["x", "y"],
                            priority_weights=[1.0, 2.0])
    np.testing.assert_array_equal(problem.throughputs[1], table.row("LM (batch size 10)", 8, ["v100", "k80"]))
    assert problem.scale_factors.tolist() == [1, 8] and problem.job_ids == ("x", "y")


def test_records_round_trip(table):
    again = ThroughputTable.from_records(table.to_records())
    assert again.to_records() == table.to_records()
    assert again.entries == table.entries and again.gpu_types == table.gpu_types


def test_own_measurements(table):
    records = [{"model": "bert", "scale_factor": 1, "throughputs_steps_per_s": {"a100": 9.0, "t4": 2.5}},
               {"model": "bert", "scale_factor": 4, "throughputs_steps_per_s": {"t4": 8.0, "a100": 30.0}}]
    own = ThroughputTable.from_records(records)
    assert own.gpu_types == ("a100", "t4") and own.models == ("bert",)
    assert own.scale_factors("bert") == (1, 4)
    assert own.throughput("bert", 4, "t4") == 8.0
    problem = own.sample_problem(allocopt.Cluster({"a100": 2, "t4": 4}), 10, seed=0)
    assert problem.runnable.any(axis=1).all()
    assert (problem.scale_factors[problem.throughputs[:, 1] == 8.0] == 4).all()


@pytest.mark.parametrize("records, message", [
    ([{"model": "m", "scale_factor": 1, "throughputs_steps_per_s": {"a": 1.0}},
      {"model": "m", "scale_factor": 2, "throughputs_steps_per_s": {"b": 1.0}}],
     r"records\[0\] \(model 'm', scale_factor 1\) has no throughput for GPU type\(s\) \['b'\]"),
    ([{"model": "m", "scale_factor": 1, "throughputs_steps_per_s": {"a": 1.0}}] * 2,
     r"entry \(model 'm', scale_factor 1\) appears twice"),
    ([{"model": "m", "scale_factor": 1, "throughputs_steps_per_s": {"a": -2.0}}],
     r"throughput of model 'm' at scale_factor 1 on GPU type 'a' is -2.0"),
    ([{"model": "m", "scale_factor": 1.5, "throughputs_steps_per_s": {"a": 1.0}}],
     r"scale_factor 1.5; give an integer"),
    ([{"model": "m", "throughputs_steps_per_s": {"a": 1.0}}], r"records\[0\] must be a mapping with"),
])
def test_bad_records_raise(records, message):
    with pytest.raises(InvalidProblemError, match=message):
        ThroughputTable.from_records(records)
