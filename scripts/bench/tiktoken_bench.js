// Times js-tiktoken (pure JS) and tiktoken (WASM) `gpt2` on the "text" field of each
// line of a JSONL file, single-threaded, PASSES passes each; prints one JSON line per pass.
// Usage: NODE_PATH=<npm-tools>/node_modules node tiktoken_bench.js DOCS.jsonl PASSES
const fs = require("fs");
const docs = fs.readFileSync(process.argv[2], "utf8").split("\n").filter((l) => l).map((l) => JSON.parse(l).text);
const passes = parseInt(process.argv[3] || "3", 10);
const bytes = docs.reduce((a, d) => a + Buffer.byteLength(d, "utf8"), 0);
function run(name, encode) {
  for (let p = 0; p < passes; p++) {
    const t0 = process.hrtime.bigint();
    let ntok = 0;
    let sum = 0n;
    for (const d of docs) {
      const ids = encode(d);
      ntok += ids.length;
    }
    const s = Number(process.hrtime.bigint() - t0) / 1e9;
    console.log(JSON.stringify({ tokenizer: name, pass: p, seconds: s, bytes, tokens: ntok }));
  }
}
const js = require("js-tiktoken").getEncoding("gpt2");
run("js-tiktoken", (d) => js.encode(d, [], []));
const wasm = require("tiktoken").get_encoding("gpt2");
run("tiktoken", (d) => wasm.encode_ordinary(d));
wasm.free();
