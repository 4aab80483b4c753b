"""The local executor on this machine's NVIDIA GPUs: discovery, and each rank seeing exactly its lease's GPUs.

Skipped on machines without NVIDIA GPUs, or without torch built with CUDA (the probe job needs it).
``benchmarks/gpu_time_sharing.py`` is the longer check: PyTorch jobs time-sharing the GPUs over rounds.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from allocopt.runtime import Lease, RoundOutcome, RoundPlan
from allocopt.runtime.devices import devices_for_cluster, discover, discover_nvidia_smi, discover_nvml
from allocopt.runtime.local import JobSpec, LocalExecutor
from tests.runtime.helpers import JOBS_DIR, assert_no_device_overlap

GPUS = discover_nvml() or discover_nvidia_smi() or []
pytestmark = pytest.mark.skipif(not GPUS, reason="no NVIDIA GPU on this machine (NVML and nvidia-smi report none)")


def _require_torch_cuda() -> None:
    torch = pytest.importorskip("torch", reason="the probe job needs torch")
    if not torch.cuda.is_available():
        pytest.skip("torch cannot use CUDA on this machine")


def test_nvml_and_nvidia_smi_report_the_same_gpus() -> None:
    nvml, smi = discover_nvml(), discover_nvidia_smi()
    if nvml is None or smi is None:
        pytest.skip("needs both NVML (nvidia-ml-py) and nvidia-smi")
    assert [(d.index, d.gpu_type, d.name, d.uuid) for d in nvml] == [(d.index, d.gpu_type, d.name, d.uuid)
                                                                      for d in smi]
    assert all(abs(a.memory_mib - b.memory_mib) <= 1 for a, b in zip(nvml, smi))
    assert discover()[0].gpu_type not in ("cpu", "unknown")


def _leases(n: int) -> list[tuple[int, ...]]:
    """One lease per GPU, and where there are two or more, a two-rank lease in reverse order."""
    return [(g,) for g in range(n)] + ([(n - 1, 0)] if n > 1 else [])


def test_each_rank_sees_exactly_its_lease_gpus_and_runs_on_them(tmp_path: Path) -> None:
    _require_torch_cuda()
    gpu_type = GPUS[0].gpu_type
    devices = devices_for_cluster({gpu_type: sum(d.gpu_type == gpu_type for d in GPUS)}, GPUS)
    probe = str(JOBS_DIR / "cuda_probe.py")
    leases = _leases(len(devices))
    jobs = {f"p{k}": JobSpec(f"p{k}", [sys.executable, probe, str(tmp_path / f"p{k}")], 1_000_000)
            for k in range(len(leases))}
    ex = LocalExecutor(jobs, devices, tmp_path / "rt")
    try:
        for k, ids in enumerate(leases):
            # a step limit ends each lease, so the round does not depend on how long CUDA takes to start
            [result] = ex.run_round(RoundPlan(k, 0.0, 120.0, (Lease(f"p{k}", gpu_type, ids, 120.0, max_steps=50),)))
            assert result.outcome is RoundOutcome.PREEMPTED and result.steps == 50, result
            assert ex.checkpointed_steps(f"p{k}") == 50
            for rank, g in enumerate(ids):
                seen = json.loads(Path(f"{tmp_path / f'p{k}'}.{rank}").read_text())
                assert seen["CUDA_VISIBLE_DEVICES"] == ",".join(str(devices[i].index) for i in ids)
                assert seen["count"] == len(ids) and seen["local_rank"] == rank
                # the device the rank computes on is the GPU its lease names, by UUID
                assert seen["uuids"][rank] == devices[g].uuid and seen["names"][rank] == devices[g].name
    finally:
        ex.close()
    assert_no_device_overlap(tmp_path / "rt")
