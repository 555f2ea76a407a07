"""gRPC front end under abuse, against the real server: HTTP/2 floods, oversized headers, too many
streams, byte budgets, silent/idle/dripping connections, keepalive and ping strikes.

Each abusive client gets what nginx, Envoy and grpc-go answer (GOAWAY ENHANCE_YOUR_CALM, a stream
error, a closed connection), and a well-behaved client keeps being served. Small timeouts come
from the command-line flags; nothing asserts on speed.
"""

from __future__ import annotations

import gzip
import struct

import h2.errors
import numpy as np
import pytest
import trio
import tritonclient.grpc as grpcclient
import tritonclient.grpc.service_pb2 as pb
from e2e.grpc_raw import (
    CONTINUATION,
    DATA,
    END_HEADERS,
    END_STREAM,
    HEADERS,
    PING,
    PREFACE,
    SETTINGS,
    Seen,
    exchange,
    flood,
    frame,
    h2_frame,
    huffman_literal,
    open_raw,
    rapid_reset,
    read_frames,
    request_block,
)
from e2e.models import SLOW_CONFIG, SLOW_PY, write_identity, write_model
from e2e.test_grpc_robustness import healthy_call, infer_request
from tritonclient.utils import InferenceServerException

from trident.errors import GRPC_DEADLINE_EXCEEDED, GRPC_INVALID_ARGUMENT, GRPC_OK, GRPC_RESOURCE_EXHAUSTED

INFER = "/inference.GRPCInferenceService/ModelInfer"
STREAM = "/inference.GRPCInferenceService/ModelStreamInfer"
ENHANCE_YOUR_CALM = h2.errors.ErrorCodes.ENHANCE_YOUR_CALM
MAX_MESSAGE = 1 << 20


pytestmark = pytest.mark.usefixtures("grpc_http2")  # once per --grpc-http2 implementation


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    repo = tmp_path_factory.mktemp("grpc-abuse")
    write_identity(repo, "FP32")
    write_model(repo, "slow", SLOW_CONFIG, SLOW_PY)
    return repo


@pytest.fixture(scope="module")
def server(repo, grpc_http2):
    from e2e.conftest import start_server

    s = start_server(f"--grpc-max-message-size={MAX_MESSAGE}", "--grpc-max-buffered-bytes=300000", repo=repo)
    yield s
    s.stop()


def calm(seen: Seen) -> bytes:
    """The debug data of the GOAWAY ENHANCE_YOUR_CALM the server sent (fails the test without one)."""
    goaway = seen.goaway()
    assert goaway is not None, "no GOAWAY"
    assert goaway[1] == ENHANCE_YOUR_CALM, goaway
    return goaway[2]


async def victim_during(port: int, abuse) -> Seen:
    """Run ``abuse()`` while a well-behaved client makes calls; both must finish."""
    async with trio.open_nursery() as nursery:
        async def victim():
            for _ in range(3):
                await healthy_call(port)

        nursery.start_soon(victim)
        seen = await abuse()
    await healthy_call(port)
    return seen


async def test_rapid_reset_gets_goaway_and_others_are_served(server):
    request = infer_request(np.zeros((1, 4), np.float32))
    seen = await victim_during(server.grpc_port, lambda: flood(server.grpc_port, rapid_reset(INFER, 20_000, request)))
    assert calm(seen) == b"too_many_resets"


@pytest.mark.parametrize("kind", ["settings", "ping", "empty-data"])
async def test_control_frame_floods_get_goaway(server, kind):
    if kind == "settings":
        payload = h2_frame(SETTINGS, 0, 0) * 100_000
    elif kind == "ping":
        payload = h2_frame(PING, 0, 0, b"flooding") * 100_000
    else:
        payload = h2_frame(HEADERS, END_HEADERS, 1, request_block(INFER)) + h2_frame(DATA, 0, 1) * 100_000
    seen = await victim_during(server.grpc_port, lambda: flood(server.grpc_port, payload))
    # the frame guard reads a whole chunk before h2 does, so a PING flood usually meets the
    # control-frame budget before gRPC's ping strikes
    reasons = (b"too_many_control_frames", b"too_many_pings") if kind == "ping" else (b"too_many_control_frames",)
    assert calm(seen) in reasons


async def test_continuation_flood_gets_goaway(server):
    payload = h2_frame(HEADERS, 0, 1, request_block(INFER)) + h2_frame(CONTINUATION, 0, 1, b"\x00" * (1 << 20)) * 64
    seen = await victim_during(server.grpc_port, lambda: flood(server.grpc_port, payload, chunk=1 << 20))
    assert calm(seen) == b"header_block_too_large"


async def test_a_70kb_metadata_header_fails_its_stream_only(server):
    x = np.arange(4, dtype=np.float32).reshape(1, 4)
    async with open_raw(server.grpc_port) as c:
        big = await c.unary(INFER, infer_request(x), extra=[(b"x-big", b"m" * 70_000)])
        assert big.status == GRPC_RESOURCE_EXHAUSTED and "header list" in big.message
        ok = await c.unary(INFER, infer_request(x), extra=[(b"x-after", b"indexed")])
        assert ok.status == GRPC_OK and c.goaway is None


def test_a_70kb_metadata_header_with_tritonclient(server):
    x = np.arange(4, dtype=np.float32).reshape(1, 4)
    with grpcclient.InferenceServerClient(server.grpc_url) as c:
        inp = grpcclient.InferInput("INPUT0", [1, 4], "FP32")
        inp.set_data_from_numpy(x)
        with pytest.raises(InferenceServerException) as e:
            c.infer("identity_fp32", [inp], headers={"x-big": "m" * 70_000})
        assert e.value.status() == "StatusCode.RESOURCE_EXHAUSTED"
        assert c.infer("identity_fp32", [inp]).as_numpy("OUTPUT0").tolist() == x.tolist()


def huffman_value(size: int) -> bytes:
    """``size`` random letters and digits: Huffman-coded to about 3/4 of that."""
    rng = np.random.default_rng(size)
    alphabet = np.frombuffer(b"abcdefghijklmnopqrstuvwxyz0123456789", np.uint8)
    return rng.choice(alphabet, size).tobytes()


@pytest.mark.parametrize(("size", "status"), [(80_000, GRPC_RESOURCE_EXHAUSTED), (48_000, GRPC_OK)],
                         ids=["over-the-list-size", "under-it"])
async def test_a_flood_of_large_huffman_coded_headers_on_one_connection(server, size, status):
    """20 calls, each with a ~60 KB (or ~36 KB) Huffman-coded header, in one write, then a plain
    call: each big call gets what the header list limit says (64 KiB: RESOURCE_EXHAUSTED over
    it, the answer under it), the plain call is answered on the same connection (no GOAWAY),
    and a client on another connection is served during the flood (the server decodes one
    large block per slice, other tasks in between)."""
    x = np.arange(4, dtype=np.float32).reshape(1, 4)
    request = frame(infer_request(x))
    big = request_block(INFER) + huffman_literal(b"x-big", huffman_value(size))
    assert 0.7 * size < len(big) < 0.8 * size
    payload = bytearray()
    for i in range(20):
        payload += h2_frame(HEADERS, END_HEADERS, 2 * i + 1, big) + h2_frame(DATA, END_STREAM, 2 * i + 1, request)
    payload += h2_frame(HEADERS, END_HEADERS, 41, request_block(INFER)) + h2_frame(DATA, END_STREAM, 41, request)
    streams = list(range(1, 42, 2))
    got = await victim_during(server.grpc_port, lambda: exchange(server.grpc_port, bytes(payload), streams))
    for sid in streams:
        headers, data = got[sid]
        expected = GRPC_OK if sid == 41 else status
        assert int(headers.get(b"grpc-status", b"-1")) == expected, (sid, headers)
        if expected == GRPC_OK:
            assert pb.ModelInferResponse.FromString(data[5:]).raw_output_contents[0] == x.tobytes()
        else:
            assert b"header list" in headers[b"grpc-message"]


@pytest.mark.parametrize("value", [b"abc", b"1", b"123456789S", b"-1S"])
async def test_a_malformed_grpc_timeout_is_invalid_argument(server, value):
    async with open_raw(server.grpc_port) as c:
        s = await c.unary(INFER, infer_request(np.zeros((1, 4), np.float32)), extra=[(b"grpc-timeout", value)])
    assert s.status == GRPC_INVALID_ARGUMENT and "malformed grpc-timeout" in s.message


async def test_byte_budget_answers_resource_exhausted_and_frees_everything(server):
    port = server.grpc_port
    async with open_raw(port) as a, open_raw(port) as b:
        first = await a.open(INFER)
        await a.send(first, b"\x00" + MAX_MESSAGE.to_bytes(4, "big") + b"\x00" * 200_000)
        second = await b.open(INFER)  # 400 000 bytes buffered by the server: over 300 000
        await b.send(second, b"\x00" + MAX_MESSAGE.to_bytes(4, "big") + b"\x00" * 200_000)
        # the server may read the two connections in either order: the later one is refused
        with trio.fail_after(10):
            async with trio.open_nursery() as nursery:
                for s in (first, second):
                    async def closed(s=s):
                        await s.closed.wait()
                        nursery.cancel_scope.cancel()
                    nursery.start_soon(closed)
        refused = second if second.closed.is_set() else first
        assert refused.status == GRPC_RESOURCE_EXHAUSTED and "buffered" in refused.message
        for conn, s in ((a, first), (b, second)):
            if not s.closed.is_set():
                await conn.reset(s)
    await healthy_call(port)  # the budget was given back


async def test_prefixes_alone_pin_no_memory(server):
    # 8 streams x a prefix declaring the maximum size (no payload): nothing is allocated, so the
    # 300 000-byte budget is untouched and a request still fits
    async with open_raw(server.grpc_port) as c:
        streams = []
        for _ in range(8):
            s = await c.open(INFER)
            await c.send(s, struct.pack(">BI", 0, MAX_MESSAGE))
            streams.append(s)
        x = np.zeros((1, 60_000), np.float32)  # 240 KB: fits only if the prefixes hold nothing
        s = await c.unary(INFER, infer_request(x))
        assert s.status == GRPC_OK, s.message


async def test_gzip_bomb_is_bounded_and_others_are_served(server_factory, repo):
    s = server_factory("--grpc-max-message-size=67108864", repo=repo)
    gz = [(b"grpc-encoding", b"gzip")]
    bomb = gzip.compress(b"\x00" * (64 << 20))  # 64 KiB -> 64 MiB: inflated off the event loop

    async def abuse():
        async with open_raw(s.grpc_port) as c:
            streams = []
            for _ in range(2):
                st = await c.open(INFER, extra=gz)
                await c.send(st, frame(bomb, compressed=True), end_stream=True)
                streams.append(st)
            for st in streams:
                with trio.fail_after(60):
                    await st.closed.wait()
            return streams

    async with trio.open_nursery() as nursery:
        nursery.start_soon(healthy_call, s.grpc_port)
        streams = await abuse()
    # 64 MiB of zero bytes is not a valid ModelInferRequest: decoded (in a worker thread), refused
    assert all(st.status not in (None, GRPC_OK) for st in streams)
    await healthy_call(s.grpc_port)


async def test_silent_idle_and_dripping_connections_are_closed(server_factory, repo):
    s = server_factory("--grpc-handshake-timeout-secs=0.5", "--grpc-idle-timeout-secs=0.5",
                       "--grpc-message-timeout-secs=0.5", repo=repo)
    port = s.grpc_port
    # silent TCP and a preface that stops half-way: closed after the handshake timeout
    for greeting in (b"", PREFACE[:10]):
        sock = await trio.open_tcp_stream("127.0.0.1", port)
        await sock.send_all(greeting)
        with trio.fail_after(10):
            while await sock.receive_some(65536):
                pass
        await sock.aclose()
    # idle: a connection with no call gets GOAWAY NO_ERROR and is closed
    async with open_raw(port) as c:
        s1 = await c.unary(INFER, infer_request(np.zeros((1, 4), np.float32)))
        assert s1.status == GRPC_OK
        with trio.fail_after(10):
            await c.closed.wait()
        assert c.goaway is not None and c.goaway.error_code == h2.errors.ErrorCodes.NO_ERROR
    # dripping: a message started and never finished fails its stream
    async with open_raw(port) as c:
        drip = await c.open(INFER)
        await c.send(drip, struct.pack(">BI", 0, 1000) + b"\x0a\x01")
        with trio.fail_after(10):
            await drip.closed.wait()
        assert drip.status == GRPC_DEADLINE_EXCEEDED and "not received whole" in drip.message


async def test_keepalive_closes_a_connection_that_does_not_ack(server_factory, repo):
    s = server_factory("--grpc-keepalive-time=200", "--grpc-keepalive-timeout=300", repo=repo)
    seen = Seen()
    sock = await trio.open_tcp_stream("127.0.0.1", s.grpc_port)
    # a ModelStreamInfer call that stays open (no message yet), then silence: no PING ACK
    await sock.send_all(PREFACE + h2_frame(SETTINGS, 0, 0) + h2_frame(HEADERS, END_HEADERS, 1, request_block(STREAM)))
    with trio.fail_after(20):
        await read_frames(sock, seen)  # reads (so PINGs arrive) but never acknowledges them
    await sock.aclose()
    assert seen.of(PING), "no keepalive PING"
    await healthy_call(s.grpc_port)


async def test_pings_without_calls_get_goaway_too_many_pings(server):
    async with open_raw(server.grpc_port) as c:
        for _ in range(4):
            c.h2.ping(b"pingpong")
        await c.flush()
        with trio.fail_after(10):
            await c.closed.wait()
    assert c.goaway is not None and c.goaway.error_code == ENHANCE_YOUR_CALM
    assert c.goaway.additional_data == b"too_many_pings"


async def test_the_connection_limit_pauses_accepting(server_factory, repo):
    s = server_factory("--grpc-max-connections=2", repo=repo)
    async with open_raw(s.grpc_port) as a, open_raw(s.grpc_port) as b:
        x = np.zeros((1, 4), np.float32)
        assert (await a.unary(INFER, infer_request(x))).status == GRPC_OK
        assert (await b.unary(INFER, infer_request(x))).status == GRPC_OK
        with trio.move_on_after(0.5) as waited:
            await healthy_call(s.grpc_port)
        assert waited.cancelled_caught, "a third connection was served while two were open"
    await healthy_call(s.grpc_port)
