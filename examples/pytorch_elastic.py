"""An elastic PyTorch job: DistributedDataParallel at the batch each allocation gets.

Run it as a job of ``allocopt run JOBS --policy sia`` (see docs/how-to/elastic-jobs.md):
each round the goodput engine chooses the job's replicas and its batch for them; this
program reads them from its lease (``local_bsz`` samples per micro-batch,
``accum_steps + 1`` micro-batches per step, the learning rate times ``lr_scale``), trains
a small MLP on synthetic regression data with ``torch.nn.parallel.DistributedDataParallel``
(gloo on CPU, NCCL on GPUs), checkpoints when its lease ends or a stop is requested, and
resumes from that checkpoint at the next allocation, whatever its size.

Every ``--report-every`` steps rank 0 reports the gradient statistics the goodput model's
statistical efficiency needs (``grad_sqr``, ``grad_var``; McCandlish et al.'s unbiased
estimates from the local and the averaged gradient of one step, ``grad_var`` per sample of
the initial batch). A DDP communication hook reads each rank's local gradient before the
all-reduce. ``--log FILE`` appends, from rank 0, a JSON line per launch (its first step,
batch and start time, epoch seconds) and ``launch world_size step time`` for every step run.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import torch
import torch.distributed as dist
from torch import nn

from allocopt.runtime import client


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--features", type=int, default=32)
    parser.add_argument("--lr", type=float, default=1e-3, help="learning rate at the initial batch size")
    parser.add_argument("--noise", type=float, default=0.5, help="label noise (sets the gradient noise scale)")
    parser.add_argument("--report-every", type=int, default=10)
    parser.add_argument("--log", help="append what each launch and step ran to this file")
    args = parser.parse_args()

    started = time.time()
    lease = client.lease()
    if lease.batch_size is None:
        raise SystemExit("pytorch_elastic.py runs as an elastic job: allocopt run JOBS --policy sia")
    if lease.num_threads is not None:
        torch.set_num_threads(lease.num_threads)
    use_cuda = torch.cuda.is_available()
    device = torch.device(f"cuda:{lease.local_rank}" if use_cuda else "cpu")
    if use_cuda:
        torch.cuda.set_device(device)
    distributed = lease.world_size > 1
    if distributed:
        dist.init_process_group("nccl" if use_cuda else "gloo", rank=lease.rank, world_size=lease.world_size,
                                init_method=f"tcp://{lease.master_addr}:{lease.master_port}")

    torch.manual_seed(0)
    teacher = nn.Linear(args.features, 1).to(device)
    model: nn.Module = nn.Sequential(nn.Linear(args.features, args.hidden), nn.ReLU(),
                                     nn.Linear(args.hidden, 1)).to(device)
    state = client.load_checkpoint()
    start = state["step"] if state else 0
    initial_batch = state["initial_batch"] if state else lease.batch_size
    if state:
        model.load_state_dict(state["model"])
    local_sqr = torch.zeros((), device=device)
    if distributed:
        model = nn.parallel.DistributedDataParallel(model)

        def hook(sqr, bucket):  # unannotated: DDP checks the annotations, which are strings here
            sqr += bucket.buffer().pow(2).sum()  # this rank's gradient, before the average over ranks
            buffer = bucket.buffer().div_(lease.world_size)
            return dist.all_reduce(buffer, async_op=True).get_future().then(lambda f: f.value()[0])

        model.register_comm_hook(local_sqr, hook)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr * lease.lr_scale, momentum=0.9)
    if state:
        optimizer.load_state_dict(state["optimizer"])
        for group in optimizer.param_groups:
            group["lr"] = args.lr * lease.lr_scale
    generator = torch.Generator(device=device).manual_seed(7919 * lease.rank + start)
    net = model.module if distributed else model
    log = open(args.log, "a", encoding="utf-8") if args.log and lease.rank == 0 else None
    launch = f"{os.getpid()}"
    if log:
        log.write(json.dumps({"start": start, "launch": launch, "world_size": lease.world_size,
                              "batch_size": lease.batch_size, "local_bsz": lease.local_bsz,
                              "accum_steps": lease.accum_steps, "lr_scale": lease.lr_scale,
                              "start_s": started}) + "\n")
        log.flush()

    def checkpoint(step: int) -> None:
        client.save_checkpoint({"step": step, "model": net.state_dict(), "optimizer": optimizer.state_dict(),
                                "initial_batch": initial_batch})

    micro = lease.accum_steps + 1
    done = start
    for step in client.steps(start, samples_per_step=lease.batch_size):
        optimizer.zero_grad(set_to_none=True)
        local_sqr.zero_()
        for k in range(micro):
            x = torch.randn(lease.local_bsz, args.features, device=device, generator=generator)
            with torch.no_grad():
                y = teacher(x) + args.noise * torch.randn(lease.local_bsz, 1, device=device, generator=generator)
            loss = nn.functional.mse_loss(model(x), y) / micro
            if distributed and k < micro - 1:
                with model.no_sync():  # accumulate locally; the last micro-batch all-reduces
                    loss.backward()
            else:
                loss.backward()
        if (step + 1) % args.report_every == 0:
            report_statistics(net, local_sqr, lease, initial_batch, distributed)
        optimizer.step()
        if log:
            log.write(f"{launch} {lease.world_size} {step} {time.time():.3f}\n")
            log.flush()
        done = step + 1
    if done != start:
        checkpoint(done)
    if log:
        log.close()
    if distributed:
        dist.destroy_process_group()


def report_statistics(net: nn.Module, local_sqr: torch.Tensor, lease: client.Lease, initial_batch: int,
                      distributed: bool) -> None:
    """Rank 0 reports the squared mean gradient and the per-sample variance at the initial batch size."""
    big_sqr = sum(float(p.grad.pow(2).sum()) for p in net.parameters() if p.grad is not None)
    if not distributed or lease.rank != 0:
        return
    b_small = lease.local_bsz * (lease.accum_steps + 1)
    b_big = b_small * lease.world_size
    small_sqr = float(local_sqr)
    grad_sqr = max((b_big * big_sqr - b_small * small_sqr) / (b_big - b_small), 0.0)
    trace = max((small_sqr - big_sqr) / (1.0 / b_small - 1.0 / b_big), 0.0)
    client.report(grad_sqr=grad_sqr, grad_var=trace / initial_batch)


if __name__ == "__main__":
    main()
