#!/usr/bin/env python3
"""A model of the tensor-core attention kernels' span under two launch orders.

The GPU starts blocks in the order of their linear index, each on the first
free slot (an SM holds `--per-sm` of them). A block's time is taken as its
step count (key tiles for the forward and dQ, head x query-tile steps for
dK/dV) plus `--overhead` steps. The span is the list-scheduling makespan of
the blocks in that order; "balanced" is the total work over the slots.

  python3 bench/attention_launch_order.py                 # the benchmark's shape
  python3 bench/attention_launch_order.py --seq 4096 --batch 2

Orders: "tile fastest", the grid (tile, head, batch) the kernels had until
2026-12-04, each (head, batch)'s tiles in turn, longest first; "longest
first", the grid (head, batch, tile) they have now, the tile slowest.
"""
import argparse
import heapq


def span(durations, slots):
    free = [0.0] * slots
    for d in durations:
        t = heapq.heappop(free)
        heapq.heappush(free, t + d)
    return max(free)


def kernels(T, B, H, G, overhead):
    """Per kernel: a list of (pair, tile, steps) blocks, tiles longest first within a pair."""
    qpg = H // G
    out = {}
    # Forward: query tiles of 64, key tiles of 64 up to the diagonal.
    out["forward"] = [((b, h), q, (q + 1) + overhead) for b in range(B) for h in range(H)
                      for q in reversed(range(T // 64))]
    # dQ: query tiles of 64, key tiles of 32.
    out["dQ"] = [((b, h), q, 2 * (q + 1) + overhead) for b in range(B) for h in range(H)
                 for q in reversed(range(T // 64))]
    # dK/dV: key tiles of 64, every head of the group, query tiles of 32 from the key tile on.
    n32 = T // 32
    out["dK/dV"] = [((b, g), k, qpg * (n32 - 2 * k) + overhead) for b in range(B) for g in range(G)
                    for k in range(T // 64)]
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--groups", type=int, default=4)
    ap.add_argument("--sms", type=int, default=132)
    ap.add_argument("--per-sm", type=int, default=2, help="resident blocks an SM (registers: 2 at 128 threads x 255)")
    ap.add_argument("--overhead", type=float, default=1.0, help="a block's fixed cost, in steps")
    a = ap.parse_args()
    slots = a.sms * a.per_sm
    print(f"T {a.seq} B {a.batch} heads {a.heads}/{a.groups}, {slots} slots; spans in steps")
    print(f"{'kernel':8} {'blocks':>6} {'longest':>8} {'tile fastest':>13} {'longest first':>14} {'balanced':>9}")
    for name, blocks in kernels(a.seq, a.batch, a.heads, a.groups, a.overhead).items():
        steps = [s for _, _, s in blocks]
        # Tile fastest: the list as built. Longest first: tile slowest, the longest tiles' blocks of every pair first.
        by_tile = [s for _, _, s in sorted(blocks, key=lambda x: -x[2])]
        print(f"{name:8} {len(blocks):>6} {max(steps):>8.0f} {span(steps, slots):>13.0f} "
              f"{span(by_tile, slots):>14.0f} {sum(steps) / slots:>9.0f}")


if __name__ == "__main__":
    main()
