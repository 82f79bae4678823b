#!/usr/bin/env bash
# Builds the libFuzzer targets with clang (address + undefined sanitizers)
# and runs each for a bounded time. Exit 77 (ctest: skipped) without clang's
# fuzzer runtime (Debian clang-14 + libclang-rt-14-dev).
set -euo pipefail
SRC=${1:?usage: run_fuzzers.sh SOURCE_DIR BUILD_DIR [SECONDS]}
OUT=${2:?}
SECONDS_EACH=${3:-20}
CXX=$(command -v clang++-14 || command -v clang++ || true)
if [ -z "$CXX" ]; then echo "SKIP: clang++ not found"; exit 77; fi
mkdir -p "$OUT"
if ! echo 'extern "C" int LLVMFuzzerTestOneInput(const unsigned char*, unsigned long){return 0;}' |
     "$CXX" -x c++ -fsanitize=fuzzer - -o "$OUT/probe" 2>/dev/null; then
  echo "SKIP: clang has no libFuzzer runtime (install libclang-rt-14-dev)"; exit 77
fi
FLAGS=(-std=c++20 -O1 -g -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined -I"$SRC/src")
LIBS=(-lfmt -lsimdjson -lz -lpthread)
CORE=("$SRC/src/core/status.cc" "$SRC/src/core/file.cc")
build() { # name sources...
  local name=$1; shift
  if [ ! -x "$OUT/$name" ] || [ -n "$(find "$@" "$SRC/src/data" -newer "$OUT/$name" -print -quit)" ]; then
    "$CXX" "${FLAGS[@]}" "$@" "${CORE[@]}" "${LIBS[@]}" -o "$OUT/$name"
  fi
}
build idx_fuzz "$SRC/tests/fuzz/idx_fuzz.cc" "$SRC/src/data/indexed_dataset.cc"
build jsonl_fuzz "$SRC/tests/fuzz/jsonl_fuzz.cc" "$SRC/src/data/jsonl.cc"

# Seed corpora: valid files (Megatron's golden .idx/.bin, the JSONL test data).
SHARED="$SRC/../shared/testdata/megatron-preprocess"
mkdir -p "$OUT/corpus_idx" "$OUT/corpus_jsonl"
if [ -f "$SHARED/small_text_document.idx" ]; then
  python3 - "$SHARED" "$OUT/corpus_idx/golden" <<'PY'
import sys
d, out = sys.argv[1], sys.argv[2]
idx = open(d + "/small_text_document.idx", "rb").read()
b = open(d + "/small_text_document.bin", "rb").read()[:512]
total = 1 + len(idx) + len(b)
cut = len(idx) + 1
first = min(255, (cut * 256) // total + 1)
open(out, "wb").write(bytes([first]) + idx + b)
PY
  head -c 4000 "$SHARED/small.jsonl" > "$OUT/corpus_jsonl/small"
fi
printf '{"text": "a"}\n{"title": "t", "text": ["x", "y"]}\n\n[1]\n{"text": "\\ud800"}' > "$OUT/corpus_jsonl/edge"

status=0
for f in idx_fuzz jsonl_fuzz; do
  corpus="$OUT/corpus_${f%_fuzz}"
  echo "== $f for ${SECONDS_EACH}s"
  if ! (cd "$OUT" && "./$f" -max_total_time="$SECONDS_EACH" -max_len=4096 -timeout=10 -rss_limit_mb=2048 \
        -print_final_stats=1 "$corpus" > "$OUT/$f.log" 2>&1); then
    echo "FAIL: $f found a crash; see $OUT/$f.log"; tail -40 "$OUT/$f.log"; status=1
  else
    grep -E "stat::number_of_executed_units|cov:" "$OUT/$f.log" | tail -2
  fi
done
rm -f /tmp/mt_idx_fuzz_* /tmp/mt_jsonl_fuzz_*
exit $status
