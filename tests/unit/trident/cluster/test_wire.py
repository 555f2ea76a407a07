"""The supervisor <-> worker control messages (sans-IO framing) and the channel over a socket pair."""

from __future__ import annotations

import socket

import pytest
import trio
from hypothesis import given
from hypothesis import strategies as st

from trident.cluster.channel import ChannelClosed, ControlChannel
from trident.cluster.wire import MAX_MESSAGE, FrameReader, WireError, decode_bytes, encode, encode_bytes
from trident.errors import Code, TritonError, invalid_arg

JSON = st.recursive(st.none() | st.booleans() | st.integers(-2**53, 2**53) | st.text(max_size=20),
                    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
                    max_leaves=20)


@given(st.lists(st.dictionaries(st.text(max_size=8), JSON, max_size=5), max_size=5), st.integers(1, 7))
def test_messages_survive_any_split(messages, step):
    data = b"".join(encode(m) for m in messages)
    reader = FrameReader()
    out = []
    for i in range(0, len(data), step):
        out += reader.feed(data[i:i + step])
    assert out == messages and reader.pending == 0


def test_a_frame_over_the_limit_is_refused_before_its_body():
    reader = FrameReader()
    with pytest.raises(WireError, match="exceeds"):
        reader.feed((MAX_MESSAGE + 1).to_bytes(4, "big"))


@pytest.mark.parametrize("body", [b"not json", b"[1, 2]", b'"text"'])
def test_a_body_that_is_not_an_object_is_refused(body):
    with pytest.raises(WireError):
        FrameReader().feed(len(body).to_bytes(4, "big") + body)


def test_bytes_travel_as_base64():
    assert decode_bytes(encode_bytes(b"\x00\xffabc")) == b"\x00\xffabc"
    with pytest.raises(WireError):
        decode_bytes("not base64!")


def _pair() -> tuple[ControlChannel, ControlChannel]:
    a, b = socket.socketpair()
    return (ControlChannel(trio.SocketStream(trio.socket.from_stdlib_socket(a)), "a"),
            ControlChannel(trio.SocketStream(trio.socket.from_stdlib_socket(b)), "b"))


async def test_calls_both_ways_with_errors_and_concurrency():
    left, right = _pair()

    async def left_handler(op, msg):
        if op == "slow":
            await trio.sleep(0.2)
            return {"done": "slow"}
        if op == "fail":
            raise invalid_arg("bad thing")
        if op == "crash":
            raise RuntimeError("boom")
        return {"echo": msg.get("value")}

    async def right_handler(op, msg):
        return {"from": "right", "op": op}

    async with trio.open_nursery() as nursery:
        nursery.start_soon(left.serve, left_handler)
        nursery.start_soon(right.serve, right_handler)
        results = {}

        async def slow():
            results["slow"] = await right.call("slow")

        nursery.start_soon(slow)
        await trio.sleep(0.01)
        # a slow request does not hold up another one
        assert (await right.call("echo", value=[1, "x"]))["echo"] == [1, "x"]
        assert "slow" not in results
        assert (await left.call("hi"))["op"] == "hi"
        with pytest.raises(TritonError) as e:
            await right.call("fail")
        assert e.value.code is Code.INVALID_ARG and e.value.message == "bad thing"
        with pytest.raises(TritonError) as e:
            await right.call("crash")
        assert e.value.code is Code.INTERNAL and "boom" in e.value.message
        await trio.sleep(0.3)
        assert results["slow"]["done"] == "slow"
        nursery.cancel_scope.cancel()


async def test_a_peer_that_goes_away_fails_the_waiting_calls():
    left, right = _pair()

    async def never(op, msg):
        await trio.sleep_forever()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(left.serve, never)
        nursery.start_soon(right.serve, never)

        async def close_soon():
            await trio.sleep(0.1)
            await left.aclose()

        nursery.start_soon(close_soon)
        with pytest.raises(ChannelClosed):
            await right.call("anything")
        with pytest.raises(ChannelClosed):
            await right.call("again")
        nursery.cancel_scope.cancel()


async def test_garbage_from_the_peer_closes_the_channel():
    a, b = socket.socketpair()
    channel = ControlChannel(trio.SocketStream(trio.socket.from_stdlib_socket(b)), "peer")
    a.sendall((5).to_bytes(4, "big") + b"[1,2]")

    async def handler(op, msg):
        return {}

    with trio.fail_after(5):
        await channel.serve(handler)
    assert channel.closed
    a.close()
