#!/usr/bin/python3
"""Reference RoPE tables in float64 with PyTorch, following Megatron's
RotaryEmbedding (megatron/core/models/common/embeddings/rotary_pos_embedding.py):
dim = int(kv_channels * rotary_percent); inv_freq = 1 / base^(arange(0, dim, 2) / dim);
with rope scaling, Llama 3.1's _apply_scaling (low 1, high 4, original 8192);
positions scaled by 1 / seq_len_interpolation_factor.

usage: rope_reference.py OUT_PREFIX [SEQ KV_CHANNELS BASE ROTARY_PERCENT SCALING(0|1) FACTOR INTERP]...
writes OUT_PREFIX<k>{cos,sin}.f64 for the k-th case, each [SEQ, ceil(dim/2)]
raw little-endian float64.
"""
import math
import sys

import numpy as np

try:
    import torch
except ImportError:
    sys.exit(77)


def apply_scaling(freqs, factor, low_freq_factor=1.0, high_freq_factor=4.0, old_context_len=8192):
    low_freq_wavelen = old_context_len / low_freq_factor
    high_freq_wavelen = old_context_len / high_freq_factor
    wavelen = 2 * math.pi / freqs
    scaled = torch.where(wavelen > low_freq_wavelen, freqs / factor, freqs)
    smooth = (old_context_len / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
    return torch.where(medium, smoothed, scaled)


def table(out, seq, kv, base, percent, scaling, factor, interp):
    seq, kv = int(seq), int(kv)
    base, percent = float(base), float(percent)
    scaling, factor, interp = scaling == "1", float(factor), float(interp)
    dim = int(kv * percent) if percent < 1.0 else kv
    inv = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))  # ceil(dim/2) of them
    if scaling:
        inv = apply_scaling(inv, factor)
    pos = torch.arange(seq, dtype=torch.float64) * (1 / interp)
    ang = torch.outer(pos, inv)
    ang.cos().numpy().astype("<f8").tofile(out + "cos.f64")
    ang.sin().numpy().astype("<f8").tofile(out + "sin.f64")


def main():
    args = sys.argv[2:]
    for k in range(len(args) // 7):
        table(f"{sys.argv[1]}{k}", *args[7 * k: 7 * k + 7])


if __name__ == "__main__":
    main()
