"""Test job for GPU machines: records the CUDA devices each rank sees, then runs matrix products as steps.

Usage: cuda_probe.py OUTPUT_PREFIX

Rank r writes ``OUTPUT_PREFIX.r``: JSON with ``CUDA_VISIBLE_DEVICES``, the CUDA device count, and the
UUID and name of each visible device (``GPU-...``, as NVML writes them), then runs steps of a
1024 x 1024 matrix product on ``cuda:LOCAL_RANK`` until the lease ends.
"""

from __future__ import annotations

import json
import os
import sys

import torch

from allocopt.runtime import client


def main() -> int:
    lease = client.lease()
    visible = [torch.cuda.get_device_properties(i) for i in range(torch.cuda.device_count())]
    with open(f"{sys.argv[1]}.{lease.rank}", "w", encoding="utf-8") as f:
        json.dump({"CUDA_VISIBLE_DEVICES": os.environ.get("CUDA_VISIBLE_DEVICES"), "count": len(visible),
                   "uuids": [f"GPU-{p.uuid}" for p in visible], "names": [p.name for p in visible],
                   "local_rank": lease.local_rank}, f)
    device = torch.device(f"cuda:{lease.local_rank}")
    a = torch.randn(1024, 1024, device=device)
    state = client.load_checkpoint()
    start = state["step"] if state else 0
    for step in client.steps(start):
        a = torch.tanh(a @ a)
        torch.cuda.synchronize(device)
        client.save_checkpoint({"step": step + 1})
    return 0


if __name__ == "__main__":
    sys.exit(main())
