"""RayExecutor losing a whole Ray node mid-round, and using it again once it is back: a second raylet joins a
local Ray instance (``ray start --address ... --block`` in its own session) and is SIGKILLed with its workers."""

from __future__ import annotations

import json
import os
import signal
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

ray = pytest.importorskip("ray", reason="the Ray executor needs Ray: pip install 'allocopt[ray]'")

from allocopt.runtime import Lease, RoundOutcome, RoundPlan  # noqa: E402
from allocopt.runtime.executor import BatchSettings  # noqa: E402
from allocopt.runtime.local import JobSpec  # noqa: E402
from allocopt.runtime.ray_executor import RayExecutor  # noqa: E402
from tests.runtime.helpers import JOBS_DIR, assert_no_device_overlap, elastic_launches  # noqa: E402

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the node's processes are found in /proc")

NODE_TYPE = "nodeloss"  # the GPU type only the second node advertises (2 units, with 2 nominal GPUs)
RAY = str(Path(sys.executable).with_name("ray"))


class _Node:
    """A Ray worker node on this machine, joined to ``address``, that the test kills and starts again."""

    def __init__(self, address: str, temp_dir: str):
        self.address, self.temp_dir, self.proc = address, temp_dir, None

    def start(self) -> None:
        self.proc = subprocess.Popen([RAY, "start", "--address", self.address, "--num-cpus=1", "--num-gpus=2",
                                      "--resources", json.dumps({f"accelerator_type:{NODE_TYPE}": 2}),
                                      "--object-store-memory=80000000", "--disable-usage-stats", "--temp-dir", self.temp_dir,
                                      "--block"],
                                     start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        _wait_for(lambda: ray.cluster_resources().get(f"accelerator_type:{NODE_TYPE}", 0) >= 2, 60.0)

    def kill(self) -> None:
        """SIGKILL the node's raylet and everything it started (its session), as when the machine is lost."""
        if self.proc is not None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait()
            self.proc = None


def _wait_for(condition, timeout_s: float) -> None:
    """Poll ``condition`` until it holds; after ``timeout_s`` (a hang guard) fail unless it holds then."""
    limit = time.time() + timeout_s
    while not condition() and time.time() < limit:
        time.sleep(0.1)
    assert condition(), f"the condition did not hold within {timeout_s:g} s (a hang)"


@pytest.fixture(scope="module")
def node() -> Iterator[_Node]:
    """A local Ray head that declares a node dead after 1.5 s without health checks, and a worker node; both
    in a temporary directory of their own (``ray start`` writes the cluster's address there, where another
    ``ray.init()`` on this machine does not look)."""
    if not os.path.exists(RAY):
        pytest.skip(f"no ray command beside {sys.executable}")
    temp_dir = tempfile.mkdtemp(prefix="rnl")  # short: Ray's socket paths live under it
    ray.init(address="local", num_cpus=1, include_dashboard=False, log_to_driver=False, _temp_dir=temp_dir,
             _system_config={"health_check_initial_delay_ms": 0, "health_check_period_ms": 500,
                             "health_check_timeout_ms": 500, "health_check_failure_threshold": 3})
    worker = _Node(ray.get_runtime_context().gcs_address, temp_dir)
    try:
        worker.start()
        yield worker
    finally:
        worker.kill()
        ray.shutdown()
        shutil.rmtree(temp_dir, ignore_errors=True)


def test_job_on_a_node_lost_mid_round_resumes_from_its_checkpoint_when_the_node_is_back(tmp_path: Path,
                                                                                       node: _Node) -> None:
    out = tmp_path / "e"
    out.mkdir()
    ex = RayExecutor({"e": JobSpec("e", [sys.executable, str(JOBS_DIR / "elastic_steps.py"), str(out)], 10 ** 6)},
                     {NODE_TYPE: 2}, tmp_path / "rt", grace_s=1.0, restart_wait_s=2.0, retry_backoff_s=0.05)
    assert ex.available_devices() == [0, 1]
    batch = BatchSettings(32, 16, 0, 1.0)
    killed: list[int] = []

    def kill_node() -> None:  # once the launch logged 3 steps (rank 0 logs with its checkpoint)
        limit = time.time() + 20.0
        while time.time() < limit:
            steps = list(out.glob("steps-e*-r0.txt"))
            if steps and len(steps[0].read_text().split()) >= 3:
                killed.extend(json.loads(f.read_text())["pid"] for f in out.glob("launch-e*-r*.json"))
                node.kill()
                return
            time.sleep(0.02)

    def lease(max_steps: int | None = None) -> Lease:
        return Lease("e", NODE_TYPE, (0, 1), 20.0, max_steps=max_steps, batch=batch)

    try:
        killer = threading.Thread(target=kill_node, daemon=True)
        killer.start()
        [lost] = ex.run_round(RoundPlan(0, 0.0, 20.0, (lease(),)))
        killer.join()
        assert len(killed) == 2 and "lost their device" in lost.message and lost.outcome is RoundOutcome.PREEMPTED
        for pid in killed:  # the ranks died with their node
            _wait_for(lambda pid=pid: not os.path.exists(f"/proc/{pid}") or
                      Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z", 10.0)
        assert ex.available_devices() == []  # the node's devices are gone
        # the node is gone: the launch waits restart_wait_s for the actors, then gives up the round
        [gone] = ex.run_round(RoundPlan(1, 0.0, 20.0, (lease(),)))
        assert gone.outcome is RoundOutcome.PREEMPTED and "not started" in gone.message and gone.steps == 0
        checkpointed = ex.checkpointed_steps("e")
        node.start()  # back: Ray restarts the actors there, and the job resumes from its checkpoint
        later = []  # (a restart starts a Ray worker: under load it can take longer than restart_wait_s)
        while len(later) < 5 and (not later or "not started" in later[-1].message):
            later += ex.run_round(RoundPlan(2 + len(later), 0.0, 20.0, (lease(max_steps=20),)))
        back = later[-1]
        assert ex.available_devices() == [0, 1]  # back
        assert back.outcome is RoundOutcome.PREEMPTED and back.restarted and back.message == "", later
        assert ex.checkpointed_steps("e") >= checkpointed + 20 and ex.failed("e") is None
    finally:
        ex.close()
    launches = elastic_launches(out)
    assert len(launches) == 2  # the launch on the lost node and the one on the node back
    committed = [s for launch in launches for s in launch[0]["steps"]]
    assert committed == list(range(ex.checkpointed_steps("e"))) and len(committed) >= 3 + 20
    last = [launches[-1][rank]["steps"] for rank in (0, 1)]
    assert last[1] == last[0] and last[0][0] == checkpointed  # resumed at the lost launch's checkpoint
    assert_no_device_overlap(ex.work_dir)
