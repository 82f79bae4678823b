"""PyTorch's side of bench/attention_bench: causal attention as nanoGPT-style
models write it for PyTorch 1.13 (no fused CPU kernel): scores = q k^T * scale,
causal mask, softmax, @ v; backward by autograd. With --device cuda (PyTorch 2.5
or later on a GPU): the fused F.scaled_dot_product_attention in bf16
(is_causal, grouped-query heads via enable_gqa), timed with synchronisation.
Prints the median forward and backward times in ms on one line."""
import argparse
import math
import time

import torch

p = argparse.ArgumentParser()
p.add_argument("--threads", type=int, default=2)
p.add_argument("--seq", type=int, default=256)
p.add_argument("--batch", type=int, default=4)
p.add_argument("--heads", type=int, default=12)
p.add_argument("--head-dim", type=int, default=64)
p.add_argument("--reps", type=int, default=20)
p.add_argument("--groups", type=int, default=0, help="query groups (--device cuda; default: --heads)")
p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
a = p.parse_args()


def median(xs):
    return sorted(xs)[len(xs) // 2]


if a.device == "cuda":
    import torch.nn.functional as F

    torch.manual_seed(0)
    B, H, T, D = a.batch, a.heads, a.seq, a.head_dim
    G = a.groups or H
    dev, bf = "cuda", torch.bfloat16
    q = torch.randn(B, H, T, D, device=dev, dtype=bf, requires_grad=True)
    k, v = (torch.randn(B, G, T, D, device=dev, dtype=bf, requires_grad=True) for _ in range(2))
    dout = torch.randn(B, H, T, D, device=dev, dtype=bf)
    tf, tb = [], []
    for r in range(a.reps + 3):
        for t in (q, k, v):
            t.grad = None
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=G != H)
        torch.cuda.synchronize()
        t1 = time.perf_counter()
        y.backward(dout)
        torch.cuda.synchronize()
        t2 = time.perf_counter()
        if r >= 3:
            tf.append((t1 - t0) * 1e3)
            tb.append((t2 - t1) * 1e3)
    print(f"{median(tf):.4f} {median(tb):.4f}")
    raise SystemExit(0)
torch.set_num_threads(a.threads)
torch.manual_seed(0)
B, H, T, D = a.batch, a.heads, a.seq, a.head_dim
q, k, v = (torch.randn(B, H, T, D, requires_grad=True) for _ in range(3))
dout = torch.randn(B, H, T, D)
mask = torch.tril(torch.ones(T, T, dtype=torch.bool))


def fwd():
    att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(D))
    att = att.masked_fill(~mask, float("-inf"))
    return torch.softmax(att, dim=-1) @ v


tf, tb = [], []
for r in range(a.reps + 1):
    for t in (q, k, v):
        t.grad = None
    t0 = time.perf_counter()
    y = fwd()
    t1 = time.perf_counter()
    y.backward(dout)
    t2 = time.perf_counter()
    if r:
        tf.append((t1 - t0) * 1e3)
        tb.append((t2 - t1) * 1e3)
print(f"{median(tf):.4f} {median(tb):.4f}")
