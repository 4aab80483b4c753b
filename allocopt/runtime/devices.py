"""Device discovery: the accelerators of this machine, their type names, memory and ids.

Sources, in order: NVML through ``nvidia-ml-py`` (optional import), then
``nvidia-smi --query-gpu=...`` when it is on ``PATH``, else ``cpu``
pseudo-devices, so that the runtime runs (and is tested) without a GPU.
Marketing names are normalized to the short type names allocopt's clusters use
(``"NVIDIA H100 80GB HBM3"`` -> ``"h100"``).
"""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from allocopt.errors import InvalidProblemError

CPU_TYPE = "cpu"

# Ordered (pattern, type): the first pattern found in the lower-cased name wins, so the
# more specific names (gh200 before h200, a100 before a10, l40s before l40 before l4) come first.
_NAME_PATTERNS: tuple[tuple[str, str], ...] = (
    (r"gh200", "gh200"), (r"gb200", "gb200"), (r"\bb200\b", "b200"), (r"\bb100\b", "b100"),
    (r"h200", "h200"), (r"h100", "h100"), (r"h800", "h800"), (r"\bh20\b", "h20"),
    (r"a100", "a100"), (r"a800", "a800"), (r"a10g", "a10g"), (r"\ba10\b", "a10"), (r"\ba30\b", "a30"),
    (r"\ba40\b", "a40"), (r"a16\b", "a16"), (r"\ba2\b", "a2"),
    (r"rtx\s*a6000", "a6000"), (r"rtx\s*a5000", "a5000"), (r"rtx\s*a4000", "a4000"),
    (r"rtx\s*6000\s*ada", "rtx6000ada"),
    (r"l40s", "l40s"), (r"\bl40\b", "l40"), (r"\bl4\b", "l4"),
    (r"v100", "v100"), (r"p100", "p100"), (r"\bp40\b", "p40"), (r"\bp4\b", "p4"), (r"\bt4\b", "t4"),
    (r"k80", "k80"), (r"\bm60\b", "m60"), (r"\bm40\b", "m40"),
    (r"titan\s*v\b", "titanv"), (r"titan\s*rtx", "titanrtx"),
)
_CONSUMER = re.compile(r"(?:rtx|gtx)\s*(\d{4})\s*(ti|super)?")


@dataclass(frozen=True)
class Device:
    """One accelerator of this machine.

    Attributes
    ----------
    index : int
        Local index (what ``CUDA_VISIBLE_DEVICES`` takes; for ``cpu`` pseudo-devices, 0..n-1).
    gpu_type : str
        Normalized type name (``"h100"``, ``"a100"``, ``"cpu"``).
    name : str
        Name as the driver reports it.
    memory_mib : int
        Total memory in MiB (0 for ``cpu`` pseudo-devices).
    uuid : str or None
    """

    index: int
    gpu_type: str
    name: str
    memory_mib: int = 0
    uuid: str | None = None


def normalize_gpu_name(name: str) -> str:
    """Short type name of a driver-reported GPU name.

    >>> normalize_gpu_name("NVIDIA H100 80GB HBM3"), normalize_gpu_name("Tesla V100-SXM2-16GB")
    ('h100', 'v100')
    >>> normalize_gpu_name("NVIDIA GeForce RTX 4090")
    'rtx4090'
    """
    text = name.lower().replace("-", " ").replace("_", " ")
    for pattern, gpu_type in _NAME_PATTERNS:
        if re.search(pattern, text):
            return gpu_type
    consumer = _CONSUMER.search(text)
    if consumer:
        return ("rtx" if "rtx" in consumer.group(0) else "gtx") + consumer.group(1) + (consumer.group(2) or "")
    words = [w for w in re.split(r"[^a-z0-9]+", text) if w and w not in {"nvidia", "tesla", "geforce", "quadro"}
             and not re.fullmatch(r"\d+gb|hbm\d*e?|sxm\d*|pcie|nvl", w)]
    return "".join(words) or "unknown"


def cpu_devices(count: int) -> list[Device]:
    """``count`` pseudo-devices of type ``cpu``, for machines without GPUs and for tests."""
    if count < 1:
        raise InvalidProblemError(f"cpu device count must be >= 1, got {count}", field="cpu_devices")
    return [Device(i, CPU_TYPE, f"cpu pseudo-device {i}") for i in range(count)]


def discover_nvml() -> list[Device] | None:
    """GPUs reported by NVML (``nvidia-ml-py``); None when NVML is not installed or not usable."""
    try:
        import pynvml
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return None
    try:
        out = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(i)
            name = pynvml.nvmlDeviceGetName(handle)
            name = name.decode() if isinstance(name, bytes) else name
            uuid = pynvml.nvmlDeviceGetUUID(handle)
            uuid = uuid.decode() if isinstance(uuid, bytes) else uuid
            memory = pynvml.nvmlDeviceGetMemoryInfo(handle).total // 2**20
            out.append(Device(i, normalize_gpu_name(name), name, int(memory), uuid))
        return out
    except pynvml.NVMLError:
        return None
    finally:
        pynvml.nvmlShutdown()


def discover_nvidia_smi(timeout_s: float = 10.0) -> list[Device] | None:
    """GPUs reported by ``nvidia-smi``; None when it is not on ``PATH`` or fails."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    try:
        text = subprocess.run([exe, "--query-gpu=index,name,memory.total,uuid", "--format=csv,noheader,nounits"],
                              capture_output=True, text=True, timeout=timeout_s, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return parse_nvidia_smi(text)


def parse_nvidia_smi(text: str) -> list[Device]:
    """Devices from ``nvidia-smi --query-gpu=index,name,memory.total,uuid --format=csv,noheader,nounits``."""
    out = []
    for line in text.splitlines():
        fields = [f.strip() for f in line.split(",")]
        if len(fields) < 3 or not fields[0].isdigit():
            continue
        memory = int(float(fields[2])) if re.fullmatch(r"[\d.]+", fields[2]) else 0
        out.append(Device(int(fields[0]), normalize_gpu_name(fields[1]), fields[1], memory,
                          fields[3] if len(fields) > 3 else None))
    return out


def discover(cpu_count: int = 1) -> list[Device]:
    """This machine's accelerators: NVML, else ``nvidia-smi``, else ``cpu_count`` cpu pseudo-devices."""
    for source in (discover_nvml, discover_nvidia_smi):
        found = source()
        if found:
            return found
    return cpu_devices(cpu_count)


def devices_for_cluster(gpus: Mapping[str, int], devices: Sequence[Device] | None = None, *,
                        aliases: Mapping[str, str] | None = None) -> list[Device]:
    """The devices backing a cluster's GPUs, in cluster-wide GPU id order (type by type, in ``gpus`` order).

    Parameters
    ----------
    gpus : mapping of str to int
        The cluster's GPU types and counts (e.g. ``Cluster.gpu_types`` with ``capacity``).
    devices : sequence of Device, optional
        Default: :func:`discover`. Type ``cpu`` is always served by pseudo-devices.
    aliases : mapping of str to str, optional
        Cluster type name -> normalized device type, where they differ (``{"h100_80g": "h100"}``).
    """
    aliases = dict(aliases or {})
    pool = list(discover() if devices is None else devices)
    out: list[Device] = []
    for cluster_type, count in gpus.items():
        count = int(count)
        if cluster_type == CPU_TYPE:
            out += cpu_devices(count) if count else []
            continue
        wanted = aliases.get(cluster_type, cluster_type)
        have = [d for d in pool if d.gpu_type == wanted]
        if len(have) < count:
            found = sorted({d.gpu_type for d in pool})
            raise InvalidProblemError(
                f"the cluster has {count} GPU(s) of type {cluster_type!r} but this machine has {len(have)} of type "
                f"{wanted!r} (found types {found}); lower the count or map the name with aliases",
                field="cluster")
        out += have[:count]
    return out
