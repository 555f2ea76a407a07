"""Large HTTP bodies that arrive in pieces: a Content-Length body of 1 MiB or more is received
into one buffer of its announced size (trident.http.fast_infer.PLACED_BODY), a gzip body is
inflated in pieces joined once (trident.protocol.compression). The answers must be exactly
those of the same bytes sent at once; a body cut short must leave the server serving.
Both HTTP layers (trident's own and hypercorn) answer the same. A large tensor the model refuses
(another datatype, an unknown input, a batch beyond its limit) is refused before its data is
decoded, over HTTP and gRPC.
"""

from __future__ import annotations

import gzip
import json
import socket
import time
from collections.abc import Iterator

import numpy as np
import pytest
import tritonclient.http as httpclient
from e2e.conftest import RunningServer, start_server
from tritonclient.utils import InferenceServerException

from trident.options import EXAMPLE_REPOSITORY

VALUES = np.arange(3 * 262144, dtype=np.float32) / 7  # 3 MiB of FP32


@pytest.fixture(scope="module", params=["trident", "hypercorn"])
def server(request) -> Iterator[RunningServer]:
    s = start_server("--allow-grpc=false", "--http-server", request.param, repo=EXAMPLE_REPOSITORY)
    yield s
    s.stop()


def binary_body(values: np.ndarray) -> tuple[bytes, int]:
    header = json.dumps({"inputs": [{"name": "INPUT0", "shape": [values.size], "datatype": "FP32",
                                     "parameters": {"binary_data_size": values.nbytes}}],
                         "outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": True}}]}).encode()
    return header + values.tobytes(), len(header)


def head(length: int, *extra: str) -> bytes:
    lines = ["POST /v2/models/identity_fp32/infer HTTP/1.1", "Host: x", f"Content-Length: {length}", *extra]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def read_response(sock: socket.socket) -> tuple[int, dict[str, str], bytes]:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(1 << 16)
        assert chunk, data
        data += chunk
    top, _, rest = data.partition(b"\r\n\r\n")
    lines = top.decode().split("\r\n")
    headers = {k.lower(): v for k, v in (line.split(": ", 1) for line in lines[1:])}
    length = int(headers["content-length"])
    while len(rest) < length:
        chunk = sock.recv(1 << 20)
        assert chunk
        rest += chunk
    return int(lines[0].split()[1]), headers, rest[:length]


def output_of(headers: dict[str, str], body: bytes) -> np.ndarray:
    json_length = int(headers["inference-header-content-length"])
    doc = json.loads(body[:json_length])
    assert doc["outputs"][0]["parameters"]["binary_data_size"] == len(body) - json_length
    return np.frombuffer(body[json_length:], dtype=np.float32)


def send_in_pieces(sock: socket.socket, data: bytes, pieces: int) -> None:
    """``data`` in ``pieces`` writes with a pause between them, so the server reads it in many."""
    step = -(-len(data) // pieces)
    for start in range(0, len(data), step):
        sock.sendall(data[start : start + step])
        time.sleep(0.02)


@pytest.mark.parametrize("pieces", [1, 2, 9, 64])
def test_a_large_binary_body_in_pieces_gets_the_answer_of_one_write(server, pieces):
    body, json_length = binary_body(VALUES)
    with socket.create_connection(("127.0.0.1", server.http_port), timeout=60) as sock:
        sock.sendall(head(len(body), f"Inference-Header-Content-Length: {json_length}"))
        send_in_pieces(sock, body, pieces)
        status, headers, answer = read_response(sock)
        assert status == 200, answer[:300]
        np.testing.assert_array_equal(output_of(headers, answer), VALUES)
        # the connection goes on: a small request right behind it
        small, small_length = binary_body(VALUES[:4])
        sock.sendall(head(len(small), f"Inference-Header-Content-Length: {small_length}") + small)
        status, headers, answer = read_response(sock)
        assert status == 200
        np.testing.assert_array_equal(output_of(headers, answer), VALUES[:4])


def test_a_large_gzip_json_body_in_pieces(server):
    doc = {"inputs": [{"name": "INPUT0", "shape": [VALUES.size], "datatype": "FP32", "data": VALUES.tolist()}],
           "outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": True}}]}
    text = json.dumps(doc).encode()
    assert len(text) > 8 << 20  # inflates past several of the inflater's 1 MiB steps
    body = gzip.compress(text, 1)
    with socket.create_connection(("127.0.0.1", server.http_port), timeout=60) as sock:
        sock.sendall(head(len(body), "Content-Type: application/json", "Content-Encoding: gzip"))
        send_in_pieces(sock, body, 5)
        status, headers, answer = read_response(sock)
    assert status == 200, answer[:300]
    np.testing.assert_array_equal(output_of(headers, answer), VALUES)


def test_a_large_body_cut_short_leaves_the_server_serving(server):
    body, json_length = binary_body(VALUES)
    for cut in (1 << 20, len(body) - 1):
        with socket.create_connection(("127.0.0.1", server.http_port), timeout=60) as sock:
            sock.sendall(head(len(body), f"Inference-Header-Content-Length: {json_length}") + body[:cut])
            time.sleep(0.1)
    # a body that announces more than it holds and a wrong header length are bad input, answered
    with socket.create_connection(("127.0.0.1", server.http_port), timeout=60) as sock:
        sock.sendall(head(len(body), f"Inference-Header-Content-Length: {len(body) + 1}") + body)
        status, _, answer = read_response(sock)
        assert status == 400 and "inference header size" in json.loads(answer)["error"]
    client = httpclient.InferenceServerClient(server.http_url)
    try:
        item = httpclient.InferInput("INPUT0", [8], "FP32")
        item.set_data_from_numpy(VALUES[:8], binary_data=True)
        result = client.infer("identity_fp32", [item])
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), VALUES[:8])
    finally:
        client.close()



def test_a_body_past_the_mapped_size_is_received_whole_or_cut_short_harmlessly(server):
    """From offload.MAPPED_BUFFER bytes the body's buffer is mapped in a decode thread, in steps
    ahead of what has arrived: the answer is the same, and a client that goes away before the
    body is in (before a step, or after some) leaves the server serving."""
    from trident.http.offload import MAPPED_BUFFER

    values = np.arange(MAPPED_BUFFER // 4 + 4099, dtype=np.float32)
    body, json_length = binary_body(values)
    assert len(body) > MAPPED_BUFFER
    for cut in (0, 1 << 20, 5 << 20):  # nothing of the body, some of it, several steps of it
        with socket.create_connection(("127.0.0.1", server.http_port), timeout=60) as sock:
            sock.sendall(head(len(body), f"Inference-Header-Content-Length: {json_length}") + body[:cut])
    with socket.create_connection(("127.0.0.1", server.http_port), timeout=60) as sock:
        sock.sendall(head(len(body), f"Inference-Header-Content-Length: {json_length}"))
        send_in_pieces(sock, body, 9)
        status, headers, answer = read_response(sock)
        assert status == 200, answer[:300]
        np.testing.assert_array_equal(output_of(headers, answer), values)


def _every(interval: float, total: float) -> Iterator[None]:
    """Yield every ``interval`` seconds for ``total`` seconds (a bounded watch)."""
    end = time.monotonic() + total
    while time.monotonic() < end:
        yield
        time.sleep(interval)


def _rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def test_a_large_announced_body_pins_memory_as_it_arrives_not_as_announced(server):
    """Bad input: clients announcing 60 MiB bodies and sending 64 KiB of each pin about what
    they sent (the buffer is mapped a step ahead of what arrived, 1 MiB at first), not 60 MiB
    each; the server answers others meanwhile and after they go."""
    announced = 60 << 20
    before = _rss_mib(server.proc.pid)
    socks = []
    try:
        for _ in range(8):
            sock = socket.create_connection(("127.0.0.1", server.http_port), timeout=60)
            sock.sendall(head(announced, "Inference-Header-Content-Length: 16") + bytes(64 << 10))
            socks.append(sock)
        client = httpclient.InferenceServerClient(server.http_url)
        try:  # answered while the 8 bodies wait (their bytes were read before this request's)
            item = httpclient.InferInput("INPUT0", [8], "FP32")
            item.set_data_from_numpy(VALUES[:8], binary_data=True)
            np.testing.assert_array_equal(client.infer("identity_fp32", [item]).as_numpy("OUTPUT0"), VALUES[:8])
        finally:
            client.close()
        # memory that does not grow has no event to wait for: watched for a second instead
        grown = max(_rss_mib(server.proc.pid) - before for _ in _every(0.05, 1.0))
        assert grown < 100, f"RSS grew {grown:.0f} MiB for 8 bodies of 64 KiB announced as 60 MiB each"
    finally:
        for sock in socks:
            sock.close()


# ---- a large tensor the model refuses is refused before its data is decoded -----------------

N_BYTES = 300_000  # BYTES elements of 4 bytes behind 4-byte prefixes: a 2.4 MB body, decoded off the loop


def bytes_body(model_shape: list[int], data: bytes, datatype: str = "BYTES") -> tuple[bytes, int]:
    header = json.dumps({"inputs": [{"name": "INPUT0", "shape": model_shape, "datatype": datatype,
                                     "parameters": {"binary_data_size": len(data)}}]}).encode()
    return header + data, len(header)


def post(server, model: str, body: bytes, json_length: int) -> tuple[int, bytes]:
    with socket.create_connection(("127.0.0.1", server.http_port), timeout=60) as sock:
        sock.sendall((f"POST /v2/models/{model}/infer HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n"
                      f"Inference-Header-Content-Length: {json_length}\r\n\r\n").encode() + body)
        status, _, answer = read_response(sock)
    return status, answer


def test_a_large_tensor_the_model_refuses_gets_the_admission_answer_before_any_decode(server):
    elements = b"\x04\x00\x00\x00abcd" * N_BYTES
    # BYTES for an FP32 input: Triton's datatype answer, the tritonclient way
    client = httpclient.InferenceServerClient(server.http_url)
    try:
        item = httpclient.InferInput("INPUT0", [N_BYTES], "BYTES")
        item.set_data_from_numpy(np.array([b"abcd"] * N_BYTES, dtype=object), binary_data=True)
        with pytest.raises(InferenceServerException) as e:
            client.infer("identity_fp32", [item])
        assert e.value.status() == "400"
        assert e.value.message() == ("inference input 'INPUT0' data-type is 'BYTES', but model 'identity_fp32' "
                                     "expects 'FP32'")
    finally:
        client.close()
    # the same with its last element cut short: still the datatype answer, so no element was read
    status, answer = post(server, "identity_fp32", *bytes_body([N_BYTES], elements[:-1]))
    assert status == 400 and "data-type is 'BYTES'" in json.loads(answer)["error"], answer
    # a BYTES model (bytes_echo: max_batch_size 8, dims [-1]) refuses a batch of N_BYTES, cut short or not
    for data in (elements, elements[:-1]):
        status, answer = post(server, "bytes_echo", *bytes_body([N_BYTES], data))
        assert status == 400, answer
        assert json.loads(answer)["error"] == "inference request batch-size must be <= 8 for 'bytes_echo'"
    # an unknown input
    header = json.dumps({"inputs": [{"name": "NOPE", "shape": [1, N_BYTES], "datatype": "BYTES",
                                     "parameters": {"binary_data_size": len(elements) - 1}}]}).encode()
    status, answer = post(server, "bytes_echo", header + elements[:-1], len(header))
    assert status == 400 and json.loads(answer)["error"] == "unexpected inference input 'NOPE' for model 'bytes_echo'"
    # what the model takes is decoded and answered: a BYTES model, and one cut short is refused
    # for its data
    status, answer = post(server, "bytes_echo", *bytes_body([1, N_BYTES], elements))
    assert status == 200, answer[:300]
    doc = json.loads(answer)
    assert doc["outputs"][0]["shape"] == [1, N_BYTES] and doc["outputs"][0]["data"][:2] == ["ABCD", "ABCD"]
    status, answer = post(server, "bytes_echo", *bytes_body([1, N_BYTES], elements[:-1]))
    assert status == 400 and "BYTES" in json.loads(answer)["error"], answer


def test_a_large_grpc_tensor_the_model_refuses_is_refused_before_any_decode():
    import tritonclient.grpc as grpcclient
    from tritonclient.grpc import service_pb2

    s = start_server("--allow-http=false", repo=EXAMPLE_REPOSITORY)
    try:
        with grpcclient.InferenceServerClient(s.grpc_url) as client:
            item = grpcclient.InferInput("INPUT0", [N_BYTES], "BYTES")
            item.set_data_from_numpy(np.array([b"abcd"] * N_BYTES, dtype=object))
            with pytest.raises(InferenceServerException) as e:
                client.infer("identity_fp32", [item])
            assert e.value.status() == "StatusCode.INVALID_ARGUMENT"
            assert e.value.message() == ("inference input 'INPUT0' data-type is 'BYTES', but model 'identity_fp32' "
                                         "expects 'FP32'")
            # BYTES contents cut short, for the FP32 model and for a BYTES model's refused batch:
            # the admission's answers, so no element was read
            for model, shape, expected in (
                ("identity_fp32", [N_BYTES], "data-type is 'BYTES'"),
                ("bytes_echo", [N_BYTES], "inference request batch-size must be <= 8 for 'bytes_echo'"),
            ):
                message = service_pb2.ModelInferRequest(model_name=model)
                message.inputs.add(name="INPUT0", datatype="BYTES", shape=shape)
                message.raw_input_contents.append(b"\x04\x00\x00\x00abcd" * N_BYTES + b"\x04")
                with pytest.raises(Exception) as raw:
                    client._client_stub.ModelInfer(message)
                assert expected in raw.value.details(), raw.value.details()
            # the BYTES model answers what it takes
            ok = grpcclient.InferInput("INPUT0", [1, N_BYTES], "BYTES")
            ok.set_data_from_numpy(np.array([[b"abcd"] * N_BYTES], dtype=object))
            result = client.infer("bytes_echo", [ok])
            assert result.as_numpy("OUTPUT0").shape == (1, N_BYTES) and result.as_numpy("OUTPUT0")[0, 0] == b"ABCD"
    finally:
        s.stop()
