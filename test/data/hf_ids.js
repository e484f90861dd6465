// Oracle for the tokenizer.json tests and benchmark: Hugging Face's own tokenizers library
// (the npm package `tokenizers`, its Rust code through the Node binding).
// Usage (NODE_PATH=<npm-tools>/node_modules):
//   node hf_ids.js ids TOKENIZER_JSON CORPUS OUT [--no-special]
//       CORPUS: documents, each a little-endian u32 byte length and the bytes; each is
//       decoded as UTF-8 with U+FFFD for ill-formed sequences (the WHATWG decoder: one
//       U+FFFD per maximal ill-formed subpart), then encoded with encodeBatch
//       (addSpecialTokens unless --no-special). OUT: per document a u32 count and the
//       ids as u32, little-endian.
//   node hf_ids.js strings TOKENIZER_JSON    stdin: JSON lines of strings; stdout: one JSON
//       line of ids per input line (addSpecialTokens), then the decode of each
//   node hf_ids.js gpt2-json VOCAB_JSON MERGES_TXT OUT
//       GPT-2's tokenizer.json built and saved by the library from the two GPT-2 files:
//       BPE, ByteLevel pre-tokenizer/post-processor/decoder, <|endoftext|> special
//   node hf_ids.js bench TOKENIZER_JSON CORPUS PASSES
//       times encodeBatch over the corpus (RAYON_NUM_THREADS sets its threads); prints
//       one JSON line per pass: {bytes, tokens, seconds}
const fs = require("fs");
const hf = require("tokenizers");

function readCorpus(path) {
  const buf = fs.readFileSync(path);
  const docs = [];
  let o = 0;
  let bytes = 0;
  while (o < buf.length) {
    const n = buf.readUInt32LE(o);
    o += 4;
    docs.push(buf.subarray(o, o + n).toString("utf8"));
    bytes += n;
    o += n;
  }
  return { docs, bytes };
}

async function main() {
  const [mode, ...args] = process.argv.slice(2);
  if (mode === "ids") {
    const tok = hf.Tokenizer.fromFile(args[0]);
    const { docs } = readCorpus(args[1]);
    const special = args[3] !== "--no-special";
    const encs = await tok.encodeBatch(docs, { addSpecialTokens: special });
    let total = 0;
    for (const e of encs) total += 1 + e.getIds().length;
    const out = Buffer.alloc(4 * total);
    let o = 0;
    for (const e of encs) {
      const ids = e.getIds();
      out.writeUInt32LE(ids.length, o);
      o += 4;
      for (const id of ids) {
        out.writeUInt32LE(id, o);
        o += 4;
      }
    }
    fs.writeFileSync(args[2], out);
  } else if (mode === "strings") {
    const tok = hf.Tokenizer.fromFile(args[0]);
    const lines = fs.readFileSync(0, "utf8").split("\n").filter((l) => l.length > 0);
    const ids = [];
    for (const l of lines) ids.push((await tok.encode(JSON.parse(l), null, { addSpecialTokens: true })).getIds());
    const out = ids.map((x) => JSON.stringify(x));
    for (const x of ids) out.push(JSON.stringify(await tok.decode(x, false)));
    process.stdout.write(out.join("\n") + "\n");
  } else if (mode === "gpt2-json") {
    // Written as the Hugging Face Hub's gpt2 tokenizer.json is (the binding has no
    // ByteLevel decoder constructor), then loaded and saved back by the library, so the
    // file is the library's own serialization and known to load.
    const vocab = JSON.parse(fs.readFileSync(args[0], "utf8"));
    const merges = fs.readFileSync(args[1], "utf8").split("\n").filter((l) => l.length > 0 && !l.startsWith("#version"));
    const byteLevel = { type: "ByteLevel", add_prefix_space: false, trim_offsets: true, use_regex: true };
    const json = {
      version: "1.0", truncation: null, padding: null,
      added_tokens: [{ id: vocab["<|endoftext|>"], content: "<|endoftext|>", single_word: false, lstrip: false,
                       rstrip: false, normalized: true, special: true }],
      normalizer: null, pre_tokenizer: byteLevel, post_processor: byteLevel, decoder: byteLevel,
      model: { type: "BPE", dropout: null, unk_token: null, continuing_subword_prefix: "", end_of_word_suffix: "",
               fuse_unk: false, byte_fallback: false, vocab, merges },
    };
    const tmp = args[2] + ".tmp." + process.pid;
    fs.writeFileSync(tmp, JSON.stringify(json));
    hf.Tokenizer.fromFile(tmp).save(tmp, false);
    fs.renameSync(tmp, args[2]);
  } else if (mode === "bench") {
    const tok = hf.Tokenizer.fromFile(args[0]);
    const { docs, bytes } = readCorpus(args[1]);
    const passes = Number(args[2] || 3);
    for (let p = 0; p < passes; ++p) {
      const t0 = process.hrtime.bigint();
      const encs = await tok.encodeBatch(docs, { addSpecialTokens: true });
      const t1 = process.hrtime.bigint();
      let tokens = 0;
      for (const e of encs) tokens += e.getIds().length;
      console.log(JSON.stringify({ tokenizer: "hf-tokenizers", bytes, tokens, seconds: Number(t1 - t0) / 1e9 }));
    }
  } else {
    console.error("usage: hf_ids.js ids|strings|gpt2-json|bench ...");
    process.exit(2);
  }
}
main().catch((e) => {
  console.error("hf_ids.js: " + (e && e.stack ? e.stack : e));
  process.exit(1);
});
