// extract-template.mjs writes one model's chat template out of
// @huggingface/ollama-utils' src/chat-template-automap.ts (a table of
// Hugging Face GGUF chat templates, keyed by Ollama model name), for the
// reference tests (mk/tokenizer.mk):
//
//   node extract-template.mjs AUTOMAP_TS MODEL OUT
//
// e.g. MODEL "library/llama3.1:8b": Llama-3.1-8B-Instruct's template, the
// one with tool calling.
import { readFileSync, writeFileSync } from "node:fs";

const [src, model, dst] = process.argv.slice(2);
if (!dst) throw new Error("usage: node extract-template.mjs AUTOMAP_TS MODEL OUT");
const text = readFileSync(src, "utf8");
const re = /model: "([^"]*)",\s*gguf:\s*("(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*')/g;
for (let m; (m = re.exec(text)); ) {
  if (m[1] !== model) continue;
  // The literal is a JavaScript string; read it as one.
  const literal = m[2];
  const body = literal.slice(1, -1).replace(/\\'/g, "'").replace(/"/g, '\\"');
  writeFileSync(dst, JSON.parse('"' + body.replace(/\\\\"/g, '\\"') + '"'));
  process.exit(0);
}
throw new Error(`${model}: not in ${src}`);
