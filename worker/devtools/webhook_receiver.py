"""A webhook receiver for the tests and ``genq bench --scenario webhooks``: a real HTTP server
on a free loopback port, in a thread, that records every delivery (headers, body, when it
arrived) and answers 500 to the first ``fail_first`` deliveries it gets (or to all while
``failing``), each after ``delay_s``. A request whose body stops short of its content-length
(a sender killed while writing it) is no delivery: nothing is recorded and nothing answered,
as a real endpoint's HTTP server would drop it."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass(frozen=True)
class Delivery:
    headers: dict[str, str]
    body: str
    accepted: bool
    at_ms: float = 0.0
    """When it arrived (Unix ms)."""


class Receiver:
    def __init__(self, fail_first: int = 0, delay_s: float = 0.0) -> None:
        self.fail_first = fail_first
        self.delay_s = delay_s
        self.failing = False
        self.deliveries: list[Delivery] = []
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("content-length", 0))
                raw = self.rfile.read(length)
                if len(raw) < length:  # the sender died mid-request: a torn request, not a delivery
                    self.close_connection = True
                    return
                body = raw.decode()
                at_ms = time.time() * 1000
                time.sleep(receiver.delay_s)  # a slow endpoint (past the sender's timeout)
                with receiver._lock:
                    ok = not receiver.failing and len(receiver.deliveries) >= receiver.fail_first
                    headers = {k.lower(): v for k, v in self.headers.items()}
                    receiver.deliveries.append(Delivery(headers, body, ok, at_ms))
                self.send_response(200 if ok else 500)
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hooks"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()

    def accepted(self) -> list[Delivery]:
        with self._lock:
            return [d for d in self.deliveries if d.accepted]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
