// Megatron TikTokenizer vocabularies from npm tiktoken's encodings, and the
// tiktoken Encoding Megatron builds over them (the reference our TikTokenizer
// is tested and benchmarked against); also the same ranks as a Hugging Face
// byte-level BPE tokenizer.json (vocabulary, derived merges, Llama 3's
// layout) for the HuggingFaceTokenizer tests and benchmark.
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


// ---------------------------------------------------------------------------
// Hugging Face tokenizer.json files from the same ranks (for the
// HuggingFaceTokenizer tests and benchmark).
// ---------------------------------------------------------------------------

// GPT-2's bytes_to_unicode.
const byteChar = [];
{
  let n = 0;
  for (let b = 0; b < 256; b++) {
    const printable = (b >= 33 && b <= 126) || (b >= 0xa1 && b <= 0xac) || (b >= 0xae && b <= 0xff);
    byteChar[b] = String.fromCodePoint(printable ? b : 256 + n++);
  }
}
export const toByteLevel = (buf) => Array.from(buf, (b) => byteChar[b]).join("");

export function addedToken(id, content) {
  return { id, content, single_word: false, lstrip: false, rstrip: false, normalized: false, special: true };
}
export const byteLevelStep = (prefix, regex) => ({ type: "ByteLevel", add_prefix_space: prefix, trim_offsets: true, use_regex: regex });

// An encoding as a byte-level BPE (Hugging Face's tokenizer.json model): vocab in rank order and, for each token of
// two or more bytes, the merge its own BPE under lower ranks ends with.
export function byteLevelBpe(encoding) {
  const toks = megatronTokens(encoding).map((b64) => Buffer.from(b64, "base64"));
  const rank = new Map(toks.map((t, r) => [t.toString("latin1"), r]));
  const vocab = {};
  toks.forEach((t, r) => { vocab[toByteLevel(t)] = r; });
  const merges = [];
  for (let r = 256; r < toks.length; r++) {
    let parts = Array.from(toks[r], (b) => Buffer.from([b]));
    for (;;) {
      let best = -1, bestRank = Infinity;
      for (let i = 0; i + 1 < parts.length; i++) {
        const rr = rank.get(Buffer.concat([parts[i], parts[i + 1]]).toString("latin1"));
        if (rr !== undefined && rr < r && rr < bestRank) { bestRank = rr; best = i; }
      }
      if (best < 0) break;
      parts.splice(best, 2, Buffer.concat([parts[best], parts[best + 1]]));
    }
    if (parts.length !== 2) throw new Error(`${encoding}: token ${r} does not split into two`);
    merges.push([toByteLevel(parts[0]), toByteLevel(parts[1])]);
  }
  return { vocab, merges, size: toks.length };
}

// Llama 3's pre-tokenisation pattern (cl100k_base's).
export const CL100K_PATTERN = String.raw`(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`;

// {tokenizer, config}: tokenizer.json and tokenizer_config.json in Llama 3's
// layout over byteLevelBpe()'s vocabulary.
export function llama3TokenizerJson(bl) {
  const V = bl.size;
  const bos = "<|begin_of_text|>", eos = "<|end_of_text|>";
  return {
    tokenizer: {
      version: "1.0", truncation: null, padding: null,
      added_tokens: [addedToken(V, bos), addedToken(V + 1, eos), addedToken(V + 2, "<|eot_id|>")],
      normalizer: null,
      pre_tokenizer: { type: "Sequence", pretokenizers: [
        { type: "Split", pattern: { Regex: CL100K_PATTERN }, behavior: "Isolated", invert: false }, byteLevelStep(false, false)] },
      post_processor: { type: "Sequence", processors: [byteLevelStep(true, false), {
        type: "TemplateProcessing",
        single: [{ SpecialToken: { id: bos, type_id: 0 } }, { Sequence: { id: "A", type_id: 0 } }],
        pair: [{ SpecialToken: { id: bos, type_id: 0 } }, { Sequence: { id: "A", type_id: 0 } },
               { SpecialToken: { id: bos, type_id: 1 } }, { Sequence: { id: "B", type_id: 1 } }],
        special_tokens: { [bos]: { id: bos, ids: [V], tokens: [bos] } } }] },
      decoder: byteLevelStep(true, true),
      model: { type: "BPE", dropout: null, unk_token: null, continuing_subword_prefix: null, end_of_word_suffix: null,
               fuse_unk: false, byte_fallback: false, ignore_merges: true, vocab: bl.vocab, merges: bl.merges },
    },
    config: { bos_token: bos, eos_token: eos, add_bos_token: true, clean_up_tokenization_spaces: true },
  };
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
