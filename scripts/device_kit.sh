#!/usr/bin/env bash
# Builds the kit that bench/device_check.sh runs on a lent GPU machine (an
# H200 whose image has CUDA 13, cuBLAS, cuDNN, NCCL and PyTorch, but none of
# our Debian libraries and no network), and checks it here.
#
#   scripts/device_kit.sh                              # configure + build build-device, pack, verify
#   scripts/device_kit.sh --build-dir build --no-build # pack existing binaries (tests the packing)
#
# Steps:
#  1. configure build-device: Release, CMAKE_CUDA_ARCHITECTURES=90a (Hopper
#     only: one fatbin, small binaries), MT_NATIVE=OFF (the device's CPU is
#     another x86-64 model; no -march=native), tests on;
#  2. build KIT_TARGETS (those that exist) with ninja -j2;
#  3. stage bin/ (the targets), lib/ (their ldd closure minus what the device
#     provides: glibc, libstdc++/libgcc_s, every CUDA/NVIDIA library),
#     lib/fallback/ (our libstdc++ and libgcc_s, used there only if the
#     image's are too old), data/ (two small token datasets, below) and
#     MANIFEST.json (git revision, build flags, required GLIBC/GLIBCXX);
#  4. pack .devkit/kit.tar.xz (ignored by git; carried to the device with
#     carry: [".devkit"]), fail if it is over 48 MiB (the device's working
#     tree limit is 64 MiB in all);
#  5. verify: unpack into a temp dir and run its kernels_test (CPU tests) with
#     LD_LIBRARY_PATH = the kit's lib + the CUDA lib dir, recording with
#     LD_DEBUG where every library was loaded from: anything outside the kit
#     that the device does not provide means the closure is incomplete.
#
# Datasets (Megatron .bin/.idx, made with the build's own `megatron preprocess`):
#  - data/corpus_text_document: the first ~2 MB of the default corpus
#    (data/corpus/corpus.jsonl, made by scripts/setup.sh) in GPT-2 BPE ids,
#    EOD 50256; trained with --tokenizer-type NullTokenizer --vocab-size 50257
#    (whose EOD is vocab-1 = 50256, the same id), so no vocab files are needed.
#    Without the corpus: random ids in [0, 50256) instead (same flags work).
#  - data/random32k_text_document: ~400k random ids in [0, 31999), EOD 31999,
#    for the 1B benchmark (--vocab-size 32000).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
ROOT=$PWD

BUILD_DIR=build-device
DO_BUILD=1
KIT_OUT=.devkit/kit.tar.xz
JOBS=2
MAX_MIB=48
# The binaries the device check runs, by CMake target name. Add new ones here
# (a target that does not exist in this tree is skipped with a note).
KIT_TARGETS=(megatron kernels_test model_test comm_test nccl_test comm_nccl_test attention_bench norm_bench)

usage() {
  sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'
  echo "options: --build-dir DIR (default build-device)  --no-build  --out FILE (default .devkit/kit.tar.xz)  --jobs N"
}
while [ $# -gt 0 ]; do
  case "$1" in
    --build-dir) BUILD_DIR=$2; shift 2 ;;
    --no-build) DO_BUILD=0; shift ;;
    --out) KIT_OUT=$2; shift 2 ;;
    --jobs) JOBS=$2; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) echo "device_kit.sh: unknown argument '$1'" >&2; usage >&2; exit 2 ;;
  esac
done

die() { echo "device_kit.sh: error: $*" >&2; exit 1; }
mib() { awk -v b="$1" 'BEGIN { printf "%.2f", b / 1048576 }'; }  # bytes -> MiB
note() { printf '\n== %s\n' "$*"; }

# ---------------------------------------------------------------- 1-2. build
if [ "$DO_BUILD" = 1 ]; then
  note "configure $BUILD_DIR (Release, sm_90a, MT_NATIVE=OFF)"
  mkdir -p "$BUILD_DIR"
  cmake -S "$ROOT" -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a \
    -DMT_NATIVE=OFF -DMT_BUILD_TESTS=ON -DMT_ENABLE_CUDA=ON >"$BUILD_DIR/configure.log" 2>&1 \
    || { tail -30 "$BUILD_DIR/configure.log"; die "cmake failed (log: $BUILD_DIR/configure.log)"; }
  grep -q "CUDA backend ON" "$BUILD_DIR/configure.log" || die "cmake did not enable the CUDA backend (log: $BUILD_DIR/configure.log)"
fi
[ -f "$BUILD_DIR/build.ninja" ] || die "$BUILD_DIR/build.ninja missing: configure it first (drop --no-build)"
if grep -q '^MT_NATIVE:BOOL=ON' "$BUILD_DIR/CMakeCache.txt"; then
  echo "WARNING: $BUILD_DIR has MT_NATIVE=ON (-march=native for this host's CPU): its CPU kernels may use" \
       "instructions the device's CPU lacks. Use the default build-device for a real kit."
fi

targets=()
for t in "${KIT_TARGETS[@]}"; do
  if ninja -C "$BUILD_DIR" -t query "$t" >/dev/null 2>&1; then targets+=("$t")
  else echo "note: target $t does not exist in $BUILD_DIR: skipped"; fi
done
[ ${#targets[@]} -gt 0 ] || die "none of the targets exist: ${KIT_TARGETS[*]}"
if [ "$DO_BUILD" = 1 ]; then
  note "build ${targets[*]} (ninja -j$JOBS)"
  start=$(date +%s)
  ninja -C "$BUILD_DIR" -j"$JOBS" "${targets[@]}" || die "build failed"
  echo "built in $(( $(date +%s) - start )) s"
fi

# Where a target's executable is: megatron at the top, tests in tests/, benches in bench/.
binary_of() {
  local f
  for f in "$BUILD_DIR/$1" "$BUILD_DIR/tests/$1" "$BUILD_DIR/bench/$1" "$BUILD_DIR/tools/$1"; do
    [ -f "$f" ] && [ -x "$f" ] && { echo "$f"; return 0; }
  done
  return 1
}

# ---------------------------------------------------------------- 3. stage
STAGE=$(mktemp -d /tmp/mt_devkit.XXXXXX)
VERIFY=""
trap 'rm -rf "$STAGE" ${VERIFY:+"$VERIFY"}' EXIT
K=$STAGE/kit
mkdir -p "$K/bin" "$K/lib/fallback" "$K/data"

note "stage binaries"
for t in "${targets[@]}"; do
  b=$(binary_of "$t") || die "target $t has no executable in $BUILD_DIR (built?)"
  cp "$b" "$K/bin/$t"
  printf '  %-16s %8s MiB  %s\n' "$t" "$(mib "$(stat -c %s "$b")")" "$b"
done
"$K/bin/megatron" --version 2>&1 | grep -q "CUDA backend: compiled" \
  || die "$BUILD_DIR/megatron was built without the CUDA backend ('megatron --version' says: $("$K/bin/megatron" --version 2>&1 | tr '\n' ' '))"

# The device provides these: glibc (and its helper libraries), the C++ runtime
# (newer there, backward compatible), the CUDA driver and every CUDA/NVIDIA
# library (toolkit under /usr/local/cuda, cuDNN/NCCL as pip packages).
EXCLUDE='^(linux-vdso|linux-gate|ld-linux[^ ]*|libc|libm|libdl|libpthread|librt|libresolv|libutil|libanl|libmvec|libnsl|libBrokenLocale|libnss_[a-z]*|libstdc\+\+|libgcc_s|libcuda|libcudart[^ ]*|libcublas[^ ]*|libcudnn[^ ]*|libnccl[^ ]*|libnvidia[^ ]*|libnvrtc[^ ]*|libnvJitLink[^ ]*|libcufft[^ ]*|libcurand[^ ]*|libcusparse[^ ]*|libcusolver[^ ]*|libcupti[^ ]*|libnvToolsExt[^ ]*)\.so'

note "stage the shared-library closure (ldd), minus what the device provides"
declare -A seen=()
for b in "$K"/bin/*; do
  ldd_out=$(ldd "$b") || die "ldd $b failed"
  if grep -q "not found" <<<"$ldd_out"; then
    die "$b has unresolved libraries here: $(grep 'not found' <<<"$ldd_out" | tr -s ' \t' ' ')"
  fi
  # Lines: "libfoo.so.1 => /path/libfoo.so.1 (0x...)" or "/lib64/ld-linux-x86-64.so.2 (0x...)".
  while read -r name arrow path _; do
    [ "$arrow" = "=>" ] || continue
    [[ "$name" =~ $EXCLUDE ]] && continue
    [ -n "${seen[$name]:-}" ] && continue
    seen[$name]=$path
    cp -L "$path" "$K/lib/$name" || die "copy $path"
  done <<<"$ldd_out"
done
for name in $(printf '%s\n' "${!seen[@]}" | sort); do
  printf '  %-28s %7s MiB  %s\n' "$name" "$(mib "$(stat -c %s "$K/lib/$name")")" "${seen[$name]}"
done
# libstdc++/libgcc_s as a fallback only (device_check.sh adds lib/fallback
# when the image's libstdc++ lacks a GLIBCXX version ours needs).
for name in libstdc++.so.6 libgcc_s.so.1; do
  p=$(ldd "$K/bin/megatron" | awk -v n="$name" '$1 == n {print $3}')
  [ -n "$p" ] && cp -L "$p" "$K/lib/fallback/$name"
done

note "datasets"
MEG="$K/bin/megatron"
TMPD=$STAGE/tmpdata
mkdir -p "$TMPD"
CORPUS=data/corpus/corpus.jsonl
if [ -f "$CORPUS" ] && [ -f data/gpt2/vocab.json ] && [ -f data/gpt2/merges.txt ]; then
  # The first ~2 MB of documents (whole lines).
  awk '{ n += length($0) + 1; if (n > 2000000) exit; print }' "$CORPUS" >"$TMPD/corpus_small.jsonl"
  "$MEG" preprocess --input "$TMPD/corpus_small.jsonl" --output-prefix "$K/data/corpus" --tokenizer-type GPT2BPETokenizer \
    --vocab-file data/gpt2/vocab.json --merge-file data/gpt2/merges.txt --append-eod --workers "$JOBS" --quiet \
    || die "preprocess of the corpus failed"
  corpus_source="first $(wc -l <"$TMPD/corpus_small.jsonl") documents of $CORPUS, GPT-2 BPE"
else
  echo "note: $CORPUS or data/gpt2 missing (scripts/setup.sh makes them): random ids instead"
  python3 - "$TMPD/corpus_small.jsonl" 50256 600000 <<'PY'
import random, sys
r, vocab_eod, total = random.Random(11), int(sys.argv[2]), int(sys.argv[3])
with open(sys.argv[1], "w") as f:
    n = 0
    while n < total:
        k = r.randint(50, 2000); n += k
        f.write('{"text": "%s"}\n' % " ".join(str(r.randrange(vocab_eod)) for _ in range(k)))
PY
  "$MEG" preprocess --input "$TMPD/corpus_small.jsonl" --output-prefix "$K/data/corpus" --tokenizer-type NullTokenizer \
    --vocab-size 50257 --append-eod --workers "$JOBS" --quiet || die "preprocess of the random corpus failed"
  corpus_source="random ids in [0, 50256), NullTokenizer"
fi
python3 - "$TMPD/random32k.jsonl" 31999 400000 <<'PY'
import random, sys
r, eod, total = random.Random(12), int(sys.argv[2]), int(sys.argv[3])
with open(sys.argv[1], "w") as f:
    n = 0
    while n < total:
        k = r.randint(500, 4000); n += k
        f.write('{"text": "%s"}\n' % " ".join(str(r.randrange(eod)) for _ in range(k)))
PY
"$MEG" preprocess --input "$TMPD/random32k.jsonl" --output-prefix "$K/data/random32k" --tokenizer-type NullTokenizer \
  --vocab-size 32000 --append-eod --workers "$JOBS" --quiet || die "preprocess of the random 32k dataset failed"
rm -rf "$TMPD"
ls -l "$K/data"

# ---------------------------------------------------------------- manifest
max_sym() { # highest GLIBC_x / GLIBCXX_x version the kit's ELF files reference
  for f in "$K"/bin/* "$K"/lib/*.so*; do objdump -T "$f" 2>/dev/null; done \
    | grep -o "($1_[0-9.]*)" | tr -d '()' | sort -uV | tail -1
}
python3 - "$K/MANIFEST.json" <<PY
import json, sys
m = {
  "git_revision": "$(git rev-parse HEAD 2>/dev/null)",
  "git_dirty": $( [ -n "$(git status --porcelain 2>/dev/null)" ] && echo True || echo False ),
  "built": "$(date -u +%Y-%m-%dT%H:%M:%SZ)",
  "build_dir": "$BUILD_DIR",
  "cmake": {k: v for k, v in (l.split("=", 1) for l in """$(grep -E '^(CMAKE_BUILD_TYPE|CMAKE_CUDA_ARCHITECTURES|MT_NATIVE|CMAKE_CUDA_COMPILER|CMAKE_CXX_COMPILER):' "$BUILD_DIR/CMakeCache.txt" | sed 's/:[A-Z]*=/=/')""".splitlines() if "=" in l)},
  "nvcc": "$(/usr/local/cuda/bin/nvcc --version 2>/dev/null | tail -1)",
  "targets": "${targets[*]}".split(),
  "libs": sorted("${!seen[*]}".split()),
  "needs_glibc": "$(max_sym GLIBC)",
  "needs_glibcxx": "$(max_sym GLIBCXX)",
  "corpus": "$corpus_source",
}
json.dump(m, open(sys.argv[1], "w"), indent=1)
PY
cat "$K/MANIFEST.json"

# ---------------------------------------------------------------- 4. pack
note "pack $KIT_OUT"
mkdir -p "$(dirname "$KIT_OUT")"
rm -f "$KIT_OUT"
XZ_OPT="-6 -T$JOBS" tar -C "$STAGE" -cJf "$KIT_OUT" kit || die "tar failed"
bytes=$(stat -c %s "$KIT_OUT")
echo "kit: $KIT_OUT, $(mib "$bytes") MiB (unpacked $(du -sh "$K" | cut -f1))"
if [ "$bytes" -gt $((MAX_MIB * 1024 * 1024)) ]; then
  die "the kit is over $MAX_MIB MiB: the device's working tree limit is 64 MiB in all; drop targets or data"
fi

# ---------------------------------------------------------------- 5. verify
note "verify: unpack and run kernels_test's CPU tests on the kit's libraries alone"
VERIFY=$(mktemp -d /tmp/mt_devkit_verify.XXXXXX)
tar -C "$VERIFY" -xJf "$KIT_OUT" || die "unpack failed"
CUDA_LIB=/usr/local/cuda/lib64
[ -d "$CUDA_LIB" ] || CUDA_LIB=/usr/local/cuda/lib
KLD="$VERIFY/kit/lib:$CUDA_LIB"
# Every library each binary resolves to must come from the kit or be one the device provides.
bad=0
for b in "$VERIFY"/kit/bin/*; do
  while read -r name arrow path _; do
    [ "$arrow" = "=>" ] || continue
    case "$path" in "$VERIFY"/kit/lib/*) continue ;; esac
    [[ "$name" =~ $EXCLUDE ]] && continue
    echo "  $(basename "$b"): $name resolves outside the kit: $path"; bad=1
  done < <(LD_LIBRARY_PATH=$KLD ldd "$b")
done
[ $bad = 0 ] || die "the library closure is incomplete"
# Run it, logging where the loader found each library (dlopen'ed ones too).
LD_DEBUG=libs LD_DEBUG_OUTPUT="$VERIFY/lddebug" LD_LIBRARY_PATH=$KLD \
  "$VERIFY/kit/bin/kernels_test" --gtest_filter='Gemm.*:LayerNorm.*' || die "the kit's kernels_test failed"
loaded=$(cat "$VERIFY"/lddebug.* | sed -n 's/.*calling init: //p' | sort -u)
outside=$(grep -v "^$VERIFY/kit/lib/" <<<"$loaded" | while read -r p; do
  n=$(basename "$p"); [[ "$n" =~ $EXCLUDE ]] || echo "$p"; done)
echo "loaded from the kit: $(grep -c "^$VERIFY/kit/lib/" <<<"$loaded"); provided by the device: $(grep -vc "^$VERIFY/kit/lib/" <<<"$loaded")"
[ -z "$outside" ] || die "libraries loaded from outside the kit that the device does not provide: $outside"
LD_LIBRARY_PATH=$KLD "$VERIFY/kit/bin/megatron" --version || die "the kit's megatron --version failed"
echo "device_kit.sh: OK: $KIT_OUT ($(mib "$bytes") MiB). On the device: carry [\".devkit\"] and run: bash bench/device_check.sh"
