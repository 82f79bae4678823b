// Megatron TikTokenizer vocabularies from npm tiktoken's encodings, and the
// tiktoken Encoding Megatron builds over them (the reference our TikTokenizer
// is tested and benchmarked against).
//
// Megatron's --tokenizer-type TikTokenizer reads a JSON list of
// {"rank", "token_bytes" (base64), "token_str"} with rank == index and the
// first 256 entries the single bytes 0..255 in order. tiktoken's cl100k_base
// and o200k_base hold the 256 single bytes at ranks 0..255 in another order;
// putting byte b at rank b changes no merge (a merge's rank is that of a
// token of two or more bytes), only the ids of single bytes.
//
// As a command:  node scripts/tiktoken_megatron.mjs ENCODING OUT.json
//   (ENCODING: cl100k_base, o200k_base, r50k_base, p50k_base)
// writes OUT.json; train with --tokenizer-type TikTokenizer
// --tokenizer-model OUT.json --vocab-size <entries + 1000> (printed).
import { createRequire } from "node:module";
import fs from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "..");
const require = createRequire(path.join(root, "package.json"));

// Megatron's _PATTERN_TIKTOKEN_V1 / _V2 (tiktoken_tokenizer.py).
export const PATTERNS = {
  v1: String.raw`[^\r\n\p{L}\p{N}]?+\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]++[\r\n]*|\s*[\r\n]|\s+(?!\S)|\s+`,
  v2: String.raw`[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+|` +
      String.raw`[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*|\p{N}|` +
      String.raw` ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+`,
};
export const DEFAULT_SPECIALS = ["<unk>", "<s>", "</s>", "<mask>", "<pad>", "<cls>", "<sep>"];

// The base64 tokens of an npm tiktoken encoding, in Megatron's order.
export function megatronTokens(encoding) {
  const src = JSON.parse(fs.readFileSync(path.join(root, `node_modules/tiktoken/encoders/${encoding}.json`), "utf8"));
  const fields = src.bpe_ranks.split(" ");  // "! 0", then every token in rank order
  if (fields[0] !== "!" || fields[1] !== "0") throw new Error(`${encoding}: unexpected bpe_ranks layout`);
  const toks = fields.slice(2);
  for (let r = 0; r < 256; r++)
    if (Buffer.from(toks[r], "base64").length !== 1) throw new Error(`${encoding}: rank ${r} is not a single byte`);
  return toks.map((b64, r) => (r < 256 ? Buffer.from([r]).toString("base64") : b64));
}

export function writeMegatronFile(tokens, file) {
  const tmp = `${file}.tmp.${process.pid}`;
  fs.writeFileSync(tmp, JSON.stringify(tokens.map((b64, r) => ({
    rank: r, token_bytes: b64, token_str: Buffer.from(b64, "base64").toString("utf8") }))));
  fs.renameSync(tmp, file);
}

// tiktoken Encoding as Megatron's TikTokenTokenizer builds it: the first
// vocabSize - numSpecial tokens at ids numSpecial.., specials 0..numSpecial-1.
export function megatronEncoder(tokens, { pattern = "v2", numSpecial = 1000, specials = DEFAULT_SPECIALS,
                                          vocabSize = null } = {}) {
  const { Tiktoken } = require("tiktoken");
  const size = vocabSize || tokens.length + numSpecial;
  const inner = tokens.slice(0, size - numSpecial);
  const named = {};
  for (let i = 0; i < numSpecial; i++) named[i < specials.length ? specials[i] : `<SPECIAL_${i}>`] = i;
  return new Tiktoken(inner.map((b64, r) => `${b64} ${r + numSpecial}`).join("\n"), named, PATTERNS[pattern]);
}

if (process.argv[1] && path.resolve(process.argv[1]) === fileURLToPath(import.meta.url)) {
  const [encoding, out] = process.argv.slice(2);
  if (!encoding || !out) {
    console.error("usage: node scripts/tiktoken_megatron.mjs ENCODING OUT.json");
    process.exit(2);
  }
  const tokens = megatronTokens(encoding);
  writeMegatronFile(tokens, out);
  console.log(`${out}: ${tokens.length} tokens; use --tokenizer-type TikTokenizer --tokenizer-model ${out} ` +
              `--vocab-size ${tokens.length + 1000}`);
}
