"""The gRPC transport's unit tests once more, on the ``h2`` fallback engine (``--grpc-http2 h2``).

tests/unit/trident/test_grpc_transport.py runs on the default engine (trident's own HTTP/2);
here every one of its tests and fixtures is collected again with the transport's engine factory
forced to :class:`trident.grpc.h2_engine.H2LibEngine`.
"""

from __future__ import annotations

import pytest
from unit.trident.test_grpc_transport import *  # noqa: F403  (the same tests, collected here again)

from trident.grpc import h2_engine, transport


@pytest.fixture(autouse=True)
def _h2_fallback(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(transport, "make_engine", h2_engine.H2LibEngine)


def test_the_fallback_engine_is_in_use() -> None:
    assert transport.make_engine is h2_engine.H2LibEngine
