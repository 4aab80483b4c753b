"""Sia/Pollux profiles shipped with allocopt: loading, malformed files, fit quality, bootstrapping, the CLI."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from allocopt import Cluster
from allocopt.configurations import sia_configurations
from allocopt.errors import AllocoptError
from allocopt.throughput import BootstrappedJob, GoodputModel, goodput_matrix, project, throughput_ratio
from allocopt.throughput.profiles import (SEED_GPU_TYPES, ApplicationProfile, Observations, ProfileFormatError,
                                          discover, load_application, load_profiles, load_seed_profiles,
                                          normalize_placement, pandas_float, read_placements, read_scalability,
                                          read_seed_profile,
                                          read_validation, shipped_profiles_dir)

ROOT = shipped_profiles_dir()
TYPES = ("aws", "rtx", "dgx-ext")
APPS = ("bert", "cifar10", "deepspeech2", "imagenet", "yolov3")  # every application of the shipped workloads


@pytest.fixture(scope="module")
def profiles():
    return load_profiles(ROOT)


def seeds(app: str) -> dict[str, Observations]:
    """1-GPU seed profiles of ``app`` on the shipped types, keyed by profile type name."""
    raw = read_seed_profile(ROOT / "seed_profiles" / f"{app}.csv")
    return {SEED_GPU_TYPES[t]: obs for t, obs in raw.items() if SEED_GPU_TYPES[t] in TYPES}


# ----- loading ----------------------------------------------------------------------------------------
def test_shipped_copy_is_small_and_attributed():
    files = [p for p in ROOT.rglob("*") if p.is_file()]
    assert sum(p.stat().st_size for p in files) < 500_000
    readme = (ROOT / "README.md").read_text()
    assert "siasosp23/artifacts" in readme and "petuum/adaptdl" in readme and "Apache License" in readme
    assert (ROOT / "LICENSE-apache-2.0").exists()
    assert discover(ROOT) == [(a, t) for a in APPS for t in sorted(TYPES)]


def test_read_placements():
    obs = read_placements(ROOT / "cifar10" / "placements-aws.csv")
    first = obs.select(0)
    assert (first.local_bsz[0], first.placement[0], first.num_nodes[0], first.num_replicas[0]) == (32, "1", 1, 1)
    rows = obs.placement == "1344"
    assert rows.any() and np.all(obs.num_nodes[rows] == 4) and np.all(obs.num_replicas[rows] == 12)
    np.testing.assert_allclose(obs.compute_time_s, obs.iter_time_s - obs.sync_time_s)
    assert str(obs.origin[0]).endswith("placements-aws.csv:2")
    assert normalize_placement("4431") == "1443" and normalize_placement((4, 0, 1)) == "14"


def test_read_scalability_validation_and_seed():
    obs = read_scalability(ROOT / "imagenet" / "scalability-rtx.csv")
    assert len(obs) == 136 and set(obs.placement) == {""} and obs.num_nodes.max() == 3
    curve = read_validation(ROOT / "cifar10" / "validation-128.csv")
    assert curve.batch_size == 128 and curve.grad_sqr.size == curve.iteration.size > 10
    seed = read_seed_profile(ROOT / "seed_profiles" / "bert.csv")
    assert set(seed) == set(SEED_GPU_TYPES)
    assert all(np.all(o.num_replicas == 1) for o in seed.values())
    assert set(load_seed_profiles(ROOT / "seed_profiles")) == set(APPS)
    # the seed's "rtx" rows are the 1-GPU rows of placements-rtx.csv
    one = read_placements(ROOT / "bert" / "placements-rtx.csv")
    one = one.select(one.num_replicas == 1)
    same = np.isin(one.local_bsz, seed["rtx"].local_bsz)
    np.testing.assert_array_equal(seed["rtx"].iter_time_s, one.iter_time_s[same])


def test_application_profile_builds_a_goodput_model(profiles):
    prof = profiles[("cifar10", "rtx")]
    assert (prof.init_batch_size, prof.max_batch_size) == (128, 4096)
    assert (prof.min_local_bsz, prof.max_local_bsz) == (32, 1024)
    grad = prof.grad_params()
    assert grad.sqr == pytest.approx(prof.validation[128].grad_sqr[0])
    mid = prof.grad_params(192, epoch=1)  # halfway between the 128 and 256 curves
    assert mid.var == pytest.approx((prof.validation[128].grad_var[1] + prof.validation[256].grad_var[1]) / 2)
    model = prof.goodput_model()
    assert isinstance(model, GoodputModel) and model.max_local_bsz == 1024
    goodput, micro, steps = model.optimize([1, 1, 2], [1, 8, 16])
    assert np.all(goodput > 0) and np.all(micro <= 1024)
    with pytest.raises(AllocoptError, match="epoch 10000 is out of range"):
        prof.grad_params(epoch=10_000)
    bare = ApplicationProfile("cifar10", "rtx", prof.placements, None, {})
    with pytest.raises(ProfileFormatError, match="no validation") as info:
        bare.goodput_model()
    assert info.value.path == str(ROOT / "cifar10")


def test_true_times_of_placements(profiles):
    prof = profiles[("cifar10", "rtx")]
    rows = prof.placements.placement == "44"
    measured = prof.placements.select(rows)
    it, sync = prof.true_times("44", measured.local_bsz)
    np.testing.assert_allclose(it, measured.iter_time_s)
    np.testing.assert_allclose(sync, measured.sync_time_s)
    between = prof.true_times((4, 4), measured.local_bsz[:2].mean())[0]  # linear in local_bsz
    assert between == pytest.approx(measured.iter_time_s[:2].mean())
    assert np.isnan(prof.true_times("44", 10 * prof.max_local_bsz)[0])  # does not fit
    assert prof.true_times("41", 64)[0] == prof.true_times("14", 64)[0]  # rotations are the same placement
    # 3 nodes x 8 GPUs: only in the scalability file
    sc = prof.scalability.select((prof.scalability.num_nodes == 3) & (prof.scalability.num_replicas == 24))
    np.testing.assert_allclose(prof.true_times("888", sc.local_bsz)[0], sc.iter_time_s)
    # 3 nodes x 9 GPUs is measured nowhere: interpolated between 8 and 10 replicas on 3 nodes
    t9 = prof.true_times("333", 128)[0]
    t8, t10 = (prof.true_times(p, 128)[0] for p in ("332", "442"))
    assert np.shape(t9) == () and np.isfinite([t8, t9, t10]).all()
    assert min(t8, t10) <= t9 <= max(t8, t10)


# ----- malformed files ---------------------------------------------------------------------------------
GOOD = "local_bsz,step_time,sync_time,placement\n32,0.05,0.001,1\n64,0.08,0.001,1\n"


@pytest.mark.parametrize("text, line, match", [
    ("local_bsz,step_time,placement\n32,0.05,1\n", 1, "missing column.*sync_time"),
    (GOOD + "abc,0.1,0.01,2\n", 4, "local_bsz is 'abc'; it is not a number"),
    (GOOD + "32,-0.1,0.01,2\n", 4, "step_time is '-0.1'; it must be a time in seconds >= 0"),
    (GOOD + "32,0.1,nan,2\n", 4, "sync_time.*finite"),
    (GOOD + "32,0.1,0.01,40\n", 4, "placement is '40'"),
    (GOOD + "32,0.1,0.01\n", 4, "3 fields, the header has 4"),
    (GOOD + "12.5,0.1,0.01,2\n", 4, "positive integer"),
    ("", 1, "empty file"),
])
def test_malformed_placements_name_file_and_line(tmp_path, text, line, match):
    path = tmp_path / "placements-x.csv"
    path.write_text(text)
    with pytest.raises(ProfileFormatError, match=match) as info:
        read_placements(path)
    assert info.value.path == str(path) and info.value.line == line
    assert str(info.value).startswith(f"{path}, line {line}: ")
    assert isinstance(info.value, AllocoptError) and isinstance(info.value, ValueError)


def test_other_malformed_files(tmp_path):
    scal = tmp_path / "scalability-x.csv"
    scal.write_text("num_nodes,num_replicas,local_bsz,step_time,sync_time\n1,1,8,0.1,0.01\n3,2,8,0.1,0.01\n")
    with pytest.raises(ProfileFormatError, match="num_nodes 3 is larger than num_replicas 2") as info:
        read_scalability(scal)
    assert info.value.line == 3
    val = tmp_path / "validation-big.csv"
    val.write_text("progress,iteration,metric,grad_sqr,grad_var\n1,1,0.5,1,1\n")
    with pytest.raises(ProfileFormatError, match="validation-<batch size>.csv"):
        read_validation(val)
    val = tmp_path / "validation-64.csv"
    val.write_text("progress,iteration,metric,grad_sqr,grad_var\n1,1,0.5,-1,1\n")
    with pytest.raises(ProfileFormatError, match="grad_sqr is '-1'") as info:
        read_validation(val)
    assert info.value.line == 2
    with pytest.raises(ProfileFormatError, match="cannot read"):
        read_placements(tmp_path / "missing.csv")
    with pytest.raises(ProfileFormatError, match="no <application>/placements"):
        discover(tmp_path)
    # a pipeline-parallel profile: step_time below sync_time, so no data-parallel fit
    (tmp_path / "pmp").mkdir()
    (tmp_path / "pmp" / "placements-x.csv").write_text(GOOD + "1,0.1,0.3,8\n")
    with pytest.raises(ProfileFormatError, match="step_time - sync_time is not positive") as info:
        load_application(tmp_path, "pmp", "x").fit()
    assert info.value.line == 4


# ----- fit quality --------------------------------------------------------------------------------------
def test_fitted_model_reproduces_heldout_step_times(profiles, capsys):
    lines = [f"{'application':12s} {'GPU type':8s} {'rows':>5s} {'held out':>8s} {'median |rel. error|':>20s}"]
    errors = {}
    for (app, gpu_type), prof in profiles.items():
        held = prof.heldout_error()
        errors[app, gpu_type] = held.median_abs_rel_error
        lines.append(f"{app:12s} {gpu_type:8s} {len(prof.observations):5d} {held.n_heldout:8d} "
                     f"{held.median_abs_rel_error:20.1%}")
        assert held.n_heldout > 0 and np.all(held.heldout.num_replicas > 1)
    with capsys.disabled():
        print("\nHeld-out iteration-time error of the fitted throughput model (shipped profiles)\n" + "\n".join(lines))
    assert all(e <= 0.10 for e in errors.values()), errors


# ----- bootstrapping -------------------------------------------------------------------------------------
def test_throughput_ratio_and_projection():
    seed = seeds("cifar10")
    ratio = throughput_ratio(seed["dgx-ext"], seed["aws"])
    assert ratio > 1  # an A100 beats a T4
    assert throughput_ratio(seed["aws"], seed["dgx-ext"]) == pytest.approx(1 / ratio)
    assert throughput_ratio(seed["rtx"], seed["rtx"]) == pytest.approx(1.0)
    ref = load_application(ROOT, "cifar10", "aws").goodput_model()
    fast = project(ref, ratio, max_local_bsz=4096)
    nodes, replicas, micro = np.array([1, 1, 2]), np.array([1, 4, 8]), np.array([64, 128, 256])
    np.testing.assert_allclose(fast.throughput(nodes, replicas, micro), ratio * ref.throughput(nodes, replicas, micro))
    assert fast.max_local_bsz == 4096 and fast.grad_params == ref.grad_params


def test_bootstrap_projects_until_the_type_has_multi_gpu_observations():
    app = "imagenet"
    profs = {t: load_application(ROOT, app, t) for t in TYPES}
    ref = profs["aws"]
    job = BootstrappedJob(seeds(app), ref.grad_params(), init_batch_size=ref.init_batch_size,
                          max_batch_size=ref.max_batch_size)
    assert all(job.projected_from(t) is None for t in TYPES)  # 1-GPU data only: each type fits its own seed
    job.observe("aws", ref.placements.select(ref.placements.num_replicas > 1))
    assert job.projected_from("aws") is None
    assert job.projected_from("rtx") == job.projected_from("dgx-ext") == "aws"
    ratio = throughput_ratio(job.observations("rtx"), job.observations("aws"))
    projected = job.model("rtx")
    aws_model = job.model("aws")
    assert projected.perf_params == aws_model.perf_params.scaled(1 / ratio)
    assert projected.max_local_bsz == seeds(app)["rtx"].local_bsz.max()
    rtx = profs["rtx"].observations
    error = np.median(np.abs(projected.perf_params.iter_time(rtx.num_nodes, rtx.num_replicas, rtx.local_bsz)
                             / rtx.iter_time_s - 1))
    assert error < 0.25  # T4 -> RTX 2080Ti projection, measured rtx multi-GPU times
    # once the job has run on several rtx GPUs, rtx uses its own fit
    multi = profs["rtx"].placements.select(profs["rtx"].placements.num_replicas > 1)
    job.observe("rtx", multi)
    assert job.projected_from("rtx") is None and job.projected_from("dgx-ext") == "aws"
    own = job.model("rtx")
    fresh = Observations.concat([seeds(app)["rtx"], multi]).fit()
    np.testing.assert_allclose(own.perf_params.iter_time(rtx.num_nodes, rtx.num_replicas, rtx.local_bsz),
                               fresh.iter_time(rtx.num_nodes, rtx.num_replicas, rtx.local_bsz), rtol=1e-2)
    own_error = np.median(np.abs(own.perf_params.iter_time(rtx.num_nodes, rtx.num_replicas, rtx.local_bsz)
                                 / rtx.iter_time_s - 1))
    assert own_error < error
    assert job.model("rtx").perf_params is own.perf_params  # cached until new observations
    # the models feed a goodput matrix directly
    cluster = Cluster({"aws": 8, "rtx": 16, "dgx-ext": 16}, gpus_per_node={"aws": 4, "rtx": 8, "dgx-ext": 8})
    G = goodput_matrix([job.models()], sia_configurations(cluster))
    assert G.shape == (1, len(sia_configurations(cluster))) and np.all(G > 0)
    with pytest.raises(AllocoptError, match="unknown GPU type"):
        job.model("v100")


# ----- command line ----------------------------------------------------------------------------------------
def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "allocopt", *args], capture_output=True, text=True, timeout=300)


def test_cli_fit_profiles_json(tmp_path):
    out = tmp_path / "fit.json"
    result = run_cli("fit-profiles", str(ROOT), "--json", str(out))
    assert result.returncode == 0, result.stderr
    assert "median |rel. error|" in result.stdout and f"{len(APPS) * len(TYPES)} of {len(APPS) * len(TYPES)} pairs" in result.stdout
    records = json.loads(out.read_text())
    assert [(r["application"], r["gpu_type"]) for r in records] == discover(ROOT)
    for r in records:
        assert set(r) == {"application", "gpu_type", "median_abs_rel_error", "n_heldout"}
        assert isinstance(r["n_heldout"], int) and r["n_heldout"] > 0
        assert 0 <= r["median_abs_rel_error"] <= 0.10
    stdout_json = run_cli("fit-profiles", str(ROOT), "--json", "-")
    assert json.loads(stdout_json.stdout) == records and "median |rel. error|" in stdout_json.stderr


def test_cli_fit_profiles_skips_unfittable_pairs_and_rejects_bad_dirs(tmp_path):
    app = tmp_path / "cifar10"
    app.mkdir()
    for name in ("placements-rtx.csv", "scalability-rtx.csv"):
        (app / name).write_text((ROOT / "cifar10" / name).read_text())
    (tmp_path / "pmp").mkdir()
    (tmp_path / "pmp" / "placements-rtx.csv").write_text(GOOD + "1,0.1,0.3,8\n")
    out = tmp_path / "fit.json"
    result = run_cli("fit-profiles", str(tmp_path), "--json", str(out))
    assert result.returncode == 0, result.stderr
    assert "warning: skipped pmp on rtx" in result.stderr and "line 4" in result.stderr
    records = {r["application"]: r for r in json.loads(out.read_text())}
    assert records["pmp"]["median_abs_rel_error"] is None and records["pmp"]["n_heldout"] == 0
    assert records["cifar10"]["median_abs_rel_error"] < 0.10
    missing = run_cli("fit-profiles", str(tmp_path / "nope"))
    assert missing.returncode == 2 and "not a directory" in missing.stderr
    (tmp_path / "cifar10" / "placements-rtx.csv").write_text("")
    (tmp_path / "cifar10" / "scalability-rtx.csv").unlink()
    broken = run_cli("fit-profiles", str(tmp_path))
    assert broken.returncode == 2 and "could be fitted" in broken.stderr


def test_cli_fit_profiles_loss_options():
    rmse = run_cli("fit-profiles", str(ROOT), "--loss", "rmse", "--json", "-")
    assert rmse.returncode == 0, rmse.stderr
    for r in json.loads(rmse.stdout):
        prof = load_application(ROOT, r["application"], r["gpu_type"])
        assert r["median_abs_rel_error"] == pytest.approx(prof.heldout_error(loss="rmse").median_abs_rel_error)
    bad_scale = run_cli("fit-profiles", str(ROOT), "--loss-scale", "0")
    assert bad_scale.returncode == 2 and "loss_scale must be" in bad_scale.stderr
    bad_loss = run_cli("fit-profiles", str(ROOT), "--loss", "huber")
    assert bad_loss.returncode == 2 and "--loss" in bad_loss.stderr



# ----- reading and looking up profiles as Sia's simulator does ----------------------------------------
#: An excerpt of Sia's CIFAR-10 profile on A100 nodes, full precision (see tests/sia_excerpt/README.md).
SIA_EXCERPT = Path(__file__).parent / "sia_excerpt"

#: (text, the float pandas 1.5.3's read_csv gives): Sia's simulator reads its profiles with it.
PANDAS_FLOATS = [
    ("0.035044655203819275", 0.0350446552038192),  # 18 significant digits: the last one dropped
    ("0.0007174400016665458", 0.0007174400016665),
    ("391.0", 391.0), ("8.947307535897329", 8.947307535897329), ("1e-05", 1e-05), ("-2.5E+3", -2500.0),
    ("123456789012345678901", 1.2345678901234568e+20), ("0.1", 0.1),
]

#: (placement, micro-batch, (step s, sync s)) Sia's ``Application.get_throughput`` returned on the excerpt
#: (pandas 1.5.3, scipy 1.15.3); NaN where Sia returns -1 (outside the measured batch sizes).
SIA_STEP_TIMES = [
    ((1,), 32, (0.0350446552038192, 0.0007174400016665)),  # a measured row: interp1d's slope from the row below
    ((1,), 45, (0.0348764061927795, 0.0005572479888796)),
    ((1,), 50, (0.03492261155655505, 0.000495925887242679)),
    ((2,), 64, (0.0299214273691177, 0.000729792010039)),
    ((2,), 100, (0.0319148662843202, 0.0006822669487445843)),
    ((4, 4), 91, (0.0340142548084259, 0.002551999989897)),
    ((4, 4), 200, (0.04146536648273461, 0.001843220477551156)),
    ((1, 1), 129, (0.0334002077579498, 0.0010353920087218)),
    ((1,), 5000, (np.nan, np.nan)),
    ((1,), 8, (np.nan, np.nan)),
    ((3,), 64, (0.030747734010219546, 0.0016652800012379)),  # not profiled: over (nodes, replicas, batch)
    ((2, 6), 100, (0.034878600192697416, 0.0025787082008625157)),
    ((8, 8), 256, (0.04853589546112785, 0.003227056814867267)),
    ((3, 5), 40, (0.033634086067859885, 0.0026840713912476923)),
]

#: (global batch size, epoch, (grad_sqr, grad_var)) of Sia's ``Application.get_grad_stats`` on the excerpt.
SIA_GRAD_STATS = [
    (128, 0, (8.947307535897329, 5.066593295150894)), (256, 3, (0.6385792401233752, 1.5625150232640328)),
    (160, 2, (1.2357794228014471, 1.5071525457230233)), (200, 4, (0.5662872769149909, 1.5149275567159806)),
    (129, 1, (1.9023629094743946, 1.602217520519608)),
]


@pytest.mark.parametrize("text, expected", PANDAS_FLOATS)
def test_pandas_float_reads_as_sias_simulator(text, expected):
    assert pandas_float(text) == expected


def test_pandas_float_rejects_text_that_is_not_a_number():
    for bad in ("", "abc", "1.2.3", "--1", "e5"):
        with pytest.raises(ValueError):
            pandas_float(bad)


@pytest.fixture(scope="module")
def sia_excerpt():
    return load_profiles(SIA_EXCERPT, sia_numbers=True)["cifar10", "dgx-ext"]


def test_sia_numbers_keep_sias_truncation_and_default_reading_is_exact(sia_excerpt):
    exact = load_profiles(SIA_EXCERPT)["cifar10", "dgx-ext"]
    assert exact.placements.iter_time_s[0] == 0.035044655203819275
    assert sia_excerpt.placements.iter_time_s[0] == 0.0350446552038192


@pytest.mark.parametrize("placement, micro, expected", SIA_STEP_TIMES)
def test_sia_times_are_sias_step_times_to_the_bit(sia_excerpt, placement, micro, expected):
    got = sia_excerpt.sia_times(placement, micro)
    np.testing.assert_array_equal(got, expected)
    rotated = placement[1:] + placement[:1]
    np.testing.assert_array_equal(sia_excerpt.sia_times(rotated, micro), expected)


@pytest.mark.parametrize("batch, epoch, expected", SIA_GRAD_STATS)
def test_grad_params_are_sias_interpolation_to_the_bit(sia_excerpt, batch, epoch, expected):
    grad = sia_excerpt.grad_params(batch, epoch)
    assert (grad.sqr, grad.var) == expected
