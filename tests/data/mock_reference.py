#!/usr/bin/python3
"""Reference for --mock-data, computed with numpy itself: numpy's
default_rng draws, and the mock documents as Megatron's
MockGPTLowLevelDataset defines them (megatron/core/datasets/gpt_dataset.py:
lengths default_rng(0).integers(1, 4096, 100000, int32); document i is
(arange(length - 1) + 1) % vocab_size followed by the EOD token).

usage: mock_reference.py OUT_DIR VOCAB_SIZE EOD
writes raw64_<seed>.npy (random_raw as int64 bits), ints_<case>.npy,
lengths.npy and docs.npy (documents 0..9 concatenated).
"""
import sys

import numpy as np

INT_CASES = [  # (seed, low, high, n): small and huge spans (the huge ones reject often)
    (0, 1, 4096, 5000),
    (1, -7, 8, 3000),
    (12345, 0, 2**31 - 1, 3000),
    (2**40 + 3, -(2**31), 2**31 - 1, 3000),
    (7, 0, 3 * 2**29 + 1, 3000),
]


def main():
    out, vocab, eod = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    for seed in (0, 1, 2**40 + 3):
        g = np.random.Generator(np.random.PCG64(seed))
        np.save(f"{out}/raw64_{seed}.npy", g.bit_generator.random_raw(64).view(np.int64))
    for k, (seed, low, high, n) in enumerate(INT_CASES):
        g = np.random.default_rng(seed)
        np.save(f"{out}/ints_{k}.npy", g.integers(low, high, size=n, dtype=np.int32))
    lengths = np.random.default_rng(seed=0).integers(low=1, high=4096, size=100000, dtype=np.int32)
    np.save(f"{out}/lengths.npy", lengths)
    docs = [np.int64(np.concatenate([(np.arange(lengths[i] - 1) + 1) % vocab, [eod]])) for i in range(10)]
    np.save(f"{out}/docs.npy", np.concatenate(docs))


if __name__ == "__main__":
    main()
