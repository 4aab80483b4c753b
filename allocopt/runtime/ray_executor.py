"""The Ray executor: runs each round's leases through Ray actors, one per device, one rank each.

Everything but where a rank's process starts is the :class:`~allocopt.runtime.local.LocalExecutor`'s:
lease, stop and progress files, extension of unchanged placements, stop file then
SIGTERM then SIGKILL within ``grace_s``, failure classification, retries and
throughput measurement.

At start the executor creates one actor per GPU of the cluster (cluster-wide
GPU id ``g`` is actor ``g``), holding that GPU through Ray resources: one unit of
the custom resource ``accelerator_type:<gpu type>`` (the cluster's type names:
``accelerator_type:h100``, ``accelerator_type:cpu`` for cpu pseudo-devices) and,
for a real GPU type, one GPU (``num_gpus=1``, so Ray assigns it). The actors of a
type are packed onto as few nodes as possible (one placement group per type), so
consecutive ids share nodes as the scheduler's placement assumes. Each rank of a
lease runs in the actor of its GPU id, as a process in its own session with the
local executor's environment (and lease epoch fence; the actor is the subreaper
of the rank's process tree): ``CUDA_VISIBLE_DEVICES`` lists the GPUs Ray
assigned to the job's actors on that node, ``LOCAL_RANK`` counts the job's ranks
on that node and ``MASTER_ADDR`` is rank 0's node. Actors outlive leases, so a
restart costs a process start, not a Ray worker start. A rank whose actor died
(killed, or its node lost) is no failure of its job: the job's other ranks are
stopped, and the job is preempted, to resume from its checkpoint in the next
round on the actor Ray restarts in its place (its retries are not spent). A
launch whose actors are not back within ``restart_wait_s`` (their node is gone
and no other has their resources) is preempted as well; once a node with
their resources joins, Ray restarts them there and the job runs on it again.

Nodes advertise the resources when started, e.g.
``ray start --head --num-gpus=8 --resources='{"accelerator_type:h100": 8}'``.
The work directory must be visible at the same path on every node (a shared
file system), as must the jobs' commands and checkpoints.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import time
from collections.abc import Callable, Hashable, Mapping, Sequence
from pathlib import Path
from typing import Any

from allocopt.errors import BackendNotInstalledError, InvalidProblemError
from allocopt.runtime.devices import CPU_TYPE, Device
from allocopt.runtime.executor import Lease
from allocopt.runtime.launch import DeviceLostError
from allocopt.runtime.local import (POLL_S, JobSpec, LocalExecutor, Rank, RankProcess, free_port, merge_environment,
                                    rank_environment, start_process)
from allocopt.runtime.procs import ProcessTree, become_subreaper, reap_children, start_ticks

try:
    import ray
    from ray.util.placement_group import PlacementGroup, placement_group, remove_placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy
except ImportError:
    raise BackendNotInstalledError("the Ray executor needs Ray: pip install 'allocopt[ray]'") from None

#: Exit status reported for a rank whose actor died (its node was lost, or it was killed).
ACTOR_DIED_STATUS = -1
RESTART_WAIT_S = 60.0  # how long a call waits for an actor that Ray is restarting
# what a call raises while Ray restarts its actor (older Ray has no such error: it holds the call)
_RESTARTING = getattr(ray.exceptions, "ActorUnavailableError", ())


def _get_when_up(call: Callable[[], Any], wait_s: float = RESTART_WAIT_S) -> Any:
    """``ray.get(call())`` for an idempotent actor call, called again while its actor is restarting
    (within ``wait_s`` seconds; then the error, or ``GetTimeoutError`` for a call held that long)."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            return ray.get(call(), timeout=max(deadline - time.monotonic(), 0.1))
        except _RESTARTING:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def accelerator_resource(gpu_type: str) -> str:
    """The Ray custom resource of a GPU type: ``accelerator_type:<gpu_type>``."""
    return f"accelerator_type:{gpu_type}"


@ray.remote(num_cpus=0, max_restarts=-1)
class _DeviceActor:
    """Holds one device and runs the rank processes leased on it, one at a time.

    Every method is a coroutine, so all run on the actor's event-loop thread:
    a process is killed when that thread ends (``PR_SET_PDEATHSIG``). Ray
    restarts a dead actor (in its placement group bundle); the new one only
    signals process trees it started itself.
    """

    def __init__(self) -> None:
        become_subreaper()
        self.procs: dict[int, subprocess.Popen] = {}  # running
        self.trees: dict[int, ProcessTree] = {}  # every process tree this actor started

    async def node(self) -> tuple[str, str, list[str]]:
        """Node id, node address and the GPU ids Ray assigned to this actor."""
        return (ray.get_runtime_context().get_node_id(), ray.util.get_node_ip_address(),
                [str(g) for g in ray.get_gpu_ids()])

    async def free_port(self) -> int:
        return free_port()

    async def start(self, command: Sequence[str] | str, env: Sequence[Mapping[str, str | None]], cwd: str | None,
                    log_file: str) -> int:
        proc, token = start_process(command, merge_environment(os.environ, *env), cwd, Path(log_file))
        self.procs[proc.pid] = proc
        self.trees[proc.pid] = ProcessTree(proc.pid, start_ticks(proc.pid), token)
        return proc.pid

    async def wait_exit(self, pid: int) -> int:
        proc = self.procs[pid]
        while (code := proc.poll()) is None:
            await asyncio.sleep(POLL_S)
        del self.procs[pid]
        return code

    async def signal_group(self, pid: int, sig: int) -> None:
        if pid in self.trees:
            self.trees[pid].signal(sig)

    async def group_alive(self, pid: int) -> bool:
        tree = self.trees.get(pid)
        if tree is None:
            return False
        members = tree.members()
        reap_children([m for m in members if m.zombie], frozenset(self.procs))
        return any(not m.zombie for m in members)


class _RayProcess(RankProcess):
    """A rank's process as the driver sees it, through the actor that started it."""

    def __init__(self, actor: ray.actor.ActorHandle, pid: int):
        self.actor, self.pid = actor, pid
        self._exit = actor.wait_exit.remote(pid)
        self._code: int | None = None
        self._lost = False

    def poll(self) -> int | None:
        if self._code is None and ray.wait([self._exit], timeout=0)[0]:
            try:
                self._code = int(ray.get(self._exit))
            except ray.exceptions.RayError:
                self._code, self._lost = ACTOR_DIED_STATUS, True
        return self._code

    def lost(self) -> bool:
        return self._lost

    def signal_group(self, sig: int) -> None:
        try:
            ray.get(self.actor.signal_group.remote(self.pid, sig))
        except ray.exceptions.RayError:
            pass  # the actor is gone, and its process with it

    def group_alive(self) -> bool:
        try:
            return bool(ray.get(self.actor.group_alive.remote(self.pid)))
        except ray.exceptions.RayError:
            return False

    def reap(self) -> None:
        try:
            ray.get(self._exit)
        except ray.exceptions.RayError:
            pass


class RayExecutor(LocalExecutor):
    """Runs round plans on a Ray cluster through one actor per device.

    Parameters
    ----------
    jobs : mapping of job id to JobSpec
    gpus : mapping of str to int
        The cluster's GPU types and counts, in cluster-wide GPU id order (as
        :class:`allocopt.Cluster`); the Ray cluster must advertise that many
        units of ``accelerator_type:<type>`` (and GPUs for real GPU types).
    work_dir : path
        As for :class:`~allocopt.runtime.local.LocalExecutor`; shared by every node.
    address : str, optional
        Address of a running Ray cluster to connect to (``"auto"``,
        ``"10.0.0.1:6379"``, ``"ray://..."``), unless this process is connected to
        Ray already (that instance is used). Default: a new local instance
        advertising ``gpus``.
    place_timeout_s : float, default 60
        How long to wait for Ray to place the device actors.
    restart_wait_s : float, default 60
        How long a launch waits for device actors that Ray is restarting (after their worker or node
        died) before the launch is given up (its job preempted) for the round.
    **options
        ``grace_s``, ``max_retries``, ``retry_backoff_s``, ``estimator``,
        ``renew_wait_s`` of :class:`~allocopt.runtime.local.LocalExecutor`.

    Raises
    ------
    InvalidProblemError
        When the Ray cluster lacks the resources of ``gpus``, or they stay taken
        for ``place_timeout_s`` seconds.
    """

    def __init__(self, jobs: Mapping[Hashable, JobSpec], gpus: Mapping[str, int], work_dir: str | os.PathLike, *,
                 address: str | None = None, place_timeout_s: float = 60.0, restart_wait_s: float = RESTART_WAIT_S,
                 **options: Any):
        self.restart_wait_s = float(restart_wait_s)
        self._owns_ray = not ray.is_initialized()
        if self._owns_ray:
            if address is None:
                ray.init(address="local", num_gpus=sum(n for t, n in gpus.items() if t != CPU_TYPE),
                         resources={accelerator_resource(t): n for t, n in gpus.items()}, include_dashboard=False,
                         log_to_driver=False)
            else:
                ray.init(address=address, log_to_driver=False)
        self._groups: list[PlacementGroup] = []
        self._actors: list[ray.actor.ActorHandle] = []
        try:
            self._place(gpus, float(place_timeout_s))
            ray.get([a.node.remote() for a in self._actors])  # every actor is up: the first leases start at once
        except BaseException:
            self._shutdown()
            raise
        slots = [t for t, n in gpus.items() for _ in range(n)]
        super().__init__(jobs, [Device(g, t, f"Ray {accelerator_resource(t)}") for g, t in enumerate(slots)],
                         work_dir, **options)

    def _place(self, gpus: Mapping[str, int], timeout_s: float) -> None:
        """One placement group per GPU type, one actor per bundle (GPU id order)."""
        have = ray.cluster_resources()
        wanted = {accelerator_resource(t): n for t, n in gpus.items()}
        wanted["GPU"] = sum(n for t, n in gpus.items() if t != CPU_TYPE)
        for name, n in wanted.items():
            if have.get(name, 0) < n:
                hint = "--num-gpus=N" if name == "GPU" else f"--resources='{{\"{name}\": N}}'"
                raise InvalidProblemError(
                    f"the cluster needs {n} of Ray resource {name!r} but the Ray cluster advertises "
                    f"{have.get(name, 0):g}; start its nodes with ray start {hint} or lower the count", field="cluster")
        for gpu_type, n in gpus.items():
            if not n:
                continue
            gpu, resource = gpu_type != CPU_TYPE, accelerator_resource(gpu_type)
            group = placement_group([{resource: 1, "GPU": 1} if gpu else {resource: 1}] * n, strategy="PACK")
            self._groups.append(group)
            try:
                ray.get(group.ready(), timeout=timeout_s)
            except ray.exceptions.GetTimeoutError:
                raise InvalidProblemError(f"Ray could not place {n} actor(s) on {resource} within {timeout_s:g} s: "
                                          "another executor holds them; stop it or lower the count (see ray status)",
                                          field="cluster") from None
            self._actors += [_DeviceActor.options(num_gpus=int(gpu), resources={resource: 1},
                                                  scheduling_strategy=PlacementGroupSchedulingStrategy(group, k)
                                                  ).remote() for k in range(n)]

    def available_devices(self, timeout_s: float = 1.0) -> list[int]:
        """The GPU ids whose actors answer within ``timeout_s`` seconds: not those of a lost node (until a
        node with their resources joins and Ray restarts them there), nor those Ray is restarting."""
        refs = [a.node.remote() for a in self._actors]
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=timeout_s)
        up = []
        for g, ref in enumerate(refs):
            if ref in ready:
                try:
                    ray.get(ref)
                except ray.exceptions.RayError:
                    continue
                up.append(g)
        return up

    def close(self) -> None:
        """Stop every job, free the devices; disconnect from Ray (shutting down a local instance it started)."""
        super().close()
        self._shutdown()

    def _shutdown(self) -> None:
        for actor in self._actors:
            ray.kill(actor)
        for group in self._groups:
            remove_placement_group(group)
        self._actors, self._groups = [], []
        if self._owns_ray and ray.is_initialized():
            ray.shutdown()

    def _start_ranks(self, lease: Lease, spec: JobSpec, env: Mapping[str, str | None],
                     progress: Sequence[Path]) -> list[Rank]:
        gpu = lease.gpu_type != CPU_TYPE
        actors = [self._actors[g] for g in lease.gpu_ids]
        try:
            # asked each time: a restarted actor may move (and a killed one may still be restarting)
            nodes = _get_when_up(lambda: [a.node.remote() for a in actors], self.restart_wait_s)
            port = _get_when_up(actors[0].free_port.remote, self.restart_wait_s)
        except ray.exceptions.RayError as err:
            raise DeviceLostError(f"the Ray actor of a GPU of {list(lease.gpu_ids)} is not up within "
                                  f"{self.restart_wait_s:g} s ({type(err).__name__})") from None
        peers: dict[str, list[int]] = {}  # node id -> the job's ranks there
        for r, (node_id, _, _) in enumerate(nodes):
            peers.setdefault(node_id, []).append(r)
        ranks: list[Rank] = []
        for r, actor in enumerate(actors):
            local = peers[nodes[r][0]]
            devices = [g for p in local for g in nodes[p][2]] if gpu else [str(lease.gpu_ids[p]) for p in local]
            rank_env = rank_environment(r, local.index(r), len(local), nodes[0][1], port, devices, gpu, progress[r])
            launched = time.time()
            try:
                pid = ray.get(actor.start.remote(spec.command, [env, rank_env], spec.cwd or os.getcwd(),
                                                 str(self.log_file(lease.job_id, r))))
            except ray.exceptions.RayError as err:  # the actor died since it answered: stop the ranks started
                for rank in ranks:
                    rank.proc.signal_group(signal.SIGKILL)
                for rank in ranks:
                    rank.proc.reap()
                raise DeviceLostError(f"the Ray actor of GPU {lease.gpu_ids[r]} died while rank {r} started "
                                      f"({type(err).__name__})") from None
            self.stats.popen_s.append(time.time() - launched)
            ranks.append(Rank(_RayProcess(actor, pid), progress[r], launched))
        return ranks


__all__ = ["ACTOR_DIED_STATUS", "RayExecutor", "accelerator_resource"]
