"""Device discovery: name normalization, nvidia-smi parsing, the cpu fallback, cluster mapping."""

from __future__ import annotations

import pytest

from allocopt.errors import InvalidProblemError
from allocopt.runtime.devices import (Device, cpu_devices, devices_for_cluster, discover, normalize_gpu_name,
                                      parse_nvidia_smi)

NAMES = {
    "NVIDIA H100 80GB HBM3": "h100", "NVIDIA H100 PCIe": "h100", "NVIDIA H100 NVL": "h100",
    "NVIDIA H200": "h200", "NVIDIA GH200 480GB": "gh200", "NVIDIA A100-SXM4-40GB": "a100",
    "NVIDIA A100 80GB PCIe": "a100", "NVIDIA A800 80GB PCIe": "a800", "NVIDIA A10G": "a10g", "NVIDIA A10": "a10",
    "NVIDIA A30": "a30", "NVIDIA A40": "a40", "NVIDIA L40S": "l40s", "NVIDIA L40": "l40", "NVIDIA L4": "l4",
    "Tesla V100-SXM2-16GB": "v100", "Tesla V100-PCIE-32GB": "v100", "Tesla P100-PCIE-16GB": "p100",
    "Tesla P40": "p40", "Tesla T4": "t4", "Tesla K80": "k80", "NVIDIA RTX A6000": "a6000",
    "NVIDIA GeForce RTX 4090": "rtx4090", "NVIDIA GeForce RTX 3090 Ti": "rtx3090ti",
    "NVIDIA GeForce GTX 1080 Ti": "gtx1080ti", "NVIDIA B200": "b200",
}


@pytest.mark.parametrize("name, expected", NAMES.items())
def test_normalize_gpu_name(name: str, expected: str) -> None:
    assert normalize_gpu_name(name) == expected


def test_unknown_name_keeps_its_model_words() -> None:
    assert normalize_gpu_name("NVIDIA Foo X9 24GB") == "foox9"


def test_parse_nvidia_smi() -> None:
    text = "0, NVIDIA H100 80GB HBM3, 81559, GPU-aaa\n1, Tesla V100-SXM2-16GB, 16160, GPU-bbb\n"
    assert parse_nvidia_smi(text) == [Device(0, "h100", "NVIDIA H100 80GB HBM3", 81559, "GPU-aaa"),
                                      Device(1, "v100", "Tesla V100-SXM2-16GB", 16160, "GPU-bbb")]


def test_cpu_fallback(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")  # no nvidia-smi; NVML finds no driver on a CPU machine
    found = discover(cpu_count=3)
    if found and found[0].gpu_type != "cpu":
        pytest.skip("this machine has NVIDIA GPUs visible through NVML")
    assert [(d.index, d.gpu_type) for d in found] == [(0, "cpu"), (1, "cpu"), (2, "cpu")]


def test_devices_for_cluster_orders_types_like_the_cluster() -> None:
    pool = [Device(0, "v100", "v"), Device(1, "a100", "a"), Device(2, "v100", "v"), Device(3, "a100", "a")]
    out = devices_for_cluster({"a100": 2, "v100": 1}, pool)
    assert [d.index for d in out] == [1, 3, 0]
    assert len(devices_for_cluster({"cpu": 4}, pool)) == 4
    assert [d.index for d in devices_for_cluster({"x": 1}, pool, aliases={"x": "v100"})] == [0]
    with pytest.raises(InvalidProblemError, match="has 2 of type"):
        devices_for_cluster({"a100": 3}, pool)
    with pytest.raises(InvalidProblemError):
        cpu_devices(0)
