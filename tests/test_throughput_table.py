"""ThroughputTable: the shipped Gavel data, lookups, sampling and user records."""

from __future__ import annotations

import json
import re

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


# ----- co-located pairs --------------------------------------------------------------------------
def test_gavel_pairs_load(table):
    assert len(table.pairs) == 921  # 26 models at scale 1 (351 unordered pairs), 19 at each of 2, 4, 8 (190)
    assert table.pair_throughputs_steps_per_s.shape == (921, 3, 2)
    scales = [s for *_, s in table.pairs]
    assert [scales.count(s) for s in (1, 2, 4, 8)] == [351, 190, 190, 190]
    with pytest.raises(ValueError):
        table.pair_throughputs_steps_per_s[0, 0, 0] = 1.0


# Literal values copied from Gavel's simulation_throughputs.json: raw[type][(a, s)][(b, s)] = [tput_a, tput_b].
GAVEL_PAIRS = [
    ("A3C", "CycleGAN", 1, "v100", (4.562135656281291, 3.1632656249608218)),
    ("CycleGAN", "A3C", 1, "k80", (0.2929245217707302, 1.465712052727541)),
    ("ResNet-50 (batch size 32)", "ResNet-50 (batch size 128)", 1, "p100", (2.4423161094540324, 1.1244175685708315)),
    ("ResNet-50 (batch size 32)", "ResNet-50 (batch size 128)", 1, "v100", (0.0, 0.0)),  # cannot share
    ("ResNet-50 (batch size 128)", "ResNet-50 (batch size 128)", 1, "v100", (0.0, 0.0)),
    ("LM (batch size 5)", "Transformer (batch size 32)", 4, "p100", (0.0, 0.0)),
]


@pytest.mark.parametrize("model_a, model_b, scale, gpu, expected", GAVEL_PAIRS)
def test_pair_lookup_matches_gavel(table, model_a, model_b, scale, gpu, expected):
    assert table.pair_throughput(model_a, model_b, scale, gpu) == expected
    assert table.pair_throughput(model_b, model_a, scale, gpu) == expected[::-1]


def test_pair_lookup_is_vectorized(table):
    a, b, s, gpus, _ = zip(*GAVEL_PAIRS)
    values = table.pair_throughputs(a, b, s, ["v100", "k80", "p100"])
    assert values.shape == (len(a), 3, 2)
    for p in range(len(a)):
        for j, gpu in enumerate(["v100", "k80", "p100"]):
            assert tuple(values[p, j]) == table.pair_throughput(a[p], b[p], s[p], gpu)
    np.testing.assert_array_equal(table.pair_throughputs(["A3C"] * 2, ["CycleGAN", "A3C"], 1),
                                  [[table.pair_throughput("A3C", m, 1, t) for t in table.gpu_types]
                                   for m in ("CycleGAN", "A3C")])
    with pytest.raises(InvalidProblemError, match="has no measurement at scale_factor=2"):
        table.pair_throughputs(["A3C"], ["CycleGAN"], 2)


def test_unconsolidated_table():
    spread, packed = ThroughputTable.gavel(consolidated=False), ThroughputTable.gavel()
    assert spread.entries == packed.entries and spread.pairs == packed.pairs
    # Gavel's k80_unconsolidated / v100_unconsolidated values, then the consolidated ones
    assert spread.throughput("ResNet-18 (batch size 16)", 2, "k80") == 9.26385034797633
    assert packed.throughput("ResNet-18 (batch size 16)", 2, "k80") == 8.758230831811566
    assert spread.throughput("ResNet-50 (batch size 64)", 4, "v100") == 11.136430014818272
    assert packed.throughput("ResNet-50 (batch size 64)", 4, "v100") == 9.451949566394442
    # absent from k80_unconsolidated: the consolidated value is kept
    assert spread.throughput("ResNet-50 (batch size 64)", 4, "k80") == 2.4122290974193286
    np.testing.assert_array_equal(spread.row("A3C", 1), packed.row("A3C", 1))


def test_space_sharing_problem_has_every_pair_of_equal_scale_factor(table):
    jobs = [("A3C", 1), ("LM (batch size 5)", 2), ("CycleGAN", 1), ("LM (batch size 10)", 2),
            ("ResNet-50 (batch size 128)", 1), ("ResNet-50 (batch size 32)", 1), ("A3C", 1),
            ("ResNet-18 (batch size 16)", 4)]
    ids = [f"j{i}" for i in range(len(jobs))]
    cluster = allocopt.Cluster({"v100": 4, "k80": 4})
    problem = table.problem(jobs, cluster, job_ids=ids, space_sharing=True)
    expected = [(i, j) for i in range(len(jobs)) for j in range(i + 1, len(jobs)) if jobs[i][1] == jobs[j][1]]
    assert problem.pairs.tolist() == [list(p) for p in expected]
    for (i, j), values in zip(expected, problem.pair_throughput_array):
        for k, gpu in enumerate(cluster.gpu_types):  # oriented as (job i, job j)
            assert tuple(values[k]) == table.pair_throughput(jobs[i][0], jobs[j][0], jobs[i][1], gpu)
    rn50 = expected.index((4, 5))
    np.testing.assert_array_equal(problem.pair_throughput_array[rn50], [[0, 0], [0, 0]])  # kept: cannot share
    assert table.problem(jobs, cluster).pairs is None
    alloc = allocopt.solve(problem, "max_min_fairness", space_sharing=True)
    assert alloc.success


def test_sample_problem_with_space_sharing(table):
    problem = table.sample_problem(GAVEL_CLUSTER, 200, seed=5, space_sharing=True)
    plain = table.sample_problem(GAVEL_CLUSTER, 200, seed=5)
    np.testing.assert_array_equal(problem.throughputs, plain.throughputs)
    counts = np.bincount(problem.scale_factors)
    assert len(problem.pairs) == sum(c * (c - 1) // 2 for c in counts)  # Gavel measured every equal-scale pair
    assert (problem.scale_factors[problem.pairs[:, 0]] == problem.scale_factors[problem.pairs[:, 1]]).all()
    assert (problem.pairs[:, 0] < problem.pairs[:, 1]).all()


def test_space_sharing_needs_pairs(table):
    isolated_only = ThroughputTable.from_records(table.to_records())
    with pytest.raises(InvalidProblemError, match="this table has none") as info:
        isolated_only.problem([("A3C", 1)], GAVEL_CLUSTER, space_sharing=True)
    assert info.value.field == "space_sharing"


@pytest.mark.parametrize("pairs, values, message", [
    ([("a", "b", 1), ("b", "a", 1)], np.ones((2, 1, 2)), r"pair \('a', 'b'\) at scale_factor 1 appears twice"),
    ([("a", "c", 1)], np.ones((1, 1, 2)), r"model 'c' has no isolated entry at scale_factor 1"),
    ([("a", "b", 2)], np.ones((1, 1, 2)), r"model 'a' has no isolated entry at scale_factor 2"),
    ([("a", "b", 1)], -np.ones((1, 1, 2)), r"has throughputs \[-1.0, -1.0\]"),
    ([("a", "b", 1)], np.ones((1, 2, 2)), r"shape \(1, 2, 2\), expected"),
])
def test_bad_pairs_raise(pairs, values, message):
    with pytest.raises(InvalidProblemError, match=message):
        ThroughputTable([("a", 1), ("b", 1)], ["x"], [[1.0], [2.0]], pairs=pairs, pair_throughputs_steps_per_s=values)


# ----- a user's measurement files --------------------------------------------------------------
HEADER = "model,scale_factor,gpu_type,throughput,other_model,throughput_other\n"
OWN_CSV = HEADER + """bert,1,a100,9.0,,
bert,1,t4,2.5,,
gpt,1,a100,4.0,,
gpt,1,t4,1.0,,
bert,4,a100,30,,
bert,4,t4,8,,
bert,1,a100,5.0,gpt,3.0
gpt,1,t4,0.5,bert,1.5
bert,1,a100,4.5,bert,4.5
bert,1,t4,0,bert,0
"""


@pytest.fixture
def own(tmp_path) -> ThroughputTable:
    path = tmp_path / "own.csv"
    path.write_text(OWN_CSV)
    return ThroughputTable.from_csv(path)


def test_own_measurements_with_pairs(own):
    assert own.gpu_types == ("a100", "t4") and own.entries == (("bert", 1), ("gpt", 1), ("bert", 4))
    assert own.throughput("bert", 4, "t4") == 8.0
    assert own.pairs == (("bert", "gpt", 1), ("bert", "bert", 1))
    assert own.pair_throughput("bert", "gpt", 1, "a100") == (5.0, 3.0)
    assert own.pair_throughput("bert", "gpt", 1, "t4") == (1.5, 0.5)  # given as (gpt, bert): reoriented
    assert own.pair_throughput("gpt", "bert", 1, "t4") == (0.5, 1.5)
    assert own.pair_throughput("bert", "bert", 1, "t4") == (0.0, 0.0)
    values = own.pair_throughputs(["gpt", "bert"], ["gpt", "gpt"], 1)
    assert np.isnan(values[0]).all() and not np.isnan(values[1]).any()  # (gpt, gpt) was not measured
    with pytest.raises(InvalidProblemError, match="no co-located measurement of 'gpt' with 'gpt'"):
        own.pair_throughput("gpt", "gpt", 1, "t4")

    problem = own.problem([("gpt", 1), ("bert", 1), ("gpt", 1), ("bert", 4), ("bert", 1)],
                          allocopt.Cluster({"t4": 4, "a100": 4}), space_sharing=True)
    # (0, 2) is (gpt, gpt): not measured, so not a pair; (3, *) differ in scale factor
    assert problem.pairs.tolist() == [[0, 1], [0, 4], [1, 2], [1, 4], [2, 4]]
    np.testing.assert_array_equal(problem.pair_throughput_array[0], [[0.5, 1.5], [3.0, 5.0]])  # t4, a100
    np.testing.assert_array_equal(problem.pair_throughput_array[1], [[0.5, 1.5], [3.0, 5.0]])
    np.testing.assert_array_equal(problem.pair_throughput_array[2], [[1.5, 0.5], [5.0, 3.0]])
    np.testing.assert_array_equal(problem.pair_throughput_array[3], [[0.0, 0.0], [4.5, 4.5]])


def _assert_same_table(a: ThroughputTable, b: ThroughputTable) -> None:
    assert a.entries == b.entries and a.gpu_types == b.gpu_types and a.pairs == b.pairs
    np.testing.assert_array_equal(a.throughputs_steps_per_s, b.throughputs_steps_per_s)
    np.testing.assert_array_equal(a.pair_throughputs_steps_per_s, b.pair_throughputs_steps_per_s)


@pytest.mark.parametrize("fmt", ["csv", "json", "frame"])
@pytest.mark.parametrize("which", ["gavel", "own", "isolated"])
def test_round_trip(table, own, tmp_path, fmt, which):
    source = {"gavel": table, "own": own, "isolated": ThroughputTable.from_records(own.to_records())}[which]
    if fmt == "frame":
        pytest.importorskip("pandas")
        again = ThroughputTable.from_frame(source.to_frame())
    else:
        path = tmp_path / f"table.{fmt}"
        getattr(source, f"to_{fmt}")(path)
        again = getattr(ThroughputTable, f"from_{fmt}")(path)
    _assert_same_table(again, source)


def test_csv_layout(own, tmp_path):
    own.to_csv(tmp_path / "out.csv")
    lines = (tmp_path / "out.csv").read_text().splitlines()
    assert lines[0] == HEADER.strip()
    assert lines[1] == "bert,1,a100,9.0,," and lines[-1] == "bert,1,t4,0.0,bert,0.0"
    own.to_json(tmp_path / "out.json")
    records = json.loads((tmp_path / "out.json").read_text())
    assert records[0] == {"model": "bert", "scale_factor": 1, "gpu_type": "a100", "throughput": 9.0}
    assert records[6] == {"model": "bert", "scale_factor": 1, "gpu_type": "a100", "throughput": 5.0,
                          "other_model": "gpt", "throughput_other": 3.0}


def test_csv_extras_are_tolerated(tmp_path):
    path = tmp_path / "m.csv"
    path.write_text("\ufeffgpu_type, model ,throughput,scale_factor,note\n\nv100, bert ,1e1,1,first\n")
    t = ThroughputTable.from_csv(path)
    assert t.entries == (("bert", 1),) and t.throughput("bert", 1, "v100") == 10.0 and t.pairs == ()


@pytest.mark.parametrize("text, location, field, message", [
    ("model,gpu_type,throughput\nbert,a100,1\n", ":1", "scale_factor", r"missing column\(s\) \['scale_factor'\]"),
    ("", ":1", "header", "empty file"),
    (HEADER + "bert,1,a100,9\nbert,1,t4,abc\n", ":3:4", "throughput", "column 'throughput': 'abc' is not a number"),
    (HEADER + "bert,1,a100,-1\n", ":2:4", "throughput", "'-1' must be a finite number >= 0"),
    (HEADER + "bert,1,a100,inf\n", ":2:4", "throughput", "'inf' must be a finite number >= 0"),
    (HEADER + "bert,1,a100,\n", ":2:4", "throughput", "missing value"),
    (HEADER + ",1,a100,1\n", ":2:1", "model", "column 'model': missing value"),
    (HEADER + "bert,two,a100,1\n", ":2:2", "scale_factor", "'two' is not a number"),
    (HEADER + "bert,1.5,a100,1\n", ":2:2", "scale_factor", "'1.5' must be an integer number of GPUs >= 1"),
    (HEADER + "bert,1,a100,1\nbert,1,t4,1\nbert,1,a100,2\n", ":4", "row", "duplicate row.* as .*m.csv:2"),
    (HEADER + "a,1,x,1\nb,1,x,1\na,1,x,1,b,2\nb,1,x,2,a,1\n", ":5", "row", "duplicate row.* as .*m.csv:4"),
    (HEADER + "a,1,x,1\na,1,y,1\nb,1,x,1\n", ":4:3", "gpu_type",
     r"model 'b' at scale_factor 1 has no row for GPU type\(s\) \['y'\]"),
    (HEADER + "a,1,x,1\na,1,y,1\na,1,x,1,a,1\n", ":4:3", "gpu_type",
     r"pair \('a', 'a'\) at scale_factor 1 has no row for GPU type\(s\) \['y'\]"),
    (HEADER + "a,1,x,1\na,1,x,1,c,2\n", ":3:5", "other_model", "model 'c' has no isolated row at scale_factor 1"),
    (HEADER + "a,1,x,1\na,1,x,1,a,\n", ":3:6", "throughput_other", "missing value; a co-located row needs both"),
    (HEADER + "a,1,x,1,,3\n", ":2:5", "other_model", "missing value"),
    (HEADER + "a,1,x,1,a,-3\n", ":2:6", "throughput_other", "'-3' must be a finite number >= 0"),
    (HEADER + "a,1,x,1,,,7\n", ":2:7", "header", "7 fields but the header has 6"),
])
def test_malformed_csv_names_file_line_and_column(tmp_path, text, location, field, message):
    path = tmp_path / "m.csv"
    path.write_text(text)
    with pytest.raises(InvalidProblemError, match=re.escape(f"{path}{location}: ") + ".*" + message) as info:
        ThroughputTable.from_csv(path)
    assert info.value.field == field


@pytest.mark.parametrize("text, match", [
    ('[\n {"model": "a", "scale_factor": 1, "gpu_type": "x", "throughput": 1},\n {"model": "a",\n'
     '  "scale_factor": 1, "gpu_type": "y", "throughput": "fast"}\n]\n', ":3: key 'throughput': 'fast' is not a"),
    ('[{"model": "a", "scale_factor": 1, "gpu_type": "x", "throughput": true}]', ":1: key 'throughput': True is not"),
    ('[\n {"model": "a", "scale_factor": 1, "gpu_type": "x"}\n]', ":2: key 'throughput': missing value"),
    ('[\n {"model": "a", "scale_factor": 1 "gpu_type": "x"}\n]', ":2:35: invalid JSON"),
    ('{"model": "a"}', ":1:1: invalid JSON: expected a JSON array"),
    ('[\n 3\n]', ":2: element 0 is int"),
    ('[] []', ":1:4: invalid JSON: extra data"),
])
def test_malformed_json_names_file_and_line(tmp_path, text, match):
    path = tmp_path / "m.json"
    path.write_text(text)
    with pytest.raises(InvalidProblemError, match=re.escape(f"{path}{match}")):
        ThroughputTable.from_json(path)


def test_malformed_frame_names_row_and_column():
    pd = pytest.importorskip("pandas")
    frame = pd.DataFrame({"model": ["a", "a"], "scale_factor": [1, 1], "gpu_type": ["x", "y"],
                          "throughput": [1.0, -2.0]}, index=["r1", "r2"])
    with pytest.raises(InvalidProblemError, match=r"DataFrame row 1 \(index 'r2'\): column 'throughput': -2.0 must"):
        ThroughputTable.from_frame(frame)
    with pytest.raises(InvalidProblemError, match=r"DataFrame: missing column\(s\) \['gpu_type'\]"):
        ThroughputTable.from_frame(frame.drop(columns="gpu_type"))
    frame.loc["r2", "throughput"] = 2.0
    frame["other_model"] = [None, np.nan]  # pandas' empty cells: isolated rows
    assert ThroughputTable.from_frame(frame).throughput("a", 1, "y") == 2.0
