#!/usr/bin/env bash
# `megatron train` end to end on a small NullTokenizer dataset:
#  - resume is exact: 40 iterations straight == 20 (stopped by --exit-interval,
#    and separately by SIGTERM with --exit-signal-handler) + resumed to 40,
#    per-iteration losses and final parameters bitwise; also with --bf16, with
#    --fp16 (the loss scaler's state too) and with gradient accumulation;
#  - loss scaling (--fp16's dynamic scaler, --loss-scale) follows Megatron's rules;
#  - a save killed mid-write leaves the previous checkpoint loadable;
#  - NaN in the loss is reported with its iteration;
#  - --use-checkpoint-args resumes with the checkpoint's model flags;
#  - --data-args-path and --per-split-data-args-path read the data flags from files;
#  - --mock-data trains on Megatron's synthetic documents;
#  - --calculate-per-token-loss does not depend on the micro-batch split;
#  - --dataloader-type cyclic resumes exactly (its order is stateless);
#  - --optimizer sgd resumes exactly and refuses to resume as adam;
#  - configuration errors are all listed at once, exit code 2.
set -u
BIN=${1:?usage: train_cli_test.sh path/to/megatron}
HERE=$(cd "$(dirname "$0")" && pwd)  # tb_events.py
TMP=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null; rm -rf "$TMP"' EXIT
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }

# A dataset of 400 documents of random ids in [0, 500), EOD 511.
python3 - "$TMP/in.jsonl" <<'PY'
import random, sys
r = random.Random(5)
with open(sys.argv[1], "w") as f:
    for _ in range(400):
        n = r.randint(5, 60)
        f.write('{"text": "%s"}\n' % " ".join(str(r.randrange(500)) for _ in range(n)))
PY
"$BIN" preprocess --input "$TMP/in.jsonl" --output-prefix "$TMP/d" --tokenizer-type NullTokenizer --vocab-size 512 \
  --append-eod --workers 2 --quiet >/dev/null || fail "preprocess"

COMMON=(--num-layers 2 --hidden-size 64 --num-attention-heads 4 --seq-length 32 --max-position-embeddings 32
  --tokenizer-type NullTokenizer --vocab-size 512 --data-path "$TMP/d_text_document" --split 90,10,0
  --lr 3e-3 --min-lr 3e-4 --lr-decay-style cosine --lr-warmup-iters 5 --weight-decay 0.1 --clip-grad 1.0
  --seed 7 --log-interval 10 --no-progress --threads 1 --data-cache-path "$TMP/cache")

losses() { python3 -c "
import json,sys
for l in open(sys.argv[1]):
    j=json.loads(l)
    if 'lm_loss' in j and 'kind' not in j: print(j['iteration'], repr(j['lm_loss']))" "$1"; }

# run NAME extra-flags... : trains into $TMP/NAME
run() { local name=$1; shift; "$BIN" train "${COMMON[@]}" --save "$TMP/$name" --metrics-file "$TMP/$name.jsonl" "$@" \
  >"$TMP/$name.log" 2>&1; }

check_resume() { # label extra-flags...
  local label=$1; shift
  run "$label-full" --train-iters 40 --save-interval 40 "$@" || { fail "$label: straight run"; cat "$TMP/$label-full.log"; return; }
  run "$label-part" --train-iters 40 --save-interval 100 --exit-interval 20 "$@" || { fail "$label: first half"; cat "$TMP/$label-part.log"; return; }
  grep -q "exiting at iteration 20 (exit-interval)" "$TMP/$label-part.log" || fail "$label: no exit at 20"
  run "$label-part" --train-iters 40 --save-interval 40 --load "$TMP/$label-part" "$@" || { fail "$label: resume"; cat "$TMP/$label-part.log"; return; }
  grep -q "loaded checkpoint" "$TMP/$label-part.log" || fail "$label: resume did not load"
  diff <(losses "$TMP/$label-full.jsonl") <(losses "$TMP/$label-part.jsonl") >/dev/null || fail "$label: losses differ after resume"
  [ "$(losses "$TMP/$label-full.jsonl" | wc -l)" = 40 ] || fail "$label: expected 40 loss lines"
  cmp -s "$TMP/$label-full/iter_0000040/model_rank00000.safetensors" "$TMP/$label-part/iter_0000040/model_rank00000.safetensors" \
    || fail "$label: final parameters differ after resume"
}

check_resume fp32 --micro-batch-size 4 --global-batch-size 4
check_resume bf16 --micro-batch-size 2 --global-batch-size 4 --bf16 --recompute-granularity full --recompute-method block --recompute-num-layers 1
check_resume threads2 --micro-batch-size 2 --global-batch-size 4 --threads 2
check_resume accum --micro-batch-size 1 --global-batch-size 4 --hidden-dropout 0.1 --attention-dropout 0.1
check_resume cyclic --micro-batch-size 2 --global-batch-size 4 --dataloader-type cyclic
# --multi-latent-attention (low-rank q and kv with their norms, YaRN) under
# --bf16 resumes exactly; a resume with --use-checkpoint-args and no MLA
# flags takes them from the checkpoint (they are not in Megatron's list;
# --qk-layernorm, which Megatron leaves to the command line, is given).
MLA=(--multi-latent-attention --q-lora-rank 24 --kv-lora-rank 16 --qk-head-dim 12 --qk-pos-emb-head-dim 4
  --v-head-dim 8 --qk-layernorm --rotary-scaling-factor 40 --mscale-all-dim 0.707)
check_resume mla --micro-batch-size 2 --global-batch-size 4 --bf16 "${MLA[@]}"
grep -q "training a GPT with multi-latent attention (q rank 24, kv rank 16, heads 12 + 4 rotated (YaRN x40), values 8)" \
  "$TMP/mla-full.log" || { fail "mla: the run's description"; head -5 "$TMP/mla-full.log"; }
run mla-args --micro-batch-size 2 --global-batch-size 4 --bf16 --train-iters 41 --save-interval 41 --qk-layernorm \
  --override-opt-param-scheduler \
  --use-checkpoint-args --load "$TMP/mla-part" \
  || { fail "mla: --use-checkpoint-args resume"; cat "$TMP/mla-args.log"; }
grep -q "setting --multi-latent-attention from checkpoint" "$TMP/mla-args.log" \
  && grep -q "setting --q-lora-rank to 24 from checkpoint" "$TMP/mla-args.log" \
  && grep -q "setting --rotary-scaling-factor to 40 from checkpoint" "$TMP/mla-args.log" \
  && grep -q "iteration       41/      41" "$TMP/mla-args.log" || { fail "mla: checkpoint args"; cat "$TMP/mla-args.log"; }
# Megatron's refusals, all listed before anything runs (exit 2).
"$BIN" train "${COMMON[@]}" --micro-batch-size 2 --global-batch-size 4 --train-iters 1 --multi-latent-attention \
  --group-query-attention --num-query-groups 2 --rotary-interleaved --qk-pos-emb-head-dim 5 >"$TMP/mla-bad.log" 2>&1
[ $? = 2 ] && grep -q "\-\-group-query-attention" "$TMP/mla-bad.log" && grep -q "\-\-rotary-interleaved" "$TMP/mla-bad.log" \
  && grep -q "\-\-qk-pos-emb-head-dim 5 is odd" "$TMP/mla-bad.log" || { fail "mla: refusals"; cat "$TMP/mla-bad.log"; }
# --mtp-num-layers: two multi-token prediction depths under --bf16 resume
# exactly (their parameters in the checkpoint), the log line has each
# depth's loss, and --use-checkpoint-args takes the depth count (Megatron
# forces it); learned absolute positions are refused, as Megatron does.
check_resume mtp --micro-batch-size 2 --global-batch-size 4 --bf16 --position-embedding-type rope --mtp-num-layers 2
grep -q "predicting 2 more tokens ahead (2 MTP layers, loss weight 0.1)" "$TMP/mtp-full.log" \
  && grep -q "| lm loss: [0-9.E+-]* | mtp_1 loss: [0-9.E+-]* | mtp_2 loss: [0-9.E+-]* |" "$TMP/mtp-full.log" \
  || { fail "mtp: the log lines"; head -5 "$TMP/mtp-full.log"; }
python3 -c "
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if '\"kind\"' not in l]
r = rows[-1]
assert all(0 <= r[f'mtp_{k}_{n}'] <= 100 for k in (1, 2) for n in ('acceptance_rate', 'cumulative_acceptance_rate')), r
" "$TMP/mtp-full.jsonl" || fail "mtp: acceptance rates in the metrics"

run mtp-args --micro-batch-size 2 --global-batch-size 4 --bf16 --train-iters 41 --save-interval 41 \
  --override-opt-param-scheduler --use-checkpoint-args --load "$TMP/mtp-part" \
  || { fail "mtp: --use-checkpoint-args resume"; cat "$TMP/mtp-args.log"; }
grep -q "setting --mtp-num-layers to 2 from checkpoint" "$TMP/mtp-args.log" \
  && grep -q "iteration       41/      41 .* mtp_2 loss" "$TMP/mtp-args.log" || { fail "mtp: checkpoint args"; cat "$TMP/mtp-args.log"; }
# --mtp-use-repeated-layer: one MTP layer's parameters at both depths.
run mtp-rep --micro-batch-size 2 --global-batch-size 4 --train-iters 6 --save-interval 6 --lr-warmup-iters 1 --position-embedding-type rope \
  --mtp-num-layers 2 --mtp-use-repeated-layer || { fail "mtp: repeated layer"; cat "$TMP/mtp-rep.log"; }
grep -q "predicting 2 more tokens ahead (one MTP layer repeated, loss weight 0.1)" "$TMP/mtp-rep.log" \
  && grep -q "mtp_2 loss" "$TMP/mtp-rep.log" || { fail "mtp: repeated layer's log"; cat "$TMP/mtp-rep.log"; }
python3 -c "
import json, struct, sys
f = open(sys.argv[1], 'rb'); n = struct.unpack('<Q', f.read(8))[0]; names = json.loads(f.read(n))
mtp = {k.split('.')[2] for k in names if k.startswith('mtp.layers.')}
assert mtp == {'0'}, mtp
" "$TMP/mtp-rep/iter_0000006/model_rank00000.safetensors" || fail "mtp: the repeated layer saved once"
"$BIN" train "${COMMON[@]}" --micro-batch-size 2 --global-batch-size 4 --train-iters 1 --mtp-num-layers 1 \
  >"$TMP/mtp-bad.log" 2>&1
[ $? = 2 ] && grep -q "supports MTP with rope and none only" "$TMP/mtp-bad.log" || { fail "mtp: refusal"; cat "$TMP/mtp-bad.log"; }
# fp16 with a dynamic loss scale that grows every 3 clean iterations from
# 2^16 until an overflow halves it: the scaler's state (scale, growth and
# hysteresis trackers) must come back from the checkpoint for the resumed
# run to skip, and so to train, as the straight one.
check_resume fp16 --micro-batch-size 2 --global-batch-size 4 --fp16 --initial-loss-scale 65536 --loss-scale-window 3
scales() { python3 -c "
import json,sys
for l in open(sys.argv[1]):
    j=json.loads(l)
    if 'loss_scale' in j and 'kind' not in j: print(j['iteration'], j['loss_scale'], j['skipped'])" "$1"; }
diff <(scales "$TMP/fp16-full.jsonl") <(scales "$TMP/fp16-part.jsonl") >/dev/null && [ "$(scales "$TMP/fp16-full.jsonl" | wc -l)" = 40 ] \
  || fail "fp16: loss scales or skipped iterations differ after resume"

# Loss scaling (--fp16, --loss-scale) against Megatron's rules:
#  - dynamic (Megatron's defaults: 2^32, hysteresis 2, window 1000): every
#    iteration whose gradients hold an inf or NaN is skipped (no update, the
#    LR schedule does not move), and the scale follows DynamicGradScaler
#    replayed here from the skip flags; the log line prints the scale, the
#    skipped count of its interval and leaves the grad norm out after a skip;
#  - a constant power-of-2 scale commutes with rounding, so --bf16
#    --loss-scale 4096 trains bit for bit as --bf16, and so does fp32 with the
#    distributed optimizer (which has a grad scaler in Megatron too);
#  - --fp16 --loss-scale 4096 skips nothing here and trains as fp32 within
#    fp16 tolerance.
run fp16-dyn --micro-batch-size 2 --global-batch-size 4 --train-iters 30 --save-interval 30 --fp16 --log-interval 5 \
  || { fail "fp16 dynamic run"; cat "$TMP/fp16-dyn.log"; }
python3 - "$TMP/fp16-dyn.jsonl" "$TMP/fp16-dyn.log" <<'PY' || fail "fp16 dynamic loss scaling"
import json, re, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
it_rows = [r for r in rows if "kind" not in r and "loss_scale" in r]
assert len(it_rows) == 30, len(it_rows)
scale, growth, hyst = 2.0 ** 32, 0, 2  # Megatron's DynamicGradScaler, step by step
prev_lr = None
for r in it_rows:
    if r["skipped"]:
        growth, hyst = 0, hyst - 1
        if hyst <= 0: scale = max(scale * 0.5, 1.0)
        assert "grad_norm" not in r, r
        if prev_lr is not None: assert r["learning_rate"] == prev_lr, ("LR moved on a skipped iteration", r)
    else:
        growth += 1
        if growth == 1000: growth, hyst, scale = 0, 2, scale * 2
        assert "grad_norm" in r, r
    assert r["loss_scale"] == scale, (r["iteration"], r["loss_scale"], scale)
    prev_lr = r["learning_rate"]
skipped = [r["iteration"] for r in it_rows if r["skipped"]]
assert skipped[:3] == [1, 2, 3] and 10 <= len(skipped) < 25, skipped  # 2^32 overflows fp16 until it is ~2^20
assert it_rows[0]["learning_rate"] == 0.0  # warmup has not started: the first update has not happened
logs = [r for r in rows if r.get("kind") == "log"]
text = open(sys.argv[2]).read()
for lg in logs:
    n = sum(1 for r in it_rows if lg["iteration"] - 5 < r["iteration"] <= lg["iteration"] and r["skipped"])
    assert lg["skipped_iterations"] == n, (lg, n)
    line = re.search(r"iteration\s+%d/.*" % lg["iteration"], text).group(0)
    assert "loss scale: %.1f |" % lg["loss_scale"] in line, line
    assert "number of skipped iterations: %3d |" % n in line, line
    assert ("grad norm:" in line) == (not it_rows[lg["iteration"] - 1]["skipped"]), line
    # The lm loss is the mean over the interval's advanced iterations: none when all were skipped.
    adv = [r["lm_loss"] for r in it_rows if lg["iteration"] - 5 < r["iteration"] <= lg["iteration"] and not r["skipped"]]
    assert ("lm loss:" in line) == bool(adv) and ("lm_loss" in lg) == bool(adv), (line, adv)
    if adv: assert abs(lg["lm_loss"] - sum(adv) / len(adv)) < 1e-12, (lg, adv)
assert any("lm_loss" not in lg for lg in logs), "expected a log interval with every iteration skipped"
print("fp16 dynamic scaling: %d of 30 iterations skipped, final scale %.0f" % (len(skipped), scale))
PY
for name in ls-bf16 ls-bf16-scaled ls-fp32-dist ls-fp32-dist-scaled ls-fp16; do
  case $name in
    ls-bf16) extra=(--bf16) ;;
    ls-bf16-scaled) extra=(--bf16 --loss-scale 4096) ;;
    ls-fp32-dist) extra=(--use-distributed-optimizer) ;;
    ls-fp32-dist-scaled) extra=(--use-distributed-optimizer --loss-scale 4096) ;;
    ls-fp16) extra=(--fp16 --loss-scale 4096) ;;
  esac
  run "$name" --micro-batch-size 2 --global-batch-size 4 --train-iters 20 --save-interval 20 "${extra[@]}" \
    || { fail "$name"; cat "$TMP/$name.log"; }
done
diff <(losses "$TMP/ls-bf16.jsonl") <(losses "$TMP/ls-bf16-scaled.jsonl") >/dev/null \
  && cmp -s "$TMP/ls-bf16/iter_0000020/model_rank00000.safetensors" "$TMP/ls-bf16-scaled/iter_0000020/model_rank00000.safetensors" \
  || fail "--bf16 --loss-scale 4096 is not bitwise --bf16"
diff <(losses "$TMP/ls-fp32-dist.jsonl") <(losses "$TMP/ls-fp32-dist-scaled.jsonl") >/dev/null \
  || fail "--use-distributed-optimizer --loss-scale 4096 is not bitwise without it"
python3 - "$TMP/ls-fp16.jsonl" "$TMP/ls-fp32-dist.jsonl" <<'PY' || fail "--fp16 --loss-scale 4096 against fp32"
import json, sys
def rows(p): return [json.loads(l) for l in open(p) if "kind" not in json.loads(l)]
h, f = rows(sys.argv[1]), rows(sys.argv[2])
assert not any(r["skipped"] for r in h) and all(r["loss_scale"] == 4096 for r in h)
worst = max(abs(a["lm_loss"] - b["lm_loss"]) / b["lm_loss"] for a, b in zip(h, f))
assert len(h) == len(f) == 20 and worst < 2e-3, worst
print("fp16 (constant scale 4096) vs fp32 over 20 iterations: losses within %.1e relative" % worst)
PY
grep -q "loss scale: 4096.0 |" "$TMP/ls-fp16.log" && grep -q -- "--fp16: gradients are accumulated and reduced in fp32" "$TMP/ls-fp16.log" \
  || fail "--fp16 log line or no-effect note"
"$BIN" train "${COMMON[@]}" --micro-batch-size 2 --global-batch-size 4 --train-iters 2 --lr-decay-iters 40 --fp16 --loss-scale -1 --hysteresis 0 \
  --min-loss-scale 0 2>"$TMP/err"
[ $? = 2 ] && grep -q "3 problems" "$TMP/err" && grep -q "\[--loss-scale\] -1 is not positive" "$TMP/err" \
  && grep -q "\[--hysteresis\] 0 must be at least 1" "$TMP/err" && grep -q "\[--min-loss-scale\] 0 is not positive" "$TMP/err" \
  || { fail "loss scale flags validated"; cat "$TMP/err"; }

# Recomputation changes memory, not numbers; measured buffers match the plan
# within 3% (here exactly: both come from the model's size tables).
for rc in none "full --recompute-method uniform --recompute-num-layers 1" selective; do
  name=rc-${rc%% *}
  extra=(); [ "$rc" != none ] && extra=(--recompute-granularity $rc)
  run "$name" --micro-batch-size 4 --global-batch-size 8 --train-iters 10 --save-interval 10 --hidden-dropout 0.1 \
    --attention-dropout 0.1 --log-interval 5 "${extra[@]}" || { fail "recompute $rc"; cat "$TMP/$name.log"; }
done
for name in rc-full rc-selective; do
  diff <(losses "$TMP/rc-none.jsonl") <(losses "$TMP/$name.jsonl") >/dev/null || fail "$name: losses differ from no recomputation"
  cmp -s "$TMP/rc-none/iter_0000010/model_rank00000.safetensors" "$TMP/$name/iter_0000010/model_rank00000.safetensors" \
    || fail "$name: parameters differ from no recomputation"
done
# --calculate-per-token-loss: every counted token of the global batch weighs
# the same, so splitting it into 4 micro-batches trains what one micro-batch
# of 8 does; with --eod-mask-loss the micro-batches count different numbers of
# tokens, and the default (the mean over micro-batches of each one's mean)
# gives a different gradient. The reported loss is Megatron's token-weighted
# one in both modes (the same at iteration 1, from the same parameters).
PTL=(--global-batch-size 8 --train-iters 4 --lr-warmup-iters 1 --save-interval 100 --eod-mask-loss --hidden-dropout 0 --attention-dropout 0)
run ptl-m4 --micro-batch-size 2 --calculate-per-token-loss "${PTL[@]}" || { fail "per-token loss, 4 micro-batches"; cat "$TMP/ptl-m4.log"; }
run ptl-m1 --micro-batch-size 8 --calculate-per-token-loss "${PTL[@]}" || { fail "per-token loss, 1 micro-batch"; cat "$TMP/ptl-m1.log"; }
run mean-m4 --micro-batch-size 2 "${PTL[@]}" || { fail "mean loss, 4 micro-batches"; cat "$TMP/mean-m4.log"; }
python3 - "$TMP" <<'PY' || fail "--calculate-per-token-loss"
import json, sys
t = sys.argv[1]
def rows(n):
    return {j["iteration"]: j for j in map(json.loads, open(f"{t}/{n}.jsonl")) if "lm_loss" in j and "kind" not in j}
a, b, c = rows("ptl-m4"), rows("ptl-m1"), rows("mean-m4")
rel = lambda x, y: abs(x - y) / abs(y)
ok = True
for it in range(1, 5):
    for k in ("lm_loss", "grad_norm"):
        if rel(a[it][k], b[it][k]) > 1e-5:
            print(f"iteration {it} {k}: 4 micro-batches {a[it][k]!r} vs 1 micro-batch {b[it][k]!r}"); ok = False
if rel(c[1]["lm_loss"], b[1]["lm_loss"]) > 1e-6:
    print(f"reported loss at iteration 1: {c[1]['lm_loss']!r} (mean mode) vs {b[1]['lm_loss']!r}"); ok = False
if rel(c[1]["grad_norm"], b[1]["grad_norm"]) < 1e-4:
    print(f"the mean-of-means gradient should differ: {c[1]['grad_norm']!r} vs {b[1]['grad_norm']!r}"); ok = False
sys.exit(0 if ok else 1)
PY

python3 - "$TMP" <<'PY' || fail "memory: measured vs planned"
import json, sys
t = sys.argv[1]
def mem(name):
    logs = [json.loads(l) for l in open(f"{t}/{name}.jsonl") if '"kind"' in l]
    return logs[-1]["memory_measured_bytes"], logs[-1]["memory_planned_bytes"]
m = {n: mem(n) for n in ("rc-none", "rc-full", "rc-selective", "bf16-full")}
for n, (meas, plan) in m.items():
    assert plan > 0 and abs(meas - plan) / plan < 0.03, (n, meas, plan)
assert m["rc-full"][0] < m["rc-none"][0], m  # a second configuration (bf16, block recompute) is checked too
assert m["rc-selective"][0] < m["rc-none"][0], m
print("memory (MiB):", {n: round(v[0] / 2**20, 2) for n, v in m.items()})
PY

# --bf16 keeps the residual stream and its gradient in bf16 (Megatron's
# default); --fp32-residual-connection keeps them in fp32. Both train the
# same model within bf16 tolerance, but not to the same bits, and the bf16
# stream measures (and plans) fewer bytes.
for name in res-bf16 res-fp32; do
  extra=(); [ $name = res-fp32 ] && extra=(--fp32-residual-connection)
  run "$name" --micro-batch-size 4 --global-batch-size 4 --train-iters 10 --save-interval 10 --log-interval 5 --bf16 "${extra[@]}" \
    || { fail "$name"; cat "$TMP/$name.log"; }
done
python3 - "$TMP" <<'PY' || fail "--fp32-residual-connection: losses or memory"
import json, sys
t = sys.argv[1]
def read(name):
    rows = [json.loads(l) for l in open(f"{t}/{name}.jsonl")]
    loss = [r["lm_loss"] for r in rows if "lm_loss" in r and "kind" not in r]
    mem = [r for r in rows if "memory_measured_bytes" in r][-1]
    return loss, mem["memory_measured_bytes"], mem["memory_planned_bytes"]
(lb, mb, pb), (lf, mf, pf) = read("res-bf16"), read("res-fp32")
assert len(lb) == len(lf) == 10, (lb, lf)
assert lb != lf, "bf16 and fp32 residual streams gave identical losses"
for a, b in zip(lb, lf):
    assert abs(a - b) < 2e-2 * b, (lb, lf)
assert mb < mf and abs(mb - pb) / pb < 0.03 and abs(mf - pf) / pf < 0.03, (mb, pb, mf, pf)
print("residual stream bf16 vs fp32: last loss %.5f vs %.5f, memory %.2f vs %.2f MiB" % (lb[-1], lf[-1], mb / 2**20, mf / 2**20))
PY

# SIGTERM with --exit-signal-handler: stop somewhere in the middle, resume to 40.
# (On a loaded machine the 40 iterations can end before the signal lands:
# then the attempt says nothing about the handler and is repeated.)
for attempt in 1 2 3 4 5; do
  rm -rf "$TMP/sig" "$TMP/sig.jsonl"
  "$BIN" train "${COMMON[@]}" --micro-batch-size 4 --global-batch-size 4 --train-iters 40 --save-interval 100 \
    --exit-signal-handler --save "$TMP/sig" --metrics-file "$TMP/sig.jsonl" >"$TMP/sig.log" 2>&1 &
  pid=$!
  for _ in $(seq 1 2400); do
    [ -f "$TMP/sig.jsonl" ] && [ "$(grep -c lm_loss "$TMP/sig.jsonl")" -ge 12 ] && break
    sleep 0.05
  done
  kill -TERM $pid 2>/dev/null
  wait $pid; rc=$?
  grep -q "(signal)" "$TMP/sig.log" && break
  [ "$(grep -c lm_loss "$TMP/sig.jsonl")" = 40 ] || break  # stopped early without saying why: a failure below
done
[ $rc = 0 ] || { fail "SIGTERM run exited $rc"; tail -20 "$TMP/sig.log"; }
grep -q "(signal)" "$TMP/sig.log" || fail "SIGTERM run did not report the signal exit"
"$BIN" train "${COMMON[@]}" --micro-batch-size 4 --global-batch-size 4 --train-iters 40 --save-interval 40 \
  --load "$TMP/sig" --save "$TMP/sig" --metrics-file "$TMP/sig.jsonl" >>"$TMP/sig.log" 2>&1 || fail "resume after SIGTERM"
diff <(losses "$TMP/fp32-full.jsonl") <(losses "$TMP/sig.jsonl") >/dev/null || fail "losses differ after a SIGTERM resume"
cmp -s "$TMP/fp32-full/iter_0000040/model_rank00000.safetensors" "$TMP/sig/iter_0000040/model_rank00000.safetensors" \
  || fail "parameters differ after a SIGTERM resume"

# A save killed mid-write: the previous checkpoint (10) stays the latest and loads.
run kill --micro-batch-size 4 --global-batch-size 4 --train-iters 20 --save-interval 10 --exit-interval 10 || fail "kill: first run"
MT_TEST_CHECKPOINT_PAUSE=mid_file "$BIN" train "${COMMON[@]}" --micro-batch-size 4 --global-batch-size 4 --train-iters 20 \
  --save-interval 10 --load "$TMP/kill" --save "$TMP/kill" >"$TMP/kill2.log" 2>&1 &
pid=$!
for _ in $(seq 1 2400); do [ -e "$TMP/kill/.paused_mid_file" ] && break; sleep 0.05; done
[ -e "$TMP/kill/.paused_mid_file" ] || fail "kill: the save never paused"
kill -KILL $pid; wait $pid 2>/dev/null
[ "$(cat "$TMP/kill/latest_checkpointed_iteration.txt")" = 10 ] || fail "kill: tracker moved"
run kill --micro-batch-size 4 --global-batch-size 4 --train-iters 20 --save-interval 10 --load "$TMP/kill" || fail "kill: resume"
grep -q "loaded checkpoint .*iter_0000010" "$TMP/kill.log" || fail "kill: did not resume from 10"

# --config FILE.yaml holds the same keys (dashes or underscores); the command line wins.
cat > "$TMP/cfg.yaml" <<YAML
num_layers: 2
hidden-size: 64
num_attention_heads: 4
seq_length: 32
max_position_embeddings: 32
tokenizer_type: NullTokenizer
vocab_size: 512
data_path: [$TMP/d_text_document]
split: "90,10,0"
lr: 3.0e-3
min_lr: 3.0e-4
lr_decay_style: cosine
lr_warmup_iters: 5
weight_decay: 0.1
seed: 7
micro_batch_size: 4
global_batch_size: 4
train_iters: 40
bf16: false
YAML
"$BIN" train --config "$TMP/cfg.yaml" --clip-grad 1.0 --threads 1 --no-progress --log-interval 10 \
  --data-cache-path "$TMP/cache" --metrics-file "$TMP/yaml.jsonl" --save "$TMP/yaml-ck" --save-interval 40 \
  >"$TMP/yaml.log" 2>&1 || { fail "--config run"; cat "$TMP/yaml.log"; }
diff <(losses "$TMP/fp32-full.jsonl") <(losses "$TMP/yaml.jsonl") >/dev/null || fail "--config run differs from the same flags"
# The checkpoint stores the file's flags, not its path: generation works once the file is gone.
mv "$TMP/cfg.yaml" "$TMP/cfg.yaml.moved"
python3 -c "import json,sys; a=json.load(open(sys.argv[1]))['args']['argv']; assert '--config' not in a and '--num-layers' in a, a" \
  "$TMP/yaml-ck/iter_0000040/common.json" || fail "--config: the checkpoint should store the expanded flags"
"$BIN" generate --load "$TMP/yaml-ck" --prompt "1 2 3" --max-new-tokens 2 >"$TMP/yaml-gen.log" 2>&1 \
  || { fail "--config: generate after the YAML file moved"; cat "$TMP/yaml-gen.log"; }
mv "$TMP/cfg.yaml.moved" "$TMP/cfg.yaml"
printf 'num_layers: [1, 2\n' > "$TMP/bad.yaml"
"$BIN" train --config "$TMP/bad.yaml" 2>"$TMP/err"; [ $? = 2 ] && grep -q "bad.yaml" "$TMP/err" || fail "a broken YAML file is not named"

# --exit-duration-in-mins 0: exit (after saving) once the first iteration is done.
run dur --micro-batch-size 4 --global-batch-size 4 --train-iters 40 --save-interval 100 --exit-duration-in-mins 0 || fail "duration run"
grep -q "exiting at iteration 1 (duration)" "$TMP/dur.log" || fail "--exit-duration-in-mins did not exit"
[ "$(cat "$TMP/dur/latest_checkpointed_iteration.txt")" = 1 ] || fail "--exit-duration-in-mins did not save"

# --finetune: only the model is loaded; iteration and data position restart.
run ft --micro-batch-size 4 --global-batch-size 4 --train-iters 10 --save-interval 10 --load "$TMP/fp32-full" --finetune || fail "finetune run"
grep -q "for fine-tuning" "$TMP/ft.log" || fail "finetune: no message"
[ "$(losses "$TMP/ft.jsonl" | head -1 | cut -d' ' -f1)" = 1 ] || fail "finetune: iteration did not restart at 1"

# MT_PROFILE_OPS=1: the op table after the run, GEMMs by shape with their FLOPs (2 M N K per call) in the
# metrics file; the forward GEMM of the fused QKV projection is 128 tokens x 192 x 64 here.
MT_PROFILE_OPS=1 run prof --micro-batch-size 4 --global-batch-size 4 --train-iters 6 --save-interval 100 \
  || { fail "profiled run"; cat "$TMP/prof.log"; }
grep -q "^op profile over 5 iteration(s)" "$TMP/prof.log" || fail "no op profile table: $(tail -3 "$TMP/prof.log")"
python3 - "$TMP/prof.jsonl" <<'PY' || fail "op_profile record"
import json, sys
rec = [json.loads(l) for l in open(sys.argv[1]) if '"op_profile"' in l][-1]
ops = {o["op"]: o for o in rec["ops"]}
qkv = ops["gemm 128x192x64 NT fp32>fp32"]
assert rec["iterations"] == 5 and qkv["calls"] == 2 * 5, (rec["iterations"], qkv)  # 2 layers x 5 iterations
assert qkv["flops"] == qkv["calls"] * 2 * 128 * 192 * 64, qkv
assert ops["attention_backward"]["flops"] == 2.5 * ops["attention_forward"]["flops"] > 0, ops["attention_forward"]
assert "gemm" not in ops and all(o["flops"] == 0 for n, o in ops.items() if not n.startswith(("gemm", "attention"))), ops
PY

# NaN detection (on by default, as in Megatron; older Megatron's switch
# accepted) names the iteration; --no-check-for-nan-in-loss-and-grad trains on.
for nan_flag in "" --check-for-nan-in-loss-and-grad; do
  MEGATRON_CPP_TEST_NAN_ITERATION=7 "$BIN" train "${COMMON[@]}" --micro-batch-size 4 --global-batch-size 4 --train-iters 20 \
    $nan_flag >"$TMP/nan.log" 2>&1
  [ $? = 2 ] || fail "NaN run should exit 2 (${nan_flag:-default})"
  grep -q "NaN or Inf found in the loss at iteration 7" "$TMP/nan.log" \
    || fail "NaN not reported with its iteration (${nan_flag:-default}): $(tail -2 "$TMP/nan.log")"
done
MEGATRON_CPP_TEST_NAN_ITERATION=7 "$BIN" train "${COMMON[@]}" --micro-batch-size 4 --global-batch-size 4 --train-iters 10 \
  --no-check-for-nan-in-loss-and-grad >"$TMP/nan.log" 2>&1 || fail "--no-check-for-nan-in-loss-and-grad: the run stopped"
# The same from a YAML file in Megatron's dest name (a store_false switch), through a FIFO.
MEGATRON_CPP_TEST_NAN_ITERATION=7 "$BIN" train "${COMMON[@]}" --micro-batch-size 4 --global-batch-size 4 --train-iters 10 \
  --config <(printf 'check_for_nan_in_loss_and_grad: false\n') >"$TMP/nan.log" 2>&1 \
  || { fail "YAML check_for_nan_in_loss_and_grad: false: the run stopped"; tail -3 "$TMP/nan.log"; }

# Configuration errors: all at once, exit 2, nothing allocated.
"$BIN" train --num-layers 3 --hidden-size 64 --num-attention-heads 5 --seq-length 64 --max-position-embeddings 32 \
  --micro-batch-size 1 --tokenizer-type NullTokenizer --vocab-size 512 --data-path "$TMP/d_text_document" \
  --train-iters 10 --train-samples 10 --use-torch-fsdp2 --dataloader-type cyclic --no-data-sharding >"$TMP/bad.log" 2>&1
[ $? = 2 ] || fail "bad configuration should exit 2"
for needle in "--lr is required" "--train-iters and --train-samples" "max_position_embeddings 32 is smaller than seq_length 64" \
              "hidden size 64 is not divisible by 5 heads" "[--use-torch-fsdp2] FSDP is not implemented" \
              "[--no-data-sharding] the cyclic loader without data sharding is not implemented"; do
  grep -qF -- "$needle" "$TMP/bad.log" || fail "bad configuration: missing '$needle'"
done
"$BIN" train --frobnicate 2>"$TMP/err"; [ $? = 2 ] && grep -q "unknown flag --frobnicate" "$TMP/err" || fail "unknown flag"

# A Megatron launch script: implementation and fusion flags are accepted and
# listed once; flags asking for what is not done here (TensorBoard, torch
# checkpoint formats, partial rotary, fp16, W&B) are refused together with the
# other configuration problems, each saying what to do instead; unknown flags
# are all listed at once.
MEGATRON_ONLY=(--use-mcore-models --transformer-impl transformer_engine --use-flash-attn --attention-softmax-in-fp32
  --no-masked-softmax-fusion --no-bias-dropout-fusion --distributed-backend nccl --num-workers 2 --log-throughput
  --timing-log-level 2 --accumulate-allreduce-grads-in-fp32 --empty-unused-memory-level 1 --no-mmap-bin-files
  --deterministic-mode --apply-query-key-layer-scaling --cuda-graph-impl none --rerun-mode validate_results
  --use-persistent-ckpt-worker --auto-detect-ckpt-format --dist-ckpt-optim-fully-reshardable --ckpt-fully-parallel-save
  --ckpt-fully-parallel-load --ckpt-assume-constant-structure --ddp-average-in-collective --no-gradient-reduce-div-fusion
  --ddp-pad-buckets-for-high-nccl-busbw --dataloader-defer-npy-index-mmap --no-one-logger --cross-entropy-fusion-impl native
  --disable-gloo-process-groups --async-strategy nvrx --te-rng-tracker --straggler-minmax-count 2 --test-mode
  --tp-comm-overlap-cfg tp.yaml --async-ckpt-use-cpu-shm --data-parallel-sharding-strategy no_shard)
run compat --micro-batch-size 4 --global-batch-size 4 --train-iters 2 --lr-decay-iters 40 --save-interval 2 "${MEGATRON_ONLY[@]}" \
  || { fail "Megatron no-effect flags"; cat "$TMP/compat.log"; }
for needle in "accepted with no effect here: --use-flash-attn: attention is always flash-style" \
              "accepted with no effect here: --distributed-backend: the backend follows --device" \
              "accepted with no effect here: --timing-log-level" \
              "accepted with no effect here: --empty-unused-memory-level: buffers are planned and allocated once" \
              "accepted with no effect here: --rerun-mode: there is no rerun state machine: a NaN or inf loss or gradient stops the run at once" \
              "accepted with no effect here: --te-rng-tracker: dropout masks come from Philox" \
              "accepted with no effect here: --disable-gloo-process-groups: there are no Gloo process groups here"; do
  grep -qF -- "$needle" "$TMP/compat.log" || fail "Megatron no-effect flags: missing '$needle'"
done
diff <(losses "$TMP/compat.jsonl") <(losses "$TMP/fp32-full.jsonl" | sed -n 1,2p) >/dev/null \
  || fail "Megatron no-effect flags changed the losses"
run refused --micro-batch-size 4 --global-batch-size 4 --train-iters 2 --lr-decay-iters 40 --save-interval 2 --wandb-project demo \
  --ckpt-format torch_dist --fp8-format hybrid --fp16-lm-cross-entropy --dataloader-type external --grad-reduce-in-bf16 --bf16 \
  --fp8-param-gather --fp8-amax-history-len 1024 --dist-ckpt-strictness log_all --batch-size 4 --checkpoint-activations \
  --log-straggler --wandb-entity me --use-megatron-fsdp --error-injection-rate 10 --error-injection-type transient_error
[ $? = 2 ] || fail "refused Megatron flags should exit 2"
for needle in "[--wandb-project] Weights & Biases logs are not written here" \
              "[--ckpt-format] checkpoints are megatron-cpp's own" "[--fp8-format] fp8 training is not implemented" \
              "[--fp16-lm-cross-entropy] the cross entropy takes fp32 logits here" \
              "[--dataloader-type] the external loader" "[--grad-reduce-in-bf16, --bf16] gradients are accumulated and reduced in fp32" \
              "[--fp8-param-gather] fp8 training" "[--fp8-amax-history-len] fp8 training" "[--dist-ckpt-strictness] checkpoints" \
              "[--batch-size] --batch-size is no longer valid (in Megatron too): use --micro-batch-size" \
              "[--checkpoint-activations] --checkpoint-activations is no longer valid (in Megatron too): use --recompute-activations" \
              "[--log-straggler] Megatron's straggler detector" "[--wandb-entity] Weights & Biases" \
              "[--use-megatron-fsdp] FSDP is not implemented" "[--error-injection-rate] there is no rerun state machine" \
              "[--error-injection-type] there is no rerun state machine"; do
  grep -qF -- "$needle" "$TMP/refused.log" || { fail "refused Megatron flags: missing '$needle'"; cat "$TMP/refused.log"; }
done
# Megatron's own checks on flags that change nothing here still apply.
"$BIN" train "${MOCK[@]}" --train-iters 2 --ddp-average-in-collective --calculate-per-token-loss --cuda-graph-impl \
  full_iteration --deterministic-mode --cross-entropy-loss-fusion --overlap-param-gather-with-optimizer-step \
  --dataloader-fast-cache-load --cross-entropy-fusion-impl te --defer-embedding-wgrad-compute \
  --overlap-p2p-communication-warmup-flush --hierarchical-context-parallel-sizes 2 2>"$TMP/err" >/dev/null
[ $? = 2 ] || fail "Megatron's checks on no-effect flags should exit 2"
for needle in "[--overlap-param-gather-with-optimizer-step, --use-distributed-optimizer, --overlap-param-gather]" \
              "[--deterministic-mode, --cross-entropy-loss-fusion] Megatron's --deterministic-mode refuses" \
              "[--ddp-average-in-collective, --calculate-per-token-loss]" \
              "[--cuda-graph-impl, --no-check-for-nan-in-loss-and-grad]" \
              "[--dataloader-fast-cache-load, --data-cache-path]" \
              "[--cross-entropy-loss-fusion, --cross-entropy-fusion-impl] Megatron refuses Transformer Engine's" \
              "[--defer-embedding-wgrad-compute, --pipeline-model-parallel-size]" \
              "[--overlap-p2p-communication-warmup-flush]" \
              "[--hierarchical-context-parallel-sizes, --context-parallel-size] the product"; do
  grep -qF -- "$needle" "$TMP/err" || { fail "Megatron's checks: missing '$needle'"; cat "$TMP/err"; }
done
# --tensorboard-dir: an event file that protobuf's own parser reads (Event,
# Summary and Value declared from tensorflow's field numbers), every record's
# masked CRC-32C checked, and Megatron's scalars equal to the metrics file's
# numbers (as float32), at their iterations and consumed-sample steps.
run tb --micro-batch-size 4 --global-batch-size 4 --train-iters 6 --lr-decay-iters 40 --save-interval 6 --log-interval 3 \
  --eval-interval 3 --eval-iters 1 --log-params-norm --log-num-zeros-in-grad --tensorboard-dir "$TMP/tb" --tensorboard-log-interval 2 \
  --log-timers-to-tensorboard --log-validation-ppl-to-tensorboard || { fail "--tensorboard-dir run"; cat "$TMP/tb.log"; }
/usr/bin/python3 - "$TMP" "$HERE" <<'PY' || fail "--tensorboard-dir: event file"
import json, math, sys
sys.path.insert(0, sys.argv[2])
from tb_events import events, scalars, f32
t = sys.argv[1]
ev = events(f"{t}/tb")
got = scalars(f"{t}/tb")
rows = [json.loads(l) for l in open(f"{t}/tb.jsonl")]
want = {}
for r in rows:
    if "lm_loss" in r and "kind" not in r and r["iteration"] % 2 == 0:
        it, s = r["iteration"], r["consumed_samples"]
        for tag, v in (("learning-rate", r["learning_rate"]), ("batch-size", 4.0), ("lm loss", r["lm_loss"]),
                       ("loss-scale", 1.0), ("grad-norm", r["grad_norm"]), ("params-norm", r["params_norm"]),
                       ("num-zeros", float(r["num_zeros"]))):
            want[(tag, it)] = want[(tag + " vs samples", s)] = f32(v)
    if "valid_lm_loss" in r:
        it, s = r["iteration"], 4 * r["iteration"]
        want[("lm loss validation", it)] = want[("lm loss validation vs samples", s)] = f32(r["valid_lm_loss"])
        ppl = math.exp(min(20, r["valid_lm_loss"]))
        want[("lm loss validation ppl", it)] = want[("lm loss validation ppl vs samples", s)] = f32(ppl)
    if "ms_per_iteration" in r:
        want[("iteration-time", r["iteration"])] = f32(r["ms_per_iteration"] / 1000)
        want[("throughput", r["iteration"])] = f32(r["tflops_per_device"])
assert set(got) == set(want), (sorted(set(got) ^ set(want)))
for k in want:
    assert got[k] == want[k], (k, got[k], want[k])
print(f"tensorboard: {len(ev)} events, {len(want)} scalars match the metrics file")
PY

# --exit-on-missing-checkpoint: a --load without a checkpoint stops the run
# (exit 2, a configuration problem naming the path) instead of training from
# scratch.
mkdir -p "$TMP/empty"
run missing --micro-batch-size 4 --global-batch-size 4 --train-iters 2 --lr-decay-iters 40 --save-interval 2 --load "$TMP/empty" \
  --exit-on-missing-checkpoint
[ $? = 2 ] && grep -qF -- "--load $TMP/empty: no checkpoint there" "$TMP/missing.log" \
  || { fail "--exit-on-missing-checkpoint"; cat "$TMP/missing.log"; }
# --use-checkpoint-args: a resume whose command line lacks the model flags
# (and gives a wrong forced one, --normalization RMSNorm) takes them from
# the checkpoint and continues exactly as the straight run; its own
# checkpoint stores the merged flags, so generation needs none.
CKARGS_DATA=(--seq-length 32 --max-position-embeddings 32 --data-path "$TMP/d_text_document" --split 90,10,0
  --lr 3e-3 --min-lr 3e-4 --lr-decay-style cosine --lr-warmup-iters 5 --weight-decay 0.1 --clip-grad 1.0
  --seed 7 --log-interval 10 --no-progress --threads 1 --data-cache-path "$TMP/cache" --micro-batch-size 4
  --global-batch-size 4 --train-iters 20)
CKARGS_MODEL=(--num-layers 2 --hidden-size 64 --num-attention-heads 4 --tokenizer-type NullTokenizer --vocab-size 512
  --swiglu --disable-bias-linear --position-embedding-type rope)
"$BIN" train "${CKARGS_MODEL[@]}" "${CKARGS_DATA[@]}" --save "$TMP/cka-full" --save-interval 20 \
  --metrics-file "$TMP/cka-full.jsonl" >"$TMP/cka-full.log" 2>&1 || { fail "ckpt-args: straight run"; cat "$TMP/cka-full.log"; }
"$BIN" train "${CKARGS_MODEL[@]}" "${CKARGS_DATA[@]}" --save "$TMP/cka-a" --save-interval 20 --exit-interval 10 \
  --metrics-file "$TMP/cka-a.jsonl" >"$TMP/cka-a.log" 2>&1 || { fail "ckpt-args: first half"; cat "$TMP/cka-a.log"; }
"$BIN" train "${CKARGS_DATA[@]}" --normalization RMSNorm --use-checkpoint-args --load "$TMP/cka-a" --save "$TMP/cka-b" \
  --save-interval 20 --metrics-file "$TMP/cka-b.jsonl" >"$TMP/cka-b.log" 2>&1 || { fail "ckpt-args: resume"; cat "$TMP/cka-b.log"; }
grep -q "setting --num-layers to 2 from checkpoint" "$TMP/cka-b.log" && grep -q "setting --swiglu from checkpoint" "$TMP/cka-b.log" \
  && grep -q "dropping --normalization: the checkpoint's arguments do not have it" "$TMP/cka-b.log" \
  || { fail "ckpt-args: notes"; cat "$TMP/cka-b.log"; }
diff <(losses "$TMP/cka-full.jsonl" | tail -n 10) <(losses "$TMP/cka-b.jsonl") >/dev/null \
  || { fail "ckpt-args: resumed losses differ from the straight run"; losses "$TMP/cka-full.jsonl"; losses "$TMP/cka-b.jsonl"; }
cmp -s "$TMP/cka-full/iter_0000020/model_rank00000.safetensors" "$TMP/cka-b/iter_0000020/model_rank00000.safetensors" \
  || fail "ckpt-args: final parameters differ from the straight run"
python3 - "$TMP/cka-b/iter_0000020/common.json" <<'PY' || fail "ckpt-args: merged flags not stored"
import json, sys
argv = json.load(open(sys.argv[1]))["args"]["argv"]
assert "--use-checkpoint-args" not in argv and "--swiglu" in argv and "--normalization" not in argv, argv
assert argv[argv.index("--hidden-size") + 1] == "64", argv
PY
"$BIN" generate --load "$TMP/cka-b" --prompt "1 2 3" --max-new-tokens 4 --seed 1 >"$TMP/cka-gen.log" 2>&1 \
  || { fail "ckpt-args: generate from the merged checkpoint"; cat "$TMP/cka-gen.log"; }
# A model flag Megatron does not take from the checkpoint, given differently: a warning.
"$BIN" train "${CKARGS_DATA[@]}" --norm-epsilon 1e-3 --use-checkpoint-args --load "$TMP/cka-a" --train-iters 11 \
  --override-opt-param-scheduler >"$TMP/cka-c.log" 2>&1 || { fail "ckpt-args: run with another --norm-epsilon"; cat "$TMP/cka-c.log"; }
grep -qF "warning: the checkpoint was trained with --norm-epsilon 1e-05 but this run has 0.001" "$TMP/cka-c.log" \
  && ! grep -q "warning: the checkpoint was trained with --use-rope-scaling" "$TMP/cka-c.log" \
  || { fail "ckpt-args: --norm-epsilon difference not warned of (or a false warning)"; cat "$TMP/cka-c.log"; }
"$BIN" train "${CKARGS_DATA[@]}" --use-checkpoint-args 2>"$TMP/err" >/dev/null
[ $? = 2 ] && grep -q -- "--use-checkpoint-args needs --load" "$TMP/err" || { fail "ckpt-args without --load"; cat "$TMP/err"; }

# A checkpoint with gated shared experts (--moe-shared-expert-gate): loading
# it into a model without the gates is refused naming the flag (nothing
# dropped in silence); --use-checkpoint-args takes the flag from it.
GATED=(--num-experts 2 --moe-router-topk 2 --moe-ffn-hidden-size 32 --moe-shared-expert-intermediate-size 32)
"$BIN" train "${CKARGS_MODEL[@]}" "${GATED[@]}" --moe-shared-expert-gate "${CKARGS_DATA[@]}" --train-iters 2 \
  --lr-decay-iters 40 --save-interval 2 --save "$TMP/gated" >"$TMP/gated.log" 2>&1 || { fail "gated shared expert: train"; cat "$TMP/gated.log"; }
grep -q "a gated shared expert of width 32" "$TMP/gated.log" || { fail "gated shared expert: header"; head -3 "$TMP/gated.log"; }
"$BIN" train "${CKARGS_MODEL[@]}" "${GATED[@]}" "${CKARGS_DATA[@]}" --train-iters 3 --lr-decay-iters 40 \
  --load "$TMP/gated" >"$TMP/gated-b.log" 2>&1; rc=$?
[ $rc != 0 ] && grep -q "mlp.shared_experts.gate_weight (its shared experts are gated) but this model's are not: add --moe-shared-expert-gate" "$TMP/gated-b.log" \
  || { fail "gated shared expert: loading without the gate should be refused (rc $rc)"; tail -5 "$TMP/gated-b.log"; }
"$BIN" train "${CKARGS_DATA[@]}" --use-checkpoint-args --train-iters 3 --lr-decay-iters 40 --override-opt-param-scheduler \
  --load "$TMP/gated" \
  >"$TMP/gated-c.log" 2>&1 \
  && grep -q "setting --moe-shared-expert-gate from checkpoint" "$TMP/gated-c.log" \
  || { fail "gated shared expert: --use-checkpoint-args"; tail -5 "$TMP/gated-c.log"; }

# --data-args-path / --per-split-data-args-path: the data flags read from a
# file train exactly as the same flags on the command line; a missing file
# is a configuration error naming it.
NODATA=()
for ((i = 0; i < ${#COMMON[@]}; i++)); do
  case "${COMMON[i]}" in --data-path|--split) i=$((i + 1)) ;; *) NODATA+=("${COMMON[i]}") ;; esac
done
DA=(--micro-batch-size 4 --global-batch-size 4 --train-iters 3 --lr-decay-iters 40 --eval-interval 3 --eval-iters 1)
echo "$TMP/d_text_document" >"$TMP/data_args.txt"
printf '{"train": "%s", "valid": ["%s"], "test": null}\n' "$TMP/d_text_document" "$TMP/d_text_document" >"$TMP/split_args.json"
"$BIN" train "${NODATA[@]}" "${DA[@]}" --data-path "$TMP/d_text_document" --split 90,10,0 --metrics-file "$TMP/da1.jsonl" >/dev/null 2>&1 \
  && "$BIN" train "${NODATA[@]}" "${DA[@]}" --data-args-path "$TMP/data_args.txt" --split 90,10,0 --metrics-file "$TMP/da2.jsonl" >/dev/null 2>&1 \
  && "$BIN" train "${NODATA[@]}" "${DA[@]}" --train-data-path "$TMP/d_text_document" --valid-data-path "$TMP/d_text_document" \
       --metrics-file "$TMP/da3.jsonl" >/dev/null 2>&1 \
  && "$BIN" train "${NODATA[@]}" "${DA[@]}" --per-split-data-args-path "$TMP/split_args.json" --metrics-file "$TMP/da4.jsonl" \
       >"$TMP/da4.log" 2>&1 || { fail "--data-args-path runs"; cat "$TMP/da4.log"; }
diff <(losses "$TMP/da1.jsonl") <(losses "$TMP/da2.jsonl") >/dev/null \
  && diff <(losses "$TMP/da3.jsonl") <(losses "$TMP/da4.jsonl") >/dev/null && [ "$(losses "$TMP/da4.jsonl" | wc -l)" = 3 ] \
  && grep -q valid_lm_loss "$TMP/da4.jsonl" || fail "--data-args-path / --per-split-data-args-path: different losses"
"$BIN" train "${NODATA[@]}" "${DA[@]}" --data-args-path "$TMP/nope.txt" 2>"$TMP/err" >/dev/null
[ $? = 2 ] && grep -qF -- "--data-args-path: cannot open '$TMP/nope.txt'" "$TMP/err" || { fail "--data-args-path missing file"; cat "$TMP/err"; }

# --mock-data: Megatron's synthetic documents (1, 2, 3, ..., EOD). The next
# token is the current one plus one, so even a tiny model learns it quickly:
# the loss starts at ln(512) and falls well below it. With a dataset too it
# is a configuration error (one data source).
MOCK=(--mock-data --tokenizer-type NullTokenizer --vocab-size 511 --num-layers 2 --hidden-size 64 --num-attention-heads 4
  --seq-length 32 --max-position-embeddings 32 --micro-batch-size 4 --global-batch-size 8 --lr 1e-2 --log-interval 1
  --no-progress --threads 1)
"$BIN" train "${MOCK[@]}" --train-iters 60 --metrics-file "$TMP/mock.jsonl" >"$TMP/mock.log" 2>&1 || { fail "--mock-data run"; cat "$TMP/mock.log"; }
grep -q "built train indices of mock: .* cached in memory" "$TMP/mock.log" || fail "--mock-data: no mock train indices"
python3 - "$TMP/mock.jsonl" <<'PY' || fail "--mock-data: loss did not fall as expected"
import json, math, sys
l = [json.loads(x)["lm_loss"] for x in open(sys.argv[1]) if "lm_loss" in x and "kind" not in x]
assert len(l) == 60, len(l)
assert abs(l[0] - math.log(512)) < 0.3, l[0]
assert l[-1] < 0.75 * math.log(512), l[-1]
print(f"mock data: loss {l[0]:.3f} -> {l[-1]:.3f}")
PY
"$BIN" train "${MOCK[@]}" --train-iters 2 --data-path "$TMP/d_text_document" 2>"$TMP/err" >/dev/null
[ $? = 2 ] && grep -q "a single data source must be provided" "$TMP/err" || { fail "--mock-data with --data-path"; cat "$TMP/err"; }

# Mixture of experts on the mock data: the router losses logged as Megatron
# names them, the loss falling; Megatron's dispatcher and grouped-GEMM flags
# accepted as no-ops; what is not implemented refused together, each named.
MOE=(--num-experts 4 --moe-router-topk 2 --moe-aux-loss-coeff 1e-2 --moe-z-loss-coeff 1e-3 --disable-bias-linear)
"$BIN" train "${MOCK[@]}" "${MOE[@]}" --moe-grouped-gemm --moe-token-dispatcher-type alltoall --moe-layer-freq "([1]*2)" \
  --moe-router-score-function softmax --train-iters 40 \
  --metrics-file "$TMP/moe.jsonl" >"$TMP/moe.log" 2>&1 || { fail "MoE run"; cat "$TMP/moe.log"; }
grep -q "training a GPT with 4 experts per layer (top 2)" "$TMP/moe.log" && grep -q "load_balancing_loss: " "$TMP/moe.log" \
  && grep -q "z_loss: " "$TMP/moe.log" && grep -q -- "--moe-token-dispatcher-type: " "$TMP/moe.log" \
  || { fail "MoE log line"; cat "$TMP/moe.log"; }
python3 - "$TMP/moe.jsonl" <<'PY' || fail "MoE: loss or router losses not as expected"
import json, math, sys
rows = [json.loads(x) for x in open(sys.argv[1])]
rows = [r for r in rows if "lm_loss" in r and "kind" not in r]
assert len(rows) == 40 and rows[-1]["lm_loss"] < 0.8 * math.log(512), rows[-1]
assert all(0.9 < r["load_balancing_loss"] < 2.5 and r["z_loss"] > 0 for r in rows), rows[0]
print(f"MoE mock data: loss {rows[0]['lm_loss']:.3f} -> {rows[-1]['lm_loss']:.3f}, "
      f"load balancing {rows[-1]['load_balancing_loss']:.3f}")
PY
# Token dropping: the header names the capacity (ceil(4 x 32 tokens x 2 / 4 x
# 0.5) = 32 of the 128 tokens a rank routes); a negative factor is dropless,
# as in Megatron (the same losses as without the flag).
"$BIN" train "${MOCK[@]}" "${MOE[@]}" --moe-layer-freq "([1]*2)" --moe-expert-capacity-factor 0.5 \
  --moe-token-drop-policy position --train-iters 3 --metrics-file "$TMP/moe-cap.jsonl" >"$TMP/moe-cap.log" 2>&1 \
  || { fail "MoE with token dropping"; cat "$TMP/moe-cap.log"; }
"$BIN" train "${MOCK[@]}" "${MOE[@]}" --moe-layer-freq "([1]*2)" --moe-expert-capacity-factor -1 \
  --train-iters 3 --metrics-file "$TMP/moe-neg.jsonl" >"$TMP/moe-neg.log" 2>&1 \
  || { fail "MoE with a negative capacity factor"; cat "$TMP/moe-neg.log"; }
grep -q "capacity factor 0.5: each expert keeps at most 32 of the 128 tokens a rank routes, dropping by position" "$TMP/moe-cap.log" \
  && ! grep -q "capacity factor" "$TMP/moe-neg.log" || { fail "token dropping header"; head -3 "$TMP/moe-cap.log"; }
python3 - "$TMP/moe.jsonl" "$TMP/moe-cap.jsonl" "$TMP/moe-neg.jsonl" <<'PY' || fail "token dropping: losses"
import json, sys
first = [[json.loads(x) for x in open(p) if '"lm_loss"' in x and '"kind"' not in x][0]["lm_loss"] for p in sys.argv[1:]]
assert first[2] == first[0] and first[1] != first[0], first
print(f"token dropping: first loss {first[1]:.6f} (capacity 0.5) vs {first[0]:.6f} (dropless, and with -1)")
PY
# --moe-layer-freq: a dense first layer (DeepSeek's first_k_dense) has the
# dense MLP's 2 x 64 x 256 parameters instead of the router's 4 x 64 and four
# experts' 4 x 2 x 64 x 256; the load-balancing loss is the mean over the one
# MoE layer (about 1, as the all-MoE run's); the checkpoint resumes with it.
"$BIN" train "${MOCK[@]}" "${MOE[@]}" --moe-layer-freq "[0]+[1]" --train-iters 4 --exit-interval 3 --save "$TMP/moe-freq" \
  --metrics-file "$TMP/moe-freq.jsonl" --moe-per-layer-logging --tensorboard-dir "$TMP/moe-freq-tb" >"$TMP/moe-freq.log" 2>&1 \
  || { fail "MoE with a dense first layer"; cat "$TMP/moe-freq.log"; }
"$BIN" train "${MOCK[@]}" "${MOE[@]}" --moe-layer-freq "[0]+[1]" --train-iters 4 --load "$TMP/moe-freq" \
  >"$TMP/moe-freq2.log" 2>&1 || { fail "MoE with a dense first layer: resume"; cat "$TMP/moe-freq2.log"; }
# --use-checkpoint-args takes the pattern from the checkpoint (forced, as Megatron's).
"$BIN" train "${MOCK[@]}" "${MOE[@]}" --train-iters 4 --load "$TMP/moe-freq" --use-checkpoint-args \
  >"$TMP/moe-freq3.log" 2>&1 && grep -q "in 1 of its 2 layers, the others dense" "$TMP/moe-freq3.log" \
  || { fail "--use-checkpoint-args: --moe-layer-freq"; tail -3 "$TMP/moe-freq3.log"; }
grep -q "training a GPT with 4 experts per layer (top 2) in 1 of its 2 layers, the others dense" "$TMP/moe-freq.log" \
  && [ "$(( $(sed -n 's/.*: \([0-9]*\) parameters,.*/\1/p' "$TMP/moe.log") - $(sed -n 's/.*: \([0-9]*\) parameters,.*/\1/p' "$TMP/moe-freq.log") ))" = 98560 ] \
  && grep -q "4 iterations from 3" "$TMP/moe-freq2.log" && grep -q "iteration  *4/  *4 " "$TMP/moe-freq2.log" \
  || { fail "--moe-layer-freq: header, parameters or resume"; head -3 "$TMP/moe-freq.log"; tail -3 "$TMP/moe-freq2.log"; }
# --moe-per-layer-logging: the MoE layers' losses in the metrics file and
# under Megatron's TensorBoard tags (moe/{name}_layer_{i}), beside the means
# (load_balancing_loss, z_loss) Megatron's tracker writes every iteration; the
# all-MoE model's two layers average to the logged mean.
"$BIN" train "${MOCK[@]}" "${MOE[@]}" --moe-per-layer-logging --train-iters 2 --metrics-file "$TMP/moe-pl.jsonl" \
  >"$TMP/moe-pl.log" 2>&1 || { fail "MoE with --moe-per-layer-logging"; cat "$TMP/moe-pl.log"; }
/usr/bin/python3 - "$TMP" "$HERE" <<'PY' || fail "--moe-layer-freq / --moe-per-layer-logging: router losses"
import json, sys
sys.path.insert(0, sys.argv[2])
from tb_events import scalars, f32
t = sys.argv[1]
load = lambda n: [json.loads(x) for x in open(f"{t}/{n}") if '"lm_loss"' in x and '"kind"' not in x]
rows = load("moe-freq.jsonl")
assert len(rows) == 3 and all(0.9 < r["load_balancing_loss"] < 2.5 for r in rows), rows
for r in rows:  # one MoE layer (layer 1): its losses are the means, layer 0 has none
    assert r["load_balancing_loss_layer_1"] == r["load_balancing_loss"] and r["z_loss_layer_1"] == r["z_loss"], r
    assert not any(k.endswith("_layer_0") for k in r), r
got = scalars(f"{t}/moe-freq-tb")
want = {}
for r in rows:
    for tag, key in (("load_balancing_loss", "load_balancing_loss"), ("z_loss", "z_loss"),
                     ("moe/load_balancing_loss_layer_1", "load_balancing_loss_layer_1"),
                     ("moe/z_loss_layer_1", "z_loss_layer_1")):
        want[(tag, r["iteration"])] = f32(r[key])
missing = [k for k in want if got.get(k) != want[k]]
assert not missing and not any(tag.endswith("_layer_0") for tag, _ in got), (missing, sorted(got)[:8])
for r in load("moe-pl.jsonl"):
    for name in ("load_balancing_loss", "z_loss"):
        a, b = r[f"{name}_layer_0"], r[f"{name}_layer_1"]
        assert a != b and abs((a + b) / 2 - r[name]) <= 1e-12 * r[name], (name, a, b, r[name])
print("per-layer router losses: one MoE layer's equal the means; two layers average to them")
PY
# --moe-input-jitter-eps: the router's input times uniform noise; the first
# loss moves off the plain run's (same seed, same data).
"$BIN" train "${MOCK[@]}" "${MOE[@]}" --moe-input-jitter-eps 0.2 --train-iters 2 --metrics-file "$TMP/moe-jit.jsonl" \
  >"$TMP/moe-jit.log" 2>&1 || { fail "MoE with router input jitter"; cat "$TMP/moe-jit.log"; }
python3 - "$TMP/moe.jsonl" "$TMP/moe-jit.jsonl" <<'PY' || fail "--moe-input-jitter-eps: first loss unchanged"
import json, sys
first = [[json.loads(x) for x in open(p) if '"lm_loss"' in x and '"kind"' not in x][0]["lm_loss"] for p in sys.argv[1:]]
assert first[0] != first[1] and abs(first[0] - first[1]) < 0.05 * first[0], first
PY
# DeepSeek's sequence-level load-balancing loss, logged under Megatron's name.
"$BIN" train "${MOCK[@]}" "${MOE[@]}" --moe-router-load-balancing-type seq_aux_loss --train-iters 2 \
  >"$TMP/moe-seq.log" 2>&1 || { fail "MoE with seq_aux_loss"; cat "$TMP/moe-seq.log"; }
grep -q "seq_load_balancing_loss: " "$TMP/moe-seq.log" && ! grep -q " load_balancing_loss: " "$TMP/moe-seq.log" \
  || { fail "seq_aux_loss log name"; grep iteration "$TMP/moe-seq.log" | head -2; }
# A shared expert (an MLP every token goes through) adds 2 layers x (fc1 + fc2)
# = 2 x 2 x 64 x 96 parameters to the same model; Megatron's overlap flag is a no-op.
"$BIN" train "${MOCK[@]}" "${MOE[@]}" --moe-shared-expert-intermediate-size 96 --moe-shared-expert-overlap \
  --train-iters 2 >"$TMP/moe-shared.log" 2>&1 || { fail "MoE with a shared expert"; cat "$TMP/moe-shared.log"; }
params() { sed -n 's/.*: \([0-9]*\) parameters,.*/\1/p' "$1"; }
# DeepSeek-V3's router: the expert bias moves by +-rate per step (3 steps of
# 0.01 here), stored with the checkpoint under Megatron's name.
"$BIN" train "${MOCK[@]}" "${MOE[@]}" --moe-router-score-function sigmoid --moe-router-enable-expert-bias \
  --moe-router-bias-update-rate 0.01 --train-iters 3 --save "$TMP/moe-sig" --save-interval 3 >"$TMP/moe-sig.log" 2>&1 \
  || { fail "MoE with the sigmoid router and expert bias"; cat "$TMP/moe-sig.log"; }
python3 - "$TMP/moe-sig/iter_0000003" <<'PY' || fail "expert bias: not moved by whole steps of the update rate"
import glob, json, struct, sys
seen = 0
for fn in glob.glob(sys.argv[1] + "/*.safetensors"):
    data = open(fn, "rb").read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    for key, h in header.items():
        if key.endswith("router.expert_bias"):
            b, e = h["data_offsets"]
            v = struct.unpack("<%df" % ((e - b) // 4), data[8 + n + b:8 + n + e])
            steps = [x / 0.01 for x in v]
            assert len(v) == 4 and all(abs(t - round(t)) < 1e-4 and abs(t) <= 3 for t in steps), v
            assert any(x != 0 for x in v), v
            seen += 1
assert seen == 2, seen
print("expert bias after 3 steps: whole steps of 0.01, both layers")
PY
[ "$(( $(params "$TMP/moe-shared.log") - $(params "$TMP/moe.log") ))" = 24576 ] \
  && grep -q "and a shared expert of width 96" "$TMP/moe-shared.log" \
  && grep -q -- "--moe-shared-expert-overlap: " "$TMP/moe-shared.log" \
  || { fail "shared expert: parameters, header or no-effect note"; head -3 "$TMP/moe-shared.log"; }
# Megatron's rule first (the planner's), then this trainer's own limits.
"$BIN" train "${MOCK[@]}" --num-experts 4 --moe-router-topk 1 --train-iters 2 2>"$TMP/err"
[ $? = 2 ] && grep -q -- "Please use --moe-router-pre-softmax when topk is 1" "$TMP/err" \
  || { fail "MoE refusals: top-1 softmax"; cat "$TMP/err"; }
"$BIN" train "${MOCK[@]}" --num-experts 4 --moe-router-topk 1 --moe-router-pre-softmax --train-iters 2 2>"$TMP/err"
[ $? = 2 ] && grep -q -- "add --disable-bias-linear" "$TMP/err" || { fail "MoE refusals: biases"; cat "$TMP/err"; }
"$BIN" train "${MOCK[@]}" "${MOE[@]}" --expert-model-parallel-size 3 --train-iters 2 2>"$TMP/err"
[ $? = 2 ] && grep -q "4 experts do not split over EP = 3" "$TMP/err" && grep -q "use --expert-model-parallel-size 4" "$TMP/err" \
  || { fail "EP that does not divide the experts"; cat "$TMP/err"; }
"$BIN" train "${MOCK[@]}" "${MOE[@]}" --moe-layer-freq "[1]*3" --moe-expert-capacity-factor 1.0 --moe-pad-expert-input-to-capacity \
  --train-iters 2 2>"$TMP/err"
[ $? = 2 ] && grep -q "2 problems" "$TMP/err" && grep -q "the list has 3 terms but --num-layers is 2" "$TMP/err" \
  && grep -q "padding each expert's input to its capacity" "$TMP/err" || { fail "MoE features not implemented, listed together"; cat "$TMP/err"; }

# Malformed inputs: clear errors, no abort, no hang.
# Ids up to 999 preprocessed for a 1024-token vocabulary, trained with 512:
# the first sample holding an id past 511 fails with the file and byte.
python3 - "$TMP/wide.jsonl" <<'PY'
import sys
with open(sys.argv[1], "w") as f:
    for i in range(50):
        f.write('{"text": "%s"}\n' % " ".join(str((i * 37 + k * 11) % 1000) for k in range(40)))
PY
"$BIN" preprocess --input "$TMP/wide.jsonl" --output-prefix "$TMP/wide" --tokenizer-type NullTokenizer --vocab-size 1024 \
  --quiet >/dev/null || fail "preprocess of the 1024-id dataset"
"$BIN" train "${COMMON[@]}" --data-path "$TMP/wide_text_document" --split 100,0,0 --micro-batch-size 2 \
  --global-batch-size 2 --train-iters 4 --lr-warmup-iters 1 2>"$TMP/err" >/dev/null
rc=$?
[ $rc = 1 ] && grep -q "wide_text_document.bin byte [0-9]* (sequence [0-9]*, token [0-9]*) holds token id [0-9]*, outside the model's vocabulary \[0, 512)" "$TMP/err" \
  || { fail "token ids past the vocabulary (rc $rc)"; cat "$TMP/err"; }
"$BIN" generate --load "$TMP/cka-b" --prompt "1 999 abc 2" --max-new-tokens 2 2>"$TMP/err" >/dev/null
rc=$?
[ $rc = 2 ] && grep -q -- "--prompt: NullTokenizer: id 999 at byte offset 2 is outside the vocabulary" "$TMP/err" \
  || { fail "generate: a prompt id outside the vocabulary (rc $rc)"; cat "$TMP/err"; }
"$BIN" generate --load "$TMP/cka-b" --prompt "1 2" --max-new-tokens 1 --vocab-file "$TMP/none.json" 2>"$TMP/err" >/dev/null
rc=$?
[ $rc = 2 ] && grep -q -- "--vocab-file: the checkpoint's tokenizer is NullTokenizer, which reads no such file" "$TMP/err" \
  || { fail "generate: a tokenizer file the checkpoint's tokenizer does not read (rc $rc)"; cat "$TMP/err"; }
# A FIFO in place of a checkpoint file is refused at once (a blocking read would hang).
cp -r "$TMP/cka-b" "$TMP/fifo-ck"
it_dir=$(ls -d "$TMP"/fifo-ck/iter_* | head -1)
for f in common.json "$(cd "$it_dir" && ls *.safetensors | head -1)"; do
  rm "$it_dir/$f" && mkfifo "$it_dir/$f"
  timeout 60 "$BIN" generate --load "$TMP/fifo-ck" --prompt "1 2" --max-new-tokens 1 2>"$TMP/err" >/dev/null
  rc=$?
  [ $rc != 124 ] && [ $rc != 0 ] && grep -q "$f' is not a regular file" "$TMP/err" \
    || { fail "a FIFO as $f (rc $rc)"; cat "$TMP/err"; }
  cp "$TMP/cka-b/$(basename "$it_dir")/$f" "$it_dir/$f.ok" && rm "$it_dir/$f" && mv "$it_dir/$f.ok" "$it_dir/$f"
done

# A NaN in a stored weight: generate and a resume refuse it by tensor and element.
rm -rf "$TMP/nan-ck" && cp -r "$TMP/cka-a" "$TMP/nan-ck"
python3 - "$TMP/nan-ck/iter_0000010/model_rank00000.safetensors" <<'PY'
import json, struct, sys
path = sys.argv[1]
data = bytearray(open(path, "rb").read())
n = struct.unpack("<Q", data[:8])[0]
h = json.loads(data[8:8 + n])
name = next(k for k in h if k.endswith("word_embeddings.weight"))
assert h[name]["dtype"] == "F32", h[name]
b = 8 + n + h[name]["data_offsets"][0] + 4 * 7
data[b:b + 4] = struct.pack("<f", float("nan"))
open(path, "wb").write(bytes(data))
PY
"$BIN" generate --load "$TMP/nan-ck" --prompt "1 2" --max-new-tokens 1 2>"$TMP/err" >/dev/null
rc=$?
[ $rc != 0 ] && grep -q "word_embeddings.weight' (from '.*model_rank00000.safetensors'): element 7 of the slice at offsets \[0, 0\] is not finite" "$TMP/err" \
  || { fail "generate: NaN weight (rc $rc)"; cat "$TMP/err"; }

# common.json counts that are not non-negative integers name their field.
for edit in "consumed_train_samples=-100" "consumed_train_samples=4.5" "optimizer.step=-1" "optimizer.step=\"4\""; do
  rm -rf "$TMP/bad-common" && cp -r "$TMP/cka-a" "$TMP/bad-common"
  python3 - "$TMP/bad-common/iter_0000010/common.json" "$edit" <<'PY'
import json, sys
path, edit = sys.argv[1], sys.argv[2]
key, val = edit.split("=", 1)
c = json.load(open(path))
o = c
for k in key.split(".")[:-1]:
    o = o[k]
o[key.split(".")[-1]] = json.loads(val)
json.dump(c, open(path, "w"))
PY
  "$BIN" train "${CKARGS_DATA[@]}" --use-checkpoint-args --load "$TMP/bad-common" --train-iters 11 \
    --override-opt-param-scheduler >/dev/null 2>"$TMP/err"
  rc=$?
  [ $rc != 0 ] && grep -qF "bad-common/iter_0000010/common.json: ${edit%%=*} is ${edit#*=}, expected a non-negative integer" "$TMP/err" \
    || { fail "common.json with $edit (rc $rc)"; cat "$TMP/err"; }
done
# A sample count no machine can index, or a step of 2^30 micro-batches:
# refused with the flags to lower, before any index or schedule is built.
# (2^42 samples: about 100 TiB of indices, more than any machine holds.)
timeout 60 "$BIN" train "${COMMON[@]}" --micro-batch-size 2 --global-batch-size 4 --train-iters 1099511627776 2>"$TMP/err" >/dev/null
rc=$?
[ $rc = 2 ] && grep -q "train split): 4398046511104 samples of 32 tokens .* GiB of dataset indices, more than this machine's .* GiB of memory: lower --train-iters" "$TMP/err" \
  || { fail "huge --train-iters (rc $rc)"; cat "$TMP/err"; }
timeout 60 "$BIN" train "${COMMON[@]}" --micro-batch-size 1 --global-batch-size 4294967296 --train-iters 10 2>"$TMP/err" >/dev/null
rc=$?
[ $rc = 2 ] && grep -q "4294967296 micro-batches a step .* are more than a schedule holds; lower --global-batch-size" "$TMP/err" \
  || { fail "huge --global-batch-size (rc $rc)"; cat "$TMP/err"; }

# Paths that cannot work are refused before training, all at once.
: >"$TMP/afile"
"$BIN" train "${MOCK[@]}" --train-iters 2 --save "$TMP/afile" --save-interval 1 --metrics-file "$TMP" 2>"$TMP/err" >/dev/null
rc=$?
[ $rc = 2 ] && grep -q -- "--save $TMP/afile: exists and is not a directory" "$TMP/err" \
  && grep -q -- "--metrics-file $TMP: is a directory" "$TMP/err" || { fail "--save a file, --metrics-file a directory (rc $rc)"; cat "$TMP/err"; }
"$BIN" train "${MOCK[@]}" --train-iters 2 --config "$TMP" 2>"$TMP/err" >/dev/null
rc=$?
[ $rc = 2 ] && grep -q -- "--config: '$TMP' is a directory" "$TMP/err" || { fail "--config a directory (rc $rc)"; cat "$TMP/err"; }

# --step-batch-size-schedule (dropout on, Megatron's default): a run whose
# global batch grows from 4 to 8 sequences after 256 tokens (8 samples) gives
# the losses of a run at 4 stopped at iteration 2 and resumed at 8: the same
# samples, LR (sample-based) and dropout masks. Megatron saves before the
# first iteration of a new batch size.
STEP=(--micro-batch-size 4 --train-samples 64 --lr-warmup-iters 0 --lr-warmup-samples 8 --save-interval 100)
run step-sched "${STEP[@]}" --step-batch-size-schedule "0:4 256:8" || { fail "step schedule run"; cat "$TMP/step-sched.log"; }
grep -q "global batch by --step-batch-size-schedule: 4 (1 micro-batches) from 0 samples, 8 (2 micro-batches) from 8 samples; 9 iterations reach --train-samples 64 (64 samples)" "$TMP/step-sched.log" \
  && grep -q "global batch 8 from iteration 3 (8 samples consumed): 2 micro-batches" "$TMP/step-sched.log" \
  && [ -d "$TMP/step-sched/iter_0000002" ] || { fail "step schedule: start line, switch or its checkpoint"; cat "$TMP/step-sched.log"; }
# Two steps of one batch size are reported as one, and none as outside the run.
run step-merge "${STEP[@]}" --step-batch-size-schedule "0:4 128:4 256:8" --exit-interval 1 \
  && grep -q "global batch by --step-batch-size-schedule: 4 (1 micro-batches) from 0 samples, 8 (2 micro-batches) from 8 samples; " "$TMP/step-merge.log" \
  || { fail "step schedule: equal steps merged"; grep "global batch by" "$TMP/step-merge.log"; }
run step-const "${STEP[@]}" --global-batch-size 4 --exit-interval 2 || fail "step schedule: constant batch 4"
run step-const "${STEP[@]}" --global-batch-size 8 --load "$TMP/step-const" || { fail "step schedule: resumed at 8"; cat "$TMP/step-const.log"; }
diff <(losses "$TMP/step-sched.jsonl" | head -8) <(losses "$TMP/step-const.jsonl") >/dev/null \
  && [ "$(losses "$TMP/step-const.jsonl" | wc -l)" = 8 ] || { fail "step schedule: losses differ from the piecewise-constant runs";
  paste <(losses "$TMP/step-sched.jsonl") <(losses "$TMP/step-const.jsonl"); }
# Resumed on two data-parallel ranks (8 sequences a step) after the step of
# 4 is behind it: accepted, as Megatron checks only the batch in force; a
# fresh run of that layout is refused before it starts.
run step-sched "${STEP[@]}" --step-batch-size-schedule "0:4 256:8" --exit-interval 3 --save-interval 100 \
  || fail "step schedule: first part"
cp -r "$TMP/step-sched" "$TMP/step-dp2"
OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1 mpirun -n 2 --oversubscribe "$BIN" train \
  "${COMMON[@]}" "${STEP[@]}" --step-batch-size-schedule "0:4 256:8" --load "$TMP/step-dp2" --save "$TMP/step-dp2" \
  >"$TMP/step-dp2.log" 2>&1 && grep -q "iteration        9/       9 | consumed samples:           64" "$TMP/step-dp2.log" \
  && grep -q "global batch by --step-batch-size-schedule: 8 (1 micro-batches) from [0-9]* samples (1 other step of the schedule lies outside this run)" "$TMP/step-dp2.log" \
  || { fail "step schedule: resume on DP 2"; tail -5 "$TMP/step-dp2.log"; }
OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1 mpirun -n 2 --oversubscribe "$BIN" train \
  "${COMMON[@]}" "${STEP[@]}" --step-batch-size-schedule "0:4 256:8" >"$TMP/step-dp2f.log" 2>&1
[ $? = 2 ] && grep -q "batch sizes 4 (from 0 samples) are not multiples of micro-batch 4 x DP 2 = 8" "$TMP/step-dp2f.log" \
  || { fail "step schedule: fresh DP 2 run"; tail -5 "$TMP/step-dp2f.log"; }
# --decrease-batch-size-if-needed: 10 asked for, 8 trained on (2 micro-batches
# of 4): 64 / 10 = 6 iterations (Megatron counts them by the batch asked for),
# 48 samples consumed, 12 skipped; validation takes --eval-global-batch-size.
run decrease --micro-batch-size 4 --global-batch-size 10 --decrease-batch-size-if-needed --train-samples 64 \
  --lr-warmup-iters 0 --save-interval 100 --eval-interval 3 --eval-iters 1 --eval-global-batch-size 4 --log-interval 6 \
  || { fail "--decrease-batch-size-if-needed run"; cat "$TMP/decrease.log"; }
grep -q "training on a global batch of 8, the 10 asked for rounded down" "$TMP/decrease.log" \
  && grep -q "iteration        6/       6 | consumed samples:           48 | skipped samples:           12 |" "$TMP/decrease.log" \
  && python3 -c "
import json, sys
c = json.load(open(sys.argv[1]))
assert c['consumed_train_samples'] == 48 and c['skipped_train_samples'] == 12, c
assert c['consumed_valid_samples'] == 2 * 4, c['consumed_valid_samples']  # evaluations at 3 and 6
" "$TMP/decrease/iter_0000006/common.json" || { fail "--decrease-batch-size-if-needed counts"; cat "$TMP/decrease.log"; }
# Resumed off the schedule's path (another schedule before): the planner
# checks the batches up to --train-samples, the trainer each batch as the
# iterations reach it, as Megatron's calculator does (7 is not a multiple of 2).
"$BIN" train "${COMMON[@]}" --micro-batch-size 2 --step-batch-size-schedule "0:8" --train-samples 400 \
  --lr-warmup-iters 0 --save "$TMP/offpath" --save-interval 5 --exit-interval 5 >/dev/null 2>&1 || fail "off-path: first run"
"$BIN" train "${COMMON[@]}" --micro-batch-size 2 --step-batch-size-schedule "0:4 1408:6 1920:7" --train-samples 50 \
  --lr-warmup-iters 0 --save "$TMP/offpath" --save-interval 100 --load "$TMP/offpath" --override-opt-param-scheduler \
  >"$TMP/offpath.log" 2>&1
[ $? = 2 ] && grep -q "at iteration 10 (62 samples consumed) the global batch is 7, not a multiple of micro-batch 2 x DP 1" "$TMP/offpath.log" \
  || { fail "step schedule: batch off the checked path"; tail -3 "$TMP/offpath.log"; }
# Megatron's underscore spellings of the scheduler switches are accepted.
"$BIN" train "${MOCK[@]}" --train-iters 1 --use-checkpoint-opt_param-scheduler --override-opt_param-scheduler 2>"$TMP/err" >/dev/null
[ $? = 2 ] && grep -q -- "--use-checkpoint-opt-param-scheduler and --override-opt-param-scheduler are exclusive" "$TMP/err" \
  || { fail "opt_param-scheduler spellings"; cat "$TMP/err"; }
# A schedule with iteration-based training is refused (Megatron's LR would decay early).
"$BIN" train "${COMMON[@]}" --micro-batch-size 4 --train-iters 10 --step-batch-size-schedule "0:4 1K:8" 2>"$TMP/err" >/dev/null
[ $? = 2 ] && grep -q "a step batch schedule needs sample-based training" "$TMP/err" || { fail "schedule with --train-iters"; cat "$TMP/err"; }
# --rampup-batch-size: ignored as by Megatron, with the schedule it described.
"$BIN" train "${MOCK[@]}" --train-iters 1 --rampup-batch-size 4 4 100 >"$TMP/out" 2>&1
[ $? = 0 ] && grep -q -- 'accepted with no effect here: --rampup-batch-size: deprecated, and ignored as by Megatron (the global batch stays 8); the ramp it describes is --step-batch-size-schedule "0:4 3200:8"' "$TMP/out" \
  || { fail "--rampup-batch-size note"; cat "$TMP/out"; }

# --profile (Megatron's nsys range): the op table of the steps after
# --profile-step-start completed iterations up to --profile-step-end, in the
# log and the metrics; on rank 1 only with --profile-ranks 1 (to stderr).
"$BIN" train "${MOCK[@]}" --train-iters 8 --log-interval 100 --profile --profile-step-start 4 --profile-step-end 6 \
  --metrics-file "$TMP/profwin.jsonl" >"$TMP/profwin.log" 2>&1 || { fail "--profile run"; cat "$TMP/profwin.log"; }
python3 - "$TMP/profwin.jsonl" <<'PY' && grep -q "^  adamw_step " "$TMP/profwin.log" || { fail "--profile: table or metrics"; cat "$TMP/profwin.log"; }
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if '"op_profile"' in l]
assert len(rows) == 1 and rows[0]["first_iteration"] == 5 and rows[0]["iterations"] == 2, rows
ops = {o["op"]: o for o in rows[0]["ops"]}
assert ops["xent_loss"]["calls"] == 4, ops["xent_loss"]  # 2 iterations of 2 micro-batches
PY
OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1 mpirun -n 2 --oversubscribe "$BIN" train "${MOCK[@]}" \
  --train-iters 3 --log-interval 100 --profile --profile-step-start 1 \
  --profile-step-end 2 --profile-ranks 1 --metrics-file "$TMP/prof2.jsonl" >"$TMP/prof2.log" 2>"$TMP/prof2.err" \
  && grep -q "^rank 1, iterations 2-2:" "$TMP/prof2.err" && ! grep -q "op_profile" "$TMP/prof2.jsonl" \
  || { fail "--profile-ranks 1"; cat "$TMP/prof2.log" "$TMP/prof2.err"; }
# --check-weight-hash-across-dp-replicas-interval on two DP replicas, before
# the loop and after iterations 2 and 4 (the distributed optimizer's
# overlapped gather waited for first); the mismatch
# path is parallel_mpi_test's ParamHashesAcrossReplicas.
OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1 mpirun -n 2 --oversubscribe "$BIN" train "${MOCK[@]}" \
  --train-iters 4 --log-interval 100 --use-distributed-optimizer --overlap-grad-reduce --overlap-param-gather \
  --check-weight-hash-across-dp-replicas-interval 2 >"$TMP/hash.log" 2>&1 \
  && [ "$(grep -c "^>>> Weight hashes match after [024] iterations...$" "$TMP/hash.log")" = 3 ] \
  || { fail "--check-weight-hash-across-dp-replicas-interval"; cat "$TMP/hash.log"; }
"$BIN" train "${MOCK[@]}" --train-iters 3 --profile --profile-step-start 4 --profile-step-end 4 --use-pytorch-profiler \
  2>"$TMP/err" >/dev/null
[ $? = 2 ] && grep -q -- "--profile-step-end 4 must be after --profile-step-start 4" "$TMP/err" \
  && grep -q -- "[--use-pytorch-profiler] there is no PyTorch profiler here" "$TMP/err" || { fail "--profile checks"; cat "$TMP/err"; }

# --log-progress: Megatron's progress.txt. A crafted history (a job of 2
# GPUs in between) puts the start of this world size's jobs an hour back at
# -3.6e15 FLOPs, so the cumulative throughput is 1.0 TFLOP/s/GPU; a resumed
# job appends its own start; FLOPs and tokens are the checkpoint's.
mkdir -p "$TMP/progress"
python3 - "$TMP/progress/progress.txt" <<'PY'
import sys, time
t = lambda s: time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(time.time() - s))
sv = "Saved checkpoint\tIteration: 1\tJob throughput: 1.0 TFLOP/s/GPU\tCumulative throughput: 1.0 TFLOP/s/GPU\tFloating-point operations: {}\tTokens (in billions): 0.00"
with open(sys.argv[1], "w") as f:
    f.write(f"{t(7200)}\tJob ID: 5\t# GPUs: 1\tStarting job\n")
    f.write(f"{t(7200)}\tJob ID: 5\t# GPUs: 1\t" + sv.format("-7.20e+15") + "\n")
    f.write(f"{t(3600)}\tJob ID: 6\t# GPUs: 2\tStarting job\n")
    f.write(f"{t(3600)}\tJob ID: 6\t# GPUs: 2\t" + sv.format("-3.60e+15") + "\n")
    f.write(f"{t(3600)}\tJob ID: 7\t# GPUs: 1\tStarting job\n")
PY
"$BIN" train "${MOCK[@]}" --train-iters 4 --save "$TMP/progress" --save-interval 2 --exit-interval 2 --log-progress \
  >"$TMP/progress.log" 2>&1 || { fail "--log-progress run"; cat "$TMP/progress.log"; }
SLURM_JOB_ID=77 "$BIN" train "${MOCK[@]}" --train-iters 4 --save "$TMP/progress" --save-interval 2 --load "$TMP/progress" \
  --log-progress >>"$TMP/progress.log" 2>&1 || { fail "--log-progress resume"; cat "$TMP/progress.log"; }
python3 - "$TMP/progress" <<'PY' || { fail "--log-progress file"; cat "$TMP/progress/progress.txt"; }
import json, sys
d = sys.argv[1]
rows = [l.rstrip("\n").split("\t") for l in open(d + "/progress.txt")][5:]
assert [r[3] for r in rows] == ["Starting job", "Saved checkpoint", "Starting job", "Saved checkpoint"], rows
assert rows[2][1] == "Job ID: 77" and all(r[2] == "# GPUs: 1" for r in rows), rows
for r, it in ((rows[1], 2), (rows[3], 4)):
    c = json.load(open(f"{d}/iter_{it:07d}/common.json"))
    assert r[4] == f"Iteration: {it}" and r[6] == "Cumulative throughput: 1.0 TFLOP/s/GPU", r
    assert r[7] == "Floating-point operations: %.2e" % c["num_floating_point_operations_so_far"], (r[7], c)
    assert r[8] == "Tokens (in billions): %.2f" % (c["consumed_train_samples"] * 32 / 1e9), r[8]
    assert r[5].startswith("Job throughput: ") and r[5].endswith(" TFLOP/s/GPU"), r[5]
PY

# --optimizer sgd: resume is exact (the momentum buffers come back), the
# checkpoint holds torch's momentum_buffer per parameter and names the
# optimizer, an Adam run refuses that state, and --sgd-momentum 0 keeps none.
check_resume sgd --micro-batch-size 2 --global-batch-size 4 --optimizer sgd --lr 0.3 --min-lr 0.03
python3 - "$TMP/sgd-full/iter_0000040" "$TMP/fp32-full/iter_0000040" <<'PY' || fail "--optimizer sgd checkpoint"
import json, struct, sys
def names(d):
    with open(d + "/model_rank00000.safetensors", "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        return set(json.loads(f.read(n))) - {"__metadata__"}
sgd, adam = names(sys.argv[1]), names(sys.argv[2])
params = {n for n in adam if not n.startswith("optimizer.")}
assert {n for n in sgd if not n.startswith("optimizer.")} == params
assert {n for n in sgd if n.startswith("optimizer.")} == {"optimizer.momentum_buffer." + p for p in params}, sorted(sgd)
assert {n for n in adam if n.startswith("optimizer.")} == {f"optimizer.{s}.{p}" for s in ("exp_avg", "exp_avg_sq") for p in params}
assert json.load(open(sys.argv[1] + "/common.json"))["optimizer"]["name"] == "sgd"
assert json.load(open(sys.argv[2] + "/common.json"))["optimizer"]["name"] == "adam"
PY
# The checkpoint's momentum wins over the command line's on resume (Megatron
# restores torch's param_groups with the state), with a note.
for m in 0.9 0.5; do
  run sgd-m$m --micro-batch-size 2 --global-batch-size 4 --optimizer sgd --lr 0.3 --min-lr 0.03 --sgd-momentum $m \
    --train-iters 41 --save-interval 41 --load "$TMP/sgd-full" --override-opt-param-scheduler \
    || { fail "sgd resume with --sgd-momentum $m"; cat "$TMP/sgd-m$m.log"; }
done
# (Adam's betas likewise: fp32-full's checkpoint has --adam-beta2 0.999.)
run adam-b2 --micro-batch-size 4 --global-batch-size 4 --adam-beta2 0.95 --train-iters 41 --save-interval 41 \
  --load "$TMP/fp32-full" --override-opt-param-scheduler || { fail "adam resume with --adam-beta2 0.95"; cat "$TMP/adam-b2.log"; }
run adam-b2same --micro-batch-size 4 --global-batch-size 4 --train-iters 41 --save-interval 41 \
  --load "$TMP/fp32-full" --override-opt-param-scheduler || { fail "adam resume"; cat "$TMP/adam-b2same.log"; }
grep -q "note: --adam-beta2 0.999 from the checkpoint replaces the command line's 0.95" "$TMP/adam-b2.log" \
  && cmp -s "$TMP/adam-b2/iter_0000041/model_rank00000.safetensors" "$TMP/adam-b2same/iter_0000041/model_rank00000.safetensors" \
  || fail "--adam-beta2 on resume: the checkpoint's did not win"
grep -q "note: --sgd-momentum 0.9 from the checkpoint replaces the command line's 0.5" "$TMP/sgd-m0.5.log" \
  && ! grep -q "from the checkpoint replaces" "$TMP/sgd-m0.9.log" \
  && cmp -s "$TMP/sgd-m0.9/iter_0000041/model_rank00000.safetensors" "$TMP/sgd-m0.5/iter_0000041/model_rank00000.safetensors" \
  || fail "--sgd-momentum on resume: the checkpoint's did not win"
run sgd-adam --micro-batch-size 2 --global-batch-size 4 --train-iters 41 --save-interval 100 --load "$TMP/sgd-full"
[ $? = 2 ] && grep -q "saved by --optimizer sgd but this run uses --optimizer adam; pass --optimizer sgd" "$TMP/sgd-adam.log" \
  || { fail "adam resuming sgd state"; cat "$TMP/sgd-adam.log"; }
run sgd-adam --micro-batch-size 2 --global-batch-size 4 --train-iters 41 --save-interval 100 --load "$TMP/sgd-full" --no-load-optim --override-opt-param-scheduler \
  || { fail "adam resuming sgd with --no-load-optim"; cat "$TMP/sgd-adam.log"; }
run sgd0 --micro-batch-size 2 --global-batch-size 4 --optimizer sgd --sgd-momentum 0 --lr 0.3 --min-lr 0.03 --train-iters 8 --save-interval 8 \
  || { fail "--sgd-momentum 0"; cat "$TMP/sgd0.log"; }
python3 -c "
import json, struct, sys
with open(sys.argv[1], 'rb') as f:
    n = struct.unpack('<Q', f.read(8))[0]
    assert not [k for k in json.loads(f.read(n)) if k.startswith('optimizer.')]" "$TMP/sgd0/iter_0000008/model_rank00000.safetensors" \
  || fail "--sgd-momentum 0 saved optimizer state"
[ "$(losses "$TMP/sgd0.jsonl" | sed -n 4p)" != "$(losses "$TMP/sgd-full.jsonl" | sed -n 4p)" ] || fail "--sgd-momentum 0 had no effect"

# A checkpoint from before optimizers were named (common.json without
# optimizer.name) holds Adam moments: an SGD run names Adam as their source.
"$BIN" train "${MOCK[@]}" --train-iters 2 --save "$TMP/unnamed" --save-interval 2 >"$TMP/unnamed.log" 2>&1 \
  && python3 -c "
import json, sys
p = sys.argv[1] + '/iter_0000002/common.json'
c = json.load(open(p)); del c['optimizer']['name']; json.dump(c, open(p, 'w'))" "$TMP/unnamed" \
  || fail "unnamed checkpoint setup"
"$BIN" train "${MOCK[@]}" --train-iters 2 --load "$TMP/unnamed" --optimizer sgd >"$TMP/unnamed.log" 2>&1
[ $? = 2 ] && grep -q "saved by --optimizer adam but this run uses --optimizer sgd" "$TMP/unnamed.log" \
  || { fail "unnamed Adam checkpoint into an SGD run"; cat "$TMP/unnamed.log"; }

# --verify-integrity: saves record integrity.json, a resume checks it; one
# changed byte in the rank file stops the resume naming the file.
"$BIN" train "${MOCK[@]}" --train-iters 4 --exit-interval 2 --save "$TMP/integ" --save-interval 2 --verify-integrity \
  >"$TMP/integ.log" 2>&1 && [ -f "$TMP/integ/iter_0000002/integrity.json" ] || { fail "--verify-integrity save"; cat "$TMP/integ.log"; }
cp -r "$TMP/integ" "$TMP/integ-bad"
"$BIN" train "${MOCK[@]}" --train-iters 4 --save "$TMP/integ" --load "$TMP/integ" --save-interval 2 --verify-integrity \
  >"$TMP/integ.log" 2>&1 || { fail "--verify-integrity resume"; cat "$TMP/integ.log"; }
python3 -c "
import sys
p = sys.argv[1] + '/iter_0000002/model_rank00000.safetensors'
b = bytearray(open(p, 'rb').read()); b[-5] ^= 1; open(p, 'wb').write(b)" "$TMP/integ-bad"
"$BIN" train "${MOCK[@]}" --train-iters 4 --save "$TMP/integ-bad" --load "$TMP/integ-bad" --save-interval 2 --verify-integrity \
  >"$TMP/integ.log" 2>&1
[ $? = 1 ] && grep -q "model_rank00000.safetensors has changed since it was saved" "$TMP/integ.log" \
  || { fail "--verify-integrity damaged file"; cat "$TMP/integ.log"; }

# --save-retain-interval: after each save the previous checkpoint goes unless
# it is a multiple of the interval; the latest always stays; a symbolic link
# stays; progress.txt records each deletion, as Megatron's does.
"$BIN" train "${MOCK[@]}" --train-iters 10 --exit-interval 6 --save "$TMP/retain" --save-interval 2 --save-retain-interval 4 --log-progress \
  >"$TMP/retain.log" 2>&1 || { fail "--save-retain-interval run"; cat "$TMP/retain.log"; }
[ "$(cd "$TMP/retain" && echo iter_*)" = "iter_0000004 iter_0000006" ] || { fail "--save-retain-interval kept $(ls "$TMP/retain")"; }
mv "$TMP/retain/iter_0000006" "$TMP/retain/six" && ln -s six "$TMP/retain/iter_0000006"
"$BIN" train "${MOCK[@]}" --train-iters 10 --save "$TMP/retain" --load "$TMP/retain" --save-interval 2 \
  --save-retain-interval 4 --log-progress >>"$TMP/retain.log" 2>&1 || { fail "--save-retain-interval resume"; cat "$TMP/retain.log"; }
[ "$(cd "$TMP/retain" && echo iter_*)" = "iter_0000004 iter_0000006 iter_0000008 iter_0000010" ] && [ -L "$TMP/retain/iter_0000006" ] \
  && grep -q "skipping deleting checkpoint from iteration 6 .* since it is a symbolic link" "$TMP/retain.log" \
  || { fail "--save-retain-interval after resume kept $(ls "$TMP/retain")"; }
[ "$(grep -c "Deleted checkpoint" "$TMP/retain/progress.txt")" = 1 ] && grep -q "Deleted checkpoint	Iteration: 2$" "$TMP/retain/progress.txt" \
  || { fail "--save-retain-interval progress lines"; cat "$TMP/retain/progress.txt"; }
"$BIN" train "${MOCK[@]}" --train-iters 6 --save "$TMP/retain2" --save-interval 2 --save-retain-interval 3 2>"$TMP/err" >/dev/null
[ $? = 2 ] && grep -q -- "--save-retain-interval 3 must be a multiple of --save-interval 2" "$TMP/err" \
  || { fail "--save-retain-interval not a multiple"; cat "$TMP/err"; }

# A rule both the flag checks and the LR scheduler state is listed once.
"$BIN" train "${MOCK[@]}" --train-iters 3 --lr-decay-samples 100 2>"$TMP/err" >/dev/null
[ $? = 2 ] && grep -q "^megatron train: error: 1 problem in the configuration:" "$TMP/err" \
  && [ "$(grep -c -- "--lr-decay-samples" "$TMP/err")" = 1 ] || { fail "--lr-decay-samples listed once"; cat "$TMP/err"; }

"$BIN" train --frobnicate 1 --mock-dat --use-flash-attn 2>"$TMP/err"
[ $? = 2 ] && grep -q "2 problems on the command line" "$TMP/err" && grep -q "unknown flag --mock-dat; did you mean --mock-data?" "$TMP/err" \
  || { fail "unknown flags listed at once"; cat "$TMP/err"; }

if [ "$fails" -gt 0 ]; then echo "$fails failure(s)"; exit 1; fi
echo "train CLI: all checks passed"
