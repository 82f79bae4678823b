#!/usr/bin/env bash
# README's first command: set up, then run the most complete job the project
# can do: the planner on the seeds' examples and the LLaMA table (HTML pages),
# the default corpus turned into Megatron's .bin/.idx, a small GPT trained in
# 3D parallelism (TP=2 x PP=2 x DP=2 on 8 MPI ranks) for 300 iterations with
# validation against the unigram baseline, and text generated from its checkpoint.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
OUT=${OUT_DIR:-out}
mkdir -p "$OUT"
M=./build/megatron

banner() { printf '\n==== %s ====\n' "$*"; }

banner "The seed's calculator example: 13e9 parameters on 32 GPUs, TP=4, PP=2"
$M plan --world-size 32 --tensor-model-parallel-size 4 --pipeline-model-parallel-size 2 \
  --num-parameters 13e9 --seq-length 2048 --micro-batch-size 2 --global-batch-size 64 --step-time 0.8 \
  | sed -n '1,/^Compute/p;/step time/p'

banner "A GPT-13B 3D-parallel job: TP=4 x PP=2 x DP=4 on 32 H100s, SP, distributed optimizer, bf16"
GPT13B=(--world-size 32 --tensor-model-parallel-size 4 --pipeline-model-parallel-size 2
  --num-layers 40 --hidden-size 5120 --num-attention-heads 40 --seq-length 2048 --max-position-embeddings 2048
  --vocab-size 50257 --micro-batch-size 1 --global-batch-size 32 --sequence-parallel
  --recompute-granularity selective --use-distributed-optimizer --bf16 --device h100)
$M plan "${GPT13B[@]}" --html "$OUT/plan_gpt13b.html" | sed -n '1,/^Rank grid/p'

banner "The same model with interleaved 1F1B (2 virtual stages per rank)"
$M plan "${GPT13B[@]}" --num-layers-per-virtual-pipeline-stage 10 --html "$OUT/plan_gpt13b_interleaved.html" \
  | sed -n '/^Pipeline/,/^Compute/p'

banner "The LLaMA parallel-configuration table on 80 GB H100s"
LLAMA=(--normalization RMSNorm --swiglu --position-embedding-type rope --disable-bias-linear
  --untie-embeddings-and-output-weights --bf16 --micro-batch-size 1 --device h100)
row() {
  local name=$1; shift
  echo "--- $name: $*" | sed 's/--num-layers.*--global-batch-size [0-9]*//'
  $M plan "${LLAMA[@]}" "$@" --html "$OUT/plan_llama_$name.html" | grep -E 'TP x PP|most loaded|^  (fits|no) ' || true
}
row 7B --world-size 8 --num-layers 32 --hidden-size 4096 --num-attention-heads 32 --ffn-hidden-size 11008 \
  --seq-length 4096 --max-position-embeddings 4096 --vocab-size 32000 --global-batch-size 1024
row 13B --world-size 8 --tensor-model-parallel-size 2 --num-layers 40 --hidden-size 5120 --num-attention-heads 40 \
  --ffn-hidden-size 13824 --seq-length 4096 --max-position-embeddings 4096 --vocab-size 32000 --global-batch-size 1024
row 70B --world-size 64 --tensor-model-parallel-size 4 --pipeline-model-parallel-size 4 --num-layers 80 --hidden-size 8192 \
  --num-attention-heads 64 --group-query-attention --num-query-groups 8 --ffn-hidden-size 28672 --seq-length 4096 \
  --max-position-embeddings 4096 --vocab-size 32000 --global-batch-size 1024
L405=(--num-layers 126 --hidden-size 16384 --num-attention-heads 128 --group-query-attention --num-query-groups 8
  --ffn-hidden-size 53248 --seq-length 8192 --max-position-embeddings 8192 --vocab-size 128256 --global-batch-size 512
  --account-for-embedding-in-pipeline-split --account-for-loss-in-pipeline-split)
row 405B --world-size 128 --tensor-model-parallel-size 8 --pipeline-model-parallel-size 8 --context-parallel-size 2 "${L405[@]}"

banner "The seed table's 405B row as printed (TP8 PP8 DP2 CP2 on 128 GPUs) is rejected"
set +e
$M plan "${LLAMA[@]}" "${L405[@]}" --world-size 128 --tensor-model-parallel-size 8 --pipeline-model-parallel-size 8 \
  --context-parallel-size 2 --data-parallel-size 2
echo "(exit code $?: invalid)"
set -e

banner "Data: the default corpus (Debian text) -> Megatron .bin/.idx with the GPT-2 tokenizer"
mkdir -p "$OUT/data"
$M preprocess --input data/corpus/corpus.jsonl --output-prefix "$OUT/data/corpus" --tokenizer-type GPT2BPETokenizer \
  --vocab-file data/gpt2/vocab.json --merge-file data/gpt2/merges.txt --append-eod --workers "$(nproc)" --log-interval 5000

# The training job: a small GPT in 3D parallelism, TP=2 x PP=2 x DP=2 on 8
# MPI ranks (one thread each: 8 ranks share this machine's cores), with
# sequence parallelism, the distributed optimizer and bf16; 300 iterations of
# 32 x 128 tokens take about 5 minutes on 2 cores.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1  # sessions and CI run as root
TRAIN=(--num-layers 4 --hidden-size 128 --num-attention-heads 4 --seq-length 128 --max-position-embeddings 128
  --micro-batch-size 4 --global-batch-size 32 --bf16
  --tensor-model-parallel-size 2 --pipeline-model-parallel-size 2 --sequence-parallel --use-distributed-optimizer
  --tokenizer-type GPT2BPETokenizer --vocab-file data/gpt2/vocab.json --merge-file data/gpt2/merges.txt
  --data-path "$OUT/data/corpus_text_document" --split 98,2,0
  --lr 3e-3 --min-lr 3e-4 --lr-decay-style cosine --lr-warmup-iters 30 --weight-decay 0.1 --clip-grad 1.0
  --hidden-dropout 0 --attention-dropout 0 --train-iters 300 --eval-interval 100 --eval-iters 8 --log-interval 50
  --save "$OUT/ckpt" --save-interval 100 --seed 1234)

banner "Plan of the training job (the same flags, 8 ranks): layout, memory, schedule, traffic"
$M plan "${TRAIN[@]}" --world-size 8 --device cpu --html "$OUT/plan_train_3d.html" \
  | grep -E "VALID|TP x PP|global batch|parameters  |this build|communication|bubble|rank  *[0-9]" | head -30

banner "Train on 8 ranks: TP=2 x PP=2 x DP=2 (validation perplexity against the unigram baseline)"
rm -rf "$OUT/ckpt"
start=$(date +%s)
mpirun -n 8 --oversubscribe $M train "${TRAIN[@]}" --threads 1 --progress | tee "$OUT/train.log" \
  | grep -E "training a GPT|groups|stages|unigram|communication|iteration +[0-9]+/|idle|validation|saved" | cut -c1-230
echo "training took $(( $(date +%s) - start )) s"

banner "Generate from the trained checkpoint (saved by 8 ranks, loaded by one)"
printf "If you want to"
$M generate --load "$OUT/ckpt" --prompt "If you want to" --max-new-tokens 40 --temperature 1.0 --top-p 0.95 --seed 2
echo

banner "Export the checkpoint as a Hugging Face GPT2LMHeadModel (config.json, safetensors, tokenizer files)"
rm -rf "$OUT/hf"
$M export --load "$OUT/ckpt" --output "$OUT/hf" --dtype fp32   # fp32: an exact check below (--dtype bf16 halves it)
if /usr/bin/python3 -c "import torch" 2>/dev/null; then
  TOK=(--tokenizer-type GPT2BPETokenizer --vocab-file data/gpt2/vocab.json --merge-file data/gpt2/merges.txt)
  prompt="def main("
  ids=$($M tokenize "${TOK[@]}" --text "$prompt" --quiet)
  ours=$($M generate --load "$OUT/ckpt" --prompt "$prompt" --max-new-tokens 16 --temperature 0 2>/dev/null)
  hf_ids=$(/usr/bin/python3 tests/checkpoint/hf_reference.py "$OUT/hf" greedy "$ids" 16)
  theirs=$(echo "$hf_ids" | $M tokenize "${TOK[@]}" --decode --input - --quiet \
    | /usr/bin/python3 -c 'import json, sys; print(json.loads(sys.stdin.readline())["text"])')
  show() { /usr/bin/python3 -c 'import sys; print(repr(sys.argv[1]))' "$1"; }
  echo "greedy continuations of \"$prompt\" (ids $ids), as Python strings:"
  echo "  megatron generate from the checkpoint:        $(show "$ours")"
  echo "  the export run as transformers' GPT-2 (PyTorch): $(show "$theirs")"
  [ "$ours" = "$theirs" ] && echo "  the same text" || echo "  DIFFERENT"
fi

banner "Pages and files"
ls -1 "$OUT"/*.html
echo "checkpoints: $OUT/ckpt (metrics: $OUT/ckpt/metrics.jsonl); Hugging Face model: $OUT/hf"
echo "Open the pages in a browser (they work offline), or edit a layout live with:"
echo "  $M plan ${GPT13B[*]} --serve 8080"
