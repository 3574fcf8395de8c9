// genq from Node.js with node-redis and only the README's wire format and Redis Functions:
// submit (FCALL genq_submit), wait and stream (XREAD on the event stream), cancel (FCALL
// genq_cancel), the depth limit. Prints one JSON report line for tests/test_functions.py.
// Usage: node functions.mjs REDIS_URL QUEUE
import { createClient } from "redis";

const [url, queue] = process.argv.slice(2);
const client = createClient({ url });
await client.connect();

const queueKeys = (q) => [`genq:{${q}}:config`, `genq:{${q}}:high`, `genq:{${q}}:normal`, `genq:{${q}}:low`];
const submit = (q, id, body, priority = "normal") =>
  client.sendCommand([
    "FCALL", "genq_submit", "5", ...queueKeys(q), `genq:res:{${id}}`,
    "3600", id, priority, JSON.stringify(body), "",
  ]);
const cancel = (id) =>
  client.sendCommand(["FCALL", "genq_cancel", "3", `genq:res:{${id}}`, `genq:ev:{${id}}`, `genq:att:{${id}}`]);

// Follow a request's event stream until its final event; return the streamed text and result.
async function follow(id) {
  let last = "0-0";
  let text = "";
  for (;;) {
    const reply = await client.sendCommand(["XREAD", "BLOCK", "5000", "STREAMS", `genq:ev:{${id}}`, last]);
    if (!reply) continue;
    for (const [entryId, fields] of reply[0][1]) {
      last = entryId;
      const event = {};
      for (let i = 0; i < fields.length; i += 2) event[fields[i]] = fields[i + 1];
      if (event.type === "delta") text += JSON.parse(event.data).text;
      if (event.type === "final") {
        const result = JSON.parse(event.data);
        if (result.text && result.text.startsWith(text)) text = result.text;
        return { text, raw: event.data };
      }
    }
  }
}

const id = `node-${process.pid}`;
const report = {};
const entry = await submit(queue, id, { prompt: "hello from node", max_new_tokens: 40, stream: true });
report.submitted = typeof entry[0];
report.duplicate = (await submit(queue, id, { prompt: "again" }))[0];
const followed = await follow(id);
report.streamed = followed.text;
report.result = followed.raw;

// A queue no worker serves, with a depth limit of 2: the third request is refused.
const idle = `${queue}-idle`;
await client.sendCommand(["HSET", `genq:{${idle}}:config`, "max_queue_depth", "2"]);
await submit(idle, `${id}-a`, { prompt: "a" });
await submit(idle, `${id}-b`, { prompt: "b" });
try {
  await submit(idle, `${id}-c`, { prompt: "c" });
  report.queue_full = "accepted";
} catch (err) {
  report.queue_full = err.message;
}
report.cancelled = await cancel(`${id}-a`);
report.cancelled_status = JSON.parse(await client.get(`genq:res:{${id}-a}`)).status;
await client.quit();
console.log(JSON.stringify(report));
