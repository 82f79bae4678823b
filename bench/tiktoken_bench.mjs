// tiktoken (npm tiktoken: OpenAI's Rust core as WASM) over the texts of a
// JSONL corpus, one thread; bench/tokenizer_bench runs it as the baseline.
// Without MEGATRON_FILE: the `gpt2` encoding, special tokens as text. With it:
// writes o200k_base's ranks there in Megatron's TikTokenizer format and times
// the Encoding Megatron builds over them (pattern v2, 1000 specials,
// allowed_special "all"; scripts/tiktoken_megatron.mjs).
// Prints one JSON line: {"bytes", "tokens", "seconds": [per run]}.
//
// usage: node tiktoken_bench.mjs SOURCE_DIR CORPUS.jsonl RUNS [MEGATRON_FILE]
import { createRequire } from "node:module";
import fs from "node:fs";
import path from "node:path";

const [root, corpus, runsArg, megatronFile] = process.argv.slice(2);
const require = createRequire(path.join(path.resolve(root), "package.json"));
const { get_encoding } = require("tiktoken");
const texts = fs.readFileSync(corpus, "utf8").split("\n").filter((l) => l.length > 0).map((l) => JSON.parse(l).text);
const bytes = texts.reduce((n, t) => n + Buffer.byteLength(t), 0);
let enc, allowed = [];
if (megatronFile) {
  const { megatronTokens, writeMegatronFile, megatronEncoder } = await import(
    path.join(path.resolve(root), "scripts/tiktoken_megatron.mjs"));
  const tokens = megatronTokens("o200k_base");
  writeMegatronFile(tokens, megatronFile);
  enc = megatronEncoder(tokens, { pattern: "v2" });
  allowed = "all";
} else {
  enc = get_encoding("gpt2");
}
const seconds = [];
let tokens = 0;
for (let r = 0; r < Number(runsArg || 5); r++) {
  tokens = 0;
  const t0 = process.hrtime.bigint();
  for (const t of texts) tokens += enc.encode(t, allowed, []).length;
  seconds.push(Number(process.hrtime.bigint() - t0) / 1e9);
}
enc.free();
console.log(JSON.stringify({ bytes, tokens, seconds }));
