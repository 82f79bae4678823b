#!/usr/bin/env python3
"""PyTorch peer of `megatron train` for a LLaMA-style decoder (the fair baseline).

usage (the defaults are the ~1B benchmark model of bench/device_check.sh):
  python3 bench/llama_torch_train.py --device cuda [--compile] [--warmup 3 --iters 10]
  /usr/bin/python3 bench/llama_torch_train.py --device cpu --num-layers 2 --hidden-size 128 \
      --num-attention-heads 4 --num-query-groups 2 --ffn-hidden-size 352 --seq-length 64 \
      --vocab-size 512 --micro-batch-size 2 --warmup 1 --iters 3
  python3 bench/llama_torch_train.py --dry-run ...   # sizes and FLOPs only, no model built

The model is the GPTModel that `megatron train` builds with --normalization
RMSNorm --swiglu --position-embedding-type rope --disable-bias-linear
--untie-embeddings-and-output-weights --group-query-attention (src/model/gpt.cc):
  - word embedding [V_pad, h], V_pad = vocab rounded up to a multiple of
    --make-vocab-size-divisible-by (Megatron's padding, TP 1);
  - per layer: RMSNorm (eps 1e-5) -> one fused QKV projection [h -> (a+2g)d]
    -> rotary embedding on q and k (non-interleaved "rotate half", base 10000,
    inv_freq_i = base^(-2i/d)) -> causal softmax attention, query head i
    reading key/value group i // (a/g) -> output projection [a d -> h] ->
    residual; RMSNorm -> fc1 [h -> 2F] -> SwiGLU silu(x1) * x2 -> fc2 [F -> h]
    -> residual. No biases, no dropout;
  - final RMSNorm, untied output layer [h -> V_pad], cross-entropy in fp32.
The QKV columns are [q heads | k groups | v groups] rather than Megatron's
per-group interleaving: the same parameters and FLOPs, only a different order.

Mixed precision like Megatron's --bf16: fp32 master parameters and gradients,
bf16 compute (torch.autocast), the residual stream in bf16 (the embedding
output is cast, as Megatron keeps activations in bf16), AdamW on the fp32
parameters (fused=True on CUDA), global-norm clipping at 1.0, weight decay on
2-D weights only. Batches are random token ids, new every step.

One timed step = zero_grad + (forward + loss + backward) per micro-batch of
the global batch (--global-batch-size / --micro-batch-size of them, the
gradients accumulating) + clip + AdamW step + loss.item(); on CUDA each step
is bracketed by torch.cuda.synchronize().
Reported: median and mean step time over the timed steps, tokens/s, model
TFLOP/s and MFU with Megatron's FLOPs formula (../shared/spec/
megatron-reference.md section 5; the same function as src/plan/plan.cc's
megatron_flops_per_iteration, which `megatron train` divides by the iteration
time), so the two MFUs are directly comparable.

The last line of stdout is one JSON object: tokens_per_s, step_ms_median,
mfu_989, tflops, params, flops_per_iteration and more. Exit 0 on success,
2 on bad flags (e.g. --compile without torch.compile), 1 on failure.
"""
import argparse
import json
import math
import statistics
import sys
import time

try:
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
except ImportError as e:  # pragma: no cover
    print(f"llama_torch_train.py: {e}: needs PyTorch", file=sys.stderr)
    sys.exit(77)


# ---------------------------------------------------------------- sizes and FLOPs

def padded_vocab(vocab, divisible_by, tp=1):
    """Megatron's vocabulary padding: ceil(V / (m*tp)) * (m*tp)."""
    m = divisible_by * tp
    return (vocab + m - 1) // m * m


def param_count(L, h, a, g, F, V_pad):
    """Parameters of the LLaMA-style GPTModel (no biases, untied, RMSNorm)."""
    d = h // a
    per_layer = 2 * h + h * (a + 2 * g) * d + a * d * h + h * 2 * F + F * h
    return L * per_layer + V_pad * h + h + V_pad * h


def megatron_flops_per_iteration(B, s, L, h, a, g, F, V_pad, swiglu=True):
    """Megatron's model FLOPs of one global batch (fwd + bwd); src/plan/plan.cc."""
    T, Q = B * s, B * s * s
    d = h / a
    q, k = a * d, g * d
    phi = 3 if swiglu else 2
    mlp = 6 * h * phi * F * L
    attn_proj = L * 6 * (h * (q + 2 * k) + q * h)
    logits = 6 * h * V_pad
    return T * (mlp + attn_proj + logits) + Q * L * 6 * q


# ---------------------------------------------------------------- the model

class RMSNorm(nn.Module):
    def __init__(self, h, eps):
        super().__init__()
        self.h, self.eps = h, eps
        self.weight = nn.Parameter(torch.ones(h))

    def forward(self, x):
        if hasattr(F, "rms_norm"):  # torch >= 2.4: one fused kernel
            # The weight in the activations' dtype, as Megatron's bf16 copy is
            # (autocast, if it runs rms_norm in fp32, casts both alike).
            return F.rms_norm(x, (self.h,), self.weight.to(x.dtype), self.eps)
        xf = x.float()
        y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return (y * self.weight.float()).to(x.dtype)


def rope_tables(seq, d, base):
    """cos, sin [seq, d/2] in fp32: angle(t, i) = t * base^(-2i/d)."""
    inv = 1.0 / (base ** (torch.arange(0, d, 2, dtype=torch.float64) / d))
    ang = torch.arange(seq, dtype=torch.float64)[:, None] * inv[None, :]
    return torch.cos(ang).float(), torch.sin(ang).float()


def apply_rope(x, cos, sin):
    """x [B, heads, T, d]; rotate half: (x1 c - x2 s, x2 c + x1 s)."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    c, s = cos.to(x.dtype), sin.to(x.dtype)
    return torch.cat((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1)


class Attention(nn.Module):
    def __init__(self, h, a, g):
        super().__init__()
        self.a, self.g, self.d = a, g, h // a
        self.qkv = nn.Linear(h, (a + 2 * g) * self.d, bias=False)
        self.proj = nn.Linear(a * self.d, h, bias=False)

    def forward(self, x, cos, sin):
        B, T, _ = x.shape
        a, g, d = self.a, self.g, self.d
        q, k, v = self.qkv(x).split([a * d, g * d, g * d], dim=-1)
        q = apply_rope(q.view(B, T, a, d).transpose(1, 2), cos, sin)
        k = apply_rope(k.view(B, T, g, d).transpose(1, 2), cos, sin)
        v = v.view(B, T, g, d).transpose(1, 2)
        if g != a:  # query head i reads group i // (a/g)
            k = k.repeat_interleave(a // g, dim=1)
            v = v.repeat_interleave(a // g, dim=1)
        if hasattr(F, "scaled_dot_product_attention"):
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:  # torch < 2.0: explicit causal softmax attention
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(d))
            mask = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()
            att = att.masked_fill(~mask, float("-inf"))
            y = torch.softmax(att.float(), dim=-1).to(v.dtype) @ v
        return self.proj(y.transpose(1, 2).reshape(B, T, a * d))


class Block(nn.Module):
    def __init__(self, h, a, g, F_, eps):
        super().__init__()
        self.ln1 = RMSNorm(h, eps)
        self.attn = Attention(h, a, g)
        self.ln2 = RMSNorm(h, eps)
        self.fc1 = nn.Linear(h, 2 * F_, bias=False)
        self.fc2 = nn.Linear(F_, h, bias=False)

    def forward(self, x, cos, sin):
        x = x + self.attn(self.ln1(x), cos, sin)
        x1, x2 = self.fc1(self.ln2(x)).chunk(2, dim=-1)
        return x + self.fc2(F.silu(x1) * x2)


class LlamaGPT(nn.Module):
    def __init__(self, args, V_pad):
        super().__init__()
        L, h, a, g = args.num_layers, args.hidden_size, args.num_attention_heads, args.num_query_groups
        self.embed = nn.Embedding(V_pad, h)
        self.layers = nn.ModuleList(Block(h, a, g, args.ffn_hidden_size, args.norm_epsilon) for _ in range(L))
        self.norm = RMSNorm(h, args.norm_epsilon)
        self.output = nn.Linear(h, V_pad, bias=False)
        cos, sin = rope_tables(args.seq_length, h // a, args.rotary_base)
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)
        # Megatron's init: normal(0, std) for weights, std / sqrt(2L) for the
        # output projection and fc2 (scaled_init_method_normal), norms at 1.
        std = args.init_method_std
        for name, p in self.named_parameters():
            if p.dim() == 2:
                scaled = name.endswith("attn.proj.weight") or name.endswith("fc2.weight")
                nn.init.normal_(p, 0.0, std / math.sqrt(2 * L) if scaled else std)
        self.act_dtype = None  # set by main(): bf16 residual stream under autocast

    def forward(self, tokens, labels):
        x = self.embed(tokens)
        if self.act_dtype is not None:
            x = x.to(self.act_dtype)
        for blk in self.layers:
            x = blk(x, self.cos, self.sin)
        logits = self.output(self.norm(x))
        return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), labels.reshape(-1))


# ---------------------------------------------------------------- the run

def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    # Sizes, with Megatron's flag names; defaults: the ~1B benchmark model.
    p.add_argument("--num-layers", type=int, default=16)
    p.add_argument("--hidden-size", type=int, default=2048)
    p.add_argument("--num-attention-heads", type=int, default=16)
    p.add_argument("--num-query-groups", type=int, default=4)
    p.add_argument("--ffn-hidden-size", type=int, default=5632)
    p.add_argument("--seq-length", type=int, default=2048)
    p.add_argument("--vocab-size", type=int, default=32000)
    p.add_argument("--make-vocab-size-divisible-by", type=int, default=128)
    p.add_argument("--micro-batch-size", type=int, default=4)
    p.add_argument("--global-batch-size", type=int, default=0,
                   help="sequences per step, a multiple of --micro-batch-size (gradient accumulation); "
                        "default: one micro-batch")
    p.add_argument("--norm-epsilon", type=float, default=1e-5)
    p.add_argument("--rotary-base", type=float, default=10000.0)
    p.add_argument("--init-method-std", type=float, default=0.02)
    # Training.
    p.add_argument("--precision", choices=["bf16", "fp32"], default="bf16", help="bf16: autocast over fp32 master weights")
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--weight-decay", type=float, default=0.1)
    p.add_argument("--clip-grad", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=1234)
    # Run.
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--compile", action="store_true", help="torch.compile each transformer block (torchtitan style)")
    p.add_argument("--compile-whole", action="store_true", help="torch.compile the whole model instead")
    p.add_argument("--warmup", type=int, default=3, help="untimed steps first (compilation happens here)")
    p.add_argument("--iters", type=int, default=10, help="timed steps")
    p.add_argument("--max-seconds", type=float, default=0, help="stop timing once the run is this old (0: no limit)")
    p.add_argument("--threads", type=int, default=0, help="CPU threads (0: torch's default)")
    p.add_argument("--peak-tflops", type=float, default=989.0, help="peak for the MFU figure (H100/H200 dense bf16)")
    p.add_argument("--dry-run", action="store_true", help="print sizes and FLOPs as JSON, build nothing")
    args = p.parse_args(argv)
    if args.hidden_size % args.num_attention_heads or args.num_attention_heads % args.num_query_groups:
        p.error("--hidden-size must divide by --num-attention-heads, and the heads by --num-query-groups")
    if (args.hidden_size // args.num_attention_heads) % 2:
        p.error("rope needs an even head dimension")
    if not args.global_batch_size:
        args.global_batch_size = args.micro_batch_size
    if args.global_batch_size % args.micro_batch_size:
        p.error(f"--global-batch-size {args.global_batch_size} is not a multiple of --micro-batch-size "
                f"{args.micro_batch_size}")
    if (args.compile or args.compile_whole) and not hasattr(torch, "compile"):
        p.error(f"--compile needs torch.compile (torch >= 2.0; this is {torch.__version__})")
    return args


def make_optimizer(model, args, on_cuda):
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": args.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    kw = dict(lr=args.lr, betas=(0.9, 0.999), eps=1e-8)
    for extra in ([{"fused": True}] if on_cuda else []) + [{"foreach": True}, {}]:
        try:
            return torch.optim.AdamW(groups, **kw, **extra), next(iter(extra), "plain")
        except (TypeError, RuntimeError):
            continue
    raise RuntimeError("no AdamW")


def main(argv):
    args = parse_args(argv)
    L, h, a, g = args.num_layers, args.hidden_size, args.num_attention_heads, args.num_query_groups
    B, s, V = args.micro_batch_size, args.seq_length, args.vocab_size
    GBS = args.global_batch_size
    accum = GBS // B  # micro-batches per step
    V_pad = padded_vocab(V, args.make_vocab_size_divisible_by)
    params = param_count(L, h, a, g, args.ffn_hidden_size, V_pad)
    flops = megatron_flops_per_iteration(GBS, s, L, h, a, g, args.ffn_hidden_size, V_pad)
    result = {"config": {"num_layers": L, "hidden_size": h, "num_attention_heads": a, "num_query_groups": g,
                         "ffn_hidden_size": args.ffn_hidden_size, "seq_length": s, "vocab_size": V,
                         "padded_vocab": V_pad, "micro_batch_size": B, "global_batch_size": GBS,
                         "precision": args.precision},
              "params": params, "flops_per_iteration": flops, "torch": torch.__version__}
    if args.dry_run:
        print(json.dumps(result))
        return 0

    t_start = time.perf_counter()
    torch.manual_seed(args.seed)
    dev = torch.device(args.device)
    on_cuda = dev.type == "cuda"
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    if on_cuda:
        torch.backends.cuda.matmul.allow_tf32 = False  # fp32 means fp32, as in our trainer
        torch.backends.cudnn.allow_tf32 = False
    model = LlamaGPT(args, V_pad).to(dev)
    built = sum(p.numel() for p in model.parameters())
    if built != params:
        print(f"llama_torch_train.py: built {built} parameters, formula says {params}", file=sys.stderr)
        return 1
    bf16 = args.precision == "bf16"
    model.act_dtype = torch.bfloat16 if bf16 else None
    mode = "eager"
    if args.compile_whole:
        model = torch.compile(model)
        mode = "compile-whole"
    elif args.compile:
        for i, blk in enumerate(model.layers):
            model.layers[i] = torch.compile(blk)
        mode = "compile"
    opt, opt_kind = make_optimizer(model, args, on_cuda)
    trainable = [p for p in model.parameters()]
    gen = torch.Generator(device=dev)
    gen.manual_seed(args.seed)

    def sync():
        if on_cuda:
            torch.cuda.synchronize()

    def step():
        # One global batch: `accum` micro-batches, each backward adding its
        # loss / accum to the gradients (Megatron's gradient accumulation).
        opt.zero_grad(set_to_none=True)
        total = None
        for _ in range(accum):
            text = torch.randint(0, V, (B, s + 1), device=dev, generator=gen)
            with torch.autocast(device_type=dev.type, dtype=torch.bfloat16, enabled=bf16):
                loss = model(text[:, :-1], text[:, 1:]) / accum
            loss.backward()
            total = loss.detach() if total is None else total + loss.detach()
        if args.clip_grad > 0:
            torch.nn.utils.clip_grad_norm_(trainable, args.clip_grad)
        opt.step()
        return total.item()  # the host reads the loss each step, as `megatron train` does

    print(f"llama_torch_train: {mode} on {args.device}, torch {torch.__version__}, {params:,} parameters, "
          f"batch {GBS} x {s} ({accum} micro-batch{'es' if accum > 1 else ''} of {B}), {args.precision}, "
          f"AdamW {opt_kind}", flush=True)
    losses, times = [], []
    first_step_s = None
    for i in range(args.warmup + args.iters):
        if args.max_seconds and time.perf_counter() - t_start > args.max_seconds and times:
            print(f"llama_torch_train: --max-seconds {args.max_seconds} reached after {len(times)} timed steps", flush=True)
            break
        sync()
        t0 = time.perf_counter()
        losses.append(step())
        sync()
        dt = time.perf_counter() - t0
        if i == 0:
            first_step_s = dt
        if i >= args.warmup:
            times.append(dt)
        print(f"  step {i + 1:3d} {'timed ' if i >= args.warmup else 'warmup'} {dt * 1000:9.1f} ms  loss {losses[-1]:.6f}",
              flush=True)
    if not times:
        print("llama_torch_train.py: no timed step completed", file=sys.stderr)
        return 1
    med = statistics.median(times)
    tflops = flops / med / 1e12
    result.update({
        "mode": mode, "device": args.device, "optimizer": opt_kind,
        "timed_iters": len(times), "warmup": args.warmup,
        "step_ms_median": med * 1000, "step_ms_mean": statistics.mean(times) * 1000,
        "step_ms_min": min(times) * 1000, "first_step_s": first_step_s,
        "tokens_per_s": GBS * s / med, "tflops": tflops, "mfu_989": tflops / 989.0,
        "mfu_peak": tflops / args.peak_tflops, "peak_tflops": args.peak_tflops,
        "loss_first": losses[0], "loss_last": losses[-1],
        "peak_mem_gib": torch.cuda.max_memory_allocated() / 2**30 if on_cuda else None,
        "wall_s": time.perf_counter() - t_start,
    })
    print(f"llama_torch_train: median {med * 1000:.1f} ms/step, {GBS * s / med:,.0f} tokens/s, {tflops:.1f} TFLOP/s, "
          f"MFU {100 * tflops / 989.0:.1f}% of 989", flush=True)
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
