#!/usr/bin/env python3
"""PyTorch/NCCL all-reduce bus bandwidth at the sizes of bench_allreduce (run with torch.distributed.run,
one process per GPU), with nccl-tests' definitions: algbw = bytes / time, busbw = algbw * 2(n-1)/n."""
import os

import torch
import torch.distributed as dist


def main():
    dist.init_process_group("nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)))
    if rank == 0:
        print(f"PyTorch {torch.__version__} NCCL all-reduce, {world} ranks, f32\n")
        print("| size MB | time ms | algbw GB/s | busbw GB/s |\n|---|---|---|---|")
    for mb in (1, 10, 100, 1000):
        n = mb * 2**20 // 4  # MiB, as bench_allreduce counts them
        x = torch.ones(n, device="cuda")
        for _ in range(5):
            dist.all_reduce(x)
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        iters = 20
        start.record()
        for _ in range(iters):
            dist.all_reduce(x)
        end.record()
        torch.cuda.synchronize()
        ms = start.elapsed_time(end) / iters
        alg = n * 4 / (ms * 1e-3) / 1e9
        if rank == 0:
            print(f"| {mb} | {ms:.3f} | {alg:.1f} | {alg * 2 * (world - 1) / world:.1f} |", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
