#!/usr/bin/python3
"""Reference for the GPT dataset indices, written from the documented
algorithm (megatron-reference.md section 2) with numpy's RandomState.

usage: gpt_indices_reference.py LENGTHS.npy BEGIN END NUM_SAMPLES|none SEQ SEED OUT_PREFIX
writes OUT_PREFIX{document,sample,shuffle}_index.npy
"""
import sys

import numpy as np


def build_sample_index(lengths, doc_index, s, epochs, tokens, x=1):
    n = (epochs * tokens - x) // s
    out = np.zeros((n + 1, 2), dtype=np.int64)
    d, off = 0, 0
    for j in range(1, n + 1):
        remaining = s + x
        while remaining != 0:
            length = int(lengths[doc_index[d]]) - off
            remaining -= length
            if remaining <= 0:
                off += remaining + length - x
                remaining = 0
            elif d == len(doc_index) - 1:
                off = int(lengths[doc_index[d]]) - x
                break
            else:
                d += 1
                off = 0
        out[j] = (d, off)
    return out


def main():
    lengths = np.load(sys.argv[1])
    begin, end = int(sys.argv[2]), int(sys.argv[3])
    num_samples = None if sys.argv[4] == "none" else int(sys.argv[4])
    s, seed, out = int(sys.argv[5]), int(sys.argv[6]), sys.argv[7]
    ids = np.arange(begin, end, dtype=np.int32)
    tokens = int(lengths[begin:end].sum())
    epochs = 1
    if num_samples is not None:
        while epochs * tokens < num_samples * s + 1:
            epochs += 1
    separate = False
    if epochs > 1:
        sans = ((epochs - 1) * tokens - 1) // s
        per_epoch = (tokens - 1) // s
        separate = (num_samples - sans) < int(0.80 * per_epoch)
    rs = np.random.RandomState(seed)

    def tiled(e):
        a = np.tile(ids, e).astype(np.int32)
        rs.shuffle(a)
        return a

    doc = np.concatenate((tiled(epochs - 1), tiled(1))) if separate else tiled(epochs)
    sample = build_sample_index(lengths, doc, s, epochs, tokens)
    n = sample.shape[0] - 1
    first = ((epochs - 1) * tokens - 1) // s if separate else n
    a = np.arange(0, first, dtype=np.int64)
    rs.shuffle(a)
    b = np.arange(first, n, dtype=np.int64)
    rs.shuffle(b)
    np.save(out + "document_index.npy", doc)
    np.save(out + "sample_index.npy", sample)
    np.save(out + "shuffle_index.npy", np.concatenate((a, b)))
    print(f"epochs={epochs} separate={separate} samples={n}")


if __name__ == "__main__":
    main()
