// tokenizers.js (npm @huggingface/tokenizers: Hugging Face's JavaScript
// tokenizer.json implementation) over the texts of a JSONL corpus, one
// thread; bench/tokenizer_bench runs it as the HuggingFaceTokenizer baseline.
// Writes DIR/tokenizer.json and DIR/tokenizer_config.json (cl100k_base's
// ranks in Llama 3's layout, scripts/tiktoken_megatron.mjs) and times
// encode(text).ids on them. Prints one JSON line: {"bytes", "tokens", "seconds"}.
//
// usage: node hf_tokenizers_bench.mjs SOURCE_DIR CORPUS.jsonl RUNS DIR
import { createRequire } from "node:module";
import fs from "node:fs";
import path from "node:path";

const [root, corpus, runsArg, dir] = process.argv.slice(2);
const require = createRequire(path.join(path.resolve(root), "package.json"));
const { Tokenizer } = require("@huggingface/tokenizers");
const { byteLevelBpe, llama3TokenizerJson } = await import(path.join(path.resolve(root), "scripts/tiktoken_megatron.mjs"));
const texts = fs.readFileSync(corpus, "utf8").split("\n").filter((l) => l.length > 0).map((l) => JSON.parse(l).text);
const bytes = texts.reduce((n, t) => n + Buffer.byteLength(t), 0);
const made = llama3TokenizerJson(byteLevelBpe("cl100k_base"));
fs.mkdirSync(dir, { recursive: true });
fs.writeFileSync(path.join(dir, "tokenizer.json"), JSON.stringify(made.tokenizer));
fs.writeFileSync(path.join(dir, "tokenizer_config.json"), JSON.stringify(made.config));
const tok = new Tokenizer(made.tokenizer, made.config);
const seconds = [];
let tokens = 0;
for (let r = 0; r < Number(runsArg || 5); r++) {
  tokens = 0;
  const t0 = process.hrtime.bigint();
  for (const t of texts) tokens += tok.encode(t).ids.length;
  seconds.push(Number(process.hrtime.bigint() - t0) / 1e9);
}
console.log(JSON.stringify({ bytes, tokens, seconds }));
