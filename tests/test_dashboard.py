"""The dashboard in a real browser: Debian's chromium, driven headless by Playwright (pointed at
the system browser: nothing is downloaded). Each page is loaded, a screenshot taken and what it
shows checked against the queue (the overview against ``genq stats --json``); every test also
checks the console stayed clean and no request left the page's origin.

Screenshots go to ``$DASHBOARD_SCREENSHOTS_DIR`` when set (``scripts/dashboard_screenshots.sh``
makes the dashboard page's), else to the test's temporary folder."""

from __future__ import annotations

import json
import os
import shutil
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from genq.common import tenants
from genq.common.keys import Keys
from genq.common.wire import encode_request
from genq.producer import Client
from genq.producer.building import build_request
from genq.producer.gateway import batches
from genq.worker.devtools.gateway_process import GatewayProcess
from genq.worker.runtime.dead_letter import add_to_pipeline, dead_letter_fields

from tests.conftest import WorkerProcess, genq_stats, wait_until

CHROMIUM = "/usr/bin/chromium"

pytestmark = pytest.mark.skipif(
    not Path(CHROMIUM).exists() or shutil.which("chromium") is None,
    reason="Debian's chromium is not installed (apt-get install chromium)",
)


class Watched:
    """A page whose console errors and requests are recorded."""

    def __init__(self, page: Any, origin: str, shots: Path) -> None:
        self.page, self.origin, self.shots = page, origin, shots
        self.errors: list[str] = []
        self.requests: list[str] = []
        page.on("console", lambda m: self.errors.append(m.text) if m.type == "error" else None)
        page.on("pageerror", lambda e: self.errors.append(str(e)))
        page.on("request", lambda r: self.requests.append(r.url))

    def open(self, view: str) -> Any:
        """Show ``view`` (``#overview``, ...) and wait for its first data."""
        self.page.goto(f"{self.origin}/dashboard#{view}")
        self.page.wait_for_function(
            f"() => document.getElementById('view').dataset.page === '{view}'"
        )
        if view != "request":
            self.fresh()
        return self.page

    def fresh(self) -> None:
        """Wait for the next refresh to be drawn."""
        before = self.page.evaluate("document.body.dataset.loaded || '0'")
        self.page.wait_for_function(f"() => (document.body.dataset.loaded || '0') !== '{before}'")

    def shot(self, name: str) -> None:
        path = self.shots / f"{name}.png"
        self.page.screenshot(path=str(path), full_page=True)
        assert path.stat().st_size > 10_000

    def check_clean(self) -> None:
        assert not self.errors, self.errors
        foreign = [u for u in self.requests if not u.startswith(self.origin + "/")]
        assert not foreign, foreign


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM)
        try:
            yield b
        finally:
            b.close()


@pytest.fixture()
def shots(tmp_path: Path) -> Path:
    where = os.environ.get("DASHBOARD_SCREENSHOTS_DIR")
    path = Path(where) if where else tmp_path / "shots"
    path.mkdir(parents=True, exist_ok=True)
    return path


@pytest.fixture()
def dashboard(
    browser: Any, redis_url: str, queue: str, tmp_path: Path, shots: Path
) -> Iterator[Watched]:
    """``genq serve`` with no keys (the dashboard is local-only), and a watched page on it."""
    gateway = GatewayProcess(redis_url, queue, tmp_path / "gateway.log")
    context = browser.new_context(viewport={"width": 1280, "height": 800})
    watched = Watched(context.new_page(), f"http://127.0.0.1:{gateway.port}", shots)
    try:
        yield watched
        watched.check_clean()
    finally:
        context.close()
        gateway.stop()


def cells(page: Any, row: str) -> dict[str, str]:
    """The ``data-test`` cells of the table row matching ``row``, by name."""
    found: dict[str, str] = page.eval_on_selector(
        row,
        "tr => Object.fromEntries([...tr.querySelectorAll('[data-test]')]"
        ".map(c => [c.dataset.test, c.textContent]))",
    )
    return found


def number(text: str) -> int:
    return int(text.replace(",", ""))


def test_the_overview_shows_what_genq_stats_shows(
    dashboard: Watched,
    r: redis.Redis,
    redis_url: str,
    queue: str,
    start_worker: Callable[..., WorkerProcess],
) -> None:
    client = Client.from_url(redis_url, queue)
    start_worker(queue, "--engine", "echo", "--echo-step-ms", "20", "--echo-cache-tokens", "4096")
    client.results(client.submit_many([f"warm {i}" for i in range(20)]), timeout=60)
    shared = "a system prompt that every one of these requests shares, " * 2
    for turn in range(2):  # the second round finds the shared prefix cached
        client.results(client.submit_many([f"{shared}{turn}-{i}" for i in range(3)]), timeout=60)
    if os.environ.get("DASHBOARD_SCREENSHOTS_DIR"):  # the docs' pictures: a minute of traffic
        for second in range(70):
            burst = 5 + (second * 7) % 40
            client.submit_many([f"s{second}-{i}" for i in range(burst)], max_new_tokens=8)
            time.sleep(1)
        time.sleep(61)  # tokens_last_minute settles (it moves while the page and stats are read)
    # Then a backlog the worker will not take: tenant "slow" may have 1 token a minute.
    tenants.update(r, Keys(queue), "slow", tokens_per_minute=1)
    client.submit_many(
        [
            {"prompt": f"p{i}", "tenant": "slow", "priority": ("high", "low")[i % 2]}
            for i in range(7)
        ]
    )
    client.submit_many([{"prompt": "q", "tenant": "slow"}] * 3)
    wait_until(lambda: genq_stats(redis_url, queue)["tenants"]["slow"]["throttled"], timeout_s=20)
    page = dashboard.open("overview")
    dashboard.fresh()
    stats = genq_stats(redis_url, queue)
    for p, s in stats["streams"].items():
        shown = cells(page, f"[data-priority={p}]")
        assert number(shown["length"]) == s["length"], p
        assert number(shown["waiting"]) == s["waiting"], p
        assert number(shown["handed_back"]) == s["handed_back"], p
        assert number(shown["held"]) == s["pending"] - s["waiting"] - s["handed_back"], p
        # Redis may not know a group's lag (deleted entries in the way): shown as "-".
        assert (shown["lag"] == "-") if s["lag"] is None else number(shown["lag"]) == s["lag"], p
    for name, t in stats["tenants"].items():
        shown = cells(page, f"[data-test=tenants] [data-tenant={name}]")
        assert number(shown["waiting"]) == t["waiting"], name
        assert number(shown["running"]) == t["running"], name
        assert number(shown["tokens_last_minute"]) == t["tokens_last_minute"], name
        assert (shown["oldest_waiting_ms"] == "-") == (t["waiting"] == 0), name
    waiting = sum(s["waiting"] + s["handed_back"] for s in stats["streams"].values())
    assert waiting > 0
    assert number(page.text_content("[data-test=total-waiting]")) == waiting
    assert page.text_content("[data-test=workers-live]") == "1 / 1"
    assert number(page.text_content("[data-test=dead-letter]")) == stats["dead_letter"]
    hit_rate = stats["prefix_cache"]["hit_rate"]
    assert hit_rate > 0
    assert page.text_content("[data-test=cache-hit-rate]") == f"{100 * hit_rate:.1f}%"
    # The charts drew every request served (the history the workers wrote).
    served = sum(t["requests_total"] for t in stats["tenants"].values())
    assert served >= 20
    wait_until(
        lambda: (
            page.evaluate(
                "fetch('dashboard/api/snapshot').then(r => r.json()).then(s => Math.round("
                "s.history.requests_per_s.reduce((a, x) => a + (x || 0), 0) * 5))"
            )
            == served
        ),
        timeout_s=15,
    )
    assert page.locator(".uplot").count() == 4
    dashboard.fresh()
    dashboard.shot("overview")
    page = dashboard.open("tenants")
    assert page.text_content("[data-tenant=slow] td:nth-child(3)") == "1"  # tokens/min
    assert page.locator("[data-tenant=slow] .pill.yes").count() == 1  # throttled
    dashboard.shot("tenants")


def test_the_workers_page_flags_a_worker_that_died_and_a_full_redis(
    dashboard: Watched,
    r: redis.Redis,
    redis_url: str,
    queue: str,
    start_worker: Callable[..., WorkerProcess],
) -> None:
    client = Client.from_url(redis_url, queue)
    doomed = start_worker(queue, "--engine", "echo", "--heartbeat-ttl-s", "2")  # consumer w0
    client.results(client.submit_many([f"p{i}" for i in range(10)]), timeout=60)
    doomed.kill()  # it took work, so the group knows it; its heartbeat expires in 2 s
    start_worker(queue, "--engine", "echo", "--heartbeat-ttl-s", "2")  # w1
    client.results(client.submit_many([f"q{i}" for i in range(10)]), timeout=60)
    page = dashboard.open("workers")
    wait_until(lambda: page.locator("[data-test=workers] .pill.dead").count() == 1, timeout_s=20)
    assert page.locator("[data-test=workers] .pill.live").count() == 1
    assert page.locator("[data-worker=w0] .pill.dead").count() == 1
    assert page.locator("[data-worker=w1] .pill.live").count() == 1
    assert page.text_content("[data-test=redis-full]") == "no"
    dashboard.shot("workers")
    r.config_set("maxmemory", 1)  # full: writes refused, and the dashboard still reads
    try:
        wait_until(lambda: page.text_content("[data-test=redis-full]") == "yes: writes refused")
        assert "Redis is full" in (page.text_content("#banner") or "")
    finally:
        r.config_set("maxmemory", 0)
    wait_until(lambda: page.is_hidden("#banner"))


def test_a_pool_workers_models_and_swaps_show_as_genq_stats_shows_them(
    dashboard: Watched,
    r: redis.Redis,
    redis_url: str,
    queue: str,
    start_worker: Callable[..., WorkerProcess],
) -> None:
    """A worker with a pool of two models, one resident, made to swap: per model the
    overview shows its holders, loads, evictions and load time as ``genq stats`` counts them,
    and the workers page what the worker holds and its last swap."""
    client = Client.from_url(redis_url, queue)
    pool = ("--model", "alpha", "--model", "beta", "--resident-models", "1")
    start_worker(
        queue, "--engine", "echo", *pool, "--echo-load-ms", "300", "--min-resident-ms", "0"
    )
    for model in ("beta", "alpha"):
        client.results(client.submit_many([{"prompt": "p", "model": model}] * 3), timeout=60)
    wait_until(lambda: r.hget(Keys(queue).worker("w0"), "model_loads") == b"3", timeout_s=20)
    page = dashboard.open("overview")
    dashboard.fresh()
    stats = {m["model"]: m for m in genq_stats(redis_url, queue)["models"]}
    assert stats["alpha"]["loads"] == 2 and stats["beta"]["evictions"] == 1, stats
    for model in ("alpha", "beta"):
        shown = cells(page, f"[data-test=models] [data-model={model}]")
        for field in ("holding", "loads", "evictions"):
            assert number(shown[field]) == stats[model][field], (model, field)
        assert shown["load_ms_p50"] != "-", model
    dashboard.shot("pool-overview")
    page = dashboard.open("workers")
    held = page.text_content("[data-worker=w0] [data-test=holding]") or ""
    assert held.startswith("alpha (beta -> alpha"), held
    dashboard.shot("pool-workers")


def test_a_cancelled_batch_shows_cancelled(dashboard: Watched, redis_url: str, queue: str) -> None:
    client = Client.from_url(redis_url, queue)  # no worker: the batch stays in progress
    lines = [
        json.dumps(
            {
                "custom_id": f"c{i}",
                "method": "POST",
                "url": "/v1/completions",
                "body": {"model": "m", "prompt": f"p{i}", "max_tokens": 4},
            }
        )
        for i in range(5)
    ]
    done = batches.submit_batch(client, lines, source="input.jsonl")
    page = dashboard.open("batches")
    assert page.text_content("#queue") == f"queue {queue}"  # on every page, not only the overview
    row = f"[data-batch='{done.id}']"
    assert page.text_content(f"{row} [data-test=state]") == "in_progress"
    page.click(f"{row} [data-test=cancel]")
    page.click(f"{row} [data-test=confirm]")
    wait_until(lambda: page.text_content(f"{row} [data-test=state]") == "cancelled")
    assert number(page.text_content(f"{row} [data-test=failed]")) == 5
    assert batches.batch_status(client, done.id)["status"] == "cancelled"
    dashboard.shot("batches")


def dead_letter(r: redis.Redis, queue: str, prompt: str) -> str:
    """A poison request's dead letter, as a worker records it; returns the request's id."""
    keys = Keys(queue)
    request = build_request(prompt, max_new_tokens=4)
    fields = dead_letter_fields(
        stream=keys.stream("normal"),
        entry_id="1-0",
        fields=encode_request(request),
        error="started 3 times, each time by a worker that died (poison?)",
        worker="w-gone",
        request_id=request.id,
    )
    pipe = r.pipeline()
    add_to_pipeline(pipe, keys, fields)
    pipe.execute()
    return request.id


def test_a_retried_dead_letter_leaves_the_list_and_purge_asks_first(
    dashboard: Watched, r: redis.Redis, queue: str
) -> None:
    first = dead_letter(r, queue, "first")
    dead_letter(r, queue, "second")
    dead_letter(r, queue, "third")
    page = dashboard.open("dead-letters")
    assert page.locator("[data-dlq]").count() == 3
    row = page.locator("[data-dlq]").first
    row.locator("[data-test=view]").click()
    wait_until(lambda: first in (page.text_content("[data-test=entry]") or ""))
    dashboard.shot("dead-letters")
    row.locator("[data-test=retry]").click()
    wait_until(lambda: page.locator("[data-dlq]").count() == 2)
    assert r.xlen(Keys(queue).stream("normal")) == 1  # back in its stream, to be run again
    assert json.loads(r.get(Keys.result(first)) or "{}")["status"] == "queued"
    page.click("[data-test=purge]")
    assert page.locator("[data-dlq]").count() == 2  # not yet: it asks
    page.click("[data-test=confirm]")
    wait_until(lambda: page.locator("[data-dlq]").count() == 0)
    assert r.xlen(Keys(queue).dead_letter) == 0


def test_a_request_is_looked_up_by_id(
    dashboard: Watched, redis_url: str, queue: str, start_worker: Callable[..., WorkerProcess]
) -> None:
    client = Client.from_url(redis_url, queue)
    start_worker(queue, "--engine", "echo")
    rid = client.submit("look me up", max_new_tokens=4, tenant="acme")
    result = client.result(rid, timeout=60)
    page = dashboard.open("request")
    page.fill("[data-test=request-id]", rid)
    page.click("[data-test=look-up]")
    page.wait_for_selector("[data-test=request]")
    assert page.text_content("[data-test=request] [data-test=state]") == "succeeded"
    assert page.text_content("[data-test=tenant]") == "acme"
    assert page.text_content("[data-test=worker]") == result.worker
    assert page.text_content("[data-test=text]") == result.text
    dashboard.shot("request")
    page.fill("[data-test=request-id]", "no-such-id")
    page.click("[data-test=look-up]")
    page.wait_for_selector("[data-test=not-found]")
    dashboard.errors.clear()  # the 404 above is the browser's own console line


def _get(url: str, headers: dict[str, str] | None = None) -> tuple[int, str]:
    req = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


def test_only_an_admin_key_sees_the_dashboard(
    browser: Any, redis_url: str, queue: str, tmp_path: Path
) -> None:
    admin, tenant_key = "admin-secret", "tenant-secret=acme"
    gateway = GatewayProcess(
        redis_url, queue, tmp_path / "gw.log", ["--admin-key", admin, "--api-key", tenant_key]
    )
    base = f"http://127.0.0.1:{gateway.port}/dashboard"
    try:
        status, body = _get(base)
        assert status == 401 and "Admin key" in body
        assert _get(f"{base}/api/snapshot")[0] == 403
        assert _get(f"{base}/api/snapshot", {"Authorization": "Bearer tenant-secret"})[0] == 403
        assert _get(f"{base}/api/snapshot", {"Authorization": f"Bearer {admin}"})[0] == 200
        # An action needs the dashboard's header (a cross-site form cannot send it).
        req = urllib.request.Request(
            f"{base}/api/dead-letters/purge",
            data=b'{"confirm": "purge"}',
            headers={"Authorization": f"Bearer {admin}"},
            method="POST",
        )
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(req, timeout=10)
        assert refused.value.code == 403
        # In a browser: the login form, then the pages.
        context = browser.new_context()
        page = context.new_page()
        page.goto(base)
        page.fill("input[name=key]", "wrong")
        page.click("button[type=submit]")
        assert page.locator("input[name=key]").count() == 1
        page.fill("input[name=key]", admin)
        page.click("button[type=submit]")
        page.wait_for_function("() => document.body.dataset.loaded")
        assert page.text_content("#queue") == f"queue {queue}"
        cookie = next(c for c in context.cookies() if c["name"] == "genq_dashboard")
        assert cookie["httpOnly"] and cookie["sameSite"] == "Strict"
        # A session, not the key: it expires, and a forged or stale one opens nothing.
        assert admin not in cookie["value"] and cookie["expires"] > time.time() + 3600
        session = {"Cookie": f"genq_dashboard={cookie['value']}"}
        assert _get(f"{base}/api/snapshot", session)[0] == 200
        expires, _, mac = cookie["value"].partition(".")
        forged = {"Cookie": f"genq_dashboard={int(expires) + 86400}.{mac}"}
        assert _get(f"{base}/api/snapshot", forged)[0] == 403
        stale = {"Cookie": f"genq_dashboard={int(time.time()) - 1}.{mac}"}
        assert _get(f"{base}/api/snapshot", stale)[0] == 403
        page.click("form.logout button")
        page.wait_for_selector("input[name=key]")
        assert not [c for c in context.cookies() if c["name"] == "genq_dashboard"]
        context.close()
    finally:
        gateway.stop()


def test_with_no_keys_the_dashboard_is_for_this_machine_only(redis_url: str, queue: str) -> None:
    from fastapi.testclient import TestClient
    from genq.producer.gateway.app import create_app
    from genq.producer.gateway.settings import GatewaySettings

    app = create_app(GatewaySettings(redis_url=redis_url, queue=queue), api=False)
    local_url = "http://127.0.0.1"  # an open gateway answers loopback host names only
    with TestClient(app, base_url=local_url, client=("10.1.2.3", 50000)) as remote:
        assert remote.get("/dashboard").status_code == 403
        assert remote.get("/dashboard/api/snapshot").status_code == 403
        assert remote.get("/v1/models").status_code == 404  # genq dashboard: no API routes
    with TestClient(app, base_url=local_url, client=("127.0.0.1", 50000)) as local:
        assert local.get("/dashboard").status_code == 200
        assert local.get("/dashboard/api/snapshot").json()["stats"]["queue"] == queue
        assert local.get("/dashboard/static/uPlot.LICENSE").text.startswith("The MIT License")
        assert local.get("/dashboard/static/..%2Fdashboard_routes.py").status_code == 404
