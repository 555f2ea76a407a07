"""Large gRPC messages against ``trident serve`` with tritonclient.grpc: a request message of
several MiB arrives in many DATA frames and is joined off the event loop
(trident.protocol.grpc_framing.Pieces), a gzip-compressed one is inflated in steps and joined
once; the answers are those of the same tensors sent small, and other clients are answered
meanwhile."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from e2e.conftest import RunningServer, start_server

from trident.options import EXAMPLE_REPOSITORY
from trident.protocol import grpc_framing

VALUES = (np.arange(3 * (1 << 20), dtype=np.float32) / 7)  # 12 MiB: past the decoder's JOIN_WHOLE


@pytest.fixture(scope="module")
def server() -> Iterator[RunningServer]:
    s = start_server("--allow-http=false", repo=EXAMPLE_REPOSITORY)
    yield s
    s.stop()


def infer(client: grpcclient.InferenceServerClient, values: np.ndarray, **kwargs) -> np.ndarray:
    item = grpcclient.InferInput("INPUT0", [values.size], "FP32")
    item.set_data_from_numpy(values)
    return client.infer("identity_fp32", [item], **kwargs).as_numpy("OUTPUT0")


@pytest.mark.parametrize("compression", [None, "gzip", "deflate"])
def test_a_large_message_gets_the_answer_of_its_tensor(server, compression):
    assert VALUES.nbytes > grpc_framing.JOIN_WHOLE
    others: list[np.ndarray] = []
    stop = threading.Event()

    def small_client() -> None:  # another client, answered while the large messages flow
        with grpcclient.InferenceServerClient(server.grpc_url) as other:
            while not stop.is_set():
                others.append(infer(other, VALUES[:16]))

    thread = threading.Thread(target=small_client)
    thread.start()
    try:
        with grpcclient.InferenceServerClient(server.grpc_url) as client:
            for _ in range(3):
                np.testing.assert_array_equal(infer(client, VALUES, compression_algorithm=compression), VALUES)
    finally:
        stop.set()
        thread.join(60)
    assert others and all(np.array_equal(o, VALUES[:16]) for o in others)
