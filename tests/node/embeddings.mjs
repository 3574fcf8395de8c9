// genq serve's /v1/embeddings from Node.js with the official openai package, unmodified: it asks
// for base64 by default and decodes it itself. Prints one JSON report line for
// tests/test_embeddings.py. Usage: node embeddings.mjs BASE_URL API_KEY MODEL
import OpenAI from "openai";

const [baseURL, apiKey, model] = process.argv.slice(2);
const client = new OpenAI({ baseURL, apiKey, maxRetries: 0 });
const input = ["The weather is lovely today.", "It's so sunny outside!"];
const byDefault = await client.embeddings.create({ model, input });
const floats = await client.embeddings.create({ model, input, encoding_format: "float" });
console.log(
  JSON.stringify({
    base64: byDefault.data.map((d) => Array.from(d.embedding)),
    float: floats.data.map((d) => d.embedding),
    usage: byDefault.usage,
  }),
);
