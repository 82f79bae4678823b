"""PyTorch's side of bench/norm_bench: RMSNorm (or LayerNorm) over the last
dimension of x [rows, cols], forward and autograd backward (dx, and the
weight's gradient). --device cuda: bf16 x and dy with the weight cast to
bf16 as bench/llama_torch_train.py does, F.rms_norm where PyTorch has it
(2.4 and later; whether it runs as fused CUDA kernels or as composed ones
depends on the version, so the version goes to stderr), timed with
synchronisation. --device cpu: fp32 (Debian's PyTorch 1.13 has no
F.rms_norm: the explicit x * rsqrt(mean(x^2) + eps) * w). Prints the median
forward and backward times in ms per call on one line (stdout)."""
import argparse
import sys
import time

import torch
import torch.nn.functional as F

p = argparse.ArgumentParser()
p.add_argument("--rows", type=int, default=8192)
p.add_argument("--cols", type=int, default=2048)
p.add_argument("--reps", type=int, default=20)
p.add_argument("--threads", type=int, default=2)
p.add_argument("--layernorm", action="store_true")
p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
a = p.parse_args()
print(f"norm_torch_bench: torch {torch.__version__}, F.rms_norm {'yes' if hasattr(F, 'rms_norm') else 'no'}",
      file=sys.stderr)

torch.manual_seed(0)
dev = a.device
if dev == "cpu":
    torch.set_num_threads(a.threads)
dt = torch.bfloat16 if dev == "cuda" else torch.float32
eps = 1e-5
x = torch.randn(a.rows, a.cols, device=dev, dtype=dt, requires_grad=True)
w = torch.randn(a.cols, device=dev, dtype=torch.float32, requires_grad=True)
b = torch.randn(a.cols, device=dev, dtype=torch.float32, requires_grad=True)
dy = torch.randn(a.rows, a.cols, device=dev, dtype=dt)


def fwd():
    if a.layernorm:
        return F.layer_norm(x, (a.cols,), w.to(dt), b.to(dt), eps)
    if hasattr(F, "rms_norm"):
        return F.rms_norm(x, (a.cols,), w.to(dt), eps)
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w.to(dt)


def sync():
    if dev == "cuda":
        torch.cuda.synchronize()


def median(xs):
    return sorted(xs)[len(xs) // 2]


# Each sample: `calls` back-to-back calls between synchronisations, divided
# by `calls` (a single call of a few tens of microseconds would be mostly
# launch and synchronisation overhead); the backward runs on one retained
# graph, so it is timed alone.
calls = 20 if dev == "cuda" else 1
inputs = (x, w, b) if a.layernorm else (x, w)
tf, tb = [], []
for r in range(a.reps + 3):
    sync()
    t0 = time.perf_counter()
    for _ in range(calls):
        y = fwd()
    sync()
    t1 = time.perf_counter()
    for _ in range(calls):
        torch.autograd.grad(y, inputs, dy, retain_graph=True)
    sync()
    t2 = time.perf_counter()
    if r >= 3:
        tf.append((t1 - t0) * 1e3 / calls)
        tb.append((t2 - t1) * 1e3 / calls)
print(f"{median(tf):.4f} {median(tb):.4f}")
