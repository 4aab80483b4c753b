"""Problem and Cluster validation: every invalid input raises a typed error naming what is wrong."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import allocopt
from allocopt import Cluster, Problem
from allocopt.errors import DataFileError, InvalidProblemError

CLUSTER = Cluster({"v100": 2, "k80": 4}, gpus_per_node=2)
T = [[40.0, 10.0], [12.0, 4.0], [100.0, 50.0]]


@pytest.mark.parametrize("kwargs, field, match", [
    (dict(throughputs=[[1.0, np.nan]]), "throughputs", r"job 0 on GPU type 'k80' is nan"),
    (dict(throughputs=[[1.0, np.inf]]), "throughputs", r"is inf.*finite steps/s"),
    (dict(throughputs=[[1.0, -2.0]]), "throughputs", r"job 0 on GPU type 'k80' is -2.0"),
    (dict(throughputs=[[1.0, 2.0, 3.0]]), "throughputs", r"shape \(1, 3\), expected \(n_jobs, n_gpu_types\) = \(1, 2\)"),
    (dict(throughputs=[1.0, 2.0]), "throughputs", r"shape \(2,\)"),
    (dict(throughputs=[["a", 1]]), "throughputs", r"numeric"),
    (dict(throughputs=T, job_ids=["a", "b"]), "job_ids", r"job_ids has 2 entries but throughputs has 3 rows"),
    (dict(throughputs=T, job_ids=["a", "b", "a"]), "job_ids", r"duplicate job id\(s\) \['a'\]"),
    (dict(throughputs=T, job_ids=["a", ["b"], "c"]), "job_ids", r"not hashable"),
    (dict(throughputs=T, priority_weights=[1, 0, 1]), "priority_weights", r"job 1 is 0.0; weights must be positive"),
    (dict(throughputs=T, priority_weights=[1, -1, 1]), "priority_weights", r"must be positive"),
    (dict(throughputs=T, priority_weights=[1, 1]), "priority_weights", r"shape \(2,\), expected \(n_jobs,\) = \(3,\)"),
    (dict(throughputs=T, scale_factors=[1, 8, 1]), "scale_factors", r"job 1 needs scale_factor=8 GPUs but the largest GPU type has 4"),
    (dict(throughputs=T, scale_factors=[1, 1.5, 1]), "scale_factors", r"integer number of GPUs"),
    (dict(throughputs=T, scale_factors=[1, 0, 1]), "scale_factors", r"must be >= 1"),
    (dict(throughputs=[[0.0, 0.0], [1.0, 1.0]]), "throughputs", r"job 0 has zero throughput on every GPU type"),
    (dict(throughputs=[[5.0, 0.0]], scale_factors=[4]), "throughputs", r"job 0 has zero throughput on every GPU type with at least its scale_factor=4"),
    (dict(throughputs=T, num_steps_remaining=[1, -1, 1]), "num_steps_remaining", r"job 1 is -1.0; it must be >= 0"),
    (dict(throughputs=T, time_since_start=[1, 1, np.nan]), "time_since_start", r"job 2 is nan"),
    (dict(throughputs=T, slos=[10, np.inf, 5]), "num_steps_remaining", r"job 0 has a deadline"),
    (dict(throughputs=T, slos=[10, 0, 5], num_steps_remaining=[1, 1, 1]), "slos", r"slo of job 1 is 0.0"),
    (dict(throughputs=T, costs={"v100": 2.0}), "costs", r"missing: \['k80'\]"),
    (dict(throughputs=T, costs={"v100": 2.0, "k80": 1.0, "a100": 3.0}), "costs", r"unknown: \['a100'\]"),
    (dict(throughputs=T, costs=[2.0, 0.0]), "costs", r"costs\['k80'\] is 0.0"),
    (dict(throughputs=T, scale_factors={0: 1}), "scale_factors", r"from_dicts"),
])
def test_invalid_arrays(kwargs, field, match):
    throughputs = kwargs.pop("throughputs")
    with pytest.raises(InvalidProblemError, match=match) as info:
        Problem(throughputs, CLUSTER, **kwargs)
    assert info.value.field == field
    assert isinstance(info.value, ValueError)


@pytest.mark.parametrize("kwargs, match", [
    (dict(throughputs={"a": {"v100": 1.0}}), r"job 'a' has no throughput for GPU type\(s\) \['k80'\]; give 0.0"),
    (dict(throughputs={"a": {"v100": 1.0, "k80": 1.0, "a100": 2.0}}), r"job 'a' has throughputs for unknown GPU type\(s\) \['a100'\]"),
    (dict(throughputs={"a": [1.0, 2.0]}), r"throughputs\['a'\] must be a mapping"),
    (dict(throughputs={"a": {"v100": 1, "k80": 1}}, scale_factors={"b": 1}), r"scale_factors names job\(s\) \['b'\] that are not in throughputs"),
    (dict(throughputs={"a": {"v100": 1, "k80": 1}, "b": {"v100": 1, "k80": 1}}, priority_weights={"a": 1}),
     r"priority_weights has no entry for job\(s\) \['b'\]"),
])
def test_invalid_dicts(kwargs, match):
    with pytest.raises(InvalidProblemError, match=match):
        Problem.from_dicts(cluster=CLUSTER, **kwargs)


@pytest.mark.parametrize("gpus, per_node, match", [
    ({}, 8, "non-empty mapping"),
    ({"v100": -1}, 8, r"gpus\['v100'\] must be a non-negative integer"),
    ({"v100": 1.5}, 8, "non-negative integer"),
    ({"v100": 4}, 0, r"gpus_per_node\['v100'\] must be a positive integer"),
    ({"v100": 4}, {"k80": 4}, "unknown GPU type"),
    ({"v100": 4, "k80": 2}, {"v100": 4}, r"no entry for GPU type\(s\) \['k80'\]"),
])
def test_invalid_cluster(gpus, per_node, match):
    with pytest.raises(InvalidProblemError, match=match):
        Cluster(gpus, gpus_per_node=per_node)


def test_unknown_gpu_type_lookup():
    with pytest.raises(InvalidProblemError, match=r"unknown GPU type 'a100'; the cluster's types are \['v100', 'k80'\]"):
        CLUSTER.index("a100")


def test_constructors_agree():
    pd = pytest.importorskip("pandas")
    ids = ["a", ("b", 2), 7]
    by_array = Problem(T, CLUSTER, job_ids=ids, scale_factors=[1, 2, 1], priority_weights=[1, 2, 3])
    by_dicts = Problem.from_dicts({j: dict(zip(CLUSTER.gpu_types, row)) for j, row in zip(ids, T)}, CLUSTER,
                                  scale_factors={"a": 1, ("b", 2): 2, 7: 1},
                                  priority_weights={"a": 1, ("b", 2): 2, 7: 3})
    frame = pd.DataFrame(np.array(T)[:, ::-1], index=ids, columns=["k80", "v100"])  # columns reordered
    by_frame = Problem(frame, CLUSTER, scale_factors=[1, 2, 1], priority_weights=[1, 2, 3])
    for p in (by_dicts, by_frame):
        assert p.job_ids == by_array.job_ids
        np.testing.assert_array_equal(p.throughputs, by_array.throughputs)
        np.testing.assert_array_equal(p.scale_factors, by_array.scale_factors)
        np.testing.assert_array_equal(p.priority_weights, by_array.priority_weights)
    assert by_array.job_index(("b", 2)) == 1
    with pytest.raises(InvalidProblemError, match="unknown job id"):
        by_array.job_index("zz")


def test_frame_columns_checked():
    pd = pytest.importorskip("pandas")
    with pytest.raises(InvalidProblemError, match=r"no column for GPU type\(s\) \['k80'\]"):
        Problem(pd.DataFrame({"v100": [1.0]}), CLUSTER)
    with pytest.raises(InvalidProblemError, match=r"unknown GPU type\(s\) \['a100'\]"):
        Problem(pd.DataFrame({"v100": [1.0], "k80": [1.0], "a100": [1.0]}), CLUSTER)


def test_problem_is_frozen_and_json_round_trips():
    p = Problem(T, CLUSTER, job_ids=["a", "b", "c"], scale_factors=[1, 2, 1], num_steps_remaining=[10, 20, 30],
                slos=[100, np.inf, 50], costs={"v100": 2.5, "k80": 0.9}, time_since_start=[0, 5, 9])
    with pytest.raises(ValueError):
        p.throughputs[0, 0] = 1.0
    q = Problem.from_json(p.to_json())
    for name in ("throughputs", "scale_factors", "priority_weights", "num_steps_remaining", "slos", "costs",
                 "time_since_start"):
        np.testing.assert_array_equal(getattr(q, name), getattr(p, name))
    assert q.job_ids == p.job_ids and q.cluster == p.cluster


def test_one_json_convention_paths_and_documents(tmp_path):
    """from_json takes a document or a path; to_json returns the document, or writes it to a path."""
    p = Problem(T, CLUSTER, job_ids=["a", "b", "c"], scale_factors=[1, 2, 1])
    assert p.to_json(tmp_path / "p.json") is None
    for source in (tmp_path / "p.json", str(tmp_path / "p.json"), p.to_json()):
        q = Problem.from_json(source)
        np.testing.assert_array_equal(q.throughputs, p.throughputs)
        assert q.job_ids == p.job_ids and q.cluster == p.cluster
    alloc = allocopt.solve(p, "max_min_fairness")
    alloc.to_json(tmp_path / "a.json")
    assert json.loads((tmp_path / "a.json").read_text()) == json.loads(json.dumps(alloc.to_json()))
    for source in (tmp_path / "a.json", alloc.to_json()):
        again = allocopt.Allocation.from_json(source, Problem.from_json(tmp_path / "p.json"))
        np.testing.assert_array_equal(again.matrix, alloc.matrix)
        assert (again.status, again.objective, again.policy, again.timings) == \
               (alloc.status, alloc.objective, alloc.policy, alloc.timings)
        np.testing.assert_allclose(again.effective_throughput, alloc.effective_throughput)
    doc = alloc.to_json()
    doc["allocation"][1]["fractions"]["a100"] = 0.5
    with pytest.raises(InvalidProblemError, match=r"allocation\[1\]: unknown GPU type 'a100'"):
        allocopt.Allocation.from_json(doc, p)
    del doc["allocation"][1]["fractions"]["a100"]
    doc["allocation"].pop()
    with pytest.raises(InvalidProblemError, match="job 'c' of the problem is missing"):
        allocopt.Allocation.from_json(doc, p)
    # the goodput problem of the sia policy, and its answer
    cluster = Cluster({"v100": 8, "k80": 4}, gpus_per_node=4)
    configs = allocopt.sia_configurations(cluster)
    G = np.random.default_rng(0).uniform(1.0, 2.0, (3, len(configs)))
    G[0, 1] = np.nan  # cannot use: null in JSON
    gp = allocopt.GoodputProblem(G, configs, cluster, job_ids=["x", "y", "z"], previous=[0, -1, 2],
                                 restart_factor=[0.5, 1.0, 1.0], pinned=[False, False, True])
    gp.to_json(tmp_path / "g.json")
    assert json.loads((tmp_path / "g.json").read_text())["jobs"][0]["goodput"][1] is None
    for source in (tmp_path / "g.json", gp.to_json()):
        again = allocopt.GoodputProblem.from_json(source)
        np.testing.assert_array_equal(again.goodput, gp.goodput)
        for name in ("previous", "restart_factor", "pinned", "rigid_gpus"):
            np.testing.assert_array_equal(getattr(again, name), getattr(gp, name))
        assert again.configurations == gp.configurations and again.job_ids == gp.job_ids
    sia = allocopt.solve(allocopt.GoodputProblem.from_json(tmp_path / "g.json"), "sia")
    doc = sia.to_json()
    assert [a["configuration"] for a in doc["allocation"]] == sia.configuration.tolist()
    assert doc["allocation"][2]["configuration"] == 2  # pinned
    sia.to_json(tmp_path / "s.json")
    for source in (tmp_path / "s.json", doc):
        again = allocopt.ConfigurationAllocation.from_json(source, gp)
        np.testing.assert_array_equal(again.configuration, sia.configuration)
        assert (again.status, again.objective, again.policy, again.timings, again.gpu_type) == \
               (sia.status, sia.objective, sia.policy, sia.timings, sia.gpu_type)
    doc["allocation"][0]["configuration"] = len(configs)
    with pytest.raises(InvalidProblemError, match=r"allocation\[0\]: configuration is"):
        allocopt.ConfigurationAllocation.from_json(doc, gp)
    doc["allocation"].pop(0)
    with pytest.raises(InvalidProblemError, match="job 'x' of the problem is missing"):
        allocopt.ConfigurationAllocation.from_json(doc, gp)


def test_allocation_with_pairs_round_trips():
    from allocopt.throughput import ThroughputTable

    problem = ThroughputTable.gavel().sample_problem(Cluster({"v100": 2, "k80": 2}), 6, seed=1,
                                                     scale_factor_probs={1: 1.0}, space_sharing=True)
    alloc = allocopt.solve(problem, "max_min_fairness", space_sharing=True)
    assert (alloc.pair_matrix > 0).any()
    again = allocopt.Allocation.from_json(json.loads(json.dumps(alloc.to_json())),
                                          Problem.from_json(json.loads(json.dumps(problem.to_json()))))
    np.testing.assert_array_equal(again.pair_matrix, alloc.pair_matrix)
    np.testing.assert_allclose(again.effective_throughput, alloc.effective_throughput)


def test_shipped_sample_problem_solves():
    path = Path(__file__).resolve().parents[1] / "examples" / "problem.json"
    alloc = allocopt.solve(Problem.from_json(path), "max_min_fairness")
    assert alloc.objective == pytest.approx(8 / 11) and alloc.job_ids == ("resnet", "lstm", "a3c")


def test_json_files_errors_are_typed(tmp_path):
    with pytest.raises(DataFileError, match=r"missing.json: cannot read the problem file"):
        Problem.from_json(tmp_path / "missing.json")
    (tmp_path / "bad.json").write_text('{"cluster":\n  {"gpus": }}')
    with pytest.raises(DataFileError, match=r"bad.json, line 2: invalid JSON"):
        Problem.from_json(tmp_path / "bad.json")
    (tmp_path / "list.json").write_text("[1, 2]")
    with pytest.raises(InvalidProblemError, match="needs 'cluster' and 'jobs' fields; got list"):
        Problem.from_json(tmp_path / "list.json")
    with pytest.raises(InvalidProblemError, match="expected a JSON document .* or the path of a JSON file, got int"):
        Problem.from_json(3)
    # a string with a NUL character is no path open() takes (it raised ValueError)
    with pytest.raises(DataFileError, match="its path holds a NUL character"):
        Problem.from_json("\x00")


def test_json_errors_name_the_job():
    doc = Problem(T, CLUSTER, job_ids=["a", "b", "c"]).to_json()
    doc["jobs"][1]["weight"] = 2
    with pytest.raises(InvalidProblemError, match=r"jobs\[1\] \(id 'b'\) has unknown field\(s\) \['weight'\]"):
        Problem.from_json(doc)
    doc["jobs"][1] = doc["jobs"][0]
    with pytest.raises(InvalidProblemError, match="job id 'a' appears twice"):
        Problem.from_json(doc)


def test_solve_rejects_non_problem():
    with pytest.raises(allocopt.errors.InvalidOptionError, match="expects an allocopt.Problem"):
        allocopt.solve({"a": 1})


def test_entities_and_pairs_round_trip():
    pairs = {("c", "a"): {"v100": (30.0, 20.0), "k80": (0.0, 0.0)}}
    p = Problem(T, CLUSTER, job_ids=["a", "b", "c"], entities=["org1", "org2", "org1"],
                entity_weights={"org1": 2.0}, time_isolated=[0, 10, 20], pair_throughputs=pairs)
    assert p.entity_ids == ("org1", "org2")
    np.testing.assert_array_equal(p.entities, [0, 1, 0])
    np.testing.assert_array_equal(p.entity_weights, [2.0, 1.0])
    np.testing.assert_array_equal(p.pairs, [[0, 2]])  # stored in job order, throughputs swapped with it
    np.testing.assert_array_equal(p.pair_throughput_array[0], [[20.0, 30.0], [0.0, 0.0]])
    q = Problem.from_json(p.to_json())
    for name in ("entities", "entity_weights", "pairs", "pair_throughput_array", "time_isolated"):
        np.testing.assert_array_equal(getattr(q, name), getattr(p, name))


@pytest.mark.parametrize("kwargs, match", [
    (dict(entities=["x", "y"]), r"entities has 2 entries, expected one per job \(3\)"),
    (dict(entities=["x", "y", "x"], entity_weights={"z": 1.0}), r"entit\(ies\) \['z'\] that no job belongs to"),
    (dict(entities=["x", "y", "x"], entity_weights={"x": 0.0}), r"entity_weights\['x'\] is 0.0"),
    (dict(entity_weights={"x": 1.0}), r"no job has an entity"),
    (dict(pair_throughputs={("a", "zz"): {}}), r"pair \('a', 'zz'\) names unknown job 'zz'"),
    (dict(pair_throughputs={("a", "a"): {}}), r"pairs a job with itself"),
    (dict(pair_throughputs={("a", "b"): {"v100": (1, 1), "k80": (1, 1)},
                            ("b", "a"): {"v100": (1, 1), "k80": (1, 1)}}), r"appears twice"),
    (dict(pair_throughputs={("a", "c"): {"v100": (1, 1)}}), r"exactly the GPU types \['v100', 'k80'\]"),
    (dict(pair_throughputs={("a", "c"): {"v100": (1, -1), "k80": (1, 1)}}), r"two finite steps/s >= 0"),
    (dict(scale_factors=[1, 2, 1], pair_throughputs={("a", "b"): {"v100": (1, 1), "k80": (1, 1)}}),
     r"scale factors 1 and 2; only jobs with equal scale factors can share GPUs"),
])
def test_invalid_entities_and_pairs(kwargs, match):
    with pytest.raises(InvalidProblemError, match=match):
        Problem(T, CLUSTER, job_ids=["a", "b", "c"], **kwargs)


def test_with_progress_equals_building_the_subset():
    cluster = allocopt.Cluster({"v100": 4, "k80": 8})
    rng = np.random.default_rng(0)
    T = rng.uniform(1, 10, size=(30, 2))
    jobs = allocopt.Problem(T, cluster, job_ids=[f"j{i}" for i in range(30)], scale_factors=rng.choice([1, 2, 4], 30),
                            priority_weights=rng.uniform(0.5, 2, 30))
    rows = np.array([7, 3, 29, 0])
    steps, since = np.array([10, 20, 30, 40]), np.array([0.0, 5.0, 6.0, 7.0])
    got = jobs.with_progress(rows, num_steps_remaining=steps, time_since_start=since, time_isolated=since)
    expected = allocopt.Problem(T[rows], cluster, job_ids=[f"j{i}" for i in rows],
                                scale_factors=jobs.scale_factors[rows], priority_weights=jobs.priority_weights[rows],
                                num_steps_remaining=steps, time_since_start=since, time_isolated=since)
    assert got.to_json() == expected.to_json() and got.job_index("j29") == 2
    with pytest.raises(InvalidProblemError) as err:  # progress vectors are checked
        jobs.with_progress(rows, num_steps_remaining=[10, -1, 30, 40])
    assert err.value.field == "num_steps_remaining" and err.value.job == "j3"
    with pytest.raises(InvalidProblemError, match="distinct positions"):
        jobs.with_progress([1, 1])
    with pytest.raises(InvalidProblemError, match="distinct positions"):
        jobs.with_progress([30])
    grouped = allocopt.Problem(T, cluster, entities=["a"] * 30)
    with pytest.raises(InvalidProblemError, match="subset"):
        grouped.with_progress(rows)
