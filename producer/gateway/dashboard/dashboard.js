/* genq dashboard: polls its gateway's /dashboard/api every second and draws what it reads.
   Everything it shows is put in the page with textContent (never as HTML): tenant names,
   errors and generated text are data, not markup. No request leaves this origin. */
"use strict";

const REFRESH_MS = 1000;
const PRIORITIES = ["high", "normal", "low"];
const ui = { page: null, timer: null, seq: 0, charts: {}, confirm: null, open: {}, lookup: null };

/* h("td", {class: "x", "data-test": "y"}, child...) -> an element. */
function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
    else el.setAttribute(k, v === true ? "" : String(v));
  }
  for (const c of children.flat(Infinity)) {
    if (c === null || c === undefined) continue;
    el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return el;
}

function fmt(n) {
  if (n === null || n === undefined || n === "") return "-";
  if (typeof n === "number" && !Number.isInteger(n)) return n.toFixed(1);
  return typeof n === "number" ? n.toLocaleString("en-US") : String(n);
}

function ms(n) {
  if (n === null || n === undefined) return "-";
  if (n < 1000) return `${n} ms`;
  if (n < 60000) return `${(n / 1000).toFixed(1)} s`;
  return `${(n / 60000).toFixed(1)} min`;
}

function when(unixMs) {
  return unixMs ? new Date(unixMs).toLocaleString() : "-";
}

function bytes(n) {
  return n >= 2 ** 30 ? `${(n / 2 ** 30).toFixed(2)} GiB` : `${(n / 2 ** 20).toFixed(1)} MiB`;
}

function pill(state) {
  return h("span", { class: `pill ${state}`, "data-test": "state" }, state);
}

/* A column named "<name" is text: left-aligned, as its cells (class "text"). */
function table(columns, rows, attrs) {
  if (!rows.length) return h("p", { class: "empty" }, "none");
  const head = columns.map((c) => c.startsWith("<") ? h("th", { class: "text" }, c.slice(1)) : h("th", {}, c));
  return h("table", attrs || {},
    h("thead", {}, h("tr", {}, head)),
    h("tbody", {}, rows));
}

async function api(path, options) {
  const init = Object.assign({ credentials: "same-origin" }, options || {});
  if (init.method === "POST") {
    init.headers = { "X-Genq-Dashboard": "1", "Content-Type": "application/json" };
  }
  const resp = await fetch(`dashboard/api/${path}`, init);
  const body = await resp.json();
  if (!resp.ok) {
    const err = new Error((body.error && body.error.message) || resp.statusText);
    err.status = resp.status;
    throw err;
  }
  return body;
}

function setStatus(text, error) {
  const el = document.getElementById("status");
  el.textContent = text;
  el.classList.toggle("error", Boolean(error));
}

function banner(text) {
  const el = document.getElementById("banner");
  el.hidden = !text;
  el.textContent = text || "";
}

/* ---- overview --------------------------------------------------------------------- */

const CHARTS = [
  { id: "throughput-requests", title: "requests/s", series: [["requests_per_s", "requests/s", "#2f6fde"]] },
  { id: "throughput-tokens", title: "tokens/s", series: [["tokens_per_s", "tokens/s", "#1f883d"]] },
  { id: "depth", title: "queue depth (waiting)", series: [["depth", "waiting", "#b7791f"]] },
  {
    id: "wait", title: "queue wait (ms)",
    series: [["wait_p50_ms", "p50", "#6f42c1"], ["wait_p99_ms", "p99", "#cf222e"]],
  },
];

function buildOverview(view) {
  view.append(
    h("div", { class: "cards", id: "cards" }),
    h("h2", {}, "By priority"), h("div", { id: "priorities" }),
    h("h2", {}, "By model"), h("div", { id: "models" }),
    h("h2", {}, "By tenant"), h("div", { id: "tenants-brief" }),
    h("h2", {}, "Last 15 minutes"),
    h("div", { class: "charts" }, CHARTS.map((c) =>
      h("div", { class: "chart" }, h("h3", {}, c.title), h("div", { id: `chart-${c.id}` })))),
  );
  ui.charts = {};
  for (const c of CHARTS) {
    const box = document.getElementById(`chart-${c.id}`);
    const opts = {
      width: Math.max(360, box.clientWidth || 420), height: 170,
      legend: { show: c.series.length > 1 },
      scales: { x: { time: true } },
      axes: [{}, { size: 56 }],
      series: [{}, ...c.series.map(([, label, stroke]) => ({
        label, stroke, width: 2, spanGaps: false, points: { show: true, size: 5, fill: stroke },
      }))],
    };
    ui.charts[c.id] = new uPlot(opts, [[], ...c.series.map(() => [])], box);
  }
}

function card(label, value, test) {
  return h("div", { class: "card" }, h("div", { class: "label" }, label),
    h("div", { class: "value", "data-test": test }, value));
}

/* Per priority, as genq stats --json gives it: waiting (not yet taken), handed back, held by
   workers (pending less those two), lag (added and never delivered), oldest wait. */
function priorityRow(name, s) {
  const waiting = s.waiting || 0, back = s.handed_back || 0;
  const held = s.pending - waiting - back;
  return h("tr", { "data-priority": name },
    h("td", {}, name),
    h("td", { "data-test": "length" }, fmt(s.length)),
    h("td", { "data-test": "waiting" }, fmt(waiting)),
    h("td", { "data-test": "handed_back" }, fmt(back)),
    h("td", { "data-test": "held" }, fmt(held)),
    h("td", { "data-test": "lag" }, fmt(s.lag)),
    h("td", { "data-test": "oldest_waiting_ms" }, ms(s.oldest_waiting_ms)));
}

/* Per lane (genq stats --json "models"): the unnamed lane shows the default model it goes to. */
function modelRow(m) {
  const name = m.model === null ? `(none: default ${m.served_by || "-"})`
    : m.model + (m.default ? " (default)" : "");
  return h("tr", { "data-model": m.model === null ? "" : m.model },
    h("td", {}, name),
    h("td", { "data-test": "waiting" }, fmt(m.waiting)),
    h("td", { "data-test": "oldest_waiting_ms" }, m.waiting ? ms(m.oldest_waiting_ms) : "-"),
    h("td", { "data-test": "workers" }, fmt(m.workers)),
    h("td", { "data-test": "holding" }, fmt(m.holding)),
    h("td", { "data-test": "loading" }, fmt(m.loading)),
    h("td", { "data-test": "running" }, fmt(m.running)),
    h("td", { "data-test": "completion_tokens" }, fmt(m.completion_tokens)),
    h("td", { "data-test": "loads" }, fmt(m.loads)),
    h("td", { "data-test": "evictions" }, fmt(m.evictions)),
    h("td", { "data-test": "load_ms_p50" }, m.load_ms_p50 ? ms(m.load_ms_p50) : "-"),
    h("td", {}, m.no_live_worker ? pill("waiting for a model with no live worker") : ""));
}

function tenantBrief(name, t) {
  return h("tr", { "data-tenant": name },
    h("td", {}, name),
    h("td", { "data-test": "waiting" }, fmt(t.waiting)),
    h("td", { "data-test": "running" }, fmt(t.running)),
    h("td", { "data-test": "oldest_waiting_ms" }, t.waiting ? ms(t.oldest_waiting_ms) : "-"),
    h("td", { "data-test": "tokens_last_minute" }, fmt(t.tokens_last_minute)),
    h("td", {}, t.throttled ? pill("yes") : "no"));
}

/** The queue's prefix cache hit rate (cached / prompt tokens of its live workers), or "-". */
function pct(cache) {
  return cache && cache.prompt_tokens ? `${(100 * cache.hit_rate).toFixed(1)}%` : "-";
}

function renderOverview(snap) {
  const s = snap.stats;
  const streams = Object.values(s.streams);
  const named = (s.models || []).filter((m) => m.model !== null);
  const waiting = streams.reduce((a, x) => a + (x.waiting || 0) + (x.handed_back || 0), 0)
    + named.reduce((a, m) => a + m.waiting, 0);
  const live = s.workers.filter((w) => w.state === "live").length;
  const running = s.workers.reduce((a, w) => a + (w.in_flight || 0), 0);
  const oldest = Math.max(0, ...streams.map((x) => x.oldest_waiting_ms || 0));
  const mem = s.redis || {};
  document.getElementById("cards").replaceChildren(
    card("waiting", fmt(waiting), "total-waiting"),
    card("running", fmt(running), "total-running"),
    card("oldest wait", ms(oldest), "oldest-wait"),
    card("workers live", `${live} / ${s.workers.length}`, "workers-live"),
    card("dead letters", fmt(s.dead_letter), "dead-letter"),
    card("Redis memory", mem.used_memory ? bytes(mem.used_memory) : "-", "redis-memory"),
    card("prefix cache hits", pct(s.prefix_cache), "cache-hit-rate"),
  );
  document.getElementById("priorities").replaceChildren(table(
    ["priority", "length", "waiting", "handed back", "held by workers", "lag", "oldest wait"],
    PRIORITIES.map((p) => priorityRow(p, s.streams[p])), { "data-test": "priorities" }));
  document.getElementById("models").replaceChildren(table(
    ["model", "waiting", "oldest wait", "live workers", "holding it", "loading it", "running",
      "tokens generated", "loads", "evictions", "load p50", ""],
    (s.models || []).map(modelRow), { "data-test": "models" }));
  document.getElementById("tenants-brief").replaceChildren(table(
    ["tenant", "waiting", "running", "oldest wait", "tokens last min", "throttled"],
    Object.entries(s.tenants).map(([n, t]) => tenantBrief(n, t)), { "data-test": "tenants" }));
  const hist = snap.history;
  for (const c of CHARTS) {
    ui.charts[c.id].setData([hist.t, ...c.series.map(([key]) => hist[key])]);
  }
}

/* ---- workers, tenants ------------------------------------------------------------- */

/** A pool's worker: the models it holds and its last swap; "-" for a worker of one model. */
function holding(w) {
  if (w.resident === undefined) return "-";
  return (w.resident || "(none)") + (w.last_swap ? ` (${w.last_swap})` : "");
}

function renderWorkers(snap) {
  const s = snap.stats, mem = s.redis || {};
  const memText = mem.used_memory === undefined ? "not readable by this Redis user"
    : `${bytes(mem.used_memory)} used of ${mem.maxmemory ? bytes(mem.maxmemory) : "no limit"} (${mem.maxmemory_policy})`;
  const rows = s.workers.map((w) => h("tr", { "data-worker": w.consumer },
    h("td", {}, w.consumer),
    h("td", {}, pill(w.state)),
    h("td", { class: "text" }, fmt(w.engine)),
    h("td", { class: "text" }, fmt(w.model)),
    h("td", { class: "text", "data-test": "holding" }, holding(w)),
    h("td", { class: "text" }, fmt(w.device)),
    h("td", { class: "text" }, w.host ? `${w.host}:${w.pid}` : "-"),
    h("td", { "data-test": "in_flight" }, fmt(w.in_flight)),
    h("td", {}, fmt(w.held)),
    h("td", { class: "text" }, (w.recent_batch_sizes || []).slice(-8).join(" ") || "-"),
    h("td", {}, fmt(Math.round(w.tokens_per_s || 0))),
    h("td", { "data-test": "inputs_per_s" }, fmt(Math.round(w.inputs_per_s || 0))),
    h("td", { "data-test": "cache_hit_rate" },
      w.cache_hit_rate === undefined ? "-" : `${(100 * w.cache_hit_rate).toFixed(1)}%`),
    h("td", {}, fmt(w.succeeded)),
    h("td", {}, fmt(w.failed)),
    h("td", {}, w.seen_ago_ms === null || w.seen_ago_ms === undefined ? "-" : ms(w.seen_ago_ms))));
  return [
    h("div", { class: "cards" },
      card("Redis memory", memText, "redis-memory"),
      card("Redis full", mem.full ? "yes: writes refused" : "no", "redis-full")),
    h("h2", {}, "Workers"),
    table(["worker", "state", "<engine", "<model", "<holding (last swap)", "<device", "<host", "in flight", "held",
      "<recent batch sizes", "tokens/s", "inputs/s", "cache hits", "succeeded", "failed", "last seen"], rows,
    { "data-test": "workers" }),
    h("p", { class: "muted" }, "silent: no heartbeat for 5 s; dead: its heartbeat expired, " +
      "its pending requests go to other workers."),
  ];
}

function renderTenants(snap) {
  const rows = Object.entries(snap.stats.tenants).map(([n, t]) => h("tr", { "data-tenant": n },
    h("td", {}, n),
    h("td", {}, fmt(t.weight)),
    h("td", {}, t.tokens_per_minute ? fmt(t.tokens_per_minute) : "no limit"),
    h("td", {}, t.max_queued ? fmt(t.max_queued) : "no limit"),
    h("td", { "data-test": "waiting" }, fmt(t.waiting)),
    h("td", { "data-test": "running" }, fmt(t.running)),
    h("td", {}, fmt(t.tokens_last_minute)),
    h("td", { "data-test": "tokens_total" }, fmt(t.tokens_total)),
    h("td", {}, fmt(t.requests_total)),
    h("td", {}, t.throttled ? pill("yes") : "no")));
  return [
    h("h2", {}, "Tenants"),
    table(["tenant", "weight", "tokens/min", "most queued", "waiting", "running",
      "tokens last min", "tokens served", "requests served", "throttled"], rows,
    { "data-test": "tenants" }),
    h("p", { class: "muted" }, "Settings: genq tenants set NAME --weight W --tokens-per-minute N."),
  ];
}

/* ---- batches ---------------------------------------------------------------------- */

function confirmButton(key, label, question, action) {
  if (ui.confirm === key) {
    return h("span", {}, `${question} `,
      h("button", { class: "danger", "data-test": "confirm", onclick: action }, "Yes"), " ",
      h("button", { onclick: () => { ui.confirm = null; refresh(); } }, "No"));
  }
  return h("button", { class: "danger", "data-test": label.toLowerCase(),
    onclick: () => { ui.confirm = key; refresh(); } }, label);
}

async function act(path, body) {
  ui.confirm = null;
  try {
    await api(path, { method: "POST", body: JSON.stringify(body || {}) });
    setStatus("done");
  } catch (err) {
    setStatus(`failed: ${err.message}`, true);
  }
  refresh();
}

function renderBatches(data) {
  const rows = data.data.map((b) => {
    const c = b.request_counts, done = c.completed + c.failed;
    const bar = h("span", {});
    bar.style.width = `${c.total ? Math.round((100 * done) / c.total) : 100}%`;
    const open = b.status === "in_progress" || b.status === "validating";
    return h("tr", { "data-batch": b.id },
      h("td", {}, b.id),
      h("td", {}, pill(b.status)),
      h("td", { class: "text" }, h("span", { class: "bar" }, bar), ` ${done}/${c.total}`),
      h("td", { "data-test": "completed" }, fmt(c.completed)),
      h("td", { "data-test": "failed" }, fmt(c.failed)),
      h("td", {}, when(b.created_at * 1000)),
      h("td", {}, when((b.completed_at || b.cancelled_at || b.failed_at || 0) * 1000)),
      h("td", {}, open ? confirmButton(`batch:${b.id}`, "Cancel", "Cancel this batch?",
        () => act(`batches/${encodeURIComponent(b.id)}/cancel`)) : ""));
  });
  return [
    h("h2", {}, "Batches"),
    table(["batch", "status", "<progress", "completed", "failed", "created", "finished", ""],
      rows, { "data-test": "batches" }),
  ];
}

/* ---- dead letters ----------------------------------------------------------------- */

function renderDead(data) {
  const rows = [];
  for (const e of data.entries) {
    rows.push(h("tr", { "data-dlq": e.dlq_id },
      h("td", {}, e.dlq_id),
      h("td", { class: "text" }, e.request_id || "-"),
      h("td", { class: "text" }, e.stream),
      h("td", { class: "text" }, e.error),
      h("td", { class: "text" }, e.worker || "-"),
      h("td", {}, when(e.at_unix_ms)),
      h("td", {},
        h("button", { "data-test": "view", onclick: () => { ui.open[e.dlq_id] = !ui.open[e.dlq_id]; refresh(); } },
          ui.open[e.dlq_id] ? "Hide" : "View"), " ",
        h("button", { "data-test": "retry",
          onclick: () => act(`dead-letters/${encodeURIComponent(e.dlq_id)}/retry`) }, "Retry"))));
    if (ui.open[e.dlq_id]) {
      rows.push(h("tr", {}, h("td", { colspan: 7 }, h("pre", { "data-test": "entry" },
        JSON.stringify(e, null, 2)))));
    }
  }
  const hooks = data.webhooks.map((w) => h("tr", { "data-dead-webhook": w.dead_id },
    h("td", {}, w.dead_id),
    h("td", { class: "text" }, w.type),
    h("td", { class: "text" }, w.object_id),
    h("td", { class: "text" }, w.endpoint),
    h("td", { class: "text" }, w.error),
    h("td", {}, fmt(w.deliveries)),
    h("td", {}, h("button", { "data-test": "retry",
      onclick: () => act(`webhook-letters/${encodeURIComponent(w.dead_id)}/retry`) }, "Retry"))));
  return [
    h("h2", {}, `Dead letters (${data.entries.length} shown)`),
    data.entries.length ? h("p", {}, confirmButton("purge", "Purge",
      "Delete every dead letter of this queue?", () => act("dead-letters/purge", { confirm: "purge" }))) : null,
    table(["entry", "<request", "<stream", "<why", "<worker", "at", ""], rows,
      { "data-test": "dead-letters" }),
    h("h2", {}, "Webhook deliveries that gave up"),
    table(["entry", "<event", "<object", "<endpoint", "<why", "attempts", ""], hooks,
      { "data-test": "dead-webhooks" }),
  ];
}

/* ---- one request ------------------------------------------------------------------ */

function buildRequest(view) {
  const input = h("input", { id: "request-id", placeholder: "request id", "data-test": "request-id" });
  const go = () => { ui.lookup = input.value.trim(); refresh(); };
  input.addEventListener("keydown", (ev) => { if (ev.key === "Enter") go(); });
  if (ui.lookup) input.value = ui.lookup;
  view.append(
    h("h2", {}, "Look up a request"),
    h("div", { class: "lookup" }, input, h("button", { onclick: go, "data-test": "look-up" }, "Look up")),
    h("div", { id: "request-out" }));
}

function renderRequest(found) {
  const out = document.getElementById("request-out");
  if (!found) { out.replaceChildren(); return; }
  if (found.error) { out.replaceChildren(h("p", { "data-test": "not-found" }, found.error)); return; }
  const s = found.state, t = s.timings || {};
  const rows = [
    ["status", pill(s.status)], ["id", s.id], ["tenant", s.tenant], ["priority", s.priority],
    ["worker", s.worker], ["model", s.model], ["batch size", s.batch_size],
    ["queued", when(t.queued_unix_ms)], ["started", when(t.started_unix_ms)],
    ["finished", when(t.finished_unix_ms)], ["queue wait", ms(t.queue_wait_ms)],
    ["generation", ms(t.generation_ms)], ["finish reason", s.finish_reason],
    ["tokens", s.usage ? `${s.usage.prompt_tokens} in, ${s.usage.completion_tokens} out` : null],
    ["error", s.error ? `${s.error.code}: ${s.error.message}` : null],
    ["response", found.response_id],
  ];
  out.replaceChildren(
    h("dl", { "data-test": "request" }, rows.filter(([, v]) => v !== null && v !== undefined)
      .map(([k, v]) => [h("dt", {}, k), h("dd", { "data-test": k.replace(" ", "_") }, v)])),
    s.text !== null && s.text !== undefined ? h("h2", {}, "Text") : null,
    s.text !== null && s.text !== undefined ? h("pre", { "data-test": "text" }, s.text) : null);
}

/* ---- the loop --------------------------------------------------------------------- */

const PAGES = {
  overview: { api: "snapshot", build: buildOverview, render: renderOverview },
  workers: { api: "snapshot", render: renderWorkers },
  tenants: { api: "snapshot", render: renderTenants },
  batches: { api: "batches", render: renderBatches },
  "dead-letters": { api: "dead-letters", render: renderDead },
  request: { build: buildRequest, render: renderRequest },
};

function show(page) {
  ui.page = PAGES[page] ? page : "overview";
  ui.confirm = null;
  for (const a of document.querySelectorAll("header nav a")) {
    a.classList.toggle("active", a.dataset.page === ui.page);
  }
  const view = document.getElementById("view");
  view.replaceChildren();
  view.dataset.page = ui.page;
  const p = PAGES[ui.page];
  if (p.build) p.build(view);
  refresh();
}

async function load() {
  const p = PAGES[ui.page];
  if (ui.page === "request") {
    if (!ui.lookup) return null;
    try {
      return await api(`requests/${encodeURIComponent(ui.lookup)}`);
    } catch (err) {
      if (err.status === 404) return { error: err.message };
      throw err;
    }
  }
  return api(p.api);
}

async function refresh() {
  clearTimeout(ui.timer);
  const page = ui.page, seq = ++ui.seq;  // a newer refresh (a click) supersedes this one
  if (document.hidden) {  // nobody is looking: no reads until the tab is shown again
    ui.timer = setTimeout(refresh, REFRESH_MS);
    return;
  }
  try {
    const data = await load();
    if (seq !== ui.seq) return;
    const queue = data && (data.queue || (data.stats && data.stats.queue));
    if (queue) document.getElementById("queue").textContent = `queue ${queue}`;
    if (data && data.stats) {
      banner(data.stats.redis && data.stats.redis.full
        ? "Redis is full: writes are refused; workers hold their results and wait" : "");
    }
    const p = PAGES[page];
    const drawn = p.render(data);
    if (Array.isArray(drawn)) document.getElementById("view").replaceChildren(...drawn.filter(Boolean));
    document.body.dataset.loaded = String(Date.now());
    // Since navigation began: what `genq bench --scenario dashboard` reports as the render time.
    document.body.dataset.firstDrawnMs = document.body.dataset.firstDrawnMs || String(performance.now());
    setStatus(`updated ${new Date().toLocaleTimeString()}`);
  } catch (err) {
    if (seq !== ui.seq) return;
    setStatus(`cannot read the queue: ${err.message}`, true);
  }
  ui.timer = setTimeout(refresh, REFRESH_MS);
}

window.addEventListener("hashchange", () => show(location.hash.slice(1)));
document.addEventListener("visibilitychange", () => { if (!document.hidden) refresh(); });
show(location.hash.slice(1));
