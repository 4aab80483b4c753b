"""Fidelity profiles: the presets, their validation, and that each reaches the simulator from Python and
the command line as the switches it groups."""

from __future__ import annotations

import ast
import json
from dataclasses import fields, replace
from pathlib import Path

import numpy as np
import pytest

import allocopt
from allocopt import Cluster
from allocopt.cli import main
from allocopt.errors import InvalidOptionError
from allocopt.mechanism.fidelity import FIDELITY_PROFILES, Fidelity, resolve_fidelity
from allocopt.mechanism.sia_workloads import read_sia_workload, shipped_workloads_dir
from allocopt.mechanism.simulator import simulate
from allocopt.mechanism.workload import shipped_trace
from allocopt.throughput.profiles import load_profiles, shipped_profiles_dir

SATURN = shipped_workloads_dir() / "saturn" / "workload-1.csv"
SIA_CLUSTER = Cluster({"aws": 8, "rtx": 8, "dgx-ext": 8}, {"aws": 4, "rtx": 8, "dgx-ext": 8})


def test_presets_and_overrides():
    allocopt_, gavel, sia = (FIDELITY_PROFILES[name] for name in ("allocopt", "gavel", "sia"))
    assert not allocopt_.gavel and not allocopt_.sia
    assert gavel.gavel and not gavel.sia and sia.sia and not sia.gavel
    switches = [f.name for f in fields(Fidelity) if f.name != "profile"]
    # every switch belongs to exactly one preset
    assert all(getattr(gavel, s) != getattr(sia, s) for s in switches)
    assert Fidelity.preset("sia", packed_placement=False) == replace(sia, packed_placement=False)
    assert resolve_fidelity(None) == allocopt_ and resolve_fidelity("gavel") == gavel
    assert resolve_fidelity({"profile": "sia", "round_grid": False}).round_grid is False
    assert resolve_fidelity({"round_grid": True}) == replace(allocopt_, round_grid=True)
    assert resolve_fidelity({"round_grid": True}, default="sia") == sia
    assert Fidelity.preset("gavel").to_dict()["profile"] == "gavel"


@pytest.mark.parametrize("value, message", [
    ("nope", "unknown fidelity profile 'nope'; profiles: allocopt, gavel, sia"),
    ({"profile": "sia", "packed": True}, "unknown fidelity field.s. packed; fields: "),
    ({"round_grid": "yes"}, "Fidelity.round_grid must be True or False, got 'yes'"),
    ({"profile": 3}, "fidelity profile must be a preset name, got 3"),
    (3.0, "fidelity must be a preset name"),
])
def test_bad_fidelity_is_named(value, message):
    with pytest.raises(InvalidOptionError, match=message):
        resolve_fidelity(value)


def test_the_simulator_does_not_import_the_adapters():
    """What the simulator and the adapters share lives below both (allocopt.formulations.gavel_policies)."""
    package = Path(allocopt.__file__).parent
    for path in (package / "mechanism").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = ([node.module or ""] if isinstance(node, ast.ImportFrom)
                     else [a.name for a in node.names] if isinstance(node, ast.Import) else [])
            assert not any(n.startswith("allocopt.adapters") for n in names), f"{path.name} imports {names}"


def test_gavel_fidelity_is_gavels_accounting_and_policy_rules():
    """``fidelity="gavel"`` on Gavel's base FIFO: Gavel's simulator's JCTs (Gavel's worker-type choice);
    the switch alone (``fifo_type_choice`` on allocopt's model) changes the type choice only."""
    trace, cluster = shipped_trace("small_test"), {"v100": 2, "p100": 2, "k80": 2}
    gavel = simulate(trace, cluster, "gavel:fifo", ftf=False, fidelity="gavel")
    ours = simulate(trace, cluster, "gavel:fifo", ftf=False)
    assert gavel.metrics["average_jct_s"] == pytest.approx(438.268, abs=1e-3)  # Gavel's own simulator
    assert ours.metrics["average_jct_s"] != pytest.approx(438.268, abs=1.0)
    assert gavel.config["fidelity"] == FIDELITY_PROFILES["gavel"].to_dict()
    assert ours.config["fidelity"]["profile"] == "allocopt"
    choice = simulate(trace, cluster, "gavel:fifo", ftf=False, fidelity={"fifo_type_choice": True})
    np.testing.assert_allclose(choice.jobs["finish_s"], gavel.jobs["finish_s"])  # no pairs: accounting agrees


@pytest.fixture(scope="module")
def sia_jobs():
    return [j for j in read_sia_workload(SATURN) if j.application == "bert"][:2]  # seconds, where cifar10 takes 15 s


def test_sia_fidelity_is_faithful_to_sia(sia_jobs):
    """``fidelity="sia"`` is the policy option ``faithful_to_sia=True``, profiles read as Sia reads them
    included; a field overridden in the fidelity is the option given False."""
    sia_dir = shipped_profiles_dir()
    run = dict(round_seconds=60.0, ftf=False)
    option = simulate(sia_jobs, SIA_CLUSTER, "sia", profiles=sia_dir, policy_options={"faithful_to_sia": True}, **run)
    preset = simulate(sia_jobs, SIA_CLUSTER, "sia", profiles=sia_dir, fidelity="sia", **run)
    np.testing.assert_array_equal(preset.jobs["finish_s"], option.jobs["finish_s"])
    own = simulate(sia_jobs, SIA_CLUSTER, "sia", profiles=sia_dir, **run)
    assert not np.array_equal(own.jobs["finish_s"], preset.jobs["finish_s"])
    profiles = load_profiles(sia_dir, sia_numbers=True)
    off = simulate(sia_jobs, SIA_CLUSTER, "sia", profiles=profiles, fidelity={"profile": "sia", "round_grid": False},
                   **run)
    given = simulate(sia_jobs, SIA_CLUSTER, "sia", profiles=profiles,
                     policy_options={"faithful_to_sia": True, "round_grid": False}, **run)
    np.testing.assert_array_equal(off.jobs["finish_s"], given.jobs["finish_s"])


def _cli(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_command_line_fidelity_and_options(tmp_path, capsys, sia_jobs):
    trace = str(shipped_trace("small_test"))
    base = ("simulate", "--trace", trace, "--cluster", "v100=2,p100=2,k80=2", "--policy", "gavel:fifo", "--no-ftf")
    code, out, _ = _cli(capsys, *base, "--fidelity", "gavel", "--json", str(tmp_path / "g.json"))
    assert code == 0 and "average_jct_s: 438.268" in out
    assert json.loads((tmp_path / "g.json").read_text())["config"]["fidelity"]["fifo_type_choice"] is True
    code, out, _ = _cli(capsys, *base, "--fidelity-field", "fifo_type_choice=true")
    assert code == 0 and "average_jct_s: 438.268" in out
    code, _, err = _cli(capsys, *base, "--fidelity", "gavle")
    assert code == 2 and "unknown fidelity profile 'gavle'" in err
    code, _, err = _cli(capsys, *base, "--fidelity-field", "fifo_type_choice=3")
    assert code == 2 and "Fidelity.fifo_type_choice must be True or False, got 3" in err
    # --option: policy options (a Sia workload with the policy's own p and lambda_n)
    csv = tmp_path / "jobs.csv"
    csv.write_text("name,time,application,num_replicas,batch_size\n" + "".join(
        f"{j.name},{j.time_s},{j.application},{j.num_replicas},{j.batch_size}\n" for j in sia_jobs))
    sia = ("simulate", "--workload", str(csv), "--policy", "sia", "--cluster", "aws=8,rtx=8,dgx-ext=8",
           "--gpus-per-node", "aws=4,rtx=8,dgx-ext=8", "--round-seconds", "60", "--no-ftf")
    code, out, _ = _cli(capsys, *sia, "--option", "p=-1", "--option", "lambda_n=2", "--json", str(tmp_path / "s.json"))
    assert code == 0
    ours = simulate(str(csv), SIA_CLUSTER, "sia", profiles=shipped_profiles_dir(), round_seconds=60.0, ftf=False,
                    policy_options={"p": -1, "lambda_n": 2})
    document = json.loads((tmp_path / "s.json").read_text())
    assert document["config"]["policy_options"] == {"p": -1, "lambda_n": 2}
    assert document["metrics"]["average_jct_s"] == pytest.approx(ours.metrics["average_jct_s"], rel=1e-12)
    code, _, err = _cli(capsys, *sia, "--option", "p=oops")
    assert code == 2 and "p" in err
    code, _, err = _cli(capsys, *base, "--solver", "ECOS", "--backend", "cvxpy", "--option", "solver_options={}")
    assert code == 2 and "--solver and --option solver_options" in err


def _write_gavel_layout(table, path: Path) -> None:
    """``table`` in the layout of Gavel's ``simulation_throughputs.json``: every pair under both members,
    mirror images, as Gavel stores them."""
    document = {t: {str(entry): {"null": float(table.throughputs_steps_per_s[i, j])}
                    for i, entry in enumerate(table.entries)} for j, t in enumerate(table.gpu_types)}
    for (a, b, s), values in zip(table.pairs, table.pair_throughputs_steps_per_s):
        for j, t in enumerate(table.gpu_types):
            document[t][str((a, s))][str((b, s))] = values[j].tolist()
            document[t][str((b, s))][str((a, s))] = values[j, ::-1].tolist()
    path.write_text(json.dumps(document))


def test_gavels_throughputs_file_gives_the_same_answer_as_the_shipped_copy(tmp_path, capsys):
    """Gavel's ``simulation_throughputs.json`` passed with ``--throughputs`` keeps its co-located pairs:
    ``gavel:gandiva`` (which packs pairs) gives Gavel's 4,996 s either way."""
    from allocopt.mechanism.workload import load_throughputs
    from allocopt.throughput import ThroughputTable

    shipped = ThroughputTable.gavel()
    path = tmp_path / "simulation_throughputs.json"
    _write_gavel_layout(shipped, path)
    read = load_throughputs(path)
    assert set(read.entries) == set(shipped.entries) and len(read.pairs) == len(shipped.pairs) == 921
    for a, b, s in shipped.pairs[::37]:
        for t in shipped.gpu_types:
            assert read.pair_throughput(a, b, s, t) == shipped.pair_throughput(a, b, s, t)
    trace = str(shipped_trace("artifact_evaluation"))
    argv = ["simulate", "--trace", trace, "--cluster", "v100=2,p100=0,k80=4", "--policy", "gavel:gandiva",
            "--fidelity", "gavel", "--no-ftf"]
    outputs = []
    for extra in ([], ["--throughputs", str(path)]):
        assert main(argv + extra) == 0
        outputs.append([line for line in capsys.readouterr().out.splitlines() if "solve_s" not in line])
    assert outputs[0] == outputs[1] and len(outputs[0]) > 5 and "average_jct_s: 4996.46" in outputs[0]  # Gavel's own simulator: 4,996.461


def test_lazy_commands_have_their_real_help():
    """``allocopt solve`` builds placeholder parsers for the commands in heavier modules; each placeholder's
    help is the real parser's, so ``allocopt --help`` reads the same either way."""
    import argparse

    from allocopt.cli import LAZY_COMMANDS, _parser

    def helps(parser: argparse.ArgumentParser) -> dict[str, str]:
        action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        return {choice.dest: choice.help for choice in action._choices_actions}

    placeholders = helps(_parser())
    for name in LAZY_COMMANDS:
        assert helps(_parser(name))[name] == placeholders[name]
