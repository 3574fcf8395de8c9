"""Batch files outside Redis. The file store (a local directory, or an S3-compatible object
store: moto's server mode, started here), uploads streamed through the gateway and checked as
they pass, and what a bad file, a full store and an unreachable one answer: one clear error,
nothing half-written."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import httpx
import openai
import pytest
import redis
from genq.common.keys import Keys
from genq.producer.gateway.file_store import (
    FileStore,
    LineCheck,
    StoredFileMissing,
    UploadRefused,
    repeats_of,
)
from genq.producer.gateway.repeated_ids import MAX_REPEATS, CustomIds, custom_id, repeats
from genq.producer.gateway.upload_stream import UploadStream
from genq.worker.devtools.gateway_process import GatewayProcess
from genq.worker.devtools.redis_server import free_port

from tests.conftest import WorkerProcess

BUCKET = "genq-files"
CHAT = {"model": "echo", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}


def batch_lines(n: int) -> bytes:
    return b"".join(
        json.dumps({"custom_id": f"c{i}", "url": "/v1/chat/completions", "body": CHAT}).encode()
        + b"\n"
        for i in range(n)
    )


# -- pure units: the checks an upload passes, and the multipart body read as it arrives ---------


def test_an_uploads_check_counts_lines_and_refuses_bad_text_at_its_line() -> None:
    check = LineCheck(max_bytes=1000, max_line_bytes=10)
    text = "é\n".encode() + b"ab\n" + "x€".encode()
    for i in range(len(text)):  # one byte at a time: a character split across chunks is fine
        check.feed(text[i : i + 1])
    check.finish()
    assert (check.bytes, check.lines) == (len(text), 3)
    bad = LineCheck(max_bytes=1000, max_line_bytes=10)
    bad.feed(b"ok\nok\n")
    with pytest.raises(UploadRefused, match="not UTF-8 text \\(line 3\\)"):
        bad.feed(b"\xff\xfe\n")
    long = LineCheck(max_bytes=1000, max_line_bytes=10)
    long.feed(b"short\n12345")
    with pytest.raises(UploadRefused, match="line 2 is over 10 bytes"):
        long.feed(b"678901\n")
    big = LineCheck(max_bytes=5, max_line_bytes=10)
    with pytest.raises(UploadRefused, match="over 5 bytes"):
        big.feed(b"a\nb\nc\n")
    cut = LineCheck(max_bytes=100, max_line_bytes=10)
    cut.feed("€".encode()[:2])
    with pytest.raises(UploadRefused, match="ends inside a character"):
        cut.finish()


def _multipart(files: dict[str, object], data: dict[str, str]) -> tuple[bytes, str]:
    request = httpx.Request("POST", "http://x/v1/files", files=files, data=data)  # type: ignore[arg-type]
    return request.read(), request.headers["content-type"]


async def _pieces(body: bytes, size: int) -> AsyncIterator[bytes]:
    for i in range(0, len(body), size):
        yield body[i : i + size]


def _read(body: bytes, content_type: str, size: int) -> tuple[bytes, UploadStream]:
    async def run() -> tuple[bytes, UploadStream]:
        form = UploadStream(_pieces(body, size), content_type, max_field_bytes=100)
        assert await form.until_file()
        got = b"".join([c async for c in form.file_chunks()])
        return got, form

    return asyncio.run(run())


def test_an_uploads_check_finds_the_lines_that_repeat_a_custom_id(tmp_path: Path) -> None:
    """Each line's custom_id is hashed as the upload passes (any chunking, any key order, any
    JSON escape); the lines whose hashes meet are read back, and only exact repeats count."""
    rows = [
        b'{"custom_id": "a", "body": {}}',
        b'{"body": {"custom_id": "x"}, "custom_id": "b"}',
        b'{"custom_id": "\\u0061", "body": {}}',  # "a" again, escaped
        b"",
        b"{not json",
        b'{"custom_id": 5}',
        b'{"url": "/v1/completions", "custom_id": "b"}',
        b'{"custom_id": "a\\"b"}',
    ]
    text = b"\n".join(rows) + b"\n"
    ids = CustomIds()
    check = LineCheck(max_bytes=10**6, max_line_bytes=100, ids=ids)
    for i in range(len(text)):  # one byte at a time: lines across chunks
        check.feed(text[i : i + 1])
    check.finish()
    assert ids.candidates() == {1, 2, 3, 7}
    numbered_rows = list(enumerate(rows, start=1))
    assert repeats(numbered_rows, ids.candidates()) == {3: 1, 7: 2}
    # A candidate whose hash met another's by chance is read back and is not a repeat.
    assert repeats(numbered_rows, {1, 2, 3, 7, 8}) == {3: 1, 7: 2}
    assert custom_id(rows[7]) == 'a"b'
    # Too many repeats: the stored file is refused and removed.
    store = FileStore(str(tmp_path / "files"))
    many = b'{"custom_id": "same"}\n' * (MAX_REPEATS + 2)
    store.put("uploads/many.jsonl", many)
    ids = CustomIds()
    check = LineCheck(max_bytes=10**9, max_line_bytes=100, ids=ids)
    check.feed(many)
    check.finish()
    with pytest.raises(UploadRefused, match=f"{MAX_REPEATS + 1} lines repeat .* line 2 repeats"):
        repeats_of(store, "uploads/many.jsonl", ids)
    assert store.size("uploads/many.jsonl") is None


def test_a_multipart_upload_is_read_as_it_arrives_whatever_its_pieces() -> None:
    content = batch_lines(200)
    body, kind = _multipart({"file": ("in.jsonl", content)}, {"purpose": "batch"})
    for size in (1, 7, 4096, len(body)):
        got, form = _read(body, kind, size)
        assert got == content and form.fields == {"purpose": "batch"}
        assert form.filename == "in.jsonl"
    # The file before its fields: they are read after it.
    file_first = (
        b'--B\r\nContent-Disposition: form-data; name="file"; filename="a.jsonl"\r\n\r\n'
        b'x\ny\r\n--B\r\nContent-Disposition: form-data; name="purpose"\r\n\r\nbatch\r\n--B--\r\n'
    )
    got, form = _read(file_first, "multipart/form-data; boundary=B", 3)
    assert got == b"x\ny" and form.fields == {"purpose": "batch"}
    from genq.common.errors import InvalidRequest

    with pytest.raises(InvalidRequest, match="multipart/form-data"):
        UploadStream(_pieces(b"{}", 2), "application/json", max_field_bytes=100)
    two, kind = _multipart({"file": ("a", b"1"), "other": ("b", b"2")}, {})
    with pytest.raises(InvalidRequest, match="one file"):
        _read(two, kind, 5)
    big_field, kind = _multipart({"file": ("a", b"1")}, {"purpose": "x" * 500})
    with pytest.raises(InvalidRequest, match="over 100 bytes"):
        _read(big_field, kind, 50)


# -- the store itself, in a directory and in an S3-compatible server ------------------------------


@pytest.fixture(scope="module")
def s3_url() -> Iterator[str]:
    """An S3-compatible server (moto's server mode) on a free loopback port, with a bucket; the
    AWS_* variables that point obstore (and gateways started from here) at it."""
    port = free_port()
    moto = Path(sys.executable).parent / "moto_server"
    log = open(os.devnull, "w")  # noqa: SIM115 (closed below)
    proc = subprocess.Popen([str(moto), "-H", "127.0.0.1", "-p", str(port)], stdout=log, stderr=log)
    endpoint = f"http://127.0.0.1:{port}"
    saved = {k: os.environ.get(k) for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")}
    saved.update(
        {k: os.environ.get(k) for k in ("AWS_ENDPOINT_URL", "AWS_ALLOW_HTTP", "AWS_REGION")}
    )
    os.environ.update(
        AWS_ACCESS_KEY_ID="genq-test",
        AWS_SECRET_ACCESS_KEY="genq-test",
        AWS_ENDPOINT_URL=endpoint,
        AWS_ALLOW_HTTP="true",
        AWS_REGION="us-east-1",
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                put = urllib.request.Request(f"{endpoint}/{BUCKET}", method="PUT")
                urllib.request.urlopen(put, timeout=2).close()
                break
            except OSError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise
                time.sleep(0.1)
        yield f"s3://{BUCKET}/genq"
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        proc.terminate()
        proc.wait(timeout=10)
        log.close()


@pytest.fixture(params=["directory", "s3"])
def where(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "directory":
        return str(tmp_path / "files")
    url: str = request.getfixturevalue("s3_url")
    return f"{url}/{tmp_path.name}"


def test_the_store_writes_whole_reads_lines_from_any_offset_and_writes_once(where: str) -> None:
    store = FileStore(where)
    content = batch_lines(3000)  # several reads' worth of lines, across multipart parts
    pieces = [content[i : i + 100_000] for i in range(0, len(content), 100_000)]

    async def chunks(fail: bool = False) -> AsyncIterator[bytes]:
        for piece in pieces:
            yield piece
        if fail:
            yield b"\xff\n"

    check = LineCheck(max_bytes=10**9, max_line_bytes=1000)
    asyncio.run(store.upload("uploads/a.jsonl", chunks(), check))
    assert (check.bytes, check.lines) == (len(content), 3000)
    assert store.size("uploads/a.jsonl") == len(content)
    # A failed upload leaves nothing: not the file, not a part of it.
    with pytest.raises(UploadRefused):
        asyncio.run(
            store.upload(
                "uploads/b.jsonl",
                chunks(fail=True),
                LineCheck(max_bytes=10**9, max_line_bytes=1000),
            )
        )
    assert store.size("uploads/b.jsonl") is None
    assert store.names("uploads") == ["uploads/a.jsonl"]
    lines = list(store.lines("uploads/a.jsonl"))
    assert b"\n".join(line for _, line in lines) + b"\n" == content
    # Read on from any line's end: what follows, exactly.
    after, _ = lines[1234]
    assert [line for _, line in store.lines("uploads/a.jsonl", after)] == [
        line for _, line in lines[1235:]
    ]
    assert list(store.lines("uploads/a.jsonl", lines[-1][0])) == []
    got = asyncio.run(_collect(store, "uploads/a.jsonl"))
    assert got == content
    # Written once, whoever tries again.
    assert store.put("out/part-0", b"one\n", create=True)
    assert not store.put("out/part-0", b"two\n", create=True)
    assert [line for _, line in store.lines("out/part-0")] == [b"one"]
    store.delete("uploads/a.jsonl")
    store.delete("uploads/a.jsonl")  # gone already: nothing to do
    with pytest.raises(StoredFileMissing):
        list(store.lines("uploads/a.jsonl"))


async def _collect(store: FileStore, name: str) -> bytes:
    return b"".join([c async for c in store.chunks(name)])


# -- through the gateway ---------------------------------------------------------------------------


def _upload(url: str, content: bytes, **kw: object) -> httpx.Response:
    files = {"file": ("in.jsonl", content)}
    return httpx.post(f"{url}/files", files=files, data={"purpose": "batch"}, timeout=60, **kw)  # type: ignore[arg-type]


def _left_in_redis(redis_url: str, queue: str) -> list[bytes]:
    """The file records of ``queue`` in Redis."""
    r = redis.Redis.from_url(redis_url)
    return [k for k in r.scan_iter(match=Keys.file("*")) if r.hget(k, "queue") == queue.encode()]


@pytest.mark.parametrize("kind", ["directory", "s3"])
def test_a_batch_runs_from_a_file_in_the_store_and_redis_keeps_only_its_record(
    kind: str,
    redis_url: str,
    queue: str,
    tmp_path: Path,
    start_worker: Callable[..., WorkerProcess],
    request: pytest.FixtureRequest,
) -> None:
    where = str(tmp_path / "files")
    if kind == "s3":
        where = f"{request.getfixturevalue('s3_url')}/{tmp_path.name}"
    gateway = GatewayProcess(redis_url, queue, tmp_path / "gw.log", ["--files-dir", where])
    try:
        start_worker(queue, "--engine", "echo")
        client = openai.OpenAI(base_url=gateway.url, api_key="x", max_retries=0, timeout=60)
        repeated = [json.loads(x) for x in batch_lines(8).splitlines()[3::4]]  # c3, c7 again
        content = batch_lines(50) + b"".join(json.dumps(x).encode() + b"\n" for x in repeated)
        uploaded = client.files.create(file=("in.jsonl", content), purpose="batch")
        assert uploaded.bytes == len(content)
        assert client.files.content(uploaded.id).content == content
        record = redis.Redis.from_url(redis_url).hgetall(Keys.file(uploaded.id))
        assert b"content" not in record and record[b"store"].decode() == where
        assert record[b"lines"] == b"52"
        store = FileStore(where)
        assert store.size(record[b"path"].decode()) == len(content)
        batch = client.batches.create(
            input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h"
        )
        deadline = time.monotonic() + 60
        while batch.status != "completed" and time.monotonic() < deadline:
            time.sleep(0.2)
            batch = client.batches.retrieve(batch.id)
        assert batch.status == "completed", batch
        assert batch.output_file_id is not None
        out = client.files.content(batch.output_file_id).text.splitlines()
        assert sorted(json.loads(x)["custom_id"] for x in out) == sorted(f"c{i}" for i in range(50))
        # The lines that repeat a custom_id are error lines; the first of each ran.
        assert batch.error_file_id is not None and batch.request_counts is not None
        assert (batch.request_counts.completed, batch.request_counts.failed) == (50, 2)
        errors = [
            json.loads(x) for x in client.files.content(batch.error_file_id).text.splitlines()
        ]
        assert [(e["custom_id"], e["error"]["message"]) for e in errors] == [
            ("c3", "line 51: custom_id 'c3' appears twice (line 4 first)"),
            ("c7", "line 52: custom_id 'c7' appears twice (line 8 first)"),
        ]
        client.files.delete(uploaded.id)
        assert store.names("uploads") == []
        assert _left_in_redis(redis_url, queue) == []
    finally:
        gateway.stop()


def test_a_bad_file_is_one_clear_error_and_leaves_nothing_behind(
    redis_url: str, queue: str, tmp_path: Path
) -> None:
    files = tmp_path / "files"
    args = ["--files-dir", str(files), "--max-body-bytes", "2000", "--max-file-bytes", "100000"]
    gateway = GatewayProcess(redis_url, queue, tmp_path / "gw.log", args)
    r = redis.Redis.from_url(redis_url)
    try:
        cases = {
            b"\x89PNG\r\n\x1a\n\x00\x00" * 100: "not UTF-8 text (line 1)",
            batch_lines(3) + b"x" * 2500 + b"\n": "line 4 is over 2000 bytes",
        }
        for content, message in cases.items():
            answer = _upload(gateway.url, content)
            assert answer.status_code == 400, answer.text
            assert message in answer.json()["error"]["message"]
        too_big = _upload(gateway.url, batch_lines(2000))
        assert too_big.status_code == 413, too_big.text
        assert "--max-file-bytes" in too_big.json()["error"]["message"]
        no_file = httpx.post(f"{gateway.url}/files", data={"purpose": "batch"}, timeout=10)
        assert no_file.status_code == 400
        wrong = httpx.post(
            f"{gateway.url}/files",
            files={"file": ("a.jsonl", batch_lines(2))},
            data={"purpose": "fine-tune"},
            timeout=10,
        )
        assert wrong.status_code == 400 and wrong.json()["error"]["param"] == "purpose"
        assert FileStore(str(files)).names("uploads") == []
        assert _left_in_redis(redis_url, queue) == []
        assert r.zcard(Keys(queue).stored("default", "files")) == 0  # the quota given back
        assert _upload(gateway.url, batch_lines(3)).status_code == 200
    finally:
        gateway.stop()


def test_a_full_store_is_a_507_and_keeps_no_part_of_the_file(
    redis_url: str, queue: str, tmp_path: Path
) -> None:
    """The gateway's files may not grow past 1 MB (``prlimit --fsize``: what a full disk
    answers, EFBIG): a 3 MB upload is a 507 ``file_store_full``, nothing stays, and a small
    upload afterwards works."""
    files = tmp_path / "files"
    gateway = GatewayProcess(
        redis_url,
        queue,
        tmp_path / "gw.log",
        ["--files-dir", str(files)],
        wrapper=["prlimit", "--fsize=1000000", "--"],
    )
    try:
        full = _upload(gateway.url, batch_lines(30_000))
        assert full.status_code == 507, full.text
        assert full.json()["error"]["code"] == "file_store_full"
        assert str(files) in full.json()["error"]["message"]
        assert FileStore(str(files)).names("uploads") == []
        assert _left_in_redis(redis_url, queue) == []
        assert _upload(gateway.url, batch_lines(10)).status_code == 200
    finally:
        gateway.stop()


def test_an_unreachable_store_is_a_503_within_its_timeout(
    redis_url: str, queue: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{free_port()}")  # nobody there
    monkeypatch.setenv("AWS_ALLOW_HTTP", "true")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "x")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "x")
    monkeypatch.setenv("AWS_REGION", "us-east-1")
    args = ["--files-dir", "s3://nowhere/genq", "--files-timeout-s", "2"]
    gateway = GatewayProcess(redis_url, queue, tmp_path / "gw.log", args)
    try:
        start = time.monotonic()
        answer = _upload(gateway.url, batch_lines(10))
        assert answer.status_code == 503, answer.text
        assert answer.json()["error"]["code"] == "file_store_unavailable"
        assert "s3://nowhere/genq" in answer.json()["error"]["message"]
        assert time.monotonic() - start < 20
        assert _left_in_redis(redis_url, queue) == []
    finally:
        gateway.stop()


def test_a_file_deleted_from_under_genq_is_a_404_saying_so(
    redis_url: str, queue: str, tmp_path: Path
) -> None:
    files = tmp_path / "files"
    gateway = GatewayProcess(redis_url, queue, tmp_path / "gw.log", ["--files-dir", str(files)])
    try:
        file_id = _upload(gateway.url, batch_lines(3)).json()["id"]
        FileStore(str(files)).delete(f"uploads/{file_id}.jsonl")
        content = httpx.get(f"{gateway.url}/files/{file_id}/content", timeout=10)
        assert content.status_code == 404 and content.json()["error"]["code"] == "file_missing"
        made = {"input_file_id": file_id, "endpoint": "/v1/chat/completions"}
        batch = httpx.post(f"{gateway.url}/batches", json=made, timeout=10)
        assert batch.status_code == 404 and batch.json()["error"]["code"] == "file_missing"
    finally:
        gateway.stop()
