"""The anchors' generators in allocopt.bench.instances: Gavel's job generator (which Soroush's
benchmark and POP's figure 2 call) reproduced draw for draw, and the instances built from it."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest

from allocopt.bench.instances import (GAVEL_GPU_TYPES, GAVEL_JOB_TABLE, SOROUSH_PRIORITIES, gavel_generated_jobs,
                                      pop_figure2_problem, soroush_problem)
from allocopt.throughput.table import DEFAULT_SCALE_FACTOR_PROBS, ThroughputTable

# The first 30 jobs of Gavel's own generator: utils.generate_job(throughputs, rng=random.Random(seed),
# generate_multi_gpu_jobs=multi_gpu) called 30 times (github.com/stanford-futuredata/gavel at c4fa400,
# scheduler/utils.py; MIT License), as "<index of the model in JobTable>x<scale factor>".
GAVEL_FIRST_JOBS = {
    (0, True): "8x4 9x8 6x8 19x1 4x2 21x1 10x1 15x1 17x1 0x4 23x1 18x1 17x1 16x1 9x8 17x2 9x1 18x1 1x1 2x1 1x1 "
               "17x4 16x1 18x4 15x4 25x1 18x1 23x1 5x1 4x1",
    (3, True): "19x1 15x1 15x1 4x1 12x1 18x2 8x1 22x1 18x2 3x1 21x1 16x1 13x4 0x1 5x4 18x1 18x1 20x1 13x8 13x4 1x4 "
               "8x1 2x1 13x1 10x1 12x1 19x1 25x1 7x1 9x4",
    (0, False): "8x1 9x1 6x1 19x1 22x1 23x1 17x1 6x1 8x1 2x1 21x1 10x1 6x1 4x1 10x1 9x1 17x1 9x1 18x1 1x1 2x1 1x1 "
                "17x1 16x1 18x1 15x1 25x1 18x1 23x1 5x1",
    (11, False): "14x1 25x1 3x1 22x1 14x1 0x1 7x1 18x1 15x1 13x1 22x1 0x1 9x1 0x1 12x1 20x1 9x1 3x1 14x1 14x1 13x1 "
                 "6x1 18x1 12x1 1x1 24x1 2x1 19x1 18x1 5x1",
}


@pytest.mark.parametrize("seed, multi_gpu", sorted(GAVEL_FIRST_JOBS))
def test_gavel_generator_reproduced_draw_for_draw(seed, multi_gpu):
    jobs = gavel_generated_jobs(30, seed, multi_gpu=multi_gpu)
    drawn = (job.split("x") for job in GAVEL_FIRST_JOBS[seed, multi_gpu].split())
    expected = [(GAVEL_JOB_TABLE[int(m)], int(s)) for m, s in drawn]
    assert jobs == expected
    assert gavel_generated_jobs(10, seed, multi_gpu=multi_gpu) == expected[:10]  # a prefix of the same stream


def test_gavel_job_table_is_the_shipped_table():
    table = ThroughputTable.gavel()
    assert sorted(GAVEL_JOB_TABLE) == sorted(table.models) and len(GAVEL_JOB_TABLE) == 26


def test_soroush_instance():
    n = 4096
    problem = soroush_problem(n, 0)
    assert problem.gpu_types == GAVEL_GPU_TYPES and problem.capacity.tolist() == [n // 4] * 3
    assert problem.job_ids == tuple(range(n))
    assert problem.priority_weights.tolist() == [SOROUSH_PRIORITIES[i % 4] for i in range(n)]
    table = ThroughputTable.gavel()
    jobs = gavel_generated_jobs(n, 0, multi_gpu=True)
    assert problem.scale_factors.tolist() == [s for _, s in jobs]
    np.testing.assert_array_equal(problem.throughputs, [table.row(m, s, GAVEL_GPU_TYPES) for m, s in jobs])
    # Gavel's scale-factor distribution, drawn before the model (multi-GPU jobs only on distributed models)
    for scale, p in DEFAULT_SCALE_FACTOR_PROBS.items():
        share = np.mean(problem.scale_factors == scale)
        assert abs(share - p) < 4 * np.sqrt(p * (1 - p) / n), (scale, share)
    multi = {m for m, s in jobs if s > 1}
    assert multi and all(len(table.scale_factors(m)) > 1 for m in multi)
    assert len({m for m, _ in jobs}) == 26
    # seeds are the anchors' trial seeds: deterministic, and different seeds differ
    np.testing.assert_array_equal(soroush_problem(n, 0).throughputs, problem.throughputs)
    assert not np.array_equal(soroush_problem(n, 1).throughputs, problem.throughputs)
    assert soroush_problem(100, 0, gpus_per_type=8).capacity.tolist() == [8, 8, 8]


def test_pop_figure2_instance():
    n = 48
    problem = pop_figure2_problem(n, 2)
    assert problem.capacity.tolist() == [n // 4] * 3 and set(problem.scale_factors.tolist()) == {1}
    assert problem.priority_weights.tolist() == [1.0] * n
    jobs = gavel_generated_jobs(n, 2, multi_gpu=False)
    table = ThroughputTable.gavel()
    np.testing.assert_array_equal(problem.throughputs, [table.row(m, 1, GAVEL_GPU_TYPES) for m, _ in jobs])
    # every pair i < j, in order, with its measured co-located throughputs
    i, j = np.triu_indices(n, 1)
    np.testing.assert_array_equal(problem.pairs, np.c_[i, j])
    a, b = 5, 17
    row = np.flatnonzero((problem.pairs[:, 0] == a) & (problem.pairs[:, 1] == b))[0]
    for g, gpu in enumerate(GAVEL_GPU_TYPES):
        expected = table.pair_throughput(jobs[a][0], jobs[b][0], 1, gpu)
        np.testing.assert_array_equal(problem.pair_throughput_array[row, g], expected)


def _anchors_script():
    spec = importlib.util.spec_from_file_location("anchors", Path(__file__).parents[1] / "benchmarks" / "anchors.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_anchor_records_read_back_and_differences_are_named():
    """benchmarks/anchors.py's reader of the anchors' dumped instances, on records written here."""
    anchors = _anchors_script()
    ours = pop_figure2_problem(12, 0)
    record = {"cluster": dict(zip(ours.gpu_types, ours.capacity.tolist())), "job_ids": list(ours.job_ids),
              "throughputs": ours.throughputs.tolist(), "scale_factors": ours.scale_factors.tolist(),
              "priority_weights": ours.priority_weights.tolist(), "pairs": ours.pairs.tolist(),
              "pair_throughputs": ours.pair_throughput_array.tolist()}
    record = json.loads(json.dumps(record))
    assert anchors.same_instance(anchors.problem_from_record(record), ours) == []
    record["throughputs"][3][1] += 1e-9
    record["pair_throughputs"][0][2][0] += 1.0
    record["priority_weights"][0] = 2.0
    assert anchors.same_instance(anchors.problem_from_record(record), ours) == ["throughputs", "priority_weights",
                                                                                 "pair_throughputs"]
    exact = np.array([1.0, 2.0, 0.05])
    assert anchors.fairness(exact, exact) == 1.0
    assert anchors.fairness(np.array([2.0, 2.0, 0.0]), exact) == pytest.approx(0.5 ** (1 / 3))


def test_small_soroush_instances_fit_every_job():
    for n in (1, 5, 31):
        problem = soroush_problem(n, 0)
        assert problem.capacity.tolist() == [8] * 3 and problem.num_jobs == n
