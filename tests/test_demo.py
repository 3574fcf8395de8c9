"""`genq demo` runs end to end: its own redis-server, a worker on the real model loaded first,
a low-priority backlog and high-priority questions after it, one answer streamed live."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow


def test_demo_loads_first_streams_an_answer_and_serves_high_before_the_backlog() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "genq.worker", "demo", "--requests", "12", "--max-batch-size", "4"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    text = out.stdout
    assert "worker ready: smollm2-135m loaded in" in text
    assert re.search(r"dashboard: http://127\.0\.0\.1:\d+/dashboard", text), text[:2000]
    assert text.index("worker ready") < text.index("submitted a backlog of 8 low-priority")
    assert "streaming the first question's answer" in text
    assert "12 succeeded" in text and "engine continuous" in text
    waits = dict(re.findall(r"(high|low) p50 (\d+) ms", text))
    assert int(waits["high"]) < int(waits["low"]), text[-600:]
