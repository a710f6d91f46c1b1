// The official OpenAI JavaScript client against examples/server.cpp (tests/server/test_server.py, case openai).
//
//   OPENAI_PKG=DIR/openai node openai_client.cjs BASE_URL API_KEY REQUESTS.json
//
// REQUESTS.json: {"chat": [body, ...], "completion": body} (request bodies; fields the client has no type for,
// like top_k or return_token_ids, are passed through as the client passes any extra field). Prints one JSON
// object: the models listed, each chat request's result non-streamed and streamed, the completion's both ways
// ({content, token_ids, finish_reason, completion_tokens, prompt_tokens}), and the client's error classes
// for an unknown model and a wrong key. The client retries nothing here (maxRetries 0).
"use strict";

const fs = require("fs");
const pkg = require(process.env.OPENAI_PKG);
const OpenAI = pkg.OpenAI;

async function main() {
  const [baseURL, apiKey, spec] = process.argv.slice(2);
  const requests = JSON.parse(fs.readFileSync(spec, "utf8"));
  const client = new OpenAI({ baseURL, apiKey, maxRetries: 0, timeout: 60000 });
  const out = { version: pkg.VERSION || require(process.env.OPENAI_PKG + "/version.js").VERSION };

  const models = [];
  for await (const m of client.models.list()) models.push(m.id);
  out.models = models;

  const fromWhole = (r, text) => ({
    content: text,
    token_ids: r.choices[0].token_ids,
    finish_reason: r.choices[0].finish_reason,
    completion_tokens: r.usage.completion_tokens,
    prompt_tokens: r.usage.prompt_tokens,
  });
  const fromStream = async (stream, chat) => {
    const res = { content: "", token_ids: [], finish_reason: null, completion_tokens: null, prompt_tokens: null };
    for await (const chunk of stream) {
      if (chunk.usage) {
        res.completion_tokens = chunk.usage.completion_tokens;
        res.prompt_tokens = chunk.usage.prompt_tokens;
      }
      for (const c of chunk.choices) {
        res.content += (chat ? c.delta.content : c.text) || "";
        res.token_ids.push(...(c.token_ids || []));
        if (c.finish_reason) res.finish_reason = c.finish_reason;
      }
    }
    return res;
  };

  out.chat = [];
  out.chat_stream = [];
  for (const body of requests.chat) {
    const r = await client.chat.completions.create({ ...body, stream: false });
    out.chat.push(fromWhole(r, r.choices[0].message.content));
    const s = await client.chat.completions.create({ ...body, stream: true, stream_options: { include_usage: true } });
    out.chat_stream.push(await fromStream(s, true));
  }
  const c = await client.completions.create({ ...requests.completion, stream: false });
  out.completion = fromWhole(c, c.choices[0].text);
  const cs = await client.completions.create({
    ...requests.completion,
    stream: true,
    stream_options: { include_usage: true },
  });
  out.completion_stream = await fromStream(cs, false);

  const errorOf = async (f) => {
    try {
      await f();
      return { status: 200, class: "none" };
    } catch (e) {
      return { status: e.status, class: e.constructor.name };
    }
  };
  out.not_found = await errorOf(() => client.chat.completions.create({ ...requests.chat[0], model: "no-such-model" }));
  const wrong = new OpenAI({ baseURL, apiKey: "wrong-key", maxRetries: 0, timeout: 60000 });
  out.unauthorized = await errorOf(() => wrong.models.list());
  process.stdout.write(JSON.stringify(out) + "\n");
}

main().catch((e) => {
  process.stderr.write(`openai_client: ${e && e.stack ? e.stack : e}\n`);
  process.exit(1);
});
