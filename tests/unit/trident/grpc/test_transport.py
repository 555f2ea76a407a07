"""The gRPC transport (trident.grpc.transport / serve) with a test method table.

Raw HTTP/2 clients (e2e.grpc_raw) send what real clients never do; grpcio (in a worker thread)
checks interoperability. The handlers record what the server side saw (cancellations, metadata).
Every test runs three times: with unary handlers run by a task of their own, with
``Method.now`` (answered in the connection's read loop where they can, as ModelInfer is), and
with ``Method.now`` answering later (``Call.answer_later``: the call has no task; another task
answers it, as a model's worker answers a queued ModelInfer).
"""

from __future__ import annotations

import gzip
import subprocess
from functools import partial

import grpc
import h2.errors
import h2.settings
import pytest
import trio
from e2e.grpc_raw import frame, open_raw

from trident.errors import (
    GRPC_DEADLINE_EXCEEDED,
    GRPC_INTERNAL,
    GRPC_INVALID_ARGUMENT,
    GRPC_OK,
    GRPC_RESOURCE_EXHAUSTED,
    GRPC_UNIMPLEMENTED,
    invalid_arg,
)
from trident.grpc.serve import serve_methods
from trident.grpc.transport import Call, GrpcError, Method, TransportConfig

MAX = 64 * 1024
WINDOW = 65536
NOW = "task"  # the unary path under test (see the unary_path fixture)


@pytest.fixture(autouse=True, params=["task", "now", "later"])
def unary_path(request, monkeypatch):
    """The unary test methods without ``Method.now`` (``task``), with it answering at once
    where it can (``now``), or with it answering later from another task (``later``)."""
    monkeypatch.setitem(globals(), "NOW", request.param)
    return request.param


def answered_later(handler, nursery: trio.Nursery):
    """``Method.now`` for ``handler`` that answers from a task in ``nursery`` (not the call's:
    the call has none) through Call.answer / Call.fail, after Call.answer_later with what
    cancels that task; the handler's awaitable, for the call's task (Call.run), where the call
    may not (a deadline)."""
    def now(call: Call, message: bytearray):
        if not call.may_answer_later:
            call.run(handler(call, message))
            return
        scope = trio.CancelScope()

        async def answer():
            with scope:
                try:
                    parts, size = await handler(call, message)
                except Exception as e:
                    call.fail(e)
                    return
                call.answer(parts, size)

        nursery.start_soon(answer)
        call.answer_later(scope.cancel)

    return now


class Recorder:
    def __init__(self) -> None:
        self.cancelled: list[str] = []
        self.release = trio.Event()
        self.started = trio.Event()
        self.received: list[bytes] = []
        self.metadata: list = []


def methods(rec: Recorder, nursery: trio.Nursery) -> dict[str, Method]:
    """The test methods; ``nursery`` holds the tasks that answer calls later (``later``)."""
    async def echo(call: Call, message: bytearray):
        return [bytes(message)], len(message)

    def fail_now(call: Call, message: bytearray):
        if message == b"triton":
            raise invalid_arg("bad input: ünïcode 100%")
        if message == b"crash":
            raise RuntimeError("handler bug")
        raise GrpcError(GRPC_INVALID_ARGUMENT, "nope")

    async def fail(call: Call, message: bytearray):
        fail_now(call, message)

    async def wait(call: Call, message: bytearray):
        rec.started.set()
        try:
            await rec.release.wait()
        except trio.Cancelled:
            rec.cancelled.append("wait")
            raise
        return [b"done"], 4

    async def meta(call: Call, message: bytearray):
        rec.metadata = call.metadata
        return [b"ok"], 2

    async def slow_reader(call: Call):
        try:
            rec.started.set()
            await rec.release.wait()
            while (m := await call.recv()) is not None:
                rec.received.append(bytes(m))
        except trio.Cancelled:
            rec.cancelled.append("slow_reader")
            raise

    async def flood(call: Call):
        try:
            await call.recv()
            chunk = b"x" * 16384
            for _ in range(64):
                await call.send_message([chunk], len(chunk))
        except trio.Cancelled:
            rec.cancelled.append("flood")
            raise

    async def bidi(call: Call):
        while (m := await call.recv()) is not None:
            await call.send_message([bytes(m)], len(m))

    table = {"Echo": Method(echo), "Fail": Method(fail), "Wait": Method(wait), "Meta": Method(meta),
             "SlowReader": Method(slow_reader, streaming=True), "Flood": Method(flood, streaming=True),
             "Bidi": Method(bidi, streaming=True)}
    if NOW == "later":
        table.update({name: Method(table[name].handler, now=answered_later(table[name].handler, nursery))
                      for name in ("Echo", "Fail", "Wait", "Meta")})
    elif NOW == "now":
        def echo_now(call: Call, message: bytearray):
            call.answer([bytes(message)], len(message))

        def meta_now(call: Call, message: bytearray):
            rec.metadata = call.metadata
            call.answer([b"ok"], 2)

        def wait_now(call: Call, message: bytearray):
            call.run(wait(call, message))  # answers later: its task awaits it

        table.update(Echo=Method(echo, now=echo_now), Fail=Method(fail, now=fail_now),
                     Wait=Method(wait, now=wait_now), Meta=Method(meta, now=meta_now))
    return {f"/test.T/{name}": m for name, m in table.items()}


@pytest.fixture
async def served(nursery):
    rec = Recorder()
    config = TransportConfig(max_message_size=MAX, initial_window_size=WINDOW, compression_level=6)
    scope = trio.CancelScope()

    async def run(task_status):
        with scope:
            await serve_methods(methods(rec, nursery), config, host="127.0.0.1", port=0, grace_period=5,
                                task_status=task_status)

    port = await nursery.start(run)
    return port, rec, scope


def grpcio(port: int, fn):
    """Run ``fn(channel)`` with a grpcio channel in a worker thread."""

    def work():
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            return fn(channel)

    return trio.to_thread.run_sync(work)


async def test_unary_round_trip_and_headers(served):
    port, _, _ = served
    async with open_raw(port) as c:
        s = await c.unary("/test.T/Echo", b"hello")
    assert s.status == GRPC_OK
    assert s.messages() == [b"hello"]
    assert s.headers[b":status"] == b"200"
    assert s.headers[b"content-type"] == b"application/grpc"
    assert b"gzip" in s.headers[b"grpc-accept-encoding"]


async def test_errors_map_to_statuses_with_percent_encoded_messages(served):
    port, _, _ = served

    def calls(channel):
        out = []
        for payload in (b"triton", b"other", b"crash"):
            try:
                channel.unary_unary("/test.T/Fail")(payload)
            except grpc.RpcError as e:
                out.append((e.code(), e.details()))
        return out

    results = await grpcio(port, calls)
    assert results[0] == (grpc.StatusCode.INVALID_ARGUMENT, "bad input: ünïcode 100%")
    assert results[1] == (grpc.StatusCode.INVALID_ARGUMENT, "nope")
    assert results[2][0] == grpc.StatusCode.INTERNAL and "handler bug" in results[2][1]
    async with open_raw(port) as c:
        s = await c.unary("/test.T/Fail", b"triton")
    assert (s.trailers or s.headers)[b"grpc-message"] == b"bad input: %C3%BCn%C3%AFcode 100%25"


async def test_unknown_service_and_method_are_unimplemented(served):
    port, _, _ = served
    async with open_raw(port) as c:
        method = await c.unary("/test.T/Missing", b"")
        service = await c.unary("/other.Service/Echo", b"")
    assert (method.status, method.message) == (GRPC_UNIMPLEMENTED, "unknown method Missing for service test.T")
    assert (service.status, service.message) == (GRPC_UNIMPLEMENTED, "unknown service other.Service")


async def test_wrong_content_type_and_method(served):
    port, _, _ = served
    async with open_raw(port) as c:
        s = await c.unary("/test.T/Echo", b"x", content_type=b"application/json")
        assert s.headers[b":status"] == b"415"
        assert s.status == GRPC_INVALID_ARGUMENT
        get = await c.open("/test.T/Echo", extra=[], end_stream=False)
        # a second request with GET: build it by hand
        sid = c.h2.get_next_available_stream_id()
        from e2e.grpc_raw import RawStream

        c.streams[sid] = raw = RawStream(sid)
        c.h2.send_headers(sid, [(b":method", b"GET"), (b":scheme", b"http"), (b":path", b"/test.T/Echo"),
                                (b":authority", b"x"), (b"content-type", b"application/grpc")], end_stream=True)
        await c.flush()
        await raw.closed.wait()
        assert raw.headers[b":status"] == b"405"
        await c.reset(get)
        ok = await c.unary("/test.T/Echo", b"still fine")
        assert ok.messages() == [b"still fine"]


async def test_declared_length_beyond_limit_is_resource_exhausted_before_the_payload(served):
    port, _, _ = served
    async with open_raw(port) as c:
        s = await c.open("/test.T/Echo")
        await c.send(s, b"\x00" + (MAX + 1).to_bytes(4, "big"))  # the prefix only; never the payload
        await s.closed.wait()
        assert s.status == GRPC_RESOURCE_EXHAUSTED
        assert f"({MAX + 1} vs. {MAX})" in s.message
        assert (await c.unary("/test.T/Echo", b"next")).messages() == [b"next"]


async def test_truncated_message_and_bad_flag_are_internal(served):
    port, _, _ = served
    async with open_raw(port) as c:
        s = await c.open("/test.T/Echo")
        await c.send(s, b"\x00\x00\x00\x00\x64" + b"0123456789", end_stream=True)
        await s.closed.wait()
        assert s.status == GRPC_INTERNAL and "incomplete" in s.message
        s = await c.open("/test.T/Echo")
        await c.send(s, b"\x02\x00\x00\x00\x01x", end_stream=True)
        await s.closed.wait()
        assert s.status == GRPC_INTERNAL and "flag" in s.message
        s = await c.open("/test.T/Echo", end_stream=True)
        await s.closed.wait()
        assert s.status == GRPC_INTERNAL and "without a request message" in s.message
        s = await c.open("/test.T/Echo")
        await c.send(s, frame(b"a") + frame(b"b"), end_stream=True)
        await s.closed.wait()
        assert s.status == GRPC_INTERNAL and "more than one" in s.message


async def test_gzip_requests_and_responses(served):
    port, _, _ = served
    gz = [(b"grpc-encoding", b"gzip"), (b"grpc-accept-encoding", b"gzip")]
    async with open_raw(port) as c:
        s = await c.open("/test.T/Echo", extra=gz)
        await c.send(s, frame(gzip.compress(b"packed" * 100), compressed=True), end_stream=True)
        await s.closed.wait()
        assert s.status == GRPC_OK
        # responses are compressed only for handlers that mark them compressible
        assert s.messages() == [b"packed" * 100]
        bomb = await c.open("/test.T/Echo", extra=gz)
        await c.send(bomb, frame(gzip.compress(b"\x00" * (MAX * 4)), compressed=True), end_stream=True)
        await bomb.closed.wait()
        assert bomb.status == GRPC_RESOURCE_EXHAUSTED
        br = await c.unary("/test.T/Echo", b"x", extra=[(b"grpc-encoding", b"br")])
        assert br.status == GRPC_UNIMPLEMENTED and "br" in br.message
        assert br.headers[b"grpc-accept-encoding"] == b"identity,deflate,gzip"
        no_encoding = await c.open("/test.T/Echo")
        await c.send(no_encoding, frame(gzip.compress(b"x"), compressed=True), end_stream=True)
        await no_encoding.closed.wait()
        assert no_encoding.status == GRPC_INTERNAL


async def test_grpc_timeout_cancels_the_handler(served):
    port, rec, _ = served
    async with open_raw(port) as c:
        s = await c.unary("/test.T/Wait", b"", extra=[(b"grpc-timeout", b"100m")])
        assert (s.status, s.message) == (GRPC_DEADLINE_EXCEEDED, "Deadline Exceeded")
        for value in (b"soon", b"abc", b"123456789S", b"10x", b"\xff1S"):
            bad = await c.unary("/test.T/Echo", b"", extra=[(b"grpc-timeout", value)])
            assert bad.status == GRPC_INVALID_ARGUMENT and "malformed grpc-timeout" in bad.message
    assert rec.cancelled == ["wait"]


async def test_grpcio_deadline_and_cancel(served):
    port, rec, _ = served

    def call(channel):
        try:
            channel.unary_unary("/test.T/Wait")(b"", timeout=0.2)
        except grpc.RpcError as e:
            return e.code()

    assert await grpcio(port, call) == grpc.StatusCode.DEADLINE_EXCEEDED
    with trio.fail_after(5):  # grpcio's own deadline may end the call before the server's cancel runs
        while rec.cancelled != ["wait"]:
            await trio.sleep(0.01)


async def test_rst_stream_mid_message_cancels_the_call_and_keeps_the_connection(served):
    port, rec, _ = served
    rec.release.set()
    async with open_raw(port) as c:
        s = await c.open("/test.T/SlowReader")
        await c.send(s, b"\x00\x00\x00\x01\x00" + b"y" * 100)  # 100 of 256 bytes
        await rec.started.wait()
        await c.reset(s)
        assert (await c.unary("/test.T/Echo", b"after")).messages() == [b"after"]
    with trio.fail_after(5):
        while rec.cancelled != ["slow_reader"]:
            await trio.sleep(0.01)


async def test_a_slow_handler_holds_back_only_its_own_stream(served):
    port, rec, _ = served
    message = frame(b"m" * 1000)
    async with open_raw(port) as c:
        s = await c.open("/test.T/SlowReader")
        sent = 0
        while c.h2.local_flow_control_window(s.stream_id) >= len(message):
            await c.send(s, message)
            sent += 1
        # a round trip on another stream: the server has seen everything sent so far
        assert (await c.unary("/test.T/Echo", b"ping")).messages() == [b"ping"]
        assert c.h2.local_flow_control_window(s.stream_id) < len(message), "window reopened unread"
        rec.release.set()
        await c.send(s, message, end_stream=True)  # waits until the handler's reads reopen the window
        await s.closed.wait()
    assert s.status == GRPC_OK
    assert len(rec.received) == sent + 1


async def test_a_client_that_never_reads_blocks_only_itself(served):
    port, rec, _ = served
    async with open_raw(port, read_window=False) as stuck:
        s = await stuck.open("/test.T/Flood")
        await stuck.send(s, frame(b"go"))
        with trio.fail_after(10):
            while len(s.data) < 65535:
                await s.changed.wait()
        async with open_raw(port) as other:
            assert (await other.unary("/test.T/Echo", b"free")).messages() == [b"free"]
        assert s.status is None
    with trio.fail_after(5):
        while rec.cancelled != ["flood"]:
            await trio.sleep(0.01)


async def test_concurrent_streams_on_one_connection(served):
    port, _, _ = served
    results: list = []
    async with open_raw(port) as c:
        async with trio.open_nursery() as n:
            for i in range(200):
                async def one(i=i):
                    s = await c.unary("/test.T/Echo", str(i).encode())
                    results.append((s.status, s.messages(), i))
                n.start_soon(one)
    assert len(results) == 200
    assert all(status == GRPC_OK and msgs == [str(i).encode()] for status, msgs, i in results)


async def test_grpcio_bidi_stream_and_metadata(served):
    port, rec, _ = served

    def calls(channel):
        replies = list(channel.stream_stream("/test.T/Bidi")(iter([b"a", b"bb", b"ccc"] * 100)))
        channel.unary_unary("/test.T/Meta")(b"", metadata=[("x-text", "hi"), ("x-blob-bin", b"\x00\xff\x10")])
        return replies

    assert await grpcio(port, calls) == [b"a", b"bb", b"ccc"] * 100
    assert ("x-text", "hi") in rec.metadata
    assert ("x-blob-bin", b"\x00\xff\x10") in rec.metadata
    async with open_raw(port) as c:
        s = await c.unary("/test.T/Meta", b"", extra=[(b"x-bad-bin", b"!!!")])
    assert s.status == GRPC_INTERNAL


async def test_pings_are_answered_and_garbage_closes_only_that_connection(served):
    port, _, _ = served
    async with open_raw(port) as c:
        c.h2.ping(b"keepaliv")
        await c.flush()
        with trio.fail_after(5):
            while not c.ping_acks:
                await trio.sleep(0.01)
        assert c.ping_acks == [b"keepaliv"]
    sock = await trio.open_tcp_stream("127.0.0.1", port)
    await sock.send_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n" * 10)
    with trio.fail_after(5):
        while await sock.receive_some(65536):
            pass
    await sock.aclose()
    async with open_raw(port) as c:
        assert (await c.unary("/test.T/Echo", b"alive")).messages() == [b"alive"]


async def test_drain_sends_goaway_and_lets_calls_finish(served):
    port, rec, scope = served
    async with open_raw(port) as c:
        s = await c.open("/test.T/Wait")
        await c.send(s, frame(b""), end_stream=True)
        await rec.started.wait()
        scope.cancel()
        with trio.fail_after(5):
            while c.goaway is None:
                await trio.sleep(0.01)
        assert c.goaway.error_code == h2.errors.ErrorCodes.NO_ERROR
        assert c.goaway.last_stream_id == s.stream_id
        rec.release.set()
        await s.closed.wait()
        assert s.status == GRPC_OK and s.messages() == [b"done"]
        await c.closed.wait()
    assert rec.cancelled == []


async def test_drain_grace_period_cancels_what_is_left(nursery):
    rec = Recorder()
    scope = trio.CancelScope()
    done = trio.Event()

    async def run(task_status):
        with scope:
            await serve_methods(methods(rec, nursery), TransportConfig(), host="127.0.0.1", port=0, grace_period=0.2,
                                task_status=task_status)
        done.set()

    port = await nursery.start(run)
    async with open_raw(port) as c:
        s = await c.open("/test.T/Wait")
        await c.send(s, frame(b""), end_stream=True)
        await rec.started.wait()
        scope.cancel()
        with trio.fail_after(5):
            await done.wait()
    assert rec.cancelled == ["wait"]


async def test_settings_are_advertised_and_honoured(served):
    port, _, _ = served
    async with open_raw(port) as c:
        with trio.fail_after(5):
            while c.h2.remote_settings.max_concurrent_streams != 1000:
                await c.window_changed.wait()
        assert c.h2.remote_settings.initial_window_size == WINDOW
        assert c.h2.remote_settings[h2.settings.SettingCodes.MAX_FRAME_SIZE] == 1024 * 1024
        big = b"f" * 60000  # one DATA frame, larger than HTTP/2's default 16 KiB frames
        assert (await c.unary("/test.T/Echo", big)).messages() == [big]


async def test_tls_with_alpn(nursery, tmp_path):
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=localhost",
                    "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)],
                   check=True, capture_output=True)
    from trident.grpc.serve import ssl_context
    from trident.options import ServerOptions

    context = ssl_context(ServerOptions(grpc_use_ssl=True, grpc_server_cert=str(cert), grpc_server_key=str(key)))
    port = await nursery.start(partial(serve_methods, methods(Recorder(), nursery), TransportConfig(), host="127.0.0.1",
                                       port=0, ssl_context=context))

    def call():
        credentials = grpc.ssl_channel_credentials(root_certificates=cert.read_bytes())
        with grpc.secure_channel(f"localhost:{port}", credentials) as channel:
            return channel.unary_unary("/test.T/Echo")(b"secret")

    assert await trio.to_thread.run_sync(call) == b"secret"
    with pytest.raises(ValueError, match="grpc-server-cert"):
        ssl_context(ServerOptions(grpc_use_ssl=True, grpc_server_cert="", grpc_server_key=""))


# ---- hardening: abuse limits, budgets, timers ------------------------------------------------

from e2e.grpc_raw import (  # noqa: E402
    CONTINUATION,
    DATA,
    END_HEADERS,
    HEADERS,
    PING,
    PREFACE,
    SETTINGS,
    flood,
    h2_frame,
    rapid_reset,
    request_block,
)

from trident.grpc.transport import ServerBudget  # noqa: E402
from trident.protocol.h2_guard import GuardLimits  # noqa: E402

ENHANCE_YOUR_CALM = h2.errors.ErrorCodes.ENHANCE_YOUR_CALM


async def start(nursery, budget: ServerBudget | None = None, **config) -> tuple[int, Recorder]:
    """A test server with TransportConfig(**config) (max message MAX, window WINDOW unless given)."""
    rec = Recorder()
    config = {"max_message_size": MAX, "initial_window_size": WINDOW, **config}
    port = await nursery.start(partial(serve_methods, methods(rec, nursery), TransportConfig(**config), host="127.0.0.1",
                                       port=0, grace_period=1, budget=budget))
    return port, rec


async def echo_ok(port: int, payload: bytes = b"victim") -> None:
    """A well-behaved call on its own connection; fails the test if it is not served."""
    with trio.fail_after(10):
        async with open_raw(port) as c:
            assert (await c.unary("/test.T/Echo", payload)).messages() == [payload]


async def test_rapid_reset_gets_goaway_enhance_your_calm_and_others_are_served(nursery):
    port, _ = await start(nursery)
    async with trio.open_nursery() as n:
        n.start_soon(echo_ok, port)
        seen = await flood(port, rapid_reset("/test.T/Echo", 20_000, b"x"))
    goaway = seen.goaway()
    assert goaway is not None and goaway[1] == ENHANCE_YOUR_CALM and goaway[2] == b"too_many_resets"
    await echo_ok(port)


@pytest.mark.parametrize("unit", [
    h2_frame(SETTINGS, 0, 0),
    h2_frame(PING, 0, 0, b"flooding"),
    h2_frame(HEADERS, END_HEADERS, 1, request_block("/test.T/Wait")) + h2_frame(DATA, 0, 1) * 1000,
], ids=["settings", "ping", "empty-data"])
async def test_control_frame_floods_get_goaway_enhance_your_calm(nursery, unit):
    port, _ = await start(nursery, max_ping_strikes=0)  # PINGs meet the flood limit, not the strikes
    count = 100_000 // max(1, unit.count(h2_frame(DATA, 0, 1)))
    payload = unit * count if len(unit) < 100 else unit * 100
    seen = await flood(port, payload)
    goaway = seen.goaway()
    assert goaway is not None and goaway[1] == ENHANCE_YOUR_CALM and goaway[2] == b"too_many_control_frames"
    # the flood was cut short: far fewer SETTINGS ACKs / PING ACKs than frames sent
    assert len(seen.of(SETTINGS)) + len(seen.of(PING)) < 5000
    await echo_ok(port)


async def test_continuation_flood_is_bounded_and_ends_the_connection(nursery):
    port, _ = await start(nursery, guard=GuardLimits(max_header_block=256 * 1024))
    block = h2_frame(HEADERS, 0, 1, request_block("/test.T/Echo"))
    payload = block + h2_frame(CONTINUATION, 0, 1, b"\x00" * (1 << 20)) * 64  # 64 MiB, never END_HEADERS
    seen = await flood(port, payload, chunk=1 << 20)
    goaway = seen.goaway()
    assert goaway is not None and goaway[1] == ENHANCE_YOUR_CALM and goaway[2] == b"header_block_too_large"
    await echo_ok(port)


async def test_large_header_list_fails_its_stream_and_keeps_the_connection(served):
    port, _, _ = served
    async with open_raw(port) as c:
        big = await c.unary("/test.T/Echo", b"x", extra=[(b"x-big", b"m" * 70_000)])
        assert big.status == GRPC_RESOURCE_EXHAUSTED and "header list" in big.message
        # HPACK stayed in step: a request indexed after the big one decodes
        for i in range(3):
            s = await c.unary("/test.T/Echo", b"after", extra=[(b"x-indexed", b"v")])
            assert s.status == GRPC_OK and s.messages() == [b"after"], i
        assert c.goaway is None


async def _fill_streams(c, rec, limit: int) -> list:
    """Once the server's MAX_CONCURRENT_STREAMS (``limit``) has arrived, ignore it (as h2 would
    not: it refuses to open one more) and keep ``limit`` Wait calls running; returns them."""
    with trio.fail_after(5):
        while c.h2.remote_settings.max_concurrent_streams != limit:
            await c.window_changed.wait()
    c.h2.remote_settings[h2.settings.SettingCodes.MAX_CONCURRENT_STREAMS] = 100
    c.h2.remote_settings.acknowledge()
    waiting = []
    for _ in range(limit):
        s = await c.open("/test.T/Wait")
        await c.send(s, frame(b""), end_stream=True)
        waiting.append(s)
    await rec.started.wait()
    return waiting


async def test_streams_over_the_limit_are_refused_and_the_connection_survives(nursery):
    port, rec = await start(nursery, max_concurrent_streams=4)
    async with open_raw(port) as c:
        waiting = await _fill_streams(c, rec, 4)
        extra = await c.open("/test.T/Echo", extra=[(b"x-new-header", b"indexed by the refused block")])
        with trio.fail_after(5):
            await extra.closed.wait()
        assert extra.reset_code == h2.errors.ErrorCodes.REFUSED_STREAM
        rec.release.set()
        for s in waiting:
            with trio.fail_after(5):
                await s.closed.wait()
            assert s.status == GRPC_OK and s.messages() == [b"done"]
        # the refused block's header entered both HPACK tables: the next request refers to it
        again = await c.unary("/test.T/Echo", b"hpack ok", extra=[(b"x-new-header", b"indexed by the refused block")])
        assert again.status == GRPC_OK and again.messages() == [b"hpack ok"]
        assert c.goaway is None


async def test_a_stream_over_the_limit_reset_in_the_same_chunk_is_refused_quietly(nursery):
    """HEADERS and RST_STREAM of a stream beyond MAX_CONCURRENT_STREAMS in one write: the engine
    has closed the stream before the transport sees the request, so there is nothing to refuse;
    the connection goes on (it used to fail on the h2 engine with StreamClosedError)."""
    port, rec = await start(nursery, max_concurrent_streams=2)
    async with open_raw(port) as c:
        waiting = await _fill_streams(c, rec, 2)
        for _ in range(3):  # each: HEADERS then RST_STREAM, one write
            sid = c.h2.get_next_available_stream_id()
            c.h2.send_headers(sid, [(b":method", b"POST"), (b":scheme", b"http"), (b":path", b"/test.T/Echo"),
                                    (b":authority", b"localhost"), (b"content-type", b"application/grpc"),
                                    (b"te", b"trailers")])
            c.h2.reset_stream(sid, h2.errors.ErrorCodes.CANCEL)
            await c.flush()
        rec.release.set()
        for s in waiting:
            with trio.fail_after(5):
                await s.closed.wait()
            assert s.status == GRPC_OK
        again = await c.unary("/test.T/Echo", b"still up")
        assert again.status == GRPC_OK and again.messages() == [b"still up"] and c.goaway is None


async def test_prefixes_alone_buffer_nothing(nursery):
    budget = ServerBudget(1 << 30)
    port, _ = await start(nursery, budget, max_message_size=64 << 20)
    async with open_raw(port) as c:
        streams = []
        for _ in range(8):
            s = await c.open("/test.T/Echo")
            await c.send(s, b"\x00" + (64 << 20).to_bytes(4, "big"))
            streams.append(s)
        assert (await c.unary("/test.T/Echo", b"sync")).messages() == [b"sync"]  # all prefixes were read
        assert budget.buffered == 0 and budget.peak < 1 << 20
        for s in streams:
            await c.reset(s)


async def test_connection_and_server_budgets_answer_resource_exhausted(nursery):
    budget = ServerBudget(150_000)
    port, _ = await start(nursery, budget, max_connection_buffered=100_000, initial_window_size=1 << 20)
    async with open_raw(port) as a, open_raw(port) as b, open_raw(port) as c:
        first = await a.open("/test.T/Echo")
        await a.send(first, b"\x00" + MAX.to_bytes(4, "big") + b"1" * 60_000)
        second = await a.open("/test.T/Echo")  # 120 000 bytes on one connection: over 100 000
        await a.send(second, b"\x00" + MAX.to_bytes(4, "big") + b"2" * 60_000)
        with trio.fail_after(5):
            await second.closed.wait()
        assert second.status == GRPC_RESOURCE_EXHAUSTED and "on this connection" in second.message
        other = await b.open("/test.T/Echo")  # 60 000 + 60 000 is within the server's budget...
        await b.send(other, b"\x00" + MAX.to_bytes(4, "big") + b"3" * 60_000)
        assert (await b.unary("/test.T/Echo", b"sync")).messages() == [b"sync"]
        third = await c.open("/test.T/Echo")  # ...a third 60 000 is not
        await c.send(third, b"\x00" + MAX.to_bytes(4, "big") + b"4" * 60_000)
        with trio.fail_after(5):
            await third.closed.wait()
        assert third.status == GRPC_RESOURCE_EXHAUSTED and "by the server" in third.message
        assert budget.peak <= 150_000
        await a.send(first, b"1" * (MAX - 60_000), end_stream=True)
        await b.send(other, b"3" * (MAX - 60_000), end_stream=True)
        await first.closed.wait()
        await other.closed.wait()
        assert first.messages() == [b"1" * MAX] and other.messages() == [b"3" * MAX]
    with trio.fail_after(5):
        while budget.buffered:
            await trio.sleep(0.01)


async def test_a_message_that_does_not_complete_in_time_fails_its_stream(nursery):
    budget = ServerBudget(1 << 30)
    port, _ = await start(nursery, budget, message_timeout=0.3)
    async with open_raw(port) as c:
        drip = await c.open("/test.T/Echo")
        await c.send(drip, b"\x00" + (1000).to_bytes(4, "big") + b"d" * 10)
        with trio.fail_after(5):
            await drip.closed.wait()
        assert drip.status == GRPC_DEADLINE_EXCEEDED and "not received whole" in drip.message
        assert budget.buffered == 0
        assert (await c.unary("/test.T/Echo", b"next")).messages() == [b"next"]


async def test_silent_and_half_open_connections_are_closed_after_the_handshake_timeout(nursery):
    port, _ = await start(nursery, handshake_timeout=0.3)
    for greeting in (b"", PREFACE, PREFACE[:10]):
        sock = await trio.open_tcp_stream("127.0.0.1", port)
        await sock.send_all(greeting)
        with trio.fail_after(5):
            while await sock.receive_some(65536):
                pass
        await sock.aclose()
    await echo_ok(port)  # a client that greets at once is served


async def test_an_idle_connection_gets_goaway_no_error(nursery):
    port, _ = await start(nursery, idle_timeout=0.3)
    async with open_raw(port) as c:
        assert (await c.unary("/test.T/Echo", b"one")).messages() == [b"one"]
        with trio.fail_after(5):
            await c.closed.wait()
        assert c.goaway is not None and c.goaway.error_code == h2.errors.ErrorCodes.NO_ERROR


async def test_keepalive_pings_and_closes_a_peer_that_does_not_answer(nursery):
    port, rec = await start(nursery, keepalive_time=0.2, keepalive_timeout=0.3)
    async with open_raw(port) as alive:  # answers PINGs: kept while its call runs
        s = await alive.open("/test.T/Wait")
        await alive.send(s, frame(b""), end_stream=True)
        with trio.fail_after(5):
            while len(alive.pings) < 2:
                await trio.sleep(0.05)
        assert not alive.closed.is_set()
        rec.release.set()
        await s.closed.wait()
        assert s.status == GRPC_OK
    rec.release = trio.Event()
    sock = await trio.open_tcp_stream("127.0.0.1", port)  # sends a call, then never reads or acks
    await sock.send_all(PREFACE + h2_frame(SETTINGS, 0, 0) + h2_frame(HEADERS, END_HEADERS, 1, request_block("/test.T/Wait"))
                        + h2_frame(DATA, 1, 1, frame(b"")))
    with trio.fail_after(5):
        while "wait" not in rec.cancelled:
            await trio.sleep(0.05)
    await trio.aclose_forcefully(sock)


async def test_too_many_pings_without_data_get_goaway_too_many_pings(nursery):
    port, _ = await start(nursery, min_recv_ping_interval=10.0, max_ping_strikes=2)
    async with open_raw(port) as c:
        for i in range(3):  # a call between pings resets the strikes
            c.h2.ping(b"pingpong")
            await c.flush()
            assert (await c.unary("/test.T/Echo", b"data")).messages() == [b"data"], i
        assert c.goaway is None
        for _ in range(4):
            c.h2.ping(b"pingpong")
        await c.flush()
        with trio.fail_after(5):
            await c.closed.wait()
        assert c.goaway is not None and c.goaway.error_code == ENHANCE_YOUR_CALM
        assert c.goaway.additional_data == b"too_many_pings"


async def test_connections_beyond_the_limit_wait_to_be_accepted(nursery):
    port, _ = await start(nursery, max_connections=2)
    async with open_raw(port) as a:
        assert (await a.unary("/test.T/Echo", b"a")).messages() == [b"a"]
        async with open_raw(port) as b:
            assert (await b.unary("/test.T/Echo", b"b")).messages() == [b"b"]
            done = trio.Event()

            async def third():
                await echo_ok(port, b"c")
                done.set()

            nursery.start_soon(third)
            await trio.sleep(0.3)
            assert not done.is_set()  # not accepted while two connections are open
        with trio.fail_after(5):
            await done.wait()  # accepted once one closed


async def test_large_gzip_messages_inflate_in_worker_threads(nursery):
    budget = ServerBudget(1 << 30, threads=1)
    port, _ = await start(nursery, budget, max_message_size=64 << 20, initial_window_size=1 << 20)
    gz = [(b"grpc-encoding", b"gzip"), (b"grpc-accept-encoding", b"gzip")]
    bomb = gzip.compress(b"\x00" * (48 << 20))  # ~48 KiB that inflate to 48 MiB
    async with open_raw(port) as c:
        async with budget.limiter:  # every worker thread is busy
            s = await c.open("/test.T/Echo", extra=gz)
            await c.send(s, frame(bomb, compressed=True), end_stream=True)
            small = await c.open("/test.T/Echo", extra=gz)  # small ones inflate inline meanwhile
            await c.send(small, frame(gzip.compress(b"tiny"), compressed=True), end_stream=True)
            with trio.fail_after(5):
                await small.closed.wait()
            assert small.messages() == [b"tiny"]
            assert not s.closed.is_set() and budget.buffered > 0  # waits for a thread, output charged
        with trio.fail_after(30):
            await s.closed.wait()
        assert s.status == GRPC_OK and len(s.messages()[0]) == 48 << 20
    with trio.fail_after(5):
        while budget.buffered:
            await trio.sleep(0.01)


async def test_large_responses_are_written_from_their_parts(nursery):
    """A response message from 64 KiB is written as DATA frames over views of its parts (no
    copy): it arrives whole through grpcio's flow control and a raw client's 64 KiB windows,
    and a client that stops reading blocks only its own call."""
    big = 3 << 20
    rec = Recorder()
    config = TransportConfig(max_message_size=big * 2, initial_window_size=WINDOW)

    async def run(task_status):
        await serve_methods(methods(rec, nursery), config, host="127.0.0.1", port=0, grace_period=5, task_status=task_status)

    port = await nursery.start(run)
    message = bytes(range(256)) * (big // 256) + b"tail"

    def echo(channel):
        call = channel.unary_unary("/test.T/Echo")
        return call(message, timeout=30)

    assert await grpcio(port, echo) == message
    async with open_raw(port) as c:  # the default 65,535-byte windows: many window updates
        s = await c.unary("/test.T/Echo", message[: 200_001])
        assert s.status == GRPC_OK and s.messages() == [message[: 200_001]]
    async with open_raw(port, read_window=False) as stuck:
        s = await stuck.open("/test.T/Echo")
        await stuck.send(s, frame(message[: 300_000]), end_stream=True)
        with trio.fail_after(10):
            while len(s.data) < 65535:
                await s.changed.wait()
        async with open_raw(port) as other:
            assert (await other.unary("/test.T/Echo", b"free")).messages() == [b"free"]
        assert s.status is None and len(s.data) <= 65535 + 9 * 4


# ---- unary calls answered in the read loop (Method.now) and their ways back to a task --------


async def test_a_unary_call_left_mid_message_releases_its_bytes(nursery):
    """Reset mid-message, or the whole connection gone: what the call buffered is given back."""
    budget = ServerBudget(1 << 30)
    port, _ = await start(nursery, budget)
    async with open_raw(port) as c:
        s = await c.open("/test.T/Echo")
        await c.send(s, b"\x00" + (1000).to_bytes(4, "big") + b"r" * 500)
        with trio.fail_after(5):
            while budget.buffered != 500:
                await trio.sleep(0.01)
        await c.reset(s)
        assert (await c.unary("/test.T/Echo", b"after")).messages() == [b"after"]
        assert budget.buffered == 0
        left = await c.open("/test.T/Echo")
        await c.send(left, b"\x00" + (1000).to_bytes(4, "big") + b"l" * 700)
        with trio.fail_after(5):
            while budget.buffered != 700:
                await trio.sleep(0.01)
    with trio.fail_after(5):  # the connection closed under the unfinished call
        while budget.buffered:
            await trio.sleep(0.01)
    await echo_ok(port)


async def test_unary_calls_in_one_chunk_are_all_answered(served):
    """Many requests arrive before the server reads: each is answered, in one write or several."""
    port, _, _ = served
    async with open_raw(port) as c:
        streams = []
        for i in range(50):
            s = await c.open("/test.T/Echo")
            c.h2.send_data(s.stream_id, frame(b"n%d" % i), end_stream=True)  # not flushed yet
            streams.append(s)
        await c.flush()
        with trio.fail_after(10):
            for s in streams:
                await s.closed.wait()
    assert [s.messages() for s in streams] == [[b"n%d" % i] for i in range(50)]
    assert all(s.status == GRPC_OK for s in streams)


async def test_unary_responses_beyond_one_frame_or_the_window(nursery):
    """A response of several frames within the window goes at once; one beyond the client's
    window waits for it (the call's task), and both arrive whole."""
    port, _ = await start(nursery, initial_window_size=1 << 20)
    payload = bytes(range(256)) * 160  # 40 960 bytes: three 16 KiB frames
    async with open_raw(port) as c:
        assert (await c.unary("/test.T/Echo", payload)).messages() == [payload]
    async with open_raw(port, settings={h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: 1000}) as c:
        s = await c.unary("/test.T/Echo", payload)
        assert (s.status, s.messages()) == (GRPC_OK, [payload])


async def test_a_unary_call_with_two_messages_or_none_is_internal(served):
    port, _, _ = served
    async with open_raw(port) as c:
        two = await c.open("/test.T/Echo")
        await c.send(two, frame(b"one") + frame(b"two"), end_stream=True)
        none = await c.open("/test.T/Echo", end_stream=True)
        with trio.fail_after(5):
            await two.closed.wait()
            await none.closed.wait()
        assert (two.status, two.message) == (GRPC_INTERNAL, "unary call received more than one request message")
        assert (none.status, none.message) == (GRPC_INTERNAL, "unary call ended without a request message")
        assert (await c.unary("/test.T/Echo", b"fine")).messages() == [b"fine"]


def test_reads_grow_while_they_come_back_full_and_shrink_after_a_short_one():
    """A large message arriving fills the 256 KiB reads: the next ones take up to 1 MiB and its
    frame headers at once, until a read returns less than 256 KiB."""
    from trident.grpc.transport import _RECEIVE_MAX, _RECEIVE_SIZE, next_receive_size

    assert next_receive_size(_RECEIVE_SIZE, _RECEIVE_SIZE) == _RECEIVE_MAX
    assert next_receive_size(_RECEIVE_MAX, _RECEIVE_MAX) == _RECEIVE_MAX
    assert next_receive_size(_RECEIVE_MAX, _RECEIVE_SIZE) == _RECEIVE_MAX  # still a lot waiting
    assert next_receive_size(_RECEIVE_MAX, _RECEIVE_SIZE - 1) == _RECEIVE_SIZE
    assert next_receive_size(_RECEIVE_SIZE, 100) == _RECEIVE_SIZE
    assert next_receive_size(_RECEIVE_SIZE, 0) == _RECEIVE_SIZE
