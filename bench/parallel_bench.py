#!/usr/bin/python3
"""Parallel efficiency of `megatron train` on this machine, same run:
one rank with 2 threads against TP2 (2 ranks x 1 thread) and DP2 (2 ranks x
1 thread, with and without the distributed optimizer), GPT-2 124M shapes
(12 layers, h 768, 12 heads, seq 1024, GPT-2 BPE vocabulary), fp32,
micro-batch 1, global batch 4, on the default corpus.

efficiency = (time per iteration of the single rank) / (time per iteration of
the layout): both use all of the machine's cores on the same global batch.
Also prints the bytes each rank communicated per iteration (comm::CommStats)
beside `megatron plan`'s prediction for the same flags. Times are medians over
the timed iterations (the first is warm-up). Not a test: nothing is asserted.

With --pipeline: one rank with 2 threads against PP2 (2 ranks x 1 thread,
1F1B) on 8 micro-batches (global batch 8, seq 512), and the efficiency
against the bubble-limited ideal 1 - (P-1)/(P-1+M) = 1 - 1/9.

usage: bench/parallel_bench.py [--iters N] [--bf16] [--pipeline]   (from the repository root, after scripts/setup.sh)
"""
import json
import os
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.path.join(ROOT, "build", "megatron")
ITERS = int(sys.argv[sys.argv.index("--iters") + 1]) if "--iters" in sys.argv else 4
BF16 = "--bf16" in sys.argv
PIPELINE = "--pipeline" in sys.argv
WORK = os.path.join(ROOT, "build", "bench-parallel")
os.makedirs(WORK, exist_ok=True)
ENV = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
           OMPI_MCA_rmaps_base_oversubscribe="1")

corpus = os.path.join(ROOT, "data", "corpus", "corpus.jsonl")
vocab, merges = os.path.join(ROOT, "data", "gpt2", "vocab.json"), os.path.join(ROOT, "data", "gpt2", "merges.txt")
for p in (BIN, corpus, vocab, merges):
    if not os.path.exists(p):
        sys.exit(f"missing {p}: run scripts/setup.sh first")
prefix = os.path.join(WORK, "corpus")
if not os.path.exists(prefix + "_text_document.idx"):
    subprocess.run([BIN, "preprocess", "--input", corpus, "--output-prefix", prefix, "--tokenizer-type", "GPT2BPETokenizer",
                    "--vocab-file", vocab, "--merge-file", merges, "--append-eod", "--workers", "2", "--quiet"], check=True)

FLAGS = ["--num-layers", "12", "--hidden-size", "768", "--num-attention-heads", "12", "--seq-length", "1024",
         "--max-position-embeddings", "1024", "--tokenizer-type", "GPT2BPETokenizer", "--vocab-file", vocab,
         "--merge-file", merges, "--data-path", prefix + "_text_document", "--split", "100,0,0",
         "--micro-batch-size", "1", "--global-batch-size", "4", "--lr", "1e-4", "--train-iters", str(ITERS),
         "--log-interval", "1", "--no-progress", "--seed", "1", "--data-cache-path", os.path.join(WORK, "cache")]
if BF16:
    FLAGS.append("--bf16")
if PIPELINE:  # 8 micro-batches of 512 tokens
    FLAGS[FLAGS.index("--seq-length") + 1] = "512"
    FLAGS[FLAGS.index("--global-batch-size") + 1] = "8"

# (name, ranks, threads per rank, extra flags)
LAYOUTS = [
    ("1 rank x 2 threads", 1, 2, []),
    ("PP2 (2 ranks x 1 thread)", 2, 1, ["--pipeline-model-parallel-size", "2"]),
    # The output layer (h x 50304) and its loss weigh about 5 layers here:
    # give the last stage 4 of the 12 layers (Megatron's uneven split).
    ("PP2, last stage 4 layers", 2, 1, ["--pipeline-model-parallel-size", "2", "--decoder-last-pipeline-num-layers", "4"]),
] if PIPELINE else [
    ("1 rank x 2 threads", 1, 2, []),
    ("DP2 (2 ranks x 1 thread)", 2, 1, []),
    ("DP2 + distributed optimizer", 2, 1, ["--use-distributed-optimizer"]),
    ("TP2 (2 ranks x 1 thread)", 2, 1, ["--tensor-model-parallel-size", "2"]),
    ("TP2 + sequence parallel", 2, 1, ["--tensor-model-parallel-size", "2", "--sequence-parallel"]),
]


def planned(extra, ranks):
    out = subprocess.run([BIN, "plan", "--json", "--device", "cpu", "--world-size", str(ranks)] + FLAGS + extra,
                         stdout=subprocess.PIPE, check=True).stdout
    c = json.loads(out).get("communication", {})
    return c.get("tp_bytes_per_iteration", 0.0), c.get("dp_bytes_per_iteration", 0.0), c.get("pp_bytes_per_iteration", 0.0)


results = []
for name, ranks, threads, extra in LAYOUTS:
    metrics = os.path.join(WORK, f"m{len(results)}.jsonl")
    if os.path.exists(metrics):
        os.remove(metrics)
    cmd = [BIN, "train"] + FLAGS + extra + ["--threads", str(threads), "--metrics-file", metrics]
    if ranks > 1:
        cmd = ["mpirun", "-n", str(ranks), "--bind-to", "core"] + cmd
    t0 = time.time()
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=ENV)
    if p.returncode != 0:
        sys.exit(f"{name} failed:\n{p.stdout.decode()[-3000:]}")
    logs = [json.loads(l) for l in open(metrics)]
    its = [l for l in logs if l.get("kind") == "log"]
    steps = [l for l in logs if "lm_loss" in l and "kind" not in l]
    ms = statistics.median(l["ms_per_iteration"] for l in its[1:]) if len(its) > 1 else its[0]["ms_per_iteration"]
    tp_b, dp_b = statistics.median(s["tp_bytes"] for s in steps), statistics.median(s["dp_bytes"] for s in steps)
    pp_b = statistics.median(s.get("pp_bytes", 0.0) for s in steps)
    tp_p, dp_p, pp_p = planned(extra, ranks)
    idle = statistics.median(l["pipeline_idle_fraction"] for l in its[1:]) if "pipeline_idle_fraction" in its[-1] else None
    results.append((name, ms, tp_b, tp_p, dp_b, dp_p, pp_b, pp_p, idle))
    print(f"{name:32s} {ms / 1000:7.2f} s/iteration  (wall {time.time() - t0:.0f} s)", flush=True)

base = results[0][1]
shape = "global batch 8 x 512 tokens (8 micro-batches)" if PIPELINE else "global batch 4 x 1024 tokens"
print(f"\nGPT-2 124M shapes, {'bf16' if BF16 else 'fp32'}, {shape}, median of iterations 2..{ITERS}")
print(f"{'layout':32s} {'s/iter':>8s} {'efficiency':>10s}   {'TP MB/iter (planned)':>22s}   {'DP MB/iter (planned)':>22s}"
      f"   {'PP MB/iter (planned)':>22s}")
for name, ms, tp_b, tp_p, dp_b, dp_p, pp_b, pp_p, idle in results:
    print(f"{name:32s} {ms / 1000:8.2f} {base / ms * 100:9.1f}%   {tp_b / 1e6:9.1f} ({tp_p / 1e6:9.1f})   "
          f"{dp_b / 1e6:9.1f} ({dp_p / 1e6:9.1f})   {pp_b / 1e6:9.1f} ({pp_p / 1e6:9.1f})")
if PIPELINE:
    ideal = 1 - 1 / 9
    for r in results[1:]:
        eff = base / r[1]
        print(f"{r[0]}, 8 micro-batches: efficiency {eff * 100:.1f}% vs the bubble-limited ideal {ideal * 100:.1f}% "
              f"({eff / ideal * 100:.1f}% of ideal); rank 0 measured idle {r[8]:.3f} vs bubble {1 / 9:.3f}")
else:
    print("targets: DP2 >= 95%, TP2 >= 90%")
