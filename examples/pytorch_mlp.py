"""A real PyTorch training job under allocopt's executor: a small MLP on synthetic regression data.

Runs stand-alone (``python examples/pytorch_mlp.py``: ``--steps`` steps, no
checkpoints, nothing written) or as a job of ``allocopt run examples/jobs.yaml ...``.
It uses the job-side client: takes its lease, resumes from the latest checkpoint
(model, optimizer, RNG and step), runs steps until the job's total steps, the
lease's end or a stop request, and checkpoints atomically every
``--checkpoint-every`` steps and when it stops. Under ``allocopt run`` on ``cpu``
devices it uses the threads its device share allows. With WORLD_SIZE > 1 it
trains data-parallel with torch.distributed (NCCL on GPUs, gloo on CPU).
"""

from __future__ import annotations

import argparse

import torch
import torch.distributed as dist
from torch import nn

from allocopt.runtime import client


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--features", type=int, default=64)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--checkpoint-every", type=int, default=50)
    parser.add_argument("--steps", type=int, default=500, help="steps of a stand-alone run (allocopt run sets them)")
    args = parser.parse_args()

    lease = client.lease()
    if lease.num_threads is not None:
        torch.set_num_threads(lease.num_threads)
    use_cuda = torch.cuda.is_available()
    device = torch.device(f"cuda:{lease.local_rank}" if use_cuda else "cpu")
    if use_cuda:
        torch.cuda.set_device(device)
    if lease.world_size > 1:
        dist.init_process_group("nccl" if use_cuda else "gloo", rank=lease.rank, world_size=lease.world_size,
                                init_method=f"tcp://{lease.master_addr}:{lease.master_port}")

    torch.manual_seed(0)
    teacher = nn.Linear(args.features, 1).to(device)  # the synthetic target: a fixed random linear map
    model = nn.Sequential(nn.Linear(args.features, args.hidden), nn.ReLU(), nn.Linear(args.hidden, args.hidden),
                          nn.ReLU(), nn.Linear(args.hidden, 1)).to(device)
    if lease.world_size > 1:
        model = nn.parallel.DistributedDataParallel(model)
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)

    state = client.load_checkpoint()
    start = state["step"] if state else 0
    if state:
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
    generator = torch.Generator(device=device).manual_seed(1000 * lease.rank + start)

    def checkpoint(step: int) -> None:
        client.save_checkpoint({"step": step, "model": model.state_dict(), "optimizer": optimizer.state_dict()})

    done = start
    for step in client.steps(start, samples_per_step=args.batch_size * lease.world_size, total=args.steps):
        x = torch.randn(args.batch_size, args.features, device=device, generator=generator)
        with torch.no_grad():
            y = teacher(x)
        loss = nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if (step + 1) % args.checkpoint_every == 0:
            checkpoint(step + 1)
            client.report(loss=loss.item(), step=step + 1)
            if lease.checkpoint_dir is None:
                print(f"step {step + 1}: loss {loss.item():.4f}", flush=True)
        done = step + 1
    if done != start:
        checkpoint(done)  # the lease ended or a stop was requested: save progress before exiting
    if lease.world_size > 1:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
