// Isolation at genq serve from Node.js with the official openai package, unmodified: a key of
// tenant B looks up tenant A's batch and file, cancels A's batch, lists batches, and makes one
// of its own. Prints one JSON report line for tests/test_gateway_tenants.py.
// Usage: node tenants.mjs BASE_URL API_KEY A_BATCH_ID A_FILE_ID
import OpenAI from "openai";

const [baseURL, apiKey, batchId, fileId] = process.argv.slice(2);
const client = new OpenAI({ baseURL, apiKey, maxRetries: 0 });
const status = async (call) => {
  try {
    await call();
    return 200;
  } catch (err) {
    return err.status;
  }
};
const report = {};
report.batch = await status(() => client.batches.retrieve(batchId));
report.file = await status(() => client.files.retrieve(fileId));
report.cancel = await status(() => client.batches.cancel(batchId));
report.listed = (await client.batches.list({ limit: 100 })).data.map((b) => b.id);
const line = { custom_id: "n1", url: "/v1/completions", body: { prompt: "node", max_tokens: 2 } };
const file = await client.files.create({
  file: new File([JSON.stringify(line)], "in.jsonl"),
  purpose: "batch",
});
const own = await client.batches.create({
  input_file_id: file.id,
  endpoint: "/v1/completions",
  completion_window: "24h",
});
report.own = (await client.batches.retrieve(own.id)).status;
console.log(JSON.stringify(report));
