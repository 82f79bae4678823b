#!/usr/bin/env bash
# The CUDA backend's check on a lent GPU machine, in ONE device call:
#
#   here:   bash scripts/device_kit.sh           # builds .devkit/kit.tar.xz
#   device: run(command="bash bench/device_check.sh", carry=[".devkit"], timeout_s=560)
#
# The whole script keeps within TOTAL_BUDGET (480 s) plus a few seconds; with
# the machine's start that is about 10 of the session's 15 device minutes.
# A rerun of some steps on the still-warm machine, e.g.:
#   run(command="STEPS='train resume' TOTAL_BUDGET=200 bash bench/device_check.sh", carry=[".devkit"])
#
# It unpacks the kit (our binaries + their libraries + two small datasets) into
# /tmp, points LD_LIBRARY_PATH (for our binaries only, never for python3) at
# the kit's lib/, the CUDA toolkit's lib64 and the pip cuDNN/NCCL lib dirs,
# then runs the steps below. Each step has a time budget and runs under
# `timeout`; its status (PASS, FAIL, TIMEOUT, SKIP), seconds and key figures
# are recorded even when it fails, and the script never stops early. Every
# line goes to $OUT/log.txt; $OUT/summary.md (markdown table) and
# $OUT/results.json are rewritten after every step, so a run cut short still
# leaves a summary. Files back in $OUT (at most 8): log.txt, summary.md,
# results.json, gtest_kernels_cuda.json, gtest_kernels_all.json,
# gtest_model.json, artifacts.tar.gz (every run's log and metrics).
#
# Steps (select with STEPS="name-prefix ...", e.g. STEPS="env bench"):
#   env              nvidia-smi, torch, nvcc, kit libraries resolve, megatron --version sees the GPU
#   kernels_cuda     kernels_test --gtest_filter='CudaTwin*:*Cuda*' (GPU twins vs CPU)
#   kernels_all      every kernels_test case
#   model            model_test (minus VsPyTorch: it needs /usr/bin/python3 with torch and our source path)
#   comm             comm_test as a single rank without MPI (+ any NCCL test binary in the kit);
#                    one GPU, no mpirun there: only np=1 is possible
#   train_<m>_<p>    GPT and LLaMA-style small models, fp32 and bf16: 10 iterations with
#                    --device cpu and --device cuda, per-iteration losses compared
#                    (max rel diff <= TOL_FP32 = 1e-4, TOL_BF16 = 2e-2)
#   resume_<m>_<p>   GPU run saved at 5 resumed on CPU to 10 vs the straight GPU run, and
#                    CPU -> GPU vs the straight CPU run (iterations 6-10, same tolerances);
#                    also reports whether a GPU rerun is bitwise identical (determinism).
#                    LLaMA fp32 and bf16, GPT fp32 (with dropout: the RNG state crosses devices)
#   bench_gemm       torch bf16 8192^3 matmul: the GEMM ceiling of this GPU
#   bench_attention  attention_bench --device cuda on the benchmark model's attention (B4 T2048
#                    a16 g4 d128): our fp32 SIMT and bf16 tensor-core kernels, fwd and bwd
#                    TFLOP/s, vs PyTorch's bf16 scaled_dot_product_attention
#   bench_norm       norm_bench --device cuda on the benchmark model's RMSNorm (8192 x 2048, bf16):
#                    the packed kernels (the default) and the column-a-thread ones, forward and
#                    backward ms and GB/s, vs PyTorch's F.rms_norm + autograd in bf16
#   bench_ours       `megatron train --device cuda`, ~1B LLaMA-style (L16 h2048 a16 g4 F5632
#                    SwiGLU, s2048, V32000, bf16, micro-batch BENCH_MBS=4, global batch
#                    BENCH_GBS=32: 8 accumulated micro-batches per step), BENCH_WARMUP=3 +
#                    BENCH_ITERS=10 iterations on the kit's random-token dataset
#   bench_torch_eager / bench_torch_compile
#                    bench/llama_torch_train.py, the same model in PyTorch
#   bench_report     tokens/s, MFU vs 989 TFLOP/s and vs the GEMM ceiling, ours/eager, ours/compile
#   profile_ours     the benchmark model for 4 iterations with MT_PROFILE_OPS=1: GPU milliseconds
#                    per op per iteration (core/op_profile.h), where the time goes; TFLOP/s of
#                    the GEMMs (per shape and together) and of attention forward and backward
#   ncu_attention    Nsight Compute (--clock-control none) on one forward and one backward of
#                    attention_bench --variant bf16, then --variant lean (the lean dK/dV
#                    build): per kernel the duration, SM and memory throughput, occupancy,
#                    registers, shared memory and warp stall reasons (runs/ncu_attention_bf16.csv
#                    and runs/ncu_attention_lean.csv in the artifacts; the headline row per kernel here)
#   ncu_norm         Nsight Compute on the RMSNorm kernels of one benchmark iteration: the
#                    first micro-batch's last forward norm, then the backward's first fused
#                    kernel and column sum, twice (runs/ncu_norm.csv and .ncu-rep; headline per kernel)
#   cli_device       the repo's tests/train/device_cli_test.sh in "gpu" mode, if it exists, with
#                    whatever time is left (its min is 0: it never takes time from the others)
#
# Environment: OUT (the device sets it; default out/device_check), TOTAL_BUDGET
# seconds (default 480), STEPS, KIT (default .devkit/kit.tar.xz), GPU_DEVICE
# (the --device value of the "GPU" runs, default cuda; `cpu` exercises the
# script without a GPU), TORCH_DEVICE (likewise for PyTorch), BENCH_SIZE=tiny
# (a tiny benchmark model, for testing the script), CAP_SCALE (multiplies the
# step budgets, for testing on a slow machine), BENCH_MBS, BENCH_GBS, BENCH_WARMUP,
# BENCH_ITERS, TOL_FP32, TOL_BF16.
#
# Tested without a GPU as:
#   OUT=/tmp/dc GPU_DEVICE=cpu TORCH_DEVICE=cpu BENCH_SIZE=tiny CAP_SCALE=6 TOTAL_BUDGET=3000 \
#     PATH=/usr/bin:$PATH bash bench/device_check.sh   # /usr/bin/python3: Debian's torch 1.13
# shellcheck disable=SC2046,SC2086  # the flag functions (small_common, ...) are meant to split into words
set -uo pipefail  # no -e: a failing command is a result to record, not a reason to stop
cd "$(dirname "$0")/.." || exit 1
ROOT=$PWD
OUT=${OUT:-$ROOT/out/device_check}
TOTAL_BUDGET=${TOTAL_BUDGET:-480}
STEPS=${STEPS:-all}
KIT_TAR=${KIT:-$ROOT/.devkit/kit.tar.xz}
GPU_DEVICE=${GPU_DEVICE:-cuda}
TORCH_DEVICE=${TORCH_DEVICE:-cuda}  # llama_torch_train.py's --device (cpu: to test the script)
TOL_FP32=${TOL_FP32:-1e-4}
TOL_BF16=${TOL_BF16:-2e-2}
BENCH_MBS=${BENCH_MBS:-4}
BENCH_GBS=${BENCH_GBS:-$((8 * BENCH_MBS))}  # 8 micro-batches per step: the optimizer step amortised as in real runs
BENCH_WARMUP=${BENCH_WARMUP:-3}
BENCH_ITERS=${BENCH_ITERS:-10}
BENCH_SIZE=${BENCH_SIZE:-1b}
CAP_SCALE=${CAP_SCALE:-1}  # multiplies every step's cap and min (for slow machines, when testing the script)

WORK=/tmp/mt_device_check   # scratch: runs, checkpoints, dataset caches
KITDIR=/tmp/mt_kit          # the unpacked kit: $KITDIR/kit/{bin,lib,data}
KIT=$KITDIR/kit
RUNS=$WORK/runs             # per run: NAME.log (stdout+stderr), NAME.jsonl (metrics)
BENCH=$WORK/bench           # gemm/ours/eager/compile/report .json
HELPER="python3 $ROOT/bench/device_check.py"
START=$(date +%s)
DEADLINE=$((START + TOTAL_BUDGET))

# ------------------------------------------------------------------ the steps' table
# name  cap(s)  min(s)  what. A step gets min(cap, time left - the mins of the
# steps after it), so a slow early step cannot starve the later ones.
STEP_TABLE="
env                  30  10  machine, toolchain, kit
kernels_cuda         60  15  kernels_test CudaTwin*/Cuda* (GPU twins vs CPU)
kernels_all          90  20  kernels_test, every case
model                45  15  model_test (minus VsPyTorch)
comm                 20   5  comm_test, one rank (single GPU: np=1 only)
train_gpt_fp32       40  15  small GPT, 10 its, CPU vs GPU, fp32
train_gpt_bf16       40  15  small GPT, 10 its, CPU vs GPU, bf16
train_llama_fp32     40  15  small LLaMA-style, 10 its, CPU vs GPU, fp32
train_llama_bf16     40  15  small LLaMA-style, 10 its, CPU vs GPU, bf16
resume_llama_fp32    45  15  LLaMA fp32: GPU ckpt@5 -> CPU to 10, and CPU -> GPU
resume_llama_bf16    45  15  LLaMA bf16: GPU ckpt@5 -> CPU to 10, and CPU -> GPU
resume_gpt_fp32      45  15  GPT fp32 (dropout: RNG state): GPU ckpt@5 -> CPU, CPU -> GPU
bench_gemm           30  15  torch bf16 8192^3 GEMM ceiling
bench_attention      25  10  attention_bench: our SIMT and tensor-core kernels vs torch sdpa
bench_norm           20   5  norm_bench: our two RMSNorm kernel builds vs torch rms_norm, benchmark shape
bench_ours          100  45  megatron train --device cuda, ~1B LLaMA bf16
bench_torch_eager    60  30  PyTorch eager, same model
bench_torch_compile 150  60  PyTorch torch.compile, same model
bench_report         15   5  tokens/s, MFU, ratios
profile_ours         90   0  MT_PROFILE_OPS=1, 4 iterations of the benchmark: GPU ms per op (time to spare)
ncu_attention        90   0  Nsight Compute on our bf16 attention kernels, both dK/dV builds (time to spare)
ncu_norm             60   0  Nsight Compute on the RMSNorm kernels in the benchmark model (time to spare)
cli_device           90   0  tests/train/device_cli_test.sh gpu (only with time to spare)
"
mapfile -t STEP_LINES < <(grep -v '^[[:space:]]*$' <<<"$STEP_TABLE")

# ------------------------------------------------------------------ recording
mkdir -p "$OUT"
rm -f "$OUT"/log.txt "$OUT"/summary.md "$OUT"/results.json "$OUT"/gtest_*.json "$OUT"/artifacts.tar.gz  # stale ones mislead
rm -rf "$WORK"
mkdir -p "$WORK" "$RUNS" "$BENCH" "$WORK/ckpt"
: >"$WORK/results.tsv"  # step \t status \t seconds \t budget \t figures \t what
: >"$WORK/kv.tsv"       # step \t key \t value
NOTES="single GPU: the comm step can only run np=1 (no mpirun, one GPU on this machine)."
CUR_STEP=""
FIGS=""
STEP_END=0
fig() { FIGS="${FIGS:+$FIGS; }$*"; echo "  -> $*"; }          # a key figure of the current step
kv() { printf '%s\t%s\t%s\n' "$CUR_STEP" "$1" "$2" >>"$WORK/kv.tsv"; }  # a machine-readable figure
elapsed() { echo $(( $(date +%s) - START )); }
left() { echo $(( DEADLINE - $(date +%s) )); }

write_summary() {
  $HELPER summary --results "$WORK/results.tsv" --kv "$WORK/kv.tsv" --md "$OUT/summary.md" --json "$OUT/results.json" \
    --bench-dir "$BENCH" --header "$(uname -n) $(date -u +%Y-%m-%dT%H:%MZ), kit $(kit_rev)" --notes "$NOTES" \
    || echo "(summary writer failed)"
}
kit_rev() { python3 -c "import json; m=json.load(open('$KIT/MANIFEST.json')); print(m['git_revision'][:10] + ('+dirty' if m['git_dirty'] else ''), m['built'])" 2>/dev/null || echo "none"; }

# t CMD...: run CMD under the time left in the current step (124 when cut off).
t() {
  local l=$(( STEP_END - $(date +%s) ))
  if [ "$l" -lt 2 ]; then echo "  (no time left in this step for: $1)"; return 124; fi
  timeout -k 5 "$l" "$@"
}
# meg ARGS...: our megatron with the kit's libraries, under the step's time.
meg() { t env LD_LIBRARY_PATH="$KLD" "$KIT/bin/megatron" "$@"; }
kitbin() { t env LD_LIBRARY_PATH="$KLD" "$KIT/bin/$1" "${@:2}"; }
have_kit() { [ -x "$KIT/bin/megatron" ] || { fig "no kit (run scripts/device_kit.sh here and carry .devkit)"; return 1; }; }

selected() {  # is step $1 chosen by STEPS (names or name prefixes, or "all")?
  local s
  for s in $STEPS; do [ "$s" = all ] || [[ "$1" == "$s"* ]] && return 0; done
  return 1
}

run_step() {  # index into STEP_LINES
  local i=$1 name cap what reserve=0 j
  read -r name cap _ what <<<"${STEP_LINES[$i]}"
  cap=$((cap * CAP_SCALE))
  for ((j = i + 1; j < ${#STEP_LINES[@]}; j++)); do
    local n2 m2
    read -r n2 _ m2 _ <<<"${STEP_LINES[$j]}"
    selected "$n2" && reserve=$((reserve + m2 * CAP_SCALE))
  done
  selected "$name" || return 0
  CUR_STEP=$name FIGS=""
  local allowed=$(( $(left) - reserve ))
  [ "$allowed" -gt "$cap" ] && allowed=$cap
  printf '\n==== step %s: %s [t+%ss, %ss left in all; budget %ss]\n' "$name" "$what" "$(elapsed)" "$(left)" "$allowed"
  local status rc=0 t0
  t0=$(date +%s)
  if [ "$allowed" -lt 5 ]; then
    status=SKIP; fig "no time left"
  else
    STEP_END=$((t0 + allowed))
    "step_$name"; rc=$?
    if [ $rc = 0 ]; then status=PASS
    elif [ $rc = 77 ]; then status=SKIP
    elif [ $rc = 124 ] || [ $rc = 137 ] || [ "$(date +%s)" -ge "$STEP_END" ]; then status=TIMEOUT
    else status=FAIL; fi
  fi
  local secs=$(( $(date +%s) - t0 ))
  printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$name" "$status" "$secs" "$allowed" "${FIGS//$'\t'/ }" "$what" >>"$WORK/results.tsv"
  printf '==== %s: %s in %ss (%ss left in all)\n' "$name" "$status" "$secs" "$(left)"
  write_summary
}

# ------------------------------------------------------------------ model flags
# Small runs: the kit's corpus (GPT-2 ids, EOD 50256 = NullTokenizer's vocab-1).
small_common() {
  echo --tokenizer-type NullTokenizer --vocab-size 50257 --data-path "$KIT/data/corpus_text_document" --split 98,2,0 \
    --data-cache-path "$WORK/cache" --lr 1e-3 --min-lr 1e-4 --lr-decay-style cosine --lr-warmup-iters 2 \
    --weight-decay 0.1 --clip-grad 1.0 --seed 1234 --train-iters 10 --log-interval 1 --no-progress
}
# GPT keeps Megatron's default dropout 0.1 (the GPU must draw the CPU's Philox masks).
gpt_small() {
  echo --num-layers 4 --hidden-size 256 --num-attention-heads 8 --seq-length 256 --max-position-embeddings 256 \
    --micro-batch-size 2 --global-batch-size 4
}
llama_small() {
  echo --num-layers 4 --hidden-size 256 --num-attention-heads 8 --group-query-attention --num-query-groups 2 \
    --ffn-hidden-size 704 --seq-length 256 --max-position-embeddings 256 --micro-batch-size 2 --global-batch-size 4 \
    --normalization RMSNorm --swiglu --position-embedding-type rope --disable-bias-linear \
    --untie-embeddings-and-output-weights --hidden-dropout 0 --attention-dropout 0
}
prec_flags() { [ "$1" = bf16 ] && echo --bf16; }
tol_of() { [ "$1" = bf16 ] && echo "$TOL_BF16" || echo "$TOL_FP32"; }

# The benchmark model: the same sizes for ours and for PyTorch.
if [ "$BENCH_SIZE" = tiny ]; then  # for testing this script without a GPU
  B_L=2 B_H=128 B_A=4 B_G=2 B_F=352 B_S=128 B_V=32000
else
  B_L=16 B_H=2048 B_A=16 B_G=4 B_F=5632 B_S=2048 B_V=32000
fi
bench_model() {  # Megatron flags of the benchmark model (both trainers' sizes)
  echo --num-layers $B_L --hidden-size $B_H --num-attention-heads $B_A --group-query-attention --num-query-groups $B_G \
    --ffn-hidden-size $B_F --seq-length $B_S --max-position-embeddings $B_S --vocab-size $B_V \
    --micro-batch-size "$BENCH_MBS" --global-batch-size "$BENCH_GBS" --normalization RMSNorm --swiglu \
    --position-embedding-type rope --disable-bias-linear --untie-embeddings-and-output-weights \
    --hidden-dropout 0 --attention-dropout 0 --bf16
}
bench_train() {  # [iterations]
  echo --tokenizer-type NullTokenizer --data-path "$KIT/data/random32k_text_document" --split 100,0,0 \
    --data-cache-path "$WORK/cache" --lr 1e-4 --lr-decay-style constant --weight-decay 0.1 --clip-grad 1.0 \
    --seed 1234 --log-interval 1 --no-progress --train-iters "${1:-$((BENCH_WARMUP + BENCH_ITERS))}"
}
torch_flags() {
  echo --num-layers $B_L --hidden-size $B_H --num-attention-heads $B_A --num-query-groups $B_G --ffn-hidden-size $B_F \
    --seq-length $B_S --vocab-size $B_V --micro-batch-size "$BENCH_MBS" --global-batch-size "$BENCH_GBS" \
    --warmup "$BENCH_WARMUP" --iters "$BENCH_ITERS"
}

# train_run NAME cpu|gpu FLAGS...: `megatron train` into $RUNS/NAME.{log,jsonl}; returns its exit code.
train_run() {
  local name=$1 dev=$2; shift 2
  [ "$dev" = gpu ] && dev=$GPU_DEVICE
  rm -f "$RUNS/$name.jsonl"
  local t0
  t0=$(date +%s)
  meg train "$@" --device "$dev" --metrics-file "$RUNS/$name.jsonl" >"$RUNS/$name.log" 2>&1
  local rc=$?
  local its
  its=$(grep -cs '"lm_loss"' "$RUNS/$name.jsonl")
  echo "  $name (--device $dev): exit $rc in $(( $(date +%s) - t0 ))s, ${its:-0} metric lines"
  if [ $rc != 0 ]; then sed 's/^/    | /' "$RUNS/$name.log" | tail -15; fi
  return $rc
}
# compare LABEL RUN REF TOL [FROM]: per-iteration losses of RUN vs REF; records the figure.
compare() {
  local label=$1 out rc
  out=$(t $HELPER cmp "$RUNS/$2.jsonl" "$RUNS/$3.jsonl" --tol "$4" --from-iter "${5:-1}"); rc=$?
  fig "$label: $out"
  kv "$label" "$out"
  return $rc
}

# ------------------------------------------------------------------ steps
step_env() {
  local rc=0
  t nvidia-smi || rc=1
  fig "$(t nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader 2>&1 | head -1)"
  local tv
  tv=$(t python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'gpu', torch.cuda.is_available() and torch.cuda.get_device_name(0))" 2>&1 | tail -1)
  fig "$tv"
  echo "  nvcc: $(nvcc --version 2>/dev/null | tail -1 || echo none); $(ldd --version | head -1); $(nproc) cores; $(grep -m1 'model name' /proc/cpuinfo)"
  echo "  LD_LIBRARY_PATH for our binaries: $KLD"
  have_kit || return 1
  echo "  kit: $(kit_rev); needs $(python3 -c "import json; m=json.load(open('$KIT/MANIFEST.json')); print(m['needs_glibc'], m['needs_glibcxx'])" 2>/dev/null)"
  local b missing=""
  for b in "$KIT"/bin/*; do
    missing+=$(LD_LIBRARY_PATH=$KLD ldd "$b" 2>&1 | grep "not found" | sed "s|^|$(basename "$b"): |")
  done
  if [ -n "$missing" ]; then fig "unresolved libraries: $missing"; rc=1; fi
  local v
  v=$(meg --version 2>&1); echo "$v" | sed 's/^/  | /'
  fig "$(grep 'CUDA backend' <<<"$v")"
  grep -q "CUDA backend: compiled, [0-9]* GPU" <<<"$v" || rc=1
  return $rc
}

step_kernels_cuda() {
  have_kit || return 1
  local rc=0 out
  kitbin kernels_test --gtest_filter='CudaTwin*:*Cuda*' --gtest_output="json:$OUT/gtest_kernels_cuda.json" || rc=$?
  # On a GPU machine a skipped GPU test is a failure (MT_REQUIRE_GPU found no usable GPU).
  out=$($HELPER gtest "$OUT/gtest_kernels_cuda.json" --fail-on-skip) || { [ $rc = 0 ] && rc=1; }
  fig "$out"
  return $rc
}

step_kernels_all() {
  have_kit || return 1
  local rc=0 out
  # Rope.TablesMatchMegatronsFormulas runs /usr/bin/python3 on our source tree's path: not there on the device.
  kitbin kernels_test --gtest_filter='-Rope.TablesMatchMegatronsFormulas' \
    --gtest_output="json:$OUT/gtest_kernels_all.json" >"$RUNS/kernels_all.log" 2>&1 || rc=$?
  grep -E '^\[  (FAILED|PASSED|SKIPPED) ' "$RUNS/kernels_all.log" | head -40
  [ $rc = 0 ] || tail -20 "$RUNS/kernels_all.log"  # a crash: where it stopped
  out=$($HELPER gtest "$OUT/gtest_kernels_all.json") || { [ $rc = 0 ] && rc=1; }
  fig "$out"
  return $rc
}

step_model() {
  have_kit || return 1
  [ -x "$KIT/bin/model_test" ] || { fig "model_test not in the kit"; return 77; }
  # VsPyTorch runs /usr/bin/python3 on our source tree's path: not there on the device.
  local rc=0 out
  kitbin model_test --gtest_filter='-*VsPyTorch*' --gtest_output="json:$OUT/gtest_model.json" >"$RUNS/model_test.log" 2>&1 || rc=$?
  grep -E '^\[  (FAILED|PASSED|SKIPPED) ' "$RUNS/model_test.log" | head -40
  [ $rc = 0 ] || tail -20 "$RUNS/model_test.log"
  out=$($HELPER gtest "$OUT/gtest_model.json") || { [ $rc = 0 ] && rc=1; }
  fig "$out"
  return $rc
}

step_comm() {
  have_kit || return 1
  local rc=0 ran=0 b out
  if [ -x "$KIT/bin/comm_test" ]; then
    ran=1
    kitbin comm_test --expect-world=1 --expect-mpi=0 --gtest_output="json:$RUNS/gtest_comm.json" >"$RUNS/comm_test.log" 2>&1 || rc=1
    tail -3 "$RUNS/comm_test.log"
    out=$($HELPER gtest "$RUNS/gtest_comm.json") || rc=1
    fig "comm_test (self, np=1): $out"
  fi
  for b in nccl_test comm_nccl_test; do  # the NCCL communicator's test, alone (no mpirun)
    [ -x "$KIT/bin/$b" ] || continue
    ran=1
    kitbin "$b" --gtest_output="json:$RUNS/gtest_$b.json" --expect-world=1 >"$RUNS/$b.log" 2>&1 || rc=1
    tail -3 "$RUNS/$b.log"
    out=$($HELPER gtest "$RUNS/gtest_$b.json") || rc=1
    fig "$b (np=1): $out"
  done
  fig "single GPU: np=1 only"
  [ $ran = 1 ] || return 77
  return $rc
}

# train_pair MODEL PREC: the same 10 iterations on GPU and CPU (GPU first: it
# matters more if time runs out), losses compared.
train_pair() {
  local m=$1 p=$2 rc=0 ms_c ms_g
  have_kit || return 1
  train_run "${m}_${p}_gpu" gpu $(small_common) $(${m}_small) $(prec_flags "$p") || rc=1
  train_run "${m}_${p}_cpu" cpu $(small_common) $(${m}_small) $(prec_flags "$p") || rc=1
  compare "gpu vs cpu" "${m}_${p}_gpu" "${m}_${p}_cpu" "$(tol_of "$p")" || rc=1
  ms_c=$($HELPER ms "$RUNS/${m}_${p}_cpu.jsonl" --skip 1); ms_g=$($HELPER ms "$RUNS/${m}_${p}_gpu.jsonl" --skip 1)
  fig "ms/it cpu $ms_c, gpu $ms_g"
  return $rc
}
step_train_gpt_fp32() { train_pair gpt fp32; }
step_train_gpt_bf16() { train_pair gpt bf16; }
step_train_llama_fp32() { train_pair llama fp32; }
step_train_llama_bf16() { train_pair llama bf16; }

# resume_cross MODEL PREC: GPU saves at 5 -> CPU resumes to 10 (vs straight GPU), and CPU -> GPU (vs straight CPU).
resume_cross() {
  local m=$1 p=$2 rc=0 tol base flags
  have_kit || return 1
  tol=$(tol_of "$p")
  base=${m}_${p}
  flags="$(small_common) $(${m}_small) $(prec_flags "$p")"
  local d
  for d in gpu cpu; do  # the straight runs, unless the train step made them (10 iteration lines)
    local n
    n=$(grep '"lm_loss"' "$RUNS/${base}_$d.jsonl" 2>/dev/null | grep -vc '"kind"')
    [ "${n:-0}" -ge 10 ] || train_run "${base}_$d" "$d" $flags || rc=1
  done
  local from to
  for pair in "gpu cpu" "cpu gpu"; do
    read -r from to <<<"$pair"
    local ck="$WORK/ckpt/${base}_${from}2${to}"
    rm -rf "$ck"
    train_run "${base}_${from}2${to}_part" "$from" $flags --save "$ck" --save-interval 100 --exit-interval 5 || rc=1
    train_run "${base}_${from}2${to}_resume" "$to" $flags --load "$ck" --save "$ck" --save-interval 100 || rc=1
    grep -q "loaded checkpoint" "$RUNS/${base}_${from}2${to}_resume.log" || { fig "$from->$to: the resume did not load a checkpoint"; rc=1; }
    compare "$from@5->$to 6-10 vs straight $from" "${base}_${from}2${to}_resume" "${base}_${from}" "$tol" 6 || rc=1
    # The part run repeats the straight run's first 5 iterations on the same device: determinism.
    local det
    det=$(t $HELPER cmp "$RUNS/${base}_${from}.jsonl" "$RUNS/${base}_${from}2${to}_part.jsonl" --tol 0 2>&1)
    if [[ "$det" == *"bitwise equal"* ]]; then fig "$from rerun its 1-5: bitwise equal"
    else fig "$from rerun its 1-5 NOT bitwise equal (WARN: $det)"; fi
  done
  return $rc
}
step_resume_llama_fp32() { resume_cross llama fp32; }
step_resume_llama_bf16() { resume_cross llama bf16; }
step_resume_gpt_fp32() { resume_cross gpt fp32; }

step_bench_gemm() {
  local out rc
  out=$(t $HELPER gemm --out "$BENCH/gemm.json" 2>&1); rc=$?
  echo "$out" | tail -5
  fig "$(echo "$out" | tail -1)"
  return $rc
}

step_bench_attention() {
  have_kit || return 1
  [ -x "$KIT/bin/attention_bench" ] || { fig "no attention_bench in the kit"; return 77; }
  [ "$GPU_DEVICE" = cuda ] || { fig "GPU_DEVICE=$GPU_DEVICE: a GPU-only benchmark"; return 77; }
  local out rc
  out=$(kitbin attention_bench --device cuda --seq 2048 --batch 4 --heads 16 --groups 4 --head-dim 128 --reps 10 \
          --torch-cmd "env -u LD_LIBRARY_PATH python3 $ROOT/bench/attention_torch_bench.py" 2>&1); rc=$?
  echo "$out" | tail -6
  fig "$(echo "$out" | grep -E 'ours|sdpa|ratio' | sed -E 's/ +/ /g' | paste -sd ';' | cut -c1-700)"
  return $rc
}

step_bench_norm() {
  have_kit || return 1
  [ -x "$KIT/bin/norm_bench" ] || { fig "no norm_bench in the kit"; return 77; }
  [ "$GPU_DEVICE" = cuda ] || { fig "GPU_DEVICE=$GPU_DEVICE: a GPU-only benchmark"; return 77; }
  local out rc
  out=$(kitbin norm_bench --device cuda --rows $((BENCH_MBS * B_S)) --cols $B_H --reps 10 \
          --torch-cmd "env -u LD_LIBRARY_PATH python3 $ROOT/bench/norm_torch_bench.py" 2>&1); rc=$?
  echo "$out" | tail -5
  fig "$(echo "$out" | grep -E 'ours|PyTorch|ratio' | sed -E 's/ +/ /g' | paste -sd ';' | cut -c1-600)"
  return $rc
}

step_bench_ours() {
  have_kit || return 1
  local rc=0
  meg plan $(bench_model) $(bench_train) --device h100 --json >"$BENCH/plan.json" 2>"$RUNS/bench_plan.log" \
    || { fig "megatron plan failed: $(tail -2 "$RUNS/bench_plan.log")"; }
  train_run bench_ours gpu $(bench_model) $(bench_train) || rc=1
  grep -E "training|iteration +[0-9]+/" "$RUNS/bench_ours.log" | cut -c1-260 | head -20
  local out
  out=$(t $HELPER ours --metrics "$RUNS/bench_ours.jsonl" --plan "$BENCH/plan.json" --skip "$BENCH_WARMUP" \
          --tokens $((BENCH_GBS * B_S)) --out "$BENCH/ours.json") || rc=1
  fig "$out"
  return $rc
}

# torch_bench eager|compile: bench/llama_torch_train.py; its last line (JSON) -> $BENCH/MODE.json
torch_bench() {
  local mode=$1 extra="" rc
  [ "$mode" = compile ] && extra=--compile
  local max=$(( STEP_END - $(date +%s) - 10 ))  # the script stops timing by itself before `t` kills it
  [ "$max" -lt 5 ] && max=5
  PYTHONUNBUFFERED=1 t python3 "$ROOT/bench/llama_torch_train.py" --device "$TORCH_DEVICE" $(torch_flags) $extra \
    --max-seconds "$max" >"$RUNS/torch_$mode.log" 2>&1
  rc=$?
  grep -v '^{' "$RUNS/torch_$mode.log" | tail -20
  if ! tail -1 "$RUNS/torch_$mode.log" | grep '^{' >"$BENCH/$mode.json"; then
    rm -f "$BENCH/$mode.json"
    [ $rc = 0 ] && rc=1
  fi
  if [ -s "$BENCH/$mode.json" ]; then
    fig "$($HELPER torch-fig "$BENCH/$mode.json")"
  else
    fig "no result ($(tail -1 "$RUNS/torch_$mode.log" | cut -c1-200))"
  fi
  return $rc
}
step_bench_torch_eager() { torch_bench eager; }
step_bench_torch_compile() { torch_bench compile; }

step_profile_ours() {
  have_kit || return 1
  local rc
  export MT_PROFILE_OPS=1
  train_run profile_ours gpu $(bench_model) $(bench_train 4); rc=$?
  unset MT_PROFILE_OPS
  sed -n '/^op profile/,$p' "$RUNS/profile_ours.log" | head -60
  fig "$($HELPER profile "$RUNS/profile_ours.jsonl")"
  fig "$(grep -A6 '^op profile' "$RUNS/profile_ours.log" | sed -E 's/ +/ /g' | paste -sd ';' | cut -c1-500)"
  return $rc
}

# ncu_ready: a kit, a GPU and Nsight Compute (NCU); else records why (77: skipped).
ncu_ready() {
  have_kit || return 1
  [ "$GPU_DEVICE" = cuda ] || { fig "GPU_DEVICE=$GPU_DEVICE: a GPU-only profile"; return 77; }
  NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2>/dev/null | head -1)
  [ -n "$NCU" ] || { fig "no ncu on this machine"; return 77; }
}
# ncu_profile ARGS...: ncu with the kit's libraries, the clocks left as they
# are, and the sections `device_check.py ncu` summarises.
ncu_profile() {
  t env LD_LIBRARY_PATH="$KLD" "$NCU" --clock-control none --section SpeedOfLight --section Occupancy \
    --section LaunchStats --section WarpStateStats --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis "$@"
}

step_ncu_attention() {
  ncu_ready || return $?
  local rc=0
  # time_ms runs each pass once untimed, then --reps 1: skip the first forward,
  # profile the second forward and the backward after it (D, dK/dV, dQ); the
  # model's bf16 path, then the same with the lean dK/dV build.
  local v
  for v in bf16 lean; do
    ncu_profile --kernel-name regex:attn_ --launch-skip 1 --launch-count 4 --csv --page details \
      "$KIT/bin/attention_bench" --device cuda --variant $v --no-torch --reps 1 --seq $B_S --batch 4 \
      --heads $B_A --groups $B_G --head-dim $((B_H / B_A)) >"$RUNS/ncu_attention_$v.csv" 2>"$RUNS/ncu_attention_$v.err" \
      || rc=$?
    tail -3 "$RUNS/ncu_attention_$v.err"
    fig "$v: $(t $HELPER ncu "$RUNS/ncu_attention_$v.csv" 2>&1 | tail -1)"
  done
  return $rc
}

step_ncu_norm() {
  ncu_ready || return $?
  local rc=0
  # One iteration; a micro-batch's forward runs 2 L + 1 norms (one kernel
  # each, norm_fwd_packed), then its backward starts with the final norm's
  # (norm_bwd_packed and norm_bwd_chunk_sum): skip all but the forward's
  # last, profile five.
  # (A report file, then its table: the training's own output shares stdout.)
  rm -f "$RUNS/ncu_norm.ncu-rep"
  ncu_profile --kernel-name regex:norm_ --launch-skip $((2 * B_L)) --launch-count 5 --export "$RUNS/ncu_norm" \
    "$KIT/bin/megatron" train $(bench_model) $(bench_train 1) --device cuda \
    >"$RUNS/ncu_norm.log" 2>&1 || rc=$?
  tail -3 "$RUNS/ncu_norm.log"
  t "$NCU" --import "$RUNS/ncu_norm.ncu-rep" --csv --page details >"$RUNS/ncu_norm.csv" 2>>"$RUNS/ncu_norm.log" || rc=1
  fig "$(t $HELPER ncu "$RUNS/ncu_norm.csv" 2>&1 | tail -1)"
  return $rc
}

step_cli_device() {
  have_kit || return 1
  local script=$ROOT/tests/train/device_cli_test.sh
  [ -f "$script" ] || { fig "no $script"; return 77; }
  # The test takes a path to megatron: a wrapper that adds the kit's libraries.
  printf '#!/bin/sh\nexec env LD_LIBRARY_PATH="%s" "%s" "$@"\n' "$KLD" "$KIT/bin/megatron" >"$WORK/megatron"
  chmod +x "$WORK/megatron"
  local rc=0
  t bash "$script" "$WORK/megatron" gpu >"$RUNS/cli_device.log" 2>&1 || rc=$?
  tail -15 "$RUNS/cli_device.log"
  fig "exit $rc: $(grep -c '^FAIL' "$RUNS/cli_device.log") FAIL lines; $(tail -1 "$RUNS/cli_device.log" | cut -c1-150)"
  return $rc
}

step_bench_report() {
  local out rc=0
  out=$(t $HELPER bench-report --dir "$BENCH") || rc=$?
  fig "$out"
  return $rc
}

# ------------------------------------------------------------------ main
main() {
  echo "device_check.sh: $(date -u), budget ${TOTAL_BUDGET}s, steps: $STEPS, OUT=$OUT"
  # The kit.
  rm -rf "$KITDIR"; mkdir -p "$KITDIR"
  if [ -f "$KIT_TAR" ]; then
    tar -C "$KITDIR" -xJf "$KIT_TAR" && echo "kit: unpacked $KIT_TAR ($(du -sh "$KIT" | cut -f1)) into $KIT" \
      || echo "kit: FAILED to unpack $KIT_TAR"
  else
    echo "kit: $KIT_TAR missing (build it with scripts/device_kit.sh and carry .devkit): the kit's steps will fail"
  fi
  # Libraries for our binaries: the kit's, then CUDA's, then the pip cuDNN/NCCL (and cu13) dirs.
  KLD=$KIT/lib
  local d
  for d in /usr/local/cuda/lib64 /usr/local/cuda/lib /usr/local/cuda/targets/x86_64-linux/lib; do
    [ -d "$d" ] && [[ ":$KLD:" != *":$(readlink -f "$d"):"* ]] && KLD+=":$(readlink -f "$d")"
  done
  while read -r d; do [ -n "$d" ] && KLD+=":$d"; done < <(python3 -c '
import glob, os
try:
    import nvidia
    for p in nvidia.__path__:
        for d in sorted(glob.glob(os.path.join(p, "*", "lib"))): print(d)
except Exception:
    pass' 2>/dev/null)
  ldconfig -p 2>/dev/null | grep -q 'libcuda\.so\.1' || for d in /usr/local/nvidia/lib64 /usr/local/nvidia/lib; do
    [ -d "$d" ] && KLD+=":$d"; done
  # The image's libstdc++ should be newer than ours; if it is not, use the kit's.
  if [ -x "$KIT/bin/megatron" ] && ! LD_LIBRARY_PATH=$KLD timeout 60 "$KIT/bin/megatron" --version >/dev/null 2>"$WORK/version.err"; then
    if grep -qE 'GLIBCXX|CXXABI|libstdc|libgcc_s' "$WORK/version.err"; then
      KLD=$KIT/lib/fallback:$KLD
      NOTES+=" The image's libstdc++ was too old: the kit's (lib/fallback) was used."
      echo "kit: using the kit's libstdc++ ($(head -1 "$WORK/version.err"))"
    else
      echo "kit: megatron --version failed: $(head -3 "$WORK/version.err")"
    fi
  fi
  [ "$GPU_DEVICE" != cuda ] && NOTES+=" GPU_DEVICE=$GPU_DEVICE: the 'GPU' runs did not use the GPU (a test of the script)."
  write_summary

  local i
  for i in "${!STEP_LINES[@]}"; do run_step "$i"; done

  # Everything else back in one file: run logs, metrics, bench JSON, gtest of comm (no checkpoints).
  tar -C "$WORK" -czf "$OUT/artifacts.tar.gz" runs bench results.tsv kv.tsv 2>/dev/null
  write_summary
  printf '\n==== done in %ss; summary:\n' "$(elapsed)"
  cat "$OUT/summary.md"
  ! cut -f2 "$WORK/results.tsv" | grep -qxE 'FAIL|TIMEOUT'  # exit 1 when a step failed
}

main 2>&1 | tee "$OUT/log.txt"
exit "${PIPESTATUS[0]}"
