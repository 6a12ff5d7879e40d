// Drives kvgate up's gateway with the official OpenAI and Anthropic Node
// SDKs (versions pinned in package.json, installed by `make sdk`) and
// prints one JSON object of what each call returned; e2e/sdk_test.go runs
// it and asserts on it.
//
//   node sdk.mjs <sdk dir with node_modules> <gateway URL> <model>
//
// Every call goes through the SDKs' own parsing: the non-streamed
// answers as the SDK types them, the streams through the SDKs' stream
// helpers (openai's ResponseStream and ChatCompletionStream, Anthropic's
// MessageStream), which check the event order and identities as they
// accumulate the final object. Routing headers come from withResponse().
import { createRequire } from 'node:module';
import { join } from 'node:path';

const [sdkDir, gateway, model] = process.argv.slice(2);
const require = createRequire(join(sdkDir, 'package.json'));
const { default: OpenAI } = require('openai');
const { default: Anthropic } = require('@anthropic-ai/sdk');

const openai = new OpenAI({ apiKey: 'unused', baseURL: gateway + '/v1', maxRetries: 0 });
const anthropic = new Anthropic({ apiKey: 'unused', baseURL: gateway, maxRetries: 0 });

const route = (h) => ({
  pool: h.get('x-kvgate-pool'),
  worker: h.get('x-kvgate-worker-id'),
  overlap: Number(h.get('x-kvgate-overlap-blocks') ?? -1),
});

// A prompt of many blocks, different per topic.
const long = (topic) =>
  Array.from({ length: 40 }, (_, i) => `Section ${i} of the ${topic} handbook explains how a cached prefix saves prefill work.`).join(' ') +
  ' What follows?';

const weatherFn = {
  type: 'function',
  name: 'get_weather',
  description: 'Weather of a city',
  parameters: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] },
};
const weatherTool = {
  name: 'get_weather',
  description: 'Weather of a city',
  input_schema: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] },
};

// err turns a thrown SDK error into what the test asserts on.
const err = (e) => ({ status: e.status ?? null, name: e.constructor?.name, body: e.error ?? null, message: String(e.message) });

async function call(fn) {
  try {
    return await fn();
  } catch (e) {
    return { thrown: err(e) };
  }
}

const out = {};

// --- OpenAI: chat and completions, streamed and not ---
out.chat = await call(async () => {
  const { data, response } = await openai.chat.completions
    .create({ model, max_tokens: 3, messages: [{ role: 'user', content: 'Tell me about KV caches.' }] })
    .withResponse();
  return { route: route(response.headers), object: data.object, text: data.choices[0].message.content, finish: data.choices[0].finish_reason };
});
out.chatStream = await call(async () => {
  const stream = openai.chat.completions.stream({ model, max_tokens: 3, messages: [{ role: 'user', content: 'Tell me about KV caches.' }] });
  const final = await stream.finalChatCompletion();
  return { text: final.choices[0].message.content, finish: final.choices[0].finish_reason };
});
out.completions = await call(async () => {
  const { data, response } = await openai.completions.create({ model, max_tokens: 3, prompt: 'Once upon a time' }).withResponse();
  return { route: route(response.headers), object: data.object, text: data.choices[0].text };
});
out.completionsStream = await call(async () => {
  const stream = await openai.completions.create({ model, max_tokens: 3, prompt: 'Once upon a time', stream: true });
  let text = '';
  for await (const chunk of stream) text += chunk.choices[0]?.text ?? '';
  return { text };
});

// --- OpenAI: Responses ---
out.responses = await call(async () => {
  const { data, response } = await openai.responses.create({ model, input: 'Tell me about KV caches.', max_output_tokens: 3 }).withResponse();
  return { route: route(response.headers), object: data.object, status: data.status, outputText: data.output_text, outputTypes: data.output.map((o) => o.type), usage: data.usage };
});
out.responsesStream = await call(async () => {
  const types = [];
  const stream = openai.responses.stream({ model, input: 'Tell me about KV caches.', max_output_tokens: 3 });
  stream.on('event', (e) => types.push(e.type));
  let deltas = '';
  stream.on('response.output_text.delta', (e) => (deltas += e.delta));
  const final = await stream.finalResponse();
  return { types, deltas, status: final.status, outputText: final.output_text, usage: final.usage };
});
out.responsesRawStream = await call(async () => {
  const stream = await openai.responses.create({ model, input: 'Tell me about KV caches.', max_output_tokens: 3, stream: true });
  const types = [];
  for await (const e of stream) types.push(e.type);
  return { types };
});
out.responsesTool = await call(async () => {
  const first = await openai.responses.create({ model, input: 'Weather in Paris?', tools: [weatherFn], max_output_tokens: 2 });
  const fc = first.output.find((o) => o.type === 'function_call');
  const second = await openai.responses.create({
    model,
    tools: [weatherFn],
    max_output_tokens: 2,
    input: [{ role: 'user', content: 'Weather in Paris?' }, fc, { type: 'function_call_output', call_id: fc.call_id, output: 'sunny' }],
  });
  return { call: { name: fc.name, arguments: JSON.parse(fc.arguments), callID: fc.call_id }, after: second.output.map((o) => o.type), afterText: second.output_text };
});
out.responsesToolStream = await call(async () => {
  const stream = openai.responses.stream({ model, input: 'Weather in Paris?', tools: [weatherFn], tool_choice: 'required', max_output_tokens: 2 });
  const types = [];
  stream.on('event', (e) => types.push(e.type));
  const final = await stream.finalResponse();
  const fc = final.output[0];
  return { types, status: final.status, type: fc.type, name: fc.name, arguments: JSON.parse(fc.arguments) };
});
out.responsesError = await call(async () => openai.responses.create({ model: 'no-such-model', input: 'hi' }));

// --- OpenAI: models ---
out.openaiModel = await call(async () => {
  const m = await openai.models.retrieve(model);
  return { id: m.id, object: m.object };
});
out.openaiModels = await call(async () => {
  const ids = [];
  for await (const m of openai.models.list()) ids.push(m.id);
  return { ids };
});

// --- Anthropic: Messages ---
out.messages = await call(async () => {
  const { data, response } = await anthropic.messages
    .create({ model, max_tokens: 3, system: 'You are terse.', messages: [{ role: 'user', content: 'Tell me about KV caches.' }] })
    .withResponse();
  return { route: route(response.headers), type: data.type, role: data.role, stop: data.stop_reason, blocks: data.content.map((b) => b.type), text: data.content[0].text, usage: data.usage };
});
out.messagesStream = await call(async () => {
  const types = [];
  const stream = anthropic.messages.stream({ model, max_tokens: 3, messages: [{ role: 'user', content: 'Tell me about KV caches.' }] });
  stream.on('streamEvent', (e) => types.push(e.type));
  let text = '';
  stream.on('text', (t) => (text += t));
  const final = await stream.finalMessage();
  return { types, text, stop: final.stop_reason, finalText: final.content[0].text, usage: final.usage };
});
out.messagesTool = await call(async () => {
  const first = await anthropic.messages.create({ model, max_tokens: 2, tools: [weatherTool], messages: [{ role: 'user', content: 'Weather in Paris?' }] });
  const use = first.content.find((b) => b.type === 'tool_use');
  const second = await anthropic.messages.create({
    model,
    max_tokens: 2,
    tools: [weatherTool],
    messages: [
      { role: 'user', content: 'Weather in Paris?' },
      { role: 'assistant', content: first.content },
      { role: 'user', content: [{ type: 'tool_result', tool_use_id: use.id, content: 'sunny' }] },
    ],
  });
  return { stop: first.stop_reason, name: use.name, input: use.input, afterStop: second.stop_reason, after: second.content.map((b) => b.type) };
});
out.messagesToolStream = await call(async () => {
  const stream = anthropic.messages.stream({
    model,
    max_tokens: 2,
    tools: [weatherTool],
    tool_choice: { type: 'tool', name: 'get_weather' },
    messages: [{ role: 'user', content: 'Weather?' }],
  });
  let partial = '';
  stream.on('inputJson', (p) => (partial += p));
  const final = await stream.finalMessage();
  return { stop: final.stop_reason, type: final.content[0].type, input: final.content[0].input, partial };
});
out.messagesError = await call(async () =>
  anthropic.messages.create({ model: 'no-such-model', max_tokens: 2, messages: [{ role: 'user', content: 'hi' }] }),
);
out.messagesBadRequest = await call(async () => anthropic.messages.create({ model, max_tokens: 2, messages: [] }));
out.anthropicModel = await call(async () => {
  const m = await anthropic.models.retrieve(model);
  return { id: m.id, type: m.type, displayName: m.display_name };
});

// --- routing: the same long prompt twice, per API ---
const twice = async (send) => {
  const a = await send();
  // The first answer's blocks reach the router's index through KV events
  // after the response: the Go test waits for them before the second
  // send (it reads a line from stdin).
  process.stdout.write(JSON.stringify({ waitFor: a.route }) + '\n');
  await new Promise((r) => process.stdin.once('data', r));
  const b = await send();
  return { first: a.route, second: b.route, usage: b.usage };
};
out.routing = {};
out.routing.chat = await twice(async () => {
  const { data, response } = await openai.chat.completions
    .create({ model, max_tokens: 2, messages: [{ role: 'system', content: 'You are terse.' }, { role: 'user', content: long('chat sdk') }] })
    .withResponse();
  return { route: route(response.headers), usage: data.usage };
});
out.routing.completions = await twice(async () => {
  const { data, response } = await openai.completions.create({ model, max_tokens: 2, prompt: long('completions sdk') }).withResponse();
  return { route: route(response.headers), usage: data.usage };
});
out.routing.responses = await twice(async () => {
  const { data, response } = await openai.responses.create({ model, instructions: 'You are terse.', input: long('responses sdk twice'), max_output_tokens: 2 }).withResponse();
  return { route: route(response.headers), usage: data.usage };
});
out.routing.messages = await twice(async () => {
  const { data, response } = await anthropic.messages
    .create({ model, max_tokens: 2, system: 'You are terse.', messages: [{ role: 'user', content: long('messages sdk') }] })
    .withResponse();
  return { route: route(response.headers), usage: data.usage };
});
process.stdin.pause();

process.stdout.write(JSON.stringify({ result: out }) + '\n');
