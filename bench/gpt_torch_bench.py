#!/usr/bin/python3
"""PyTorch forward+backward tokens/s for the same GPT as bench/gpt_bench.

usage: gpt_torch_bench.py LAYERS HIDDEN HEADS VOCAB B T ITERS
Uses the reference model of tests/model/reference_gpt.py (fp32). Run by
gpt_bench with PyTorch tuned as ../shared/TOOLCHAIN.md says
(OPENBLAS_CORETYPE=SkylakeX, OpenMP OpenBLAS). Prints "tokens_per_s X".
"""
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "model"))
import torch  # noqa: E402
from reference_gpt import forward  # noqa: E402

L, h, a, V, B, T, iters = (int(x) for x in sys.argv[1:8])
torch.manual_seed(0)
torch.set_num_threads(int(os.environ.get("MT_BENCH_THREADS", "2")))
cfg = dict(num_layers=L, hidden_size=h, num_attention_heads=a, num_query_groups=a, kv_channels=h // a,
           normalization="LayerNorm", norm_epsilon=1e-5, position_embedding_type="learned_absolute",
           rotary_base=10000, swiglu=False, openai_gelu=False, apply_residual_connection_post_layernorm=False)
P = {"embedding.word_embeddings.weight": torch.randn(V, h) * 0.02, "embedding.position_embeddings.weight": torch.randn(T, h) * 0.02}
for i in range(L):
    p = f"decoder.layers.{i}."
    for n in ("input_layernorm", "pre_mlp_layernorm"):
        P[p + n + ".weight"], P[p + n + ".bias"] = torch.ones(h), torch.zeros(h)
    for n, o, inn in (("self_attention.linear_qkv", 3 * h, h), ("self_attention.linear_proj", h, h),
                      ("mlp.linear_fc1", 4 * h, h), ("mlp.linear_fc2", h, 4 * h)):
        P[p + n + ".weight"], P[p + n + ".bias"] = torch.randn(o, inn) * 0.02, torch.zeros(o)
P["decoder.final_layernorm.weight"], P["decoder.final_layernorm.bias"] = torch.ones(h), torch.zeros(h)
for t in P.values():
    t.requires_grad_(True)
tokens = torch.randint(0, V, (B, T), dtype=torch.int32)
labels = torch.randint(0, V, (B, T), dtype=torch.int32)
best = 1e30
for it in range(iters + 1):
    for t in P.values():
        t.grad = None
    t0 = time.perf_counter()
    _, loss = forward(P, tokens, labels, cfg)
    loss.backward()
    dt = time.perf_counter() - t0
    if it > 0:
        best = min(best, dt)
print(f"tokens_per_s {B * T / best:.1f}")
