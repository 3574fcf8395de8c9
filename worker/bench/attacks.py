"""``genq bench --scenario attacks``: attacks by one tenant, repeated against one
``genq serve`` with its defaults, while another tenant works (its quotas and limits).

A Redis with a ``maxmemory`` (``REDIS_MB``, noeviction), one echo worker, one gateway with two
keys (alice attacks, bob chats). Bob sends chats one after another for the whole run; a sampler
reads Redis' memory and the gateway's RSS every 50 ms. Alice, one attack after another:

- **junk batches**: files of junk lines (``JUNK_LINES`` each) made into batches;
- **uploads until refused**: small files until the gateway says no (the tenant's quota of
  1,000 files: 429; their bytes are in the file store, not Redis);
- **huge body**: a chat body of ``HUGE_MB`` (counted as it arrives);
- **tool schemas**: chats with 4 tools of 100 KB each (the issue's: 6.2 s of frozen ``/health``);
- **tool arguments**: 2,000,000 characters of tool-call arguments;
- **malformed**: deep nesting, ``model`` as a list, a number as a text part;
- **priority**: ``priority: high`` from a tenant whose highest is ``normal``.

Per attack: alice's answers (status codes), bob's chats in that time (all served? p50), the
peak of Redis' memory against its limit, the gateway's RSS peak. Goals: alice gets a clear
4xx (or 507 for room), bob's chats all succeed, Redis stays under its limit, the gateway's
memory stays bounded.
"""

from __future__ import annotations

import json
import statistics
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

QUEUE = "attacks-bench"
KEYS = ["--api-key", "key-a=alice", "--api-key", "key-b=bob"]
ALICE = {"Authorization": "Bearer key-a"}
BOB = {"Authorization": "Bearer key-b"}
CHAT = {"model": "echo", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}


class _Watch:
    """Bob's chats and the samples of Redis' memory and the gateway's RSS, in threads."""

    def __init__(self, base: str, r: Any, pid: int) -> None:
        self.base, self.r, self.pid = base, r, pid
        self.bob: list[tuple[float, bool, float]] = []  # (at, served, seconds)
        self.samples: list[tuple[float, int, float]] = []  # (at, used bytes, rss MB)
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=f, daemon=True) for f in (self._bob, self._sample)]
        for t in self.threads:
            t.start()

    def _bob(self) -> None:
        import httpx

        with httpx.Client(timeout=60) as http:
            while not self.stop.is_set():
                t0 = time.perf_counter()
                try:
                    ok = http.post(f"{self.base}/chat/completions", json=CHAT, headers=BOB)
                    served = ok.status_code == 200
                except httpx.HTTPError:
                    served = False
                self.bob.append((time.monotonic(), served, time.perf_counter() - t0))

    def _sample(self) -> None:
        from genq.worker.bench.flood import _rss_mb

        while not self.stop.is_set():
            used = int(self.r.info("memory")["used_memory"])
            self.samples.append((time.monotonic(), used, _rss_mb(self.pid)))
            time.sleep(0.05)

    def close(self) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(timeout=70)

    def during(self, t0: float, t1: float) -> dict[str, Any]:
        """Bob's chats and the peaks between ``t0`` and ``t1``."""
        bob = [b for b in self.bob if t0 <= b[0] <= t1 + 1.0]
        mem = [s for s in self.samples if t0 <= s[0] <= t1] or self.samples[-1:]
        return {
            "bob_served": sum(1 for b in bob if b[1]),
            "bob_sent": len(bob),
            "bob_p50_ms": statistics.median(b[2] for b in bob) * 1000 if bob else 0.0,
            "redis_peak_mb": max(s[1] for s in mem) / 2**20,
            "gateway_peak_mb": max(s[2] for s in mem),
        }


def _junk_batches(base: str, http: Any, quick: bool) -> list[int]:
    lines = 2_000 if quick else 20_000
    junk = "\n".join(f"junk line {i} " + "x" * 40 for i in range(lines)).encode()
    codes = []
    for _ in range(3 if quick else 10):
        files = {"file": ("junk.jsonl", junk)}
        up = http.post(f"{base}/files", files=files, data={"purpose": "batch"}, headers=ALICE)
        codes.append(up.status_code)
        if up.status_code != 200:
            continue
        create = {
            "input_file_id": up.json()["id"],
            "endpoint": "/v1/chat/completions",
            "completion_window": "24h",
        }
        codes.append(http.post(f"{base}/batches", json=create, headers=ALICE).status_code)
    return codes


def _uploads(base: str, http: Any, quick: bool) -> list[int]:
    """Files until the tenant's quota says no (its 1,000 files: they go to the file store, not
    Redis, and cost Redis a record each)."""
    content = b'{"x": 1}\n' * ((1 if quick else 64) * 2**10 // 9)
    codes: list[int] = []
    for _ in range(1_100):
        files = {"file": ("big.jsonl", content)}
        up = http.post(f"{base}/files", files=files, data={"purpose": "batch"}, headers=ALICE)
        codes.append(up.status_code)
        if up.status_code != 200 and codes.count(up.status_code) >= 3:
            break  # refused three times: the point is made
    return codes


def _huge_body(base: str, http: Any, quick: bool) -> list[int]:
    filler = "x" * ((20 if quick else 150) * 2**20)
    body = json.dumps({**CHAT, "messages": [{"role": "user", "content": filler}]})
    headers = {**ALICE, "Content-Type": "application/json"}
    return [http.post(f"{base}/chat/completions", content=body, headers=headers).status_code]


def _tool_schemas(base: str, http: Any, quick: bool) -> list[int]:
    props = {f"p{i}": {"type": "string", "description": "d" * 80} for i in range(1000)}
    tool = {"type": "function", "function": {"name": "f", "parameters": {"properties": props}}}
    body = {**CHAT, "tools": [tool] * 4}
    url = f"{base}/chat/completions"
    return [http.post(url, json=body, headers=ALICE).status_code for _ in range(3)]


def _tool_arguments(base: str, http: Any, quick: bool) -> list[int]:
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "a" * 2_000_000}}
    messages = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": "ok"},
    ]
    body = {**CHAT, "messages": messages}
    return [http.post(f"{base}/chat/completions", json=body, headers=ALICE).status_code]


NUMBER_PART = {"type": "text", "text": 5}


def _malformed(base: str, http: Any, quick: bool) -> list[int]:
    bodies = [
        "[" * 100_000 + "]" * 100_000,
        json.dumps({**CHAT, "model": ["echo"]}),
        json.dumps(
            {**CHAT, "messages": [{"role": "user", "content": [{"type": "text", "text": 5}]}]}
        ),
    ]
    headers = {**ALICE, "Content-Type": "application/json"}
    url = f"{base}/chat/completions"
    return [http.post(url, content=b, headers=headers).status_code for b in bodies]


def _priority(base: str, http: Any, quick: bool) -> list[int]:
    body = {**CHAT, "priority": "high"}
    return [http.post(f"{base}/chat/completions", json=body, headers=ALICE).status_code]


ATTACKS: dict[str, Callable[[str, Any, bool], list[int]]] = {
    "junk batches": _junk_batches,
    "uploads until refused": _uploads,
    "huge body": _huge_body,
    "tool schemas": _tool_schemas,
    "tool arguments": _tool_arguments,
    "malformed": _malformed,
    "priority": _priority,
}


def run_attacks(redis_url: str, *, quick: bool) -> dict[str, Any]:
    """The scenario on ``redis_url`` (its maxmemory set for the run, then put back)."""
    import logging

    import httpx
    import redis
    from genq.common import tenants
    from genq.common.keys import Keys
    from genq.common.wire import as_text
    from genq.worker.devtools.gateway_process import GatewayProcess
    from genq.worker.devtools.worker_process import start_worker

    logging.getLogger("httpx").setLevel(logging.WARNING)
    r = redis.Redis.from_url(redis_url)
    limit_mb = 96 if quick else 512
    before = {as_text(k): as_text(v) for k, v in r.config_get("maxmemory*").items()}
    r.config_set("maxmemory", f"{limit_mb}mb")
    r.config_set("maxmemory-policy", "noeviction")
    tenants.update(r, Keys(QUEUE), "alice", max_priority="normal")
    worker = start_worker(redis_url=redis_url, queue=QUEUE, engine="echo", max_queue_depth=0)
    tmp = Path(tempfile.mkdtemp())  # its log, and its file store (the uploads go there)
    files = ["--files-dir", str(tmp / "files")]
    gateway = GatewayProcess(redis_url, QUEUE, tmp / "gateway.log", [*KEYS, *files])
    rows: dict[str, dict[str, Any]] = {}
    try:
        deadline = time.monotonic() + 60
        while not httpx.get(f"{gateway.url}/models", headers=BOB).json()["data"]:
            if time.monotonic() > deadline:
                raise RuntimeError("no echo worker came up")
            time.sleep(0.1)
        watch = _Watch(gateway.url, r, gateway.proc.pid)
        try:
            time.sleep(1.0)
            rows["(none: bob alone)"] = {"alice": {}, **watch.during(0.0, time.monotonic())}
            with httpx.Client(timeout=120) as http:
                for name, attack in ATTACKS.items():
                    t0 = time.monotonic()
                    codes = attack(gateway.url, http, quick)
                    time.sleep(0.5)  # bob's chat in flight at the end, and one after
                    rows[name] = {
                        "alice": dict(Counter(codes)),
                        **watch.during(t0, time.monotonic()),
                    }
        finally:
            watch.close()
        return {"redis_limit_mb": limit_mb, "quick": quick, "attacks": rows}
    finally:
        gateway.stop()
        worker.terminate()
        worker.wait(timeout=30)
        r.config_set("maxmemory", before.get("maxmemory") or "0")
        r.config_set("maxmemory-policy", before.get("maxmemory-policy") or "noeviction")
        tenants.delete(r, Keys(QUEUE), "alice")


def attacks_markdown(res: dict[str, Any]) -> str:
    lines = [
        f"One tenant's attacks at one `genq serve` with its defaults; Redis' maxmemory "
        f"{res['redis_limit_mb']} MB (noeviction); another tenant's chats one after another "
        "all along:",
        "",
        "| attack | alice's answers | bob's chats served | bob p50 | Redis peak | gateway RSS "
        "peak |",
        "|---|---|---|---|---|---|",
    ]
    for name, row in res["attacks"].items():
        answers = ", ".join(f"{n} x {code}" for code, n in sorted(row["alice"].items())) or "-"
        lines.append(
            f"| {name} | {answers} | {row['bob_served']} / {row['bob_sent']} | "
            f"{row['bob_p50_ms']:.0f} ms | {row['redis_peak_mb']:.0f} MB | "
            f"{row['gateway_peak_mb']:.0f} MB |"
        )
    return "\n".join(lines)


def run_and_print(params: dict[str, Any]) -> None:
    """``genq bench --scenario attacks`` with the command's parameters."""
    from genq.worker.bench.modes import report_on_redis

    quick = bool(params["quick"])
    report_on_redis(params, lambda url: run_attacks(url, quick=quick), attacks_markdown)
