#!/usr/bin/env bash
# `megatron train --device cuda` against `--device cpu` on the same data and
# seeds, and checkpoints that move between the two:
#  - a small GPT and a small LLaMA-style model (RMSNorm, SwiGLU, RoPE, GQA,
#    no biases, untied output layer), fp32 and --bf16, 10 iterations each:
#    per-iteration losses agree;
#  - a run stopped at iteration 5 on one device resumes on the other and
#    reproduces the straight run's losses for iterations 6-10, both ways;
#  - 2 ranks (TP2 + SP, CP2 with document masks and position ids, and DP2 with the distributed optimizer and overlapped
#    reduction and gather on LLaMA; PP2 on GPT, tied embeddings) on the
#    device against the same layout on the CPU, and a PP2 device run resumed
#    by one CPU rank (where there are 2 GPUs, or on the simulated device).
#
# Tolerance: "sim" under MT_SIMULATE_CUDA=1 (CI: the simulated device runs
# the CPU kernels on guarded memory, so a host access to device memory
# faults, and the only numeric difference is the gradient norm's summation
# order on the device: relative 1e-6); "gpu" on a real GPU: relative 1e-4 in
# fp32 and 2e-2 with --bf16 (other summation orders, bf16 rounding).
# usage: device_cli_test.sh path/to/megatron sim|gpu
set -u
BIN=${1:?usage: device_cli_test.sh path/to/megatron sim|gpu}
MODE=${2:?usage: device_cli_test.sh path/to/megatron sim|gpu}
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }

python3 - "$TMP/in.jsonl" <<'PY'
import random, sys
r = random.Random(9)
with open(sys.argv[1], "w") as f:
    for _ in range(300):
        n = r.randint(5, 60)
        f.write('{"text": "%s"}\n' % " ".join(str(r.randrange(500)) for _ in range(n)))
PY
"$BIN" preprocess --input "$TMP/in.jsonl" --output-prefix "$TMP/d" --tokenizer-type NullTokenizer --vocab-size 512 \
  --append-eod --workers 1 --quiet >/dev/null || fail "preprocess"

COMMON=(--seq-length 32 --max-position-embeddings 32 --tokenizer-type NullTokenizer --vocab-size 512
  --data-path "$TMP/d_text_document" --split 100,0,0 --micro-batch-size 2 --global-batch-size 4
  --lr 3e-3 --min-lr 3e-4 --lr-decay-style cosine --lr-warmup-iters 2 --weight-decay 0.1 --clip-grad 1.0
  --seed 3 --log-interval 5 --no-progress --threads 1 --data-cache-path "$TMP/cache" --train-iters 10
  --hidden-dropout 0.1 --attention-dropout 0.1 --save-interval 100)
GPT=(--num-layers 2 --hidden-size 64 --num-attention-heads 4)
LLAMA=(--num-layers 2 --hidden-size 64 --num-attention-heads 8 --group-query-attention --num-query-groups 2
  --ffn-hidden-size 128 --normalization RMSNorm --swiglu --position-embedding-type rope --disable-bias-linear
  --untie-embeddings-and-output-weights)

# run NAME device flags... : trains into $TMP/NAME, metrics in $TMP/NAME.jsonl,
# launched by "${LAUNCH[@]}" (empty: one process; see mrun).
LAUNCH=()
run() {
  local name=$1 dev=$2; shift 2
  "${LAUNCH[@]}" "$BIN" train "${COMMON[@]}" --device "$dev" --save "$TMP/$name" --metrics-file "$TMP/$name.jsonl" "$@" \
    >"$TMP/$name.log" 2>&1 || { fail "$name: exit $?"; tail -20 "$TMP/$name.log"; return 1; }
}

# compare A B first_iteration rtol : per-iteration losses of iterations >= first
compare() {
  python3 - "$TMP/$1.jsonl" "$TMP/$2.jsonl" "$3" "$4" <<'PY'
import json, sys
def losses(p, first):
    out = {}
    for l in open(p):
        j = json.loads(l)
        if "lm_loss" in j and "kind" not in j and j["iteration"] >= first:
            out[j["iteration"]] = j["lm_loss"]
    return out
a, b = losses(sys.argv[1], int(sys.argv[3])), losses(sys.argv[2], int(sys.argv[3]))
rtol = float(sys.argv[4])
if sorted(a) != sorted(b) or not a:
    sys.exit(f"iterations differ: {sorted(a)} vs {sorted(b)}")
worst = max(abs(a[i] - b[i]) / abs(b[i]) for i in a)
print(f"  max relative loss difference {worst:.3g} over iterations {min(a)}-{max(a)} (tolerance {rtol:g})")
sys.exit(0 if worst <= rtol else f"losses differ beyond {rtol}: {[(i, a[i], b[i]) for i in sorted(a)]}")
PY
}

tol() { # precision -> relative tolerance
  if [ "$MODE" = sim ]; then echo 1e-6; elif [ "$1" = bf16 ]; then echo 2e-2; else echo 1e-4; fi
}

for model in gpt llama; do
  if [ $model = gpt ]; then flags=("${GPT[@]}"); else flags=("${LLAMA[@]}"); fi
  for prec in fp32 bf16; do
    extra=(); [ $prec = bf16 ] && extra=(--bf16)
    t=$(tol $prec)
    echo "== $model $prec"
    run "$model-$prec-cpu" cpu "${flags[@]}" "${extra[@]}" || continue
    run "$model-$prec-cuda" cuda "${flags[@]}" "${extra[@]}" || continue
    grep -q "on CUDA" "$TMP/$model-$prec-cuda.log" || fail "$model $prec: the cuda run did not say it ran on CUDA"
    compare "$model-$prec-cuda" "$model-$prec-cpu" 1 "$t" || fail "$model $prec: cuda vs cpu losses"
    # Stop at 5 on one device, resume on the other.
    for pair in "cuda cpu" "cpu cuda"; do
      set -- $pair
      name="$model-$prec-$1-then-$2"
      run "$name" "$1" "${flags[@]}" "${extra[@]}" --exit-interval 5 || continue
      run "$name" "$2" "${flags[@]}" "${extra[@]}" --load "$TMP/$name" || continue
      grep -q "loaded checkpoint" "$TMP/$name.log" || fail "$name: resume did not load"
      compare "$name" "$model-$prec-$1" 6 "$t" || fail "$name: resumed losses vs the straight $1 run"
    done
  done
done

# Several ranks on the device (one GPU per rank; NCCL groups on real GPUs,
# MPI staged through host memory on the simulated device): tensor + sequence,
# context, pipeline, and data parallelism with the distributed optimizer and
# overlapped gradient reduction, and expert parallelism (a LLaMA-style MoE
# whose tokens travel to the other rank's experts: all-to-all), whole
# experts under TP (--expert-tensor-parallel-size 1), each against
# the same layout on the CPU;
# and a pipeline run stopped on the device resumed by one CPU rank.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
gpus=2
if [ "$MODE" = gpu ]; then
  gpus=$("$BIN" --version 2>/dev/null | sed -n 's/.*CUDA backend: compiled, \([0-9]*\) GPU.*/\1/p')
fi
if [ "${gpus:-0}" -lt 2 ]; then
  echo "== several ranks: skipped (${gpus:-0} GPU here; each rank needs its own)"
elif ! command -v mpirun >/dev/null; then
  fail "several ranks: no mpirun"
else
  mrun() { # as run, on 2 ranks
    local rc=0
    LAUNCH=(mpirun -n 2 --oversubscribe)
    run "$@" || rc=1
    LAUNCH=()
    return $rc
  }
  # LLaMA-style for TP and DP; GPT for PP (its tied embeddings add the
  # first and last stages' embedding group).
  MOE=(--num-experts 4 --moe-router-topk 2 --moe-ffn-hidden-size 64 --moe-aux-loss-coeff 1e-2)
  for layout in tp2 pp2 dp2 cp2 moedp2 ep2 etp1; do
    case $layout in
      moedp2) lflags=("${LLAMA[@]}" "${MOE[@]}" --use-distributed-optimizer) ;;
      ep2) lflags=("${LLAMA[@]}" "${MOE[@]}" --moe-shared-expert-intermediate-size 64 --expert-model-parallel-size 2
                   --use-distributed-optimizer) ;;
      tp2) lflags=("${LLAMA[@]}" --tensor-model-parallel-size 2 --sequence-parallel) ;;
      # Whole experts under TP (ETP 1): their gradients over the TP ranks as expert data-parallel group.
      etp1) lflags=("${LLAMA[@]}" "${MOE[@]}" --tensor-model-parallel-size 2 --sequence-parallel
                    --expert-tensor-parallel-size 1) ;;
      cp2) lflags=("${LLAMA[@]}" --context-parallel-size 2 --reset-position-ids --reset-attention-mask) ;;
      pp2) lflags=("${GPT[@]}" --pipeline-model-parallel-size 2) ;;
      dp2) lflags=("${LLAMA[@]}" --use-distributed-optimizer --overlap-grad-reduce --overlap-param-gather) ;;
    esac
    for prec in fp32 bf16; do
      extra=(); [ $prec = bf16 ] && extra=(--bf16)
      t=$(tol $prec)
      echo "== $layout $prec, 2 ranks"
      mrun "$layout-$prec-cpu" cpu "${lflags[@]}" "${extra[@]}" || continue
      mrun "$layout-$prec-cuda" cuda "${lflags[@]}" "${extra[@]}" || continue
      grep -q "on CUDA (.*groups)" "$TMP/$layout-$prec-cuda.log" ||
        fail "$layout $prec: the cuda run did not name its device groups"
      compare "$layout-$prec-cuda" "$layout-$prec-cpu" 1 "$t" || fail "$layout $prec: 2 ranks, cuda vs cpu losses"
    done
  done
  echo "== pp2 on cuda stopped at 5, resumed by one cpu rank"
  if mrun pp2-cuda-then-cpu cuda "${GPT[@]}" --pipeline-model-parallel-size 2 --exit-interval 5; then
    run pp2-cuda-then-cpu cpu "${GPT[@]}" --load "$TMP/pp2-cuda-then-cpu" &&
      { compare pp2-cuda-then-cpu pp2-fp32-cpu 6 "$(tol fp32)" || fail "pp2 cuda -> 1 cpu rank: resumed losses"; }
  fi
fi

# --device cuda without a usable GPU is a configuration error naming the flag.
if [ "$MODE" = sim ]; then
  env -u MT_SIMULATE_CUDA "$BIN" train "${COMMON[@]}" "${GPT[@]}" --device cuda >"$TMP/nogpu.log" 2>&1
  rc=$?
  if env -u MT_SIMULATE_CUDA "$BIN" --version 2>/dev/null | grep -q "CUDA backend: compiled, [0-9]* GPU"; then
    echo "  (a real GPU is present: skipping the no-GPU error check)"
  else
    [ $rc = 2 ] || fail "--device cuda without a GPU: exit $rc, expected 2"
    grep -q "\[--device\] cuda was asked for" "$TMP/nogpu.log" || { fail "--device cuda without a GPU: message"; cat "$TMP/nogpu.log"; }
  fi
fi

# On NCCL groups (several ranks, real GPUs), an interleaved PP 2 schedule
# whose pair of ranks mixes activations and gradients out of order is refused
# before anything is allocated (NCCL pairs messages in issue order). The
# check runs with the other configuration checks, so it shows here without a
# GPU too, beside the no-GPU error, in builds that have NCCL.
if [ "$MODE" = sim ] && command -v mpirun >/dev/null &&
   env -u MT_SIMULATE_CUDA "$BIN" --version | grep -q "NCCL groups: compiled"; then
  echo "== NCCL: interleaved PP 2 with micro-batch groups of 4 is refused"
  env -u MT_SIMULATE_CUDA mpirun -n 2 --oversubscribe "$BIN" train "${COMMON[@]}" --num-layers 4 --hidden-size 64 \
    --num-attention-heads 4 --pipeline-model-parallel-size 2 --num-layers-per-virtual-pipeline-stage 1 \
    --global-batch-size 16 --microbatch-group-size-per-virtual-pipeline-stage 4 --device cuda >"$TMP/nccl-pp.log" 2>&1
  rc=$?
  [ $rc = 2 ] || fail "NCCL interleaved refusal: exit $rc, expected 2"
  grep -q "on NCCL groups this interleaved schedule mixes the two directions" "$TMP/nccl-pp.log" ||
    { fail "NCCL interleaved refusal: message"; tail -5 "$TMP/nccl-pp.log"; }
fi

if [ $fails -gt 0 ]; then echo "$fails failure(s)"; exit 1; fi
echo "all device checks passed"
