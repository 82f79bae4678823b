#!/usr/bin/env bash
# `megatron plan` as a user runs it: exit codes, one-line errors naming the
# flag, --help, --json, --html written atomically.
set -u
BIN=${1:?usage: plan_cli_test.sh path/to/megatron}
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }

# expect CODE "stderr/stdout substring" args...
expect() {
  local code=$1 needle=$2; shift 2
  "$BIN" "$@" >"$TMP/out" 2>"$TMP/err"
  local got=$?
  [ "$got" = "$code" ] || fail "megatron $* exited $got, expected $code; stderr: $(head -c 300 "$TMP/err")"
  if [ -n "$needle" ] && ! grep -qF -- "$needle" "$TMP/out" "$TMP/err"; then
    fail "megatron $* did not print '$needle'; got: $(head -c 300 "$TMP/out" "$TMP/err")"
  fi
  if [ "$code" = 2 ] && [ "$#" -gt 0 ] && [ -s "$TMP/err" ] && [ "$(wc -l <"$TMP/err")" -ne 1 ]; then
    fail "megatron $*: error is not one line: $(cat "$TMP/err")"
  fi
}

SEED="--world-size 32 --tensor-model-parallel-size 4 --pipeline-model-parallel-size 2 --num-parameters 13e9 --seq-length 2048 --micro-batch-size 2 --global-batch-size 64 --step-time 0.8"
SMALL="--world-size 8 --tensor-model-parallel-size 2 --pipeline-model-parallel-size 2 --num-layers 4 --hidden-size 256 --num-attention-heads 8 --seq-length 512 --max-position-embeddings 512 --vocab-size 50257 --micro-batch-size 1 --global-batch-size 8"

expect 0 "plan " --help
expect 0 "--tensor-model-parallel-size" plan --help
expect 2 "unknown subcommand 'frob'" frob
expect 2 "usage: megatron <subcommand>"
expect 0 "163,840 tokens/s" plan $SEED
expect 0 "208.0 GB" plan $SEED
expect 2 "--data-parallel-size" plan --world-size 30 --tensor-model-parallel-size 4 --pipeline-model-parallel-size 2 --data-parallel-size 4 --num-parameters 13e9 --seq-length 2048 --micro-batch-size 2
expect 2 "INVALID" plan --world-size 30 --tensor-model-parallel-size 4 --pipeline-model-parallel-size 2 --data-parallel-size 4 --num-parameters 13e9 --seq-length 2048 --micro-batch-size 2

# Bad input: one line, names the flag, exit 2.
expect 2 "--tensor-model-parallel-size: expected an integer, got 'two'" plan --tensor-model-parallel-size two
expect 2 "--tensor-model-parallel-size: must be a positive integer, got 0" plan --tensor-model-parallel-size 0
expect 2 "--pipeline-model-parallel-size: must be a positive integer, got -2" plan --pipeline-model-parallel-size -2
expect 2 "--world-size: '123456789012345678901234567890' is out of range" plan --world-size 123456789012345678901234567890
expect 2 "unknown flag --tensor-parallel-size; did you mean --tensor-model-parallel-size?" plan --tensor-parallel-size 2
expect 2 "--device: invalid choice 'tpu'" plan --device tpu
expect 2 "--hidden-size needs a value" plan --hidden-size
expect 2 "--vocab-file: cannot open" plan $SMALL --vocab-file "$TMP/nope.json" --vocab-size 5
expect 2 "--num-layers is required" plan --world-size 8 --micro-batch-size 1 --seq-length 8

# JSON is machine-readable and says the same thing.
"$BIN" plan $SMALL --json >"$TMP/plan.json" || fail "--json exited non-zero"
python3 - "$TMP/plan.json" <<'PY' || fail "JSON content"
import json, sys
j = json.load(open(sys.argv[1]))
assert j["valid"] is True
assert j["layout"]["dp"] == 2 and j["layout"]["world"] == 8
assert j["groups"]["tp"] == [[0, 1], [2, 3], [4, 5], [6, 7]], j["groups"]["tp"]
assert len(j["ranks"]) == 8
assert j["model"]["padded_vocab_size"] == 50432
PY
"$BIN" plan --world-size 3 --tensor-model-parallel-size 2 --json >"$TMP/bad.json"; [ $? = 2 ] || fail "invalid --json should exit 2"
python3 -c "import json,sys; j=json.load(open('$TMP/bad.json')); assert not j['valid'] and j['errors'], j" || fail "invalid JSON content"

# --html writes the page via a temporary name; no temporary is left behind.
"$BIN" plan $SMALL --html "$TMP/page.html" >/dev/null || fail "--html exited non-zero"
[ -s "$TMP/page.html" ] || fail "--html wrote nothing"
ls "$TMP" | grep -q '\.tmp\.' && fail "temporary file left behind"
grep -q 'const PLAN = {' "$TMP/page.html" || fail "page has no plan data"
"$BIN" plan $SMALL --html "$TMP/no/such/dir/page.html" >/dev/null 2>"$TMP/err"; [ $? = 1 ] || fail "--html into a missing directory should exit 1"
grep -q -- "--html" "$TMP/err" || fail "--html error does not name the flag"

# Under mpirun the world size comes from the launcher's environment.
OMPI_COMM_WORLD_SIZE=16 "$BIN" plan --tensor-model-parallel-size 2 --pipeline-model-parallel-size 2 --num-layers 4 --hidden-size 256 --num-attention-heads 8 --seq-length 512 --max-position-embeddings 512 --vocab-size 100 --micro-batch-size 1 >"$TMP/out" || fail "launcher world size"
grep -q "x 4 = 16" "$TMP/out" || fail "world size from OMPI_COMM_WORLD_SIZE not used: $(grep 'TP x' "$TMP/out")"

# ...and only rank 0 prints.
OMPI_COMM_WORLD_RANK=3 OMPI_COMM_WORLD_SIZE=8 "$BIN" plan $SMALL >"$TMP/out" || fail "rank 3 exit code"
[ -s "$TMP/out" ] && fail "a non-zero MPI rank printed the plan"

# --tp-comm-overlap changes nothing here but needs --sequence-parallel, as Megatron asserts.
"$BIN" plan $SMALL --tp-comm-overlap >"$TMP/out" 2>&1
[ $? = 2 ] && grep -q "tp-comm-overlap needs sequence parallelism" "$TMP/out" || { fail "--tp-comm-overlap without SP"; cat "$TMP/out"; }
"$BIN" plan $SMALL --tp-comm-overlap --sequence-parallel >/dev/null 2>&1 || fail "--tp-comm-overlap with SP"

# --config: the YAML file's flags, as `megatron train` reads them (the command line wins).
printf 'world_size: 8\ntensor-model-parallel-size: 2\npipeline-model-parallel-size: 2\nnum-layers: 4\nhidden-size: 256\nnum-attention-heads: 8\nseq-length: 512\nmax-position-embeddings: 512\nvocab-size: 50257\nmicro-batch-size: 1\nglobal-batch-size: 4\n' >"$TMP/plan.yaml"
"$BIN" plan --config "$TMP/plan.yaml" --global-batch-size 8 --json >"$TMP/cfg.json" || fail "plan --config exit code"
"$BIN" plan $SMALL --json >"$TMP/flags.json" || fail "plan exit code"
cmp -s "$TMP/cfg.json" "$TMP/flags.json" || fail "plan --config differs from the same flags on the command line"
for bad in "$TMP/none.yaml" "$TMP"; do
  "$BIN" plan $SMALL --config "$bad" >/dev/null 2>"$TMP/err"
  [ $? = 2 ] && grep -q -- "--config: " "$TMP/err" || { fail "plan --config $bad"; cat "$TMP/err"; }
done

if [ "$fails" -gt 0 ]; then echo "$fails failure(s)"; exit 1; fi
echo "plan CLI: all checks passed"
