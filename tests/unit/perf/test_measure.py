"""trident.perf.measure, options and report: windows, percentiles, stability, server deltas,
flag parsing and the CSV layout."""

from __future__ import annotations

import argparse

import numpy as np
import pytest

from trident.perf.measure import ServerStats, is_stable, merge, server_stats_from_json, summarize
from trident.perf.options import PerfOptions, add_perf_arguments, parse_range, perf_options
from trident.perf.report import CSV_COLUMNS, Result, csv_text, level_text
from trident.perf.sweep import load_levels
from trident.perf.wire import PerfError


def records(latencies_us, ok=None):
    n = len(latencies_us)
    start = np.arange(n, dtype=np.int64) * 1_000_000
    lat = np.asarray(latencies_us, np.int64) * 1000
    out = np.stack([start, start + 10_000, start + lat - 5_000, start + lat, np.ones(n, np.int64)], axis=1)
    if ok is not None:
        out[:, 4] = ok
    return out


def test_summary_figures():
    s = summarize(records(range(1, 101)), duration_s=2.0, batch=4, client_cpu_s=0.5)
    assert s.count == 100 and s.throughput == 200.0 and s.client_cpu_pct == 25.0
    assert s.percentile_us(50) == 51.0 and s.percentile_us(99) == 100.0
    assert s.avg_us == pytest.approx(50.5)
    assert s.send_ns == 10_000 and s.recv_ns == 5_000


def test_failed_requests_are_counted_apart():
    s = summarize(records([10, 20, 30], ok=[1, 0, 1]), 1.0, 1)
    assert (s.count, s.failed) == (2, 1) and s.avg_us == 20.0


def test_stability_needs_three_close_windows():
    w = [summarize(records([100] * 100), 1.0, 1) for _ in range(2)]
    assert not is_stable(w, 10, None)
    w.append(summarize(records([105] * 100), 1.0, 1))
    assert is_stable(w, 10, None)
    assert not is_stable(w, 1, None)  # 5% apart
    w.append(summarize(records([100] * 50), 1.0, 1))  # throughput halves
    assert not is_stable(w, 10, None)
    p = [summarize(records([100] * 98 + [1000, 1000]), 1.0, 1) for _ in range(3)]
    assert is_stable(p, 10, 99) and p[0].latency_us(99) == 1000.0


def test_merge_keeps_all_latencies_and_sums_server_stats():
    a = summarize(records([10] * 10), 1.0, 1)
    b = summarize(records([30] * 30), 1.0, 1)
    a.server, b.server = ServerStats(success_count=10, queue_ns=1000), ServerStats(success_count=30, queue_ns=3000)
    m = merge([a, b])
    assert m.count == 40 and m.throughput == 20.0 and m.avg_us == 25.0
    assert m.server == ServerStats(success_count=40, queue_ns=4000)


def test_server_stats_delta_from_the_statistics_extension():
    def doc(n):
        d = lambda c, ns: {"count": c, "ns": ns}  # noqa: E731
        return {"model_stats": [{"name": "m", "version": "1", "inference_count": n, "execution_count": n,
                                 "inference_stats": {"success": d(n, 100 * n), "fail": d(0, 0), "queue": d(n, 10 * n),
                                                     "compute_input": d(n, 5 * n), "compute_infer": d(n, 60 * n),
                                                     "compute_output": d(n, 5 * n)}}]}
    delta = server_stats_from_json(doc(30), "") - server_stats_from_json(doc(10), "")
    us = delta.per_request_us()
    assert delta.success_count == 20
    assert us["request"] == pytest.approx(0.1) and us["queue"] == pytest.approx(0.01)
    assert us["overhead"] == pytest.approx(0.02)
    assert server_stats_from_json(doc(5), "2") == ServerStats()


def parse(*argv):
    p = argparse.ArgumentParser()
    add_perf_arguments(p)
    return perf_options(p.parse_args(["-m", "m", *argv]))


def test_flags_and_defaults():
    o = parse()
    assert (o.url, o.protocol, o.measurement_interval_ms, o.stability_pct, o.max_trials) == \
        ("localhost:8000", "http", 5000, 10.0, 10)
    assert o.concurrency == (1.0, 1.0, 1.0)
    o = parse("-i", "grpc", "--concurrency-range", "2:8:3", "-p", "100", "-s", "5", "-r", "4", "-l", "7",
              "--percentile", "95", "-z", "-b", "2", "--shape", "X:1,2", "-a")
    assert o.url == "localhost:8001" and list(load_levels(o)) == [2.0, 5.0, 8.0]
    assert (o.latency_threshold_ms, o.percentile, o.input_data, o.batch_size, o.async_mode) == (7, 95, "zero", 2, True)
    o = parse("--request-rate-range", "10:30:10", "--request-distribution", "poisson")
    assert list(load_levels(o)) == [10.0, 20.0, 30.0] and o.distribution == "poisson"


@pytest.mark.parametrize("argv, message", [
    (["--binary-search"], "UNSUPPORTED: --binary-search"),
    (["--sequence-length", "4"], "UNSUPPORTED: --sequence-length"),
    (["--streaming"], "needs -i grpc"),
    (["--concurrency-range", "0:4"], "start and step must be positive"),
    (["--concurrency-range", "a"], "integers"),
    (["--concurrency-range", "8:2"], "end at least start"),
    (["--concurrency-range", "1", "--request-rate-range", "5"], "can not be combined"),
    (["--concurrency-range", "1000000"], "at most"),
    (["-p", "0"], "--measurement-interval"),
    (["--percentile", "100"], "--percentile"),
    (["--workers", "1000"], "--workers"),
])
def test_bad_flags(argv, message):
    with pytest.raises(PerfError, match=message.replace("(", r"\(")):
        parse(*argv)


def test_parse_range_defaults():
    assert parse_range("4", "x", integer=True) == (4.0, 4.0, 1.0)
    assert parse_range("0.5:2:0.5", "x", integer=False) == (0.5, 2.0, 0.5)


def test_csv_has_perf_analyzers_columns():
    s = summarize(records([100, 200, 300, 400]), 1.0, 1)
    s.server = ServerStats(success_count=4, success_ns=400_000, queue_ns=40_000, compute_infer_ns=200_000)
    o = PerfOptions(concurrency=(1, 1, 1))
    text = csv_text(o, [Result(1, s, True)])
    header, row = text.strip().split("\n")
    assert header.split(",") == ["Concurrency", *CSV_COLUMNS]
    cells = dict(zip(header.split(","), row.split(","), strict=True))
    assert cells["Concurrency"] == "1" and cells["Inferences/Second"] == "4.00"
    assert cells["Server Queue"] == "10" and cells["Server Compute Infer"] == "50"
    assert cells["p50 latency"] == "300" and cells["Avg latency"] == "250"
    o = PerfOptions(request_rate=(5, 5, 1), collect_metrics=True)
    header = csv_text(o, [Result(5, s, True)]).split("\n")[0].split(",")
    assert header[0] == "Request Rate" and header[-4:] == ["Avg GPU Utilization", "Avg GPU Power Usage",
                                                           "Max GPU Memory Usage", "Total GPU Memory"]


def test_level_text_reads_like_perf_analyzer():
    s = summarize(records([100] * 10), 1.0, 1)
    s.server = ServerStats(inference_count=10, execution_count=10, success_count=10, success_ns=500_000)
    text = level_text(PerfOptions(concurrency=(1, 1, 1)), Result(1, s, False))
    assert text.startswith("Request concurrency: 1\n  WARNING: no stable measurement")
    for line in ("    Throughput: 10.0 infer/sec", "    p99 latency: 100 usec", "    Successful request count: 10",
                 "    Avg request latency: 50 usec (overhead 50 usec + queue 0 usec"):
        assert line in text
