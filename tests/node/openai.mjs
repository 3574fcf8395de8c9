// genq serve from Node.js with the official openai package, unmodified: models, a chat
// completion, a streamed one, and an error. Prints one JSON report line for tests/test_gateway.py.
// Usage: node openai.mjs BASE_URL API_KEY
import OpenAI from "openai";

const [baseURL, apiKey] = process.argv.slice(2);
const client = new OpenAI({ baseURL, apiKey, maxRetries: 0 });
const report = {};

report.models = (await client.models.list()).data.map((m) => m.id);
const chat = await client.chat.completions.create({
  model: "echo",
  messages: [{ role: "user", content: "hello from node" }],
  max_tokens: 64,
});
report.chat = chat.choices[0].message.content;
report.finish_reason = chat.choices[0].finish_reason;

const stream = await client.chat.completions.create({
  model: "echo",
  messages: [{ role: "user", content: "stream to node" }],
  stream: true,
});
let streamed = "";
for await (const chunk of stream) streamed += chunk.choices[0]?.delta?.content ?? "";
report.streamed = streamed;

try {
  await client.completions.create({ model: "echo", prompt: "x", max_tokens: 100000 });
  report.error = "accepted";
} catch (err) {
  report.error = `${err.status} ${err.constructor.name}`;
}
console.log(JSON.stringify(report));
