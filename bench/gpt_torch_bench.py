#!/usr/bin/python3
"""PyTorch training step of the same GPT as bench/gpt_bench (the fair peer).

usage: /usr/bin/python3 gpt_torch_bench.py --layers 12 --hidden 768 --heads 12 \
           --vocab 50304 --max-pos 1024 --batch 4 --seq 256 --steps 5 --warmup 3 --threads 2

Normally run by gpt_bench, which sets PyTorch's tuned environment for this
process only (../shared/TOOLCHAIN.md, "PyTorch as a fair peer"):
  OPENBLAS_CORETYPE=SkylakeX LD_LIBRARY_PATH=/usr/lib/x86_64-linux-gnu/openblas-openmp
Run it by hand with those two variables set to get the same figures.

The model is nanoGPT-style (nn.Module, fp32): learned positions, pre-LN
blocks with LayerNorm, exact GELU, causal softmax attention (torch 1.13 has no
scaled_dot_product_attention), tied input/output embedding, dropout 0. One
training step = zero_grad(set_to_none) + forward + cross-entropy +
loss.backward() + clip_grad_norm_(1.0) + torch.optim.AdamW.step() (foreach
when this torch accepts it; torch 1.13 has no fused CPU AdamW), with
nanoGPT's two parameter groups (weight decay on 2-D tensors only).

Prints "key value" lines that gpt_bench parses:
  step_s_median, fwd_s, bwd_s, clip_s, opt_s (medians over the timed steps),
  train_tokens_per_s, fwdbwd_tokens_per_s, foreach, blas (the OpenBLAS
  library mapped into this process), cpu_util (process CPU s / wall s).
"""
import argparse
import math
import os
import statistics
import sys
import time

try:
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
except ImportError as e:  # pragma: no cover
    print(f"gpt_torch_bench.py: {e}; run with /usr/bin/python3 (python3-torch)", file=sys.stderr)
    sys.exit(77)


class Block(nn.Module):
    def __init__(self, h, a, max_pos):
        super().__init__()
        self.a = a
        self.ln_1 = nn.LayerNorm(h)
        self.c_attn = nn.Linear(h, 3 * h)
        self.c_proj = nn.Linear(h, h)
        self.ln_2 = nn.LayerNorm(h)
        self.c_fc = nn.Linear(h, 4 * h)
        self.c_proj2 = nn.Linear(4 * h, h)
        self.register_buffer("mask", torch.tril(torch.ones(max_pos, max_pos, dtype=torch.bool)), persistent=False)

    def attn(self, x):
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(C, dim=2)
        q, k, v = (t.view(B, T, self.a, C // self.a).transpose(1, 2) for t in (q, k, v))
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        att = att.masked_fill(~self.mask[:T, :T], float("-inf"))
        y = F.softmax(att, dim=-1) @ v
        return self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        # tanh GELU: what Megatron's default fused bias-GELU (and ours) computes
        return x + self.c_proj2(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, L, h, a, V, max_pos):
        super().__init__()
        self.wte = nn.Embedding(V, h)
        self.wpe = nn.Embedding(max_pos, h)
        self.h = nn.ModuleList(Block(h, a, max_pos) for _ in range(L))
        self.ln_f = nn.LayerNorm(h)
        self.lm_head = nn.Linear(h, V, bias=False)
        self.lm_head.weight = self.wte.weight  # tied
        for n, p in self.named_parameters():
            if p.dim() == 2:
                std = 0.02 / math.sqrt(2 * L) if n.endswith("c_proj.weight") or n.endswith("c_proj2.weight") else 0.02
                nn.init.normal_(p, 0.0, std)
            elif n.endswith(".bias"):
                nn.init.zeros_(p)

    def forward(self, idx, targets):
        B, T = idx.shape
        x = self.wte(idx) + self.wpe(torch.arange(T, dtype=torch.long))
        for blk in self.h:
            x = blk(x)
        logits = self.lm_head(self.ln_f(x))
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


def blas_library():
    try:
        with open("/proc/self/maps") as f:
            libs = {line.split()[-1] for line in f if "openblas" in line}
        return ",".join(sorted(libs)) or "none"
    except OSError:
        return "unknown"


def main():
    ap = argparse.ArgumentParser()
    for k, d in (("layers", 12), ("hidden", 768), ("heads", 12), ("vocab", 50304), ("max-pos", 1024),
                 ("batch", 4), ("seq", 256), ("steps", 5), ("warmup", 3), ("threads", 2)):
        ap.add_argument("--" + k, type=int, default=d)
    ap.add_argument("--foreach", choices=("auto", "on", "off"), default="auto")
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(args.threads)
    L, h, a, V, B, T = args.layers, args.hidden, args.heads, args.vocab, args.batch, args.seq
    model = GPT(L, h, a, V, args.max_pos)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}]
    foreach = {"auto": True, "on": True, "off": False}[args.foreach]
    try:
        opt = torch.optim.AdamW(groups, lr=6e-4, betas=(0.9, 0.95), eps=1e-8, foreach=foreach)
    except TypeError:  # a torch without the foreach argument
        foreach = None
        opt = torch.optim.AdamW(groups, lr=6e-4, betas=(0.9, 0.95), eps=1e-8)
    idx = torch.randint(0, 50257, (B, T), dtype=torch.long)
    tgt = torch.randint(0, 50257, (B, T), dtype=torch.long)
    times = {k: [] for k in ("step", "fwd", "bwd", "clip", "opt", "zero")}
    cpu0, wall0 = time.process_time(), time.perf_counter()
    for it in range(args.warmup + args.steps):
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        t1 = time.perf_counter()
        loss = model(idx, tgt)
        t2 = time.perf_counter()
        loss.backward()
        t3 = time.perf_counter()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        t4 = time.perf_counter()
        opt.step()
        t5 = time.perf_counter()
        if it == args.warmup - 1 or (args.warmup == 0 and it == 0):
            cpu0, wall0 = time.process_time(), time.perf_counter()
        if it >= args.warmup:
            for k, v in (("step", t5 - t0), ("zero", t1 - t0), ("fwd", t2 - t1), ("bwd", t3 - t2), ("clip", t4 - t3),
                         ("opt", t5 - t4)):
                times[k].append(v)
            print(f"step {it - args.warmup} {t5 - t0:.4f} s loss {loss.item():.4f}", file=sys.stderr, flush=True)
    cpu_util = (time.process_time() - cpu0) / max(1e-9, time.perf_counter() - wall0)
    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"step_s_median {med['step']:.6f}")
    for k in ("zero", "fwd", "bwd", "clip", "opt"):
        print(f"{k}_s {med[k]:.6f}")
    print(f"train_tokens_per_s {B * T / med['step']:.2f}")
    print(f"fwdbwd_tokens_per_s {B * T / statistics.median(f + b for f, b in zip(times['fwd'], times['bwd'])):.2f}")
    print(f"foreach {foreach}")
    print(f"blas {blas_library()}")
    print(f"cpu_util {cpu_util:.2f}")
    print(f"torch {torch.__version__} threads {torch.get_num_threads()}")


if __name__ == "__main__":
    main()
