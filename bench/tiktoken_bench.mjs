// tiktoken's `gpt2` encoding (npm tiktoken: OpenAI's Rust core as WASM) over
// the texts of a JSONL corpus, one thread; bench/tokenizer_bench runs it as
// the baseline. Prints one JSON line: {"bytes", "tokens", "seconds": [per run]}.
//
// usage: node tiktoken_bench.mjs SOURCE_DIR CORPUS.jsonl RUNS
import { createRequire } from "node:module";
import fs from "node:fs";
import path from "node:path";

const [root, corpus, runsArg] = process.argv.slice(2);
const require = createRequire(path.join(path.resolve(root), "package.json"));
const { get_encoding } = require("tiktoken");
const texts = fs.readFileSync(corpus, "utf8").split("\n").filter((l) => l.length > 0).map((l) => JSON.parse(l).text);
const bytes = texts.reduce((n, t) => n + Buffer.byteLength(t), 0);
const enc = get_encoding("gpt2");
const seconds = [];
let tokens = 0;
for (let r = 0; r < Number(runsArg || 5); r++) {
  tokens = 0;
  const t0 = process.hrtime.bigint();
  for (const t of texts) tokens += enc.encode(t, [], []).length;
  seconds.push(Number(process.hrtime.bigint() - t0) / 1e9);
}
enc.free();
console.log(JSON.stringify({ bytes, tokens, seconds }));
