"""allocopt slurm against real Slurm daemons (munged, slurmctld, slurmd; started by .ci/slurm-setup.sh).

The tests submit real batch jobs to partition ``allocopt`` (node gpu-a: 2 x gpu:a100, node gpu-v:
2 x gpu:v100, count-only GRES) whose script runs tests/jobs/slurm_train.py under ``allocopt slurm
exec``: each step appends its number to a file exactly once (checkpoint = file length). They skip
only where the daemons cannot answer.

The elastic jobs (``--policy sia``) run in partition ``bench`` (node gpu-big-a: 256 x gpu:a100, node
gpu-big-v: 256 x gpu:v100) under tests/jobs/slurm_elastic_train.py, which logs the batch and GPUs each
launch got; they opt in with a marker of their own, so that controllers of other runs on the same
daemons leave them alone (and theirs are left alone).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from allocopt.errors import InvalidProblemError
from allocopt.integrations.slurm import Journal, elastic_spec, parse_comment
from allocopt.integrations.slurm_commands import _node_list, parse_gpu_gres
from allocopt.runtime.elastic import ElasticSpec
from tests.runtime.helpers import elastic_launches

ROOT = Path(__file__).resolve().parents[1]
PARTITION = "allocopt"
ROUND_S = 3.0
KILL_AFTER_ROUNDS = 12  # journaled rounds before the controller is killed
SHARE_TOLERANCE = 0.06  # |share of GPU seconds received - share of the allocation's GPU seconds|, per job
# seconds per step on each type (plus the checkpoint's fsync): model "fast3x" gains 3x on a100, "flat" 1.5x
STEP_S = {"fast3x": "a100=0.02,v100=0.06", "flat": "a100=0.03,v100=0.045"}
TABLE = [{"model": "fast3x", "scale_factor": 1, "gpu_type": "a100", "throughput": 50.0},
         {"model": "fast3x", "scale_factor": 1, "gpu_type": "v100", "throughput": 16.7},
         {"model": "flat", "scale_factor": 1, "gpu_type": "a100", "throughput": 33.0},
         {"model": "flat", "scale_factor": 1, "gpu_type": "v100", "throughput": 22.0}]


def _sinfo_ok() -> bool:
    try:
        return subprocess.run(["sinfo", "--noheader", "--partition", PARTITION], capture_output=True,
                              timeout=15).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


@pytest.fixture(scope="module")
def slurm() -> None:
    """Real Slurm: answering already, or started here by .ci/slurm-setup.sh (root, packages installed)."""
    if shutil.which("sinfo") is None and shutil.which("slurmctld") is None:
        pytest.skip("Slurm is not installed (sinfo not found); run .ci/slurm-setup.sh as root")
    if not _sinfo_ok():
        if os.geteuid() != 0 or shutil.which("slurmctld") is None:
            pytest.skip("Slurm daemons are not answering and cannot be started here (needs root and "
                        "slurm-wlm); run .ci/slurm-setup.sh as root")
        proc = subprocess.run(["bash", str(ROOT / ".ci" / "slurm-setup.sh")], capture_output=True, text=True,
                              timeout=300)
        if proc.returncode != 0 or not _sinfo_ok():
            pytest.skip(f"Slurm daemons could not start: {proc.stderr.strip()[-500:]}")


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}


def _sbatch(script: Path | None, *options: str) -> str:
    proc = subprocess.run(["sbatch", "--parsable", f"--partition={PARTITION}", *options,
                           *([str(script)] if script else [])],
                          capture_output=True, text=True, env=_env(), check=True)
    return proc.stdout.strip().split(";")[0]


def _show(job_id: str) -> dict[str, str]:
    out = subprocess.run(["scontrol", "show", "job", job_id], capture_output=True, text=True).stdout
    return dict(tok.split("=", 1) for tok in out.split() if "=" in tok)


def _controller(spool: Path, table: Path, log: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "allocopt", "slurm", "run", "--spool", str(spool),
                             "--partition", PARTITION, "--round-seconds", str(ROUND_S), "--throughputs", str(table),
                             "--exit-when-done"], env=_env(), stdout=open(log, "a"), stderr=subprocess.STDOUT)


def _wait(predicate, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"hang: {what} not within {timeout_s:g} s")
        time.sleep(0.2)


def _rounds(state: Path) -> int:
    journal = Journal(state)
    try:
        return len(journal.rounds())
    finally:
        journal.close()


def test_slurm_output_parsing():
    assert _node_list("gpu-[1-3,07],cpu") == ("gpu-1", "gpu-2", "gpu-3", "gpu-07", "cpu")
    assert parse_gpu_gres("gpu:a100:2(S:0-1)") == ("a100", 2)
    assert parse_gpu_gres("gpu:2") == (None, 2) and parse_gpu_gres("gpu") == (None, 1)
    assert parse_gpu_gres("mps:100") is None


def test_comment_parsing():
    assert parse_comment("hello") is None
    assert parse_comment("allocopt") == {}
    assert parse_comment("allocopt:model=bert,steps=10") == {"model": "bert", "steps": "10"}
    with pytest.raises(InvalidProblemError, match="color"):
        parse_comment("allocopt:color=red")


@pytest.mark.parametrize("wrapper", [["allocopt", "slurm", "exec"], ["allocopt.integrations.slurm_exec"]])
def test_exec_outside_a_job_is_a_usage_error(wrapper):
    env = {k: v for k, v in _env().items() if k != "SLURM_JOB_ID"}
    proc = subprocess.run([sys.executable, "-m", *wrapper, "--spool", "/tmp", "--", "true"],
                          capture_output=True, text=True, env=env)
    assert proc.returncode == 2 and "SLURM_JOB_ID" in proc.stderr and "Traceback" not in proc.stderr


def test_jobs_run_exactly_once_under_preemption_and_a_controller_kill(slurm, tmp_path):
    spool = tmp_path / "spool"
    spool.mkdir()
    table = tmp_path / "throughputs.json"
    table.write_text(json.dumps(TABLE))
    jobs = {}  # job id -> (model, total steps, output file)
    # the last job is submitted without --hold: the controller holds it (or requeues it held if Slurm
    # started it first) until it has a lease
    for k, (model, steps) in enumerate([("fast3x", 900), ("fast3x", 900), ("fast3x", 900), ("flat", 800),
                                        ("flat", 800), ("flat", 600)]):
        out = tmp_path / f"steps-{k}.txt"
        script = tmp_path / f"job-{k}.sh"
        script.write_text(f"#!/bin/bash\nexec {sys.executable} -m allocopt.integrations.slurm_exec --spool {spool} -- "
                          f"{sys.executable} {ROOT / 'tests' / 'jobs' / 'slurm_train.py'} {out} "
                          f"--step-s {STEP_S[model]}\n")
        jid = _sbatch(script, *(["--hold"] if k < 5 else []), "--gres=gpu:1",
                      f"--comment=allocopt:model={model},steps={steps}", f"--output={tmp_path / f'slurm-{k}.log'}")
        jobs[jid] = (model, steps, out)
    foreign = _sbatch(None, "--gres=gpu:1", "--wrap=sleep 6", "--output=/dev/null")
    rejected = _sbatch(tmp_path / "job-0.sh", "--hold", "--comment=allocopt:color=red", "--output=/dev/null")
    state = spool / "controller.sqlite"
    log = tmp_path / "controller.log"
    try:
        ctl = _controller(spool, table, log)
        # kill -9 once a few rounds are journaled, with jobs running; Slurm keeps running them meanwhile
        _wait(lambda: state.exists() and _rounds(state) >= KILL_AFTER_ROUNDS, 120, "journaled rounds")
        for _ in range(10):  # between two rounds (the last one enacted), while jobs run
            done = _rounds(state)
            _wait(lambda: _rounds(state) > done, 30, "the next round")
            time.sleep(ROUND_S / 3)
            running = [j for j in jobs if _show(j).get("JobState") == "RUNNING"]
            if running:
                break
        ctl.send_signal(signal.SIGKILL)
        ctl.wait()
        killed_at = time.time()
        time.sleep(2 * ROUND_S)
        assert running and all(_show(j).get("JobState") in ("RUNNING", "COMPLETED") for j in running)
        ctl = _controller(spool, table, log)
        assert ctl.wait(timeout=240) == 0, log.read_text()[-3000:]
    finally:
        subprocess.run(["scancel", *jobs, foreign, rejected], capture_output=True)
    text = log.read_text()
    journal = Journal(state)
    records, rounds = journal.jobs(), journal.rounds()

    # every job ran exactly its steps: none lost, none repeated
    for jid, (model, steps, out) in jobs.items():
        lines = [line.split() for line in out.read_text().splitlines()]
        assert [int(parts[0]) for parts in lines] == list(range(steps)), f"job {jid}: steps lost or repeated"
        assert records[jid].status == "done", records[jid]
    # preemption went through requeue: jobs ran again after a requeue (SLURM_RESTART_COUNT > 0 in the step log)
    restarted = {jid for jid, (_, _, out) in jobs.items()
                 if any(int(line.split()[2]) > 0 for line in out.read_text().splitlines())}
    assert restarted and sum(records[j].preemptions for j in jobs) >= len(restarted), text[-2000:]
    assert any(r["actions"]["requeuehold"] for r in rounds)
    # the journal is contiguous across the kill, and the restarted controller credited the time jobs ran
    # while it was down (a lease of the last journaled round gets more than a round's seconds)
    assert [r["idx"] for r in rounds] == list(range(len(rounds)))
    after = next(r for r in rounds if r["start"] > killed_at)
    assert max(seconds for _, seconds, _ in after["results"]) > 1.5 * ROUND_S, after
    # the job that did not opt in was never touched; the malformed opt-in stays held with the reason
    shown = _show(foreign)
    assert shown["Restarts"] == "0" and shown["ExcNodeList"] == "(null)" and shown["JobState"] == "COMPLETED"
    assert foreign not in records
    assert records[rejected].status == "rejected" and "color" in records[rejected].message

    # GPU time follows the allocation: from round 2 (the job that did not opt in has left; throughputs are
    # measured) to the kill, with all six jobs active, each job's share of the GPU seconds used is within
    # SHARE_TOLERANCE of its share of the GPU seconds the allocation gave (each requeue costs Slurm's
    # stop-and-start latency, up to ~2.5 s of a 3-s round on a loaded machine)
    expected = dict.fromkeys(jobs, 0.0)
    received = dict.fromkeys(jobs, 0.0)
    window = [k for k in range(2, len(rounds) - 1) if set(jobs) <= set(rounds[k]["allocation"])
              and rounds[k + 1]["start"] < killed_at]
    assert len(window) >= KILL_AFTER_ROUNDS - 4
    for k in window:
        dt = rounds[k + 1]["start"] - rounds[k]["start"]
        for jid in jobs:
            expected[jid] += sum(rounds[k]["allocation"][jid].values()) * dt
        for jid, seconds, _ in rounds[k + 1]["results"]:
            if jid in received:
                received[jid] += seconds
    total_e, total_r = sum(expected.values()), sum(received.values())
    shares = {j: (round(received[j] / total_r, 3), round(expected[j] / total_e, 3)) for j in jobs}
    assert all(abs(r - e) <= SHARE_TOLERANCE for r, e in shares.values()), shares


def test_gpu_counts_of_every_request_form_and_excluded_nodes(slurm, tmp_path):
    """Whole-job GPU counts from --gres (times nodes), --gpus and --gpus-per-task (times tasks); the user's
    --exclude kept; a foreign job's --gpus taken off the capacity (partition bench: 256 a100 + 256 v100)."""
    from allocopt.integrations.slurm import SlurmController
    from allocopt.integrations.slurm_commands import Slurm

    def submit(*options: str) -> str:
        out = subprocess.run(["sbatch", "--parsable", "--partition=bench", "--output=/dev/null", *options,
                              "--wrap=sleep 60"], capture_output=True, text=True, check=True).stdout
        return out.strip().split(";")[0]

    forms = {"--gres=gpu:2": 2, "--gpus=3": 3, "--ntasks=2 --gpus-per-task=2": 4, "--nodes=2 --gres=gpu:1": 2,
             "--gpus-per-node=a100:3": 3}
    ids = {submit("--hold", "--comment=allocopt:model=m", *form.split()): n for form, n in forms.items()}
    excluding = submit("--hold", "--comment=allocopt", "--gres=gpu:1", "--exclude=gpu-big-v")
    foreign = submit("--gpus=a100:5", "--nodelist=gpu-big-a")
    try:
        _wait(lambda: _show(foreign).get("JobState") == "RUNNING", 60, "the foreign job running")
        controller = SlurmController(Slurm(["bench"]), Journal(tmp_path / "c.sqlite"), tmp_path / "spool",
                                     round_seconds=60.0)
        controller.run_round()
        assert {jid: controller.records[jid].scale_factor for jid in ids} == ids
        assert controller.records[excluding].user_excluded == "gpu-big-v"
        assert controller.engine.cluster.capacity.tolist() == [256 - 5, 256]
        assert foreign not in controller.records
    finally:
        subprocess.run(["scancel", *ids, excluding, foreign], capture_output=True)


# ----- elastic jobs (--policy sia) ---------------------------------------------------------
ELASTIC_PARTITION = "bench"
MARKER = f"allocopt-elastic-{os.getpid()}"
ELASTIC_ROUND_S = 3.0
TRAIN = ROOT / "tests" / "jobs" / "slurm_elastic_train.py"


def test_elastic_comment_parsing():
    attrs = parse_comment("allocopt:batch_size=16,max_replicas=2,types=a100,steps=100,application=cifar10")
    assert elastic_spec(attrs, "7") == ElasticSpec(batch_size=16, max_replicas=2, application="cifar10")
    assert elastic_spec(parse_comment("allocopt:model=m,steps=5"), "7") is None
    with pytest.raises(InvalidProblemError, match="max_replicas"):
        elastic_spec(parse_comment("allocopt:batch_size=16,max_replicas=two"), "7")
    with pytest.raises(InvalidProblemError, match="batch_size"):
        elastic_spec(parse_comment("allocopt:min_replicas=2"), "7")


def _elastic_controller(spool: Path, log: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "allocopt", "slurm", "run", "--spool", str(spool), "--partition",
                             ELASTIC_PARTITION, "--policy", "sia", "--round-seconds", str(ELASTIC_ROUND_S),
                             "--marker", MARKER, "--exit-when-done"],
                            env=_env(), stdout=open(log, "a"), stderr=subprocess.STDOUT)


def _sbatch_elastic(script: Path, *options: str) -> str:
    proc = subprocess.run(["sbatch", "--parsable", f"--partition={ELASTIC_PARTITION}", *options, str(script)],
                          capture_output=True, text=True, env=_env(), check=True)
    return proc.stdout.strip().split(";")[0]


def _script(tmp_path: Path, spool: Path, name: str, *args: str) -> tuple[Path, Path]:
    out = tmp_path / name
    out.mkdir()
    script = tmp_path / f"{name}.sh"
    script.write_text(f"#!/bin/bash\nexec {sys.executable} -m allocopt.integrations.slurm_exec --spool {spool} -- "
                      f"{sys.executable} {TRAIN} {out} {' '.join(args)}\n")
    return script, out


def test_elastic_jobs_are_resized_by_requeue_and_update_with_the_engines_batch(slurm, tmp_path):
    spool = tmp_path / "spool"
    spool.mkdir()
    # grow: may take both a100 GPUs and reports a gradient noise scale that makes larger batches worth it;
    # fixed: one v100 at most, so its configuration never changes; rigid: no batch_size (rejected under sia)
    # (steps of 20+ ms: a light load on the machine's cores)
    grow_sh, grow_out = _script(tmp_path, spool, "grow", "--alpha", "0.02", "--grad-sqr", "1", "--grad-var", "20")
    fixed_sh, fixed_out = _script(tmp_path, spool, "fixed", "--alpha", "0.02")
    steps = {"grow": 700, "fixed": 300}
    grow = _sbatch_elastic(grow_sh, "--hold", "--gres=gpu:1", f"--output={tmp_path / 'grow.log'}",
                   f"--comment={MARKER}:batch_size=16,max_batch_size=256,max_local_bsz=64,max_replicas=2,types=a100,"
                   f"steps={steps['grow']}")
    fixed = _sbatch_elastic(fixed_sh, "--hold", "--gres=gpu:1", f"--output={tmp_path / 'fixed.log'}",
                    f"--comment={MARKER}:batch_size=16,max_replicas=1,types=v100,steps={steps['fixed']}")
    rigid = _sbatch_elastic(fixed_sh, "--hold", "--gres=gpu:1", "--output=/dev/null", f"--comment={MARKER}:steps=10")
    log = tmp_path / "controller.log"
    try:
        ctl = _elastic_controller(spool, log)
        assert ctl.wait(timeout=240) == 0, log.read_text()[-3000:]
        shown_fixed = _show(fixed)
    finally:
        subprocess.run(["scancel", grow, fixed, rigid], capture_output=True, check=False)
    journal = Journal(spool / "controller.sqlite")
    records, rounds = journal.jobs(), journal.rounds()
    journal.close()
    text = log.read_text()

    for jid, name, out in ((grow, "grow", grow_out), (fixed, "fixed", fixed_out)):
        assert records[jid].status == "done", (records[jid], text[-2000:])
        # every step exactly once across the launches
        ran = [int(line.split()[0]) for line in (out / "steps.txt").read_text().splitlines()]
        assert ran == list(range(steps[name])), f"{name}: steps lost or repeated"
        # each launch got the batch the engine chose for the allocation it was released on, and that allocation
        for f in sorted(out.glob("launch-*.json")):
            launch = json.loads(f.read_text())
            decision = rounds[launch["lease_file"]["round"]]["allocation"][jid]
            got = {k: launch[k] for k in ("batch_size", "local_bsz", "accum_steps", "lr_scale")}
            assert got == decision["batch"], (name, launch, decision)
            assert launch["replicas"] == decision["replicas"] == launch["gpus_on_node"] * launch["num_nodes"]
            assert launch["gpu_type"] == decision["gpu_type"] == launch["lease_file"]["gpu_type"]
            assert got["batch_size"] == launch["replicas"] * got["local_bsz"] * (got["accum_steps"] + 1)
    # grow was resized through requeue-hold and scontrol update: its launches ran on 1 and on 2 GPUs
    launches = [json.loads(f.read_text()) for f in sorted(grow_out.glob("launch-*.json"))]
    assert {launch["gpus_on_node"] for launch in launches} == {1, 2}, launches
    assert any(grow in r["actions"]["requeuehold"] for r in rounds) and records[grow].preemptions >= 1
    assert max(launch["batch_size"] for launch in launches) > 16  # the noise scale made a larger batch worth it
    # fixed kept its configuration: launched once, never requeued
    assert len(list(fixed_out.glob("launch-*.json"))) == 1
    assert shown_fixed["Restarts"] == "0" and records[fixed].preemptions == 0
    assert not any(fixed in r["actions"]["requeuehold"] for r in rounds)
    # a rigid job under a goodput policy is kept held with the reason
    assert records[rigid].status == "rejected" and "rigid" in records[rigid].message


# ----- node loss and controller crashes (partition elastic: nodes gpu-e1, gpu-e2 of 2 x a100) ----------------
NODELOSS_PARTITION = "elastic"
NODES = ("gpu-e1", "gpu-e2")
ELASTIC_STEPS = ROOT / "tests" / "jobs" / "elastic_steps.py"
# reports a gradient noise scale that makes 4 replicas (both nodes) worth it; steps of ~40 ms
SPREAD = "batch_size=16,max_batch_size=256,max_local_bsz=64,max_replicas=4,types=a100"


def _ranked_job(tmp_path: Path, spool: Path, name: str, *args: str) -> tuple[Path, Path]:
    """A job script that runs one task per GPU under srun (each rank logs the steps it runs)."""
    out = tmp_path / name
    out.mkdir()
    script = tmp_path / f"{name}.sh"
    # (the batch environment keeps the submission's SLURM_NTASKS: srun is given the count of this launch)
    script.write_text("#!/bin/bash\nexec srun --ntasks=$((SLURM_JOB_NUM_NODES * SLURM_GPUS_ON_NODE)) "
                      f"--ntasks-per-node=$SLURM_GPUS_ON_NODE {sys.executable} -m allocopt.integrations.slurm_exec "
                      f"--spool {spool} -- {sys.executable} {ELASTIC_STEPS} {out} "
                      f"--alpha 0.04 --grad-sqr 1 --grad-var 20 {' '.join(args)}\n")
    return script, out


def _nodeloss_controller(spool: Path, log: Path, marker: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "allocopt", "slurm", "run", "--spool", str(spool), "--partition",
                             NODELOSS_PARTITION, "--policy", "sia", "--round-seconds", str(ELASTIC_ROUND_S),
                             "--marker", marker], env=_env(), stdout=open(log, "a"), stderr=subprocess.STDOUT)


def _running_launch(out: Path, min_steps: int = 5) -> dict[int, dict] | None:
    """The newest launch once all its ranks started and rank 0 ran ``min_steps`` steps (None before)."""
    launches = elastic_launches(out)
    if not launches:
        return None
    last = launches[-1]
    world = next(iter(last.values()))["world_size"]
    return last if len(last) == world and len(last.get(0, {}).get("steps", ())) >= min_steps else None


def _check_exactly_once(out: Path, spool: Path, job_id: str) -> list[dict[int, dict]]:
    """Every step committed exactly once across the launches (rank 0's fenced log is the checkpoint's history),
    up to the last checkpoint; every rank of a launch ran rank 0's steps."""
    launches = elastic_launches(out)
    ran = [s for launch in launches for s in launch[0]["steps"]]
    checkpoints = sorted((spool / "jobs" / job_id / "checkpoints").glob("ckpt-*.ckpt"))
    last = int(checkpoints[-1].name[len("ckpt-"):-len(".ckpt")])
    assert ran == list(range(last)), "steps lost or run twice"
    for launch in launches:
        assert sorted(launch) == list(range(launch[0]["world_size"])), launch.keys()
        for doc in launch.values():
            assert doc["steps"] == launch[0]["steps"], (doc["epoch"], doc["rank"])
    return launches


@pytest.fixture
def nodes_back() -> None:
    """Resume the elastic partition's nodes whatever the test did to them."""
    yield
    for node in NODES:
        subprocess.run(["scontrol", "update", f"nodename={node}", "state=resume"], capture_output=True, check=False)


def _node_state(node: str) -> str:
    return subprocess.run(["sinfo", "--noheader", "--Node", f"--nodes={node}", "--format=%t"], capture_output=True,
                          text=True, check=False).stdout.strip()


def test_elastic_job_resumes_on_what_is_left_when_a_node_goes_down_and_uses_it_again(slurm, nodes_back, tmp_path):
    spool = tmp_path / "spool"
    spool.mkdir()
    marker = f"allocopt-nodeloss-{os.getpid()}"
    script, out = _ranked_job(tmp_path, spool, "spread")
    job = subprocess.run(["sbatch", "--parsable", f"--partition={NODELOSS_PARTITION}", "--hold", "--gres=gpu:1",
                          "--ntasks=2", f"--output={tmp_path / 'spread.log'}",
                          f"--comment={marker}:{SPREAD},steps=1000000", str(script)],
                         capture_output=True, text=True, env=_env(), check=True).stdout.strip().split(";")[0]
    log = tmp_path / "controller.log"
    ctl = _nodeloss_controller(spool, log, marker)
    try:
        _wait(lambda: (launch := _running_launch(out)) is not None and launch[0]["world_size"] == 4, 90,
              "the job running on both nodes")
        subprocess.run(["scontrol", "update", "nodename=gpu-e2", "state=down", "reason=allocopt-test"], check=True)
        down_at = time.time()
        _wait(lambda: (launch := _running_launch(out)) is not None and launch[0]["world_size"] == 2, 60,
              "the job running on what is left")
        assert _node_state("gpu-e2").startswith("down")
        subprocess.run(["scontrol", "update", "nodename=gpu-e2", "state=resume"], check=True)
        up_at = time.time()
        _wait(lambda: (launch := _running_launch(out)) is not None and launch[0]["world_size"] == 4
              and launch[0]["epoch"] > 2, 60, "the job back on both nodes")
    finally:
        ctl.send_signal(signal.SIGINT)
        ctl.wait(timeout=60)
        subprocess.run(["scancel", job], capture_output=True, check=False)
        _wait(lambda: _show(job).get("JobState") not in ("RUNNING", "COMPLETING"), 30, "the job stopped")
    text = log.read_text()
    launches = _check_exactly_once(out, spool, job)
    journal = Journal(spool / "controller.sqlite")
    rounds = journal.rounds()
    journal.close()
    worlds = [(launch[0]["world_size"], sorted({d["node"] for d in launch.values()})) for launch in launches]
    # on both nodes, then on gpu-e1 alone (resumed from its checkpoint), then on both again
    k = worlds.index((4, list(NODES)))
    assert (2, ["gpu-e1"]) in worlds[k:] and (4, list(NODES)) in worlds[worlds.index((2, ["gpu-e1"]), k):], worlds
    # the plans saw the capacity loss: no lease on gpu-e2 from the first round after it went down until it came back
    while_down = [r for r in rounds if down_at + 0.5 < r["start"] < up_at]
    assert while_down and all("gpu-e2" not in r["leases"][job]["nodes"] for r in while_down if job in r["leases"])
    assert "Traceback" not in text, text[-3000:]


def test_controller_killed_between_requeue_and_release_recovers_from_its_journal(slurm, tmp_path):
    spool = tmp_path / "spool"
    spool.mkdir()
    marker = f"allocopt-crash-{os.getpid()}"
    # a stopping launch takes 3 s to exit (a large checkpoint): the controller is killed in that window, after
    # its requeuehold and before its release
    script, out = _ranked_job(tmp_path, spool, "resized", "--stop-s", "3")
    job = subprocess.run(["sbatch", "--parsable", f"--partition={NODELOSS_PARTITION}", "--hold", "--gres=gpu:1",
                          "--ntasks=2", f"--output={tmp_path / 'resized.log'}",
                          f"--comment={marker}:{SPREAD},steps=1000000", str(script)],
                         capture_output=True, text=True, env=_env(), check=True).stdout.strip().split(";")[0]
    log = tmp_path / "controller.log"
    state = spool / "controller.sqlite"
    ctl = _nodeloss_controller(spool, log, marker)
    try:
        _wait(lambda: _running_launch(out) is not None, 60, "the job's first launch")
        _wait(lambda: _show(job).get("JobState") == "COMPLETING", 60, "a resize (requeuehold)")
        ctl.send_signal(signal.SIGKILL)
        ctl.wait()
        killed_at = time.time()
        requeued_rounds = [r["idx"] for r in Journal(state).rounds() if job in r["actions"]["requeuehold"]]
        # Slurm finishes the requeue; nobody releases the job while the controller is down
        _wait(lambda: _show(job).get("JobState") == "PENDING", 30, "the requeued job stopped")
        time.sleep(2 * ELASTIC_ROUND_S)
        shown = _show(job)
        assert shown["JobState"] == "PENDING" and "held" in shown["Reason"].lower(), shown
        epochs = len(elastic_launches(out))
        ctl = _nodeloss_controller(spool, log, marker)  # same spool and journal
        _wait(lambda: _running_launch(out) is not None and len(elastic_launches(out)) > epochs, 60,
              "the job released by the restarted controller")
    finally:
        ctl.send_signal(signal.SIGINT)
        ctl.wait(timeout=60)
        subprocess.run(["scancel", job], capture_output=True, check=False)
        _wait(lambda: _show(job).get("JobState") not in ("RUNNING", "COMPLETING"), 30, "the job stopped")
    text = log.read_text()
    assert requeued_rounds, text[-3000:]
    launches = _check_exactly_once(out, spool, job)
    assert len(launches) == epochs + 1 and launches[-1][0]["world_size"] > launches[0][0]["world_size"]
    journal = Journal(state)
    rounds, record = journal.rounds(), journal.jobs()[job]
    journal.close()
    # the journal goes on from where it was: the restarted controller's first round released the job, at the
    # configuration its lease file (and the launch) carries
    assert [r["idx"] for r in rounds] == list(range(len(rounds)))
    first = next(r for r in rounds if r["start"] > killed_at)
    assert job in first["actions"]["release"], first["actions"]
    resumed = launches[-1][0]
    assert resumed["world_size"] == record.lease["replicas"] and resumed["batch_size"] == record.lease["batch"]["batch_size"]
    assert "Traceback" not in text, text[-3000:]


def test_scattered_placement_releases_a_rigid_job_on_both_nodes(slurm, tmp_path):
    """--placement scattered: a 2-GPU rigid job submitted for one node (-N1) runs on both nodes of the partition,
    one GPU each (NumNodes=2-2, Gres=gpu:1), and finishes every step once."""
    spool, out = tmp_path / "spool", tmp_path / "steps.txt"
    spool.mkdir()
    script = tmp_path / "job.sh"
    script.write_text(f"#!/bin/bash\nexec {sys.executable} -m allocopt.integrations.slurm_exec --spool {spool} -- "
                      f"{sys.executable} {ROOT / 'tests' / 'jobs' / 'count_steps.py'} {out} --sleep-s 0.05\n")
    marker = f"place{os.getpid()}"
    job = subprocess.run(["sbatch", "--parsable", f"--partition={NODELOSS_PARTITION}", "--hold", "--gres=gpu:2", "-N1",
                          f"--output={tmp_path / 'job.log'}", f"--comment={marker}:steps=40", str(script)],
                         capture_output=True, text=True, env=_env(), check=True).stdout.strip().split(";")[0]
    try:
        done = subprocess.run([sys.executable, "-m", "allocopt", "slurm", "run", "--spool", str(spool), "--partition",
                               NODELOSS_PARTITION, "--placement", "scattered", "--round-seconds", "2", "--marker",
                               marker, "--exit-when-done", "--max-rounds", "60"], env=_env(), capture_output=True,
                              text=True, timeout=180, check=False)
        assert done.returncode == 0, done.stderr
        shown = _show(job)
        assert shown["JobState"] == "COMPLETED" and shown["NumNodes"] == "2", shown
        assert set(_node_list(shown["NodeList"])) == set(NODES), shown
        assert [int(x) for x in out.read_text().split()] == list(range(40))
        journal = Journal(spool / "controller.sqlite")
        assert journal.rounds()[0]["actions"]["nodes"] == {job: list(NODES)}
        journal.close()
    finally:
        subprocess.run(["scancel", job], capture_output=True, check=False)
