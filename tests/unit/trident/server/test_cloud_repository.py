"""A cloud download's progress lines (trident.server.cloud_repository)."""

from __future__ import annotations

import logging

from trident.server.cloud_repository import DownloadProgress, describe_size, progress_interval


def test_sizes_read_as_people_write_them():
    assert [describe_size(n) for n in (0, 1023, 1024, 3 << 20, 5 << 30, 1 << 45)] == [
        "0 bytes", "1023 bytes", "1.0 KiB", "3.0 MiB", "5.0 GiB", "32768.0 GiB"]


def test_progress_is_logged_at_most_every_interval(caplog):
    now = [100.0]
    progress = DownloadProgress("big", 1000, 5.0, clock=lambda: now[0])
    with caplog.at_level(logging.INFO, logger="trident.repository"):
        for _ in range(10):  # 100 bytes a second: one line every 5 s
            now[0] += 1.0
            progress.add(100)
        progress.add(0)
        progress.finished(2)
    messages = [r.getMessage() for r in caplog.records]
    assert messages == ["downloading 'big': 500 bytes of 1000 bytes (50%) in 5.0 s",
                        "downloaded 'big': 2 object(s), 1000 bytes in 10.000 s (100 bytes/s)"]
    assert progress.lines == 1 and progress.done == 1000


def test_a_callback_counts_what_the_store_reports_and_the_rest():
    progress = DownloadProgress("m", 300, 60.0)
    callback = progress.callback(200)
    callback.set_size(200)
    callback.relative_update(50)
    callback.absolute_update(120)
    assert progress.done == 120
    callback.rest()  # a store that reported less: the object's size counts once it is there
    assert progress.done == 200
    callback.rest()
    assert progress.done == 200


def test_the_interval_comes_from_the_environment(caplog):
    assert progress_interval({}) == 5.0
    assert progress_interval({"TRIDENT_LOAD_PROGRESS_SECS": "0.5"}) == 0.5
    with caplog.at_level(logging.WARNING, logger="trident.repository"):
        for bad in ("soon", "0", "-1", "inf", "nan"):
            assert progress_interval({"TRIDENT_LOAD_PROGRESS_SECS": bad}) == 5.0
    assert len(caplog.records) == 5 and "TRIDENT_LOAD_PROGRESS_SECS" in caplog.records[0].getMessage()
