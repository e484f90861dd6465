// Oracle for the tokenizer test: prints, for each line of a JSONL file of strings, the
// js-tiktoken `gpt2` ids twice: special tokens as text, and <|endoftext|> allowed.
// Usage: NODE_PATH=<npm-tools>/node_modules node tiktoken_ids.js corpus.jsonl
const fs = require("fs");
const { getEncoding } = require("js-tiktoken");
const enc = getEncoding("gpt2");
const lines = fs.readFileSync(process.argv[2], "utf8").split("\n").filter((l) => l.length > 0);
const out = [];
for (const line of lines) {
  const text = JSON.parse(line);
  out.push(JSON.stringify({ ordinary: enc.encode(text, [], []), special: enc.encode(text, "all") }));
}
process.stdout.write(out.join("\n") + "\n");
