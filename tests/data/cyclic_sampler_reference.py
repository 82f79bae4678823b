#!/usr/bin/python3
"""Megatron's cyclic data order, written here from its definition for the
loader test: MegatronPretrainingRandomSampler (data sharding on, Megatron's
default) restarted without end as Megatron's cyclic_iter restarts it, with
torch.randperm from PyTorch itself.

usage: cyclic_sampler_reference.py TOTAL MICRO_BATCH DP RANK CONSUMED STEPS
prints the sample ids of STEPS micro-batches of data-parallel rank RANK, one
micro-batch per line. Exit code 77 when torch is not installed.
"""
import sys

try:
    import torch
except ImportError as e:  # pragma: no cover
    print(f"cyclic_sampler_reference.py: {e}; install python3-torch", file=sys.stderr)
    sys.exit(77)


def epoch_batches(total, mbs, dp, rank, consumed):
    """One __iter__ of the sampler: the micro-batches left in the current epoch."""
    step = mbs * dp
    active = total - total % step
    epoch, in_epoch = consumed // active, consumed % active
    assert in_epoch % step == 0
    bucket = (total // step) * mbs
    g = torch.Generator()
    g.manual_seed(epoch)
    perm = torch.randperm(bucket, generator=g).tolist()
    ids = [rank * bucket + x for x in perm[in_epoch // dp:]]
    for k in range(len(ids) // mbs):
        yield ids[k * mbs:(k + 1) * mbs]


def main():
    total, mbs, dp, rank, consumed, steps = map(int, sys.argv[1:7])
    out = []
    while len(out) < steps:
        for batch in epoch_batches(total, mbs, dp, rank, consumed):
            out.append(batch)
            consumed += mbs * dp  # every rank's sampler advances by the whole step
            if len(out) == steps:
                break
    for b in out:
        print(" ".join(map(str, b)))


if __name__ == "__main__":
    main()
