"""The start-up notes of trident.startup: explicit model control open to code upload (its level
by listening address and the flags it names; the server's own line is checked end to end in
tests/e2e/test_security_flags.py), the send timeout hypercorn does not apply."""

from __future__ import annotations

import logging

import pytest

from trident.options import ServerOptions
from trident.startup import log_startup_notes


def _notes(caplog: pytest.LogCaptureFixture, **options: object) -> list[logging.LogRecord]:
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="trident.serve"):
        log_startup_notes(ServerOptions(**options))  # type: ignore[arg-type]
    return [r for r in caplog.records if "open to code upload" in r.getMessage()]


def test_all_interfaces_is_a_warning_and_loopback_is_info(caplog: pytest.LogCaptureFixture) -> None:
    [record] = _notes(caplog, model_control_mode="explicit")  # 0.0.0.0: tritonserver's default
    assert record.levelno == logging.WARNING and "on all interfaces" in record.getMessage()
    [record] = _notes(caplog, model_control_mode="explicit", http_address="127.0.0.1", grpc_address="127.0.0.1")
    assert record.levelno == logging.INFO and "on all interfaces" not in record.getMessage()
    assert "--http-restricted-api=model-repository:" in record.getMessage()
    assert "--grpc-restricted-protocol=model-repository:" in record.getMessage()


def test_only_open_front_ends_are_named(caplog: pytest.LogCaptureFixture) -> None:
    [record] = _notes(caplog, model_control_mode="explicit", allow_grpc=False)
    assert "--grpc-restricted-protocol" not in record.getMessage()
    assert _notes(caplog, model_control_mode="explicit", allow_grpc=False,
                  http_restricted_api=["model-repository:k=v"]) == []
    # a restriction of other APIs leaves the load API open
    [record] = _notes(caplog, model_control_mode="explicit", allow_grpc=False, http_restricted_api=["statistics:k=v"])
    assert "--http-restricted-api=model-repository:" in record.getMessage()


@pytest.mark.parametrize("mode", ["none", "poll"])
def test_no_note_without_the_load_api(caplog: pytest.LogCaptureFixture, mode: str) -> None:
    assert _notes(caplog, model_control_mode=mode) == []


def test_hypercorn_says_it_does_not_apply_the_send_timeout(caplog: pytest.LogCaptureFixture) -> None:
    def notes(**options: object) -> list[str]:
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="trident.serve"):
            log_startup_notes(ServerOptions(**options))  # type: ignore[arg-type]
        return [r.getMessage() for r in caplog.records if "--http-send-timeout-secs" in r.getMessage()]

    assert notes(http_server="hypercorn") == [
        "--http-send-timeout-secs=60 is not applied with --http-server hypercorn: an HTTP client that never reads "
        "keeps its connection (--http-server trident applies it)"]
    assert notes(http_server="hypercorn", http_send_timeout_secs=0) == []
    assert notes() == []  # trident's layer applies it
