"""The gRPC transport's unit tests once more, on the ``h2`` fallback engine (``--grpc-http2 h2``).

tests/unit/trident/grpc/test_transport.py runs on the default engine (trident's own HTTP/2);
here every one of its tests and fixtures is collected again with the transport's engine factory
forced to :class:`trident.grpc.h2_engine.H2LibEngine`.
"""

from __future__ import annotations

import pytest
from unit.trident.grpc.test_transport import *  # noqa: F403  (the same tests, collected here again)

from trident.grpc import config, h2_engine, transport


@pytest.fixture(autouse=True)
def _h2_fallback(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(transport, "make_engine", h2_engine.H2LibEngine)


def test_the_fallback_engine_is_in_use() -> None:
    assert transport.make_engine is h2_engine.H2LibEngine


def test_grpc_http2_option_selects_the_engine() -> None:
    from trident.grpc.serve import transport_config
    from trident.options import ServerOptions
    from trident.protocol import http2

    assert transport_config(ServerOptions()).http2 == "trident"
    assert isinstance(h2_engine.make_engine(transport_config(ServerOptions())), http2.H2Server)
    fallback = transport_config(ServerOptions(grpc_http2="h2"))
    assert fallback.http2 == "h2" and isinstance(h2_engine.make_engine(fallback), h2_engine.H2LibEngine)
    with pytest.raises(ValueError, match="--grpc-http2"):
        transport_config(ServerOptions(grpc_http2="nghttp2"))
    with pytest.raises(ValueError, match="unknown HTTP/2 implementation"):
        h2_engine.make_engine(config.TransportConfig(http2="nghttp2"))


def test_cli_grpc_http2_flag() -> None:
    from trident.cli import build_parser

    parser = build_parser()
    assert parser.parse_args(["serve"]).grpc_http2 == "trident"
    assert parser.parse_args(["serve", "--grpc-http2", "h2"]).grpc_http2 == "h2"
    with pytest.raises(SystemExit):
        parser.parse_args(["serve", "--grpc-http2", "nghttp2"])
