"""trident.http.fastserver: the HTTP/1.1 serving layer, driven with raw sockets.

Responses are read back with h11 (an independent parser); ASGI apps here are small recorders.
"""

from __future__ import annotations

import json
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import h11
import numpy as np
import pytest
import trio
import tritonclient.http as httpclient

from trident import sockets_io
from trident.http import fastserver, watch
from trident.http.fastserver import serve_asgi, serve_http_fast
from trident.options import EXAMPLE_REPOSITORY, ServerOptions
from trident.server import RequestHandle, open_server


class Recorder:
    """An ASGI app that records scopes and received messages and echoes the body.

    ``stream_parts`` > 1 sends the echo as that many body messages without content-length.
    """

    def __init__(self, stream_parts: int = 1) -> None:
        self.scopes: list[dict[str, Any]] = []
        self.messages: list[dict[str, Any]] = []
        self.stream_parts = stream_parts

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        self.scopes.append(dict(scope))
        body = b""
        while True:
            message = await receive()
            self.messages.append(message)
            body += message.get("body", b"")
            if message["type"] == "http.disconnect" or not message.get("more_body"):
                break
        if self.stream_parts == 1:
            await send({"type": "http.response.start", "status": 200,
                        "headers": [(b"content-length", b"%d" % len(body))]})
            await send({"type": "http.response.body", "body": body})
            return
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
        step = max(1, len(body) // self.stream_parts)
        for i in range(0, len(body), step):
            await send({"type": "http.response.body", "body": body[i : i + step], "more_body": True})
        await send({"type": "http.response.body", "body": b""})


@asynccontextmanager
async def serving(app: Any, **kwargs: Any) -> AsyncIterator[int]:
    async with trio.open_nursery() as nursery:
        port = await nursery.start(lambda task_status: serve_asgi(app, host="127.0.0.1", port=0,
                                                                  task_status=task_status, **kwargs))
        yield port
        nursery.cancel_scope.cancel()


class Client:
    """A raw TCP client reading responses with an h11 client state machine."""

    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream
        self.conn = h11.Connection(h11.CLIENT)

    @classmethod
    async def connect(cls, port: int) -> Client:
        return cls(await trio.open_tcp_stream("127.0.0.1", port))

    async def send(self, data: bytes) -> None:
        await self.stream.send_all(data)

    async def response(self, method: str = "POST") -> tuple[h11.Response, bytes, list[h11.InformationalResponse]]:
        """Read the next response (to a request already sent raw) with its body."""
        if self.conn.our_state is h11.DONE and self.conn.their_state is h11.DONE:
            self.conn.start_next_cycle()
        self.conn.send(h11.Request(method=method, target="/", headers=[("Host", "x")]))
        self.conn.send(h11.EndOfMessage())
        response: h11.Response | None = None
        informational: list[h11.InformationalResponse] = []
        body = b""
        while True:
            event = self.conn.next_event()
            if event is h11.NEED_DATA:
                self.conn.receive_data(await self.stream.receive_some(65536))
            elif isinstance(event, h11.InformationalResponse):
                informational.append(event)
            elif isinstance(event, h11.Response):
                response = event
            elif isinstance(event, h11.Data):
                body += event.data
            elif isinstance(event, h11.EndOfMessage):
                assert response is not None
                return response, body, informational
            else:
                raise AssertionError(f"unexpected {event!r}")

    async def read_to_eof(self) -> bytes:
        data = b""
        while chunk := await self.stream.receive_some(65536):
            data += chunk
        return data


def post(path: bytes, body: bytes, *extra: bytes) -> bytes:
    head = b"POST %s HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n" % (path, len(body))
    return head + b"".join(e + b"\r\n" for e in extra) + b"\r\n" + body


def headers_of(response: h11.Response) -> dict[bytes, bytes]:
    return dict(response.headers)


async def test_keep_alive_and_the_scope():
    app = Recorder()
    async with serving(app) as port:
        client = await Client.connect(port)
        await client.send(b"GET /v2/a%20b%2Fc?x=1&y=%20 HTTP/1.1\r\nHost: x\r\nX-Mixed-Case: V\r\n\r\n")
        response, body, _ = await client.response("GET")
        assert response.status_code == 200 and body == b""
        await client.send(post(b"/second", b"payload"))
        response, body, _ = await client.response()
        assert body == b"payload"
    first, second = app.scopes
    assert first["type"] == "http" and first["asgi"]["version"] == "3.0"
    assert (first["method"], first["path"], first["raw_path"], first["query_string"]) == (
        "GET", "/v2/a b/c", b"/v2/a%20b%2Fc", b"x=1&y=%20")
    assert (first["http_version"], first["scheme"], first["root_path"]) == ("1.1", "http", "")
    assert (b"x-mixed-case", b"V") in first["headers"] and (b"host", b"x") in first["headers"]
    assert first["client"][0] == "127.0.0.1" and first["server"] == ("127.0.0.1", port)
    assert first["client"] == second["client"]  # one connection
    assert app.messages[0] == {"type": "http.request", "body": b"", "more_body": False}


async def test_pipelined_requests_are_answered_in_order():
    async def app(scope: Any, receive: Any, send: Any) -> None:
        body = (await receive())["body"]
        await trio.sleep(0.01 * (3 - len(body)))  # later requests would finish first if run at once
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": body + b"!"})

    async with serving(app) as port:
        client = await Client.connect(port)
        await client.send(post(b"/", b"1") + post(b"/", b"22") + b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        bodies = [(await client.response(m))[1] for m in ("POST", "POST", "GET")]
    assert bodies == [b"1!", b"22!", b"!"]


async def test_expect_100_continue():
    app = Recorder()
    async with serving(app) as port:
        client = await Client.connect(port)
        await client.send(b"POST / HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: 5\r\n\r\n")
        with trio.fail_after(10):
            assert await client.stream.receive_some(100) == b"HTTP/1.1 100 Continue\r\n\r\n"
        client.conn.receive_data(b"HTTP/1.1 100 Continue\r\n\r\n")
        await client.send(b"hello")
        response, body, informational = await client.response()
        assert [i.status_code for i in informational] == [100]
        assert response.status_code == 200 and body == b"hello"


async def test_a_refused_body_gets_no_continue_and_the_connection_closes():
    async def refuse(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 400, "headers": [(b"content-length", b"2")]})
        await send({"type": "http.response.body", "body": b"no"})

    async with serving(refuse) as port:
        client = await Client.connect(port)
        await client.send(b"POST / HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: 99999999\r\n\r\n")
        with trio.fail_after(10):
            data = await client.read_to_eof()
    assert data.startswith(b"HTTP/1.1 400 Bad Request\r\n") and b"100 Continue" not in data
    assert b"connection: close\r\n" in data and data.endswith(b"\r\n\r\nno")


async def test_unread_body_sent_anyway_is_drained_while_the_client_reads():
    async def refuse(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 400, "headers": [(b"content-length", b"2")]})
        await send({"type": "http.response.body", "body": b"no"})

    big = b"b" * (4 << 20)
    async with serving(refuse) as port:
        client = await Client.connect(port)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(client.send, post(b"/", big))
            with trio.fail_after(20):
                data = await client.read_to_eof()  # lingering close: no reset before the response is read
    assert data.startswith(b"HTTP/1.1 400 ") and data.endswith(b"no")


async def test_small_unread_body_is_skipped_and_the_connection_kept():
    async def ignore_body(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": scope["path"].encode()})

    async with serving(ignore_body) as port:
        client = await Client.connect(port)
        await client.send(post(b"/one", b"x" * 1000))
        assert (await client.response())[1] == b"/one"
        await client.send(post(b"/two", b"y" * 10))
        assert (await client.response())[1] == b"/two"


async def test_chunked_request_and_chunked_response():
    app = Recorder(stream_parts=3)
    async with serving(app) as port:
        client = await Client.connect(port)
        await client.send(b"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
                          b"5;ext=1\r\nhello\r\n1\r\n \r\n")
        await trio.sleep(0.01)
        await client.send(b"5\r\nworld\r\n0\r\nX-Trailer: 1\r\n\r\n")
        response, body, _ = await client.response()
    assert body == b"hello world"
    assert headers_of(response)[b"transfer-encoding"] == b"chunked"
    assert b"".join(m["body"] for m in app.messages) == b"hello world"


async def test_large_body_arrives_in_bounded_messages():
    app = Recorder()
    big = bytes(range(256)) * (3 * 4096 + 7)  # ~3 MiB
    async with serving(app) as port:
        client = await Client.connect(port)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(client.send, post(b"/", big))
            response, body, _ = await client.response()
    assert body == big
    assert len(app.messages) > 1 and all(len(m["body"]) <= 1 << 20 for m in app.messages)
    assert [m["more_body"] for m in app.messages] == [True] * (len(app.messages) - 1) + [False]


@pytest.mark.parametrize("request_bytes, status", [
    (b"GET / HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * (70 * 1024) + b"\r\n\r\n", 431),
    (b"GET / HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * (70 * 1024), 431),
    (b"GET /\r\n\r\n", 400),
    (b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n", 400),
    (b"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", 400),
])
async def test_bad_requests_get_an_error_and_close(request_bytes, status):
    async with serving(Recorder()) as port:
        client = await Client.connect(port)
        await client.send(request_bytes)
        with trio.fail_after(10):
            data = await client.read_to_eof()
    assert data.startswith(b"HTTP/1.1 %d " % status) and b"connection: close\r\n" in data


async def test_disconnect_is_delivered_while_the_app_runs():
    got: list[str] = []
    done = trio.Event()

    async def app(scope: Any, receive: Any, send: Any) -> None:
        assert (await receive())["type"] == "http.request"
        got.append((await receive())["type"])  # blocks until the client goes away
        done.set()

    async with serving(app) as port:
        client = await Client.connect(port)
        await client.send(post(b"/", b"abc"))
        await trio.sleep(0.05)
        await client.stream.aclose()
        with trio.fail_after(10):
            await done.wait()
    assert got == ["http.disconnect"]


async def test_pending_receive_returns_disconnect_once_the_response_is_sent():
    """The app's watcher pattern: a receive() waiting next to the handler ends with the response."""
    watcher_saw: list[str] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await receive()

        async def watch() -> None:
            watcher_saw.append((await receive())["type"])

        async with trio.open_nursery() as nursery:
            nursery.start_soon(watch)
            await trio.sleep(0.01)
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": b"ok"})

    async with serving(app) as port:
        client = await Client.connect(port)
        for _ in range(2):  # and the connection stays usable
            await client.send(post(b"/", b"x"))
            assert (await client.response())[1] == b"ok"
        with trio.fail_after(10):
            while len(watcher_saw) < 2:
                await trio.sleep(0.01)
    assert watcher_saw == ["http.disconnect", "http.disconnect"]


async def test_app_failures_give_500():
    async def app(scope: Any, receive: Any, send: Any) -> None:
        if scope["path"] == "/raise":
            raise ValueError("boom")

    async with serving(app) as port:
        for path in (b"/raise", b"/silent"):
            client = await Client.connect(port)
            await client.send(b"GET %s HTTP/1.1\r\nHost: x\r\n\r\n" % path)
            with trio.fail_after(10):
                assert (await client.read_to_eof()).startswith(b"HTTP/1.1 500 ")


async def test_http10_closes_unless_keep_alive_is_asked():
    async with serving(Recorder(stream_parts=2)) as port:
        client = await Client.connect(port)
        await client.send(b"POST / HTTP/1.0\r\nContent-Length: 4\r\n\r\nabcd")
        with trio.fail_after(10):
            data = await client.read_to_eof()
        assert data.startswith(b"HTTP/1.1 200 OK\r\n") and data.endswith(b"\r\n\r\nabcd")
        assert b"transfer-encoding" not in data  # close-delimited
        client = await Client.connect(port)
        await client.send(b"GET / HTTP/1.0\r\nConnection: keep-alive\r\n\r\n" * 2)
        with trio.fail_after(10):
            data = b""
            while data.count(b"HTTP/1.1 200") < 2:
                data += await client.stream.receive_some(65536)
        assert data.count(b"connection: keep-alive\r\n") == 2


async def test_idle_keep_alive_connections_time_out():
    async with serving(Recorder(), keep_alive_timeout=0.05) as port:
        client = await Client.connect(port)
        await client.send(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        await client.response("GET")
        with trio.fail_after(10):
            assert await client.stream.receive_some(100) == b""


async def test_graceful_shutdown():
    trigger = trio.Event()
    release = trio.Event()
    entered = trio.Event()
    returned = trio.Event()

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await receive()
        if scope["path"] == "/slow":
            entered.set()
            await release.wait()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"done"})

    async def run_server(task_status: trio.TaskStatus[int]) -> None:
        await serve_asgi(app, host="127.0.0.1", port=0, shutdown_trigger=trigger.wait, task_status=task_status)
        returned.set()

    async with trio.open_nursery() as nursery:
        port = await nursery.start(run_server)
        idle = await Client.connect(port)
        await idle.send(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        await idle.response("GET")
        busy = await Client.connect(port)
        await busy.send(b"GET /slow HTTP/1.1\r\nHost: x\r\n\r\n")
        await entered.wait()
        trigger.set()
        with trio.fail_after(10):
            assert await idle.stream.receive_some(100) == b""  # idle connection closed
        await trio.sleep(0.05)
        with pytest.raises(OSError):
            await trio.open_tcp_stream("127.0.0.1", port)  # no longer accepting
        assert not returned.is_set()
        release.set()
        with trio.fail_after(10):
            response, body, _ = await busy.response("GET")
            assert body == b"done" and headers_of(response)[b"connection"] == b"close"
            assert await busy.stream.receive_some(100) == b""
            await returned.wait()


async def test_grace_period_then_cancellation():
    cancelled = trio.Event()
    entered = trio.Event()
    trigger = trio.Event()

    async def stuck(scope: Any, receive: Any, send: Any) -> None:
        entered.set()
        try:
            await trio.sleep_forever()
        finally:
            cancelled.set()

    async with trio.open_nursery() as nursery:
        port = await nursery.start(lambda task_status: serve_asgi(
            stuck, host="127.0.0.1", port=0, shutdown_trigger=trigger.wait, graceful_timeout=0.05,
            task_status=task_status))
        client = await Client.connect(port)
        await client.send(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        await entered.wait()
        trigger.set()
        with trio.fail_after(10):
            await cancelled.wait()
            assert await client.read_to_eof() == b""


async def test_cancellation_closes_listener_and_connections():
    entered = trio.Event()

    async def stuck(scope: Any, receive: Any, send: Any) -> None:
        entered.set()
        await trio.sleep_forever()

    async with trio.open_nursery() as nursery:
        port = await nursery.start(lambda task_status: serve_asgi(stuck, host="127.0.0.1", port=0,
                                                                  task_status=task_status))
        client = await Client.connect(port)
        await client.send(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        await entered.wait()
        nursery.cancel_scope.cancel()
    with trio.fail_after(10):
        assert await client.read_to_eof() == b""
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", port), timeout=2).close()


def tritonclient_session(port: int) -> dict[str, Any]:
    client = httpclient.InferenceServerClient(f"127.0.0.1:{port}")
    a = np.arange(16, dtype=np.float32).reshape(1, 16)
    inputs = []
    for name in ("INPUT0", "INPUT1"):
        item = httpclient.InferInput(name, [1, 16], "FP32")
        item.set_data_from_numpy(a)
        inputs.append(item)
    as_json = client.infer("add_sub", inputs, request_compression_algorithm="gzip",
                           outputs=[httpclient.InferRequestedOutput("OUTPUT0", binary_data=False)])
    return {"ready": client.is_server_ready(), "binary": client.infer("add_sub", inputs).as_numpy("OUTPUT0"),
            "json": as_json.as_numpy("OUTPUT0"), "expected": a + a}


async def test_serves_the_kserve_app_to_tritonclient():
    options = ServerOptions(model_repositories=[str(Path(EXAMPLE_REPOSITORY))], exit_timeout_secs=5)
    async with open_server(options) as server, trio.open_nursery() as nursery:
        port = await nursery.start(
            lambda task_status: serve_http_fast(server, host="127.0.0.1", port=0, task_status=task_status))
        got = await trio.to_thread.run_sync(tritonclient_session, port)
        nursery.cancel_scope.cancel()
    assert got["ready"]
    np.testing.assert_array_equal(got["binary"], got["expected"])
    np.testing.assert_array_equal(got["json"], got["expected"])


def test_cli_selects_the_serving_layer(capsys):
    from trident.cli import build_parser, options_from_args

    assert options_from_args(build_parser().parse_args(["serve", "--http-server", "trident"])).http_server == "trident"
    assert options_from_args(build_parser().parse_args(["serve", "--http-server=hypercorn"])).http_server == "hypercorn"
    with pytest.raises(SystemExit) as e:
        build_parser().parse_args(["serve", "--http-server", "nginx"])
    assert e.value.code == 2 and "--http-server" in capsys.readouterr().err


# ---- timeouts and the connection cap (hardening) ------------------------------------------------


async def test_a_slowloris_head_gets_408_within_the_header_timeout():
    """One byte of the head every 50 ms never completes it: the whole-head deadline fires anyway."""
    app = Recorder()
    async with serving(app, header_timeout=0.3) as port:
        client = await Client.connect(port)

        async def dribble() -> None:
            for byte in b"GET / HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 1000:
                await client.send(bytes([byte]))
                await trio.sleep(0.05)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(dribble)
            with trio.fail_after(10):
                data = await client.read_to_eof()
            nursery.cancel_scope.cancel()
    assert data.startswith(b"HTTP/1.1 408 Request Timeout\r\n") and b"connection: close\r\n" in data
    assert app.scopes == []


async def test_a_silent_connection_is_closed_after_the_header_timeout():
    async with serving(Recorder(), header_timeout=0.2) as port:
        client = await Client.connect(port)
        with trio.fail_after(10):
            assert await client.read_to_eof() == b""  # nothing to answer: closed without a response


async def test_the_head_timeout_starts_at_the_first_byte_of_a_later_request():
    """An idle keep-alive connection is the reaper's business, not the header timeout's."""
    async with serving(Recorder(), header_timeout=0.2) as port:
        client = await Client.connect(port)
        await client.send(post(b"/", b"one"))
        assert (await client.response())[1] == b"one"
        await trio.sleep(0.5)  # idle longer than the header timeout: still open
        await client.send(post(b"/", b"two"))
        assert (await client.response())[1] == b"two"
        await client.send(b"GET / HTTP/1.1\r\n")  # then a partial head: 408 once it is late
        with trio.fail_after(10):
            data = await client.read_to_eof()
    assert data.startswith(b"HTTP/1.1 408 ")


async def test_a_stalled_body_gets_408_and_the_app_sees_a_disconnect():
    app = Recorder()
    async with serving(app, body_timeout=0.2) as port:
        client = await Client.connect(port)
        await client.send(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\nabc")
        with trio.fail_after(10):
            data = await client.read_to_eof()
    assert data.startswith(b"HTTP/1.1 408 Request Timeout\r\n") and b"connection: close\r\n" in data
    assert app.messages[-1] == {"type": "http.disconnect"}
    assert b"".join(m.get("body", b"") for m in app.messages) == b"abc"


async def test_a_slow_but_steady_body_is_not_a_timeout():
    """A body longer than the body timeout is fine while it arrives faster than MIN_BODY_RATE."""
    app = Recorder()
    chunk = b"s" * fastserver.MIN_BODY_RATE
    async with serving(app, body_timeout=0.3) as port:
        client = await Client.connect(port)
        await client.send(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % (6 * len(chunk)))
        for _ in range(6):
            await trio.sleep(0.1)
            await client.send(chunk)
        response, body, _ = await client.response()
    assert response.status_code == 200 and body == chunk * 6


async def test_a_dripping_body_gets_408_though_it_never_pauses_long():
    """One byte every 0.1 s never pauses for the 0.3 s body timeout, but falls behind MIN_BODY_RATE."""
    app = Recorder()
    async with serving(app, body_timeout=0.3) as port:
        client = await Client.connect(port)
        await client.send(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n")
        with trio.fail_after(10):
            for _ in range(8):  # 0.8 s of dripping: past the 0.3 s (+ 8 bytes' worth) deadline
                await trio.sleep(0.1)
                await client.send(b"d")
            data = await client.read_to_eof()
    assert data.startswith(b"HTTP/1.1 408 Request Timeout\r\n")
    assert app.messages[-1] == {"type": "http.disconnect"}


async def test_at_the_connection_limit_accepting_pauses_until_one_closes():
    async with serving(Recorder(), max_connections=2) as port:
        first, second = await Client.connect(port), await Client.connect(port)
        for client in (first, second):
            await client.send(post(b"/", b"held"))
            assert (await client.response())[1] == b"held"
        third = await Client.connect(port)  # the kernel completes the handshake (backlog)
        await third.send(post(b"/", b"third"))
        with trio.move_on_after(0.5) as waited:
            await third.stream.receive_some(100)
        assert waited.cancelled_caught  # not accepted while two connections are open
        await first.stream.aclose()
        with trio.fail_after(10):
            assert (await third.response())[1] == b"third"
        await second.send(post(b"/", b"still"))
        assert (await second.response())[1] == b"still"


async def test_serve_http_fast_takes_the_limits_from_the_options():
    options = ServerOptions(model_repositories=[str(Path(EXAMPLE_REPOSITORY))], exit_timeout_secs=5,
                            http_header_timeout_secs=0.2, http_body_timeout_secs=0.2)
    async with open_server(options) as server, trio.open_nursery() as nursery:
        port = await nursery.start(
            lambda task_status: serve_http_fast(server, host="127.0.0.1", port=0, task_status=task_status))
        head = await Client.connect(port)
        await head.send(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n")
        body = await Client.connect(port)
        await body.send(b"POST /v2/models/add_sub/infer HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{")
        with trio.fail_after(10):
            assert (await head.read_to_eof()).startswith(b"HTTP/1.1 408 ")
            assert (await body.read_to_eof()).startswith(b"HTTP/1.1 408 ")
        nursery.cancel_scope.cancel()


async def test_the_infer_fast_path_leaves_no_task_behind(monkeypatch):
    """Disconnects during watched inferences, bad and truncated bodies: every task ends with its connection."""
    monkeypatch.setattr(watch, "WATCH_DELAY", 0.01)
    options = ServerOptions(model_repositories=[str(Path(EXAMPLE_REPOSITORY))], exit_timeout_secs=5)
    body = b'{"inputs": [{"name": "INPUT0", "shape": [2], "datatype": "FP32", "data": [1, 2]}]}'
    path = b"/v2/models/identity_fp32/infer"
    cancelled: list[bool] = []
    async with open_server(options) as server, trio.open_nursery() as nursery:
        start = server.start

        def slow_start(request: Any, **kwargs: Any) -> RequestHandle:  # the fast path's call: awaited, watched
            async def drive(handle: RequestHandle, send: Any) -> None:
                try:
                    await trio.sleep(0.3)
                except trio.Cancelled:
                    cancelled.append(True)
                    raise
                await send(await start(request, **kwargs).wait())

            return RequestHandle(drive)

        port = await nursery.start(
            lambda task_status: serve_http_fast(server, host="127.0.0.1", port=0, task_status=task_status))
        warm = await Client.connect(port)
        await warm.send(post(path, body))
        assert (await warm.response())[0].status_code == 200
        await warm.stream.aclose()
        await trio.sleep(0.1)
        living = trio.lowlevel.current_statistics().tasks_living
        monkeypatch.setattr(server, "start", slow_start)

        async def one(kind: int) -> None:
            client = await Client.connect(port)
            if kind == 0:  # leaves while its request is watched
                await client.send(post(path, body))
                await trio.sleep(0.1)
            elif kind == 1:  # answered, after a watch that ends with the request
                await client.send(post(path, body))
                assert (await client.response())[0].status_code == 200
            elif kind == 2:  # bad JSON: 400, the connection stays
                await client.send(post(path, b"{oops") + post(path, b"[]"))
                assert (await client.response())[0].status_code == 400
                assert (await client.response())[0].status_code == 400
            else:  # a truncated body, then gone
                await client.send(post(path, body)[:-5])
            await client.stream.aclose()

        with trio.fail_after(20):
            async with trio.open_nursery() as clients:
                for i in range(24):
                    clients.start_soon(one, i % 4)
            while trio.lowlevel.current_statistics().tasks_living > living:
                await trio.sleep(0.05)
        assert len(cancelled) == 6  # every request whose client left while it ran
        assert trio.lowlevel.current_statistics().tasks_living == living
        nursery.cancel_scope.cancel()


async def test_a_repeated_head_is_read_alike_each_time():
    """The same head again (its infer headers are remembered by the endpoint): binary requests
    keep their JSON length, a bad Inference-Header-Content-Length is refused every time."""
    options = ServerOptions(model_repositories=[str(Path(EXAMPLE_REPOSITORY))])
    header = b'{"inputs":[{"name":"INPUT0","shape":[2],"datatype":"FP32","parameters":{"binary_data_size":8}}]}'
    binary = header + np.array([1.5, 2.5], np.float32).tobytes()
    path = b"/v2/models/identity_fp32/infer"
    async with open_server(options) as server, trio.open_nursery() as nursery:
        port = await nursery.start(
            lambda task_status: serve_http_fast(server, host="127.0.0.1", port=0, task_status=task_status))
        client = await Client.connect(port)
        for _ in range(3):
            await client.send(post(path, binary, b"Inference-Header-Content-Length: %d" % len(header)))
            response, body, _ = await client.response()
            assert response.status_code == 200
            assert json.loads(body)["outputs"][0]["data"] == [1.5, 2.5]
            await client.send(post(path, binary, b"Inference-Header-Content-Length: abc"))
            response, body, _ = await client.response()
            assert response.status_code == 400
            assert json.loads(body) == {"error": "Unable to parse Inference-Header-Content-Length, got: abc"}
        await client.stream.aclose()
        nursery.cancel_scope.cancel()


async def test_responses_kept_for_the_end_of_the_round_stay_in_order_when_the_client_stops_reading(monkeypatch):
    """Small /infer responses made while other tasks share the loop's round are kept and written
    together when the round ends. A client that pipelines many and reads none fills the socket:
    what a flush could not write is written by a task of the connection's, before anything newer
    (the connection stops reading meanwhile), and every response arrives whole and in order."""
    writers: list[int] = []
    write_after = sockets_io.SocketIO._write_after

    async def counted(self: Any, previous: trio.Event | None, parts: list[Any], busy: trio.Event) -> None:
        writers.append(sum(len(p) for p in parts))
        await write_after(self, previous, parts, busy)

    monkeypatch.setattr(sockets_io.SocketIO, "_write_after", counted)
    options = ServerOptions(model_repositories=[str(Path(EXAMPLE_REPOSITORY))])
    values, count = 15_000, 150  # about 60 KB per response (under DEFER_BYTES), 9 MB in all
    path = b"/v2/models/identity_fp32/infer"
    requests = []
    for i in range(count):
        data = np.full(values, i, np.float32).tobytes()
        header = json.dumps({"id": str(i), "inputs": [{"name": "INPUT0", "shape": [values], "datatype": "FP32",
                                                       "parameters": {"binary_data_size": len(data)}}],
                             "outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": True}}]}).encode()
        requests.append(post(path, header + data, b"Inference-Header-Content-Length: %d" % len(header)))
    async with open_server(options) as server, trio.open_nursery() as nursery:
        port = await nursery.start(
            lambda task_status: serve_http_fast(server, host="127.0.0.1", port=0, task_status=task_status))

        async def company() -> None:  # another task runnable in every round: responses are kept
            while True:
                await trio.sleep(0)

        nursery.start_soon(company)
        client = await Client.connect(port)
        nursery.start_soon(client.send, b"".join(requests))
        await trio.sleep(1.0)  # the server answers until the socket is full
        assert writers, "no flush was left with bytes the socket did not take"
        with trio.fail_after(30):
            for i in range(count):
                response, body, _ = await client.response()
                assert response.status_code == 200
                json_length = int(headers_of(response)[b"inference-header-content-length"])
                doc = json.loads(body[:json_length])
                assert doc["id"] == str(i)
                assert doc["outputs"][0]["parameters"]["binary_data_size"] == values * 4
                assert np.array_equal(np.frombuffer(body[json_length:], np.float32), np.full(values, i, np.float32))
        nursery.cancel_scope.cancel()
