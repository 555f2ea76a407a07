"""Custom metric families (trident.backends.metrics) and their Prometheus text."""

from __future__ import annotations

import gc

import pytest
from prometheus_client.parser import text_string_to_metric_families

from trident.backends.metrics import COUNTER, GAUGE, HISTOGRAM, CustomMetrics, MetricError, custom_metrics_for
from trident.backends.python import pb_utils


def test_counter_gauge_histogram_render_with_exact_names() -> None:
    m = CustomMetrics()
    c = m.acquire_family("my_requests", "Requests", COUNTER)
    g = m.acquire_family("my_temperature", "Degrees", GAUGE)
    h = m.acquire_family("my_latency", "Latency", HISTOGRAM)
    c.acquire_series({"model": "a"}).increment(2)
    c.acquire_series({"model": "b"}).increment(0.5)
    gauge = g.acquire_series(None)
    gauge.set(-3)
    gauge.increment(1)
    hist = h.acquire_series({"model": "a"}, [0.1, 1.0])
    for v in (0.05, 0.5, 5):
        hist.observe(v)
    text = m.render().decode()
    assert "# TYPE my_requests counter\n" in text  # no _total suffix
    assert 'my_requests{model="a"} 2\n' in text and 'my_requests{model="b"} 0.5\n' in text
    assert "my_temperature -2\n" in text
    assert 'my_latency_bucket{model="a",le="0.1"} 1\n' in text
    assert 'my_latency_bucket{model="a",le="1"} 2\n' in text
    assert 'my_latency_bucket{model="a",le="+Inf"} 3\n' in text
    assert 'my_latency_count{model="a"} 3\n' in text and 'my_latency_sum{model="a"} 5.55\n' in text
    parsed = {f.name: f for f in text_string_to_metric_families(text)}  # valid exposition format
    assert parsed["my_latency"].type == "histogram" and parsed["my_temperature"].type == "gauge"


def test_kind_rules() -> None:
    m = CustomMetrics()
    counter = m.acquire_family("c", "", COUNTER).acquire_series({})
    with pytest.raises(MetricError, match="negative"):
        counter.increment(-1)
    with pytest.raises(MetricError, match="only supported for a gauge"):
        counter.set(1)
    with pytest.raises(MetricError, match="only supported for a histogram"):
        counter.observe(1)
    hist_family = m.acquire_family("h", "", HISTOGRAM)
    with pytest.raises(MetricError, match="needs buckets"):
        hist_family.acquire_series({})
    with pytest.raises(MetricError, match="strictly increasing"):
        hist_family.acquire_series({}, [1, 1])
    hist = hist_family.acquire_series({}, [1])
    with pytest.raises(MetricError, match="not supported for a histogram"):
        hist.get()
    with pytest.raises(MetricError, match="not supported for a histogram"):
        hist.increment(1)
    with pytest.raises(MetricError, match="already exists as a counter"):
        m.acquire_family("c", "", GAUGE)
    with pytest.raises(MetricError, match="invalid metric name"):
        m.acquire_family("1bad", "", GAUGE)
    with pytest.raises(MetricError, match="unknown metric kind"):
        m.acquire_family("ok", "", 7)
    with pytest.raises(MetricError, match="buckets are only allowed"):
        m.acquire_family("g", "", GAUGE).acquire_series({}, [1.0])
    with pytest.raises(MetricError, match="labels must be"):
        m.acquire_family("g", "", GAUGE).acquire_series({"a": 1})  # type: ignore[dict-item]


def test_reference_counting_shares_and_removes_series() -> None:
    m = CustomMetrics()
    f1 = m.acquire_family("shared", "d", COUNTER)
    f2 = m.acquire_family("shared", "d", COUNTER)
    assert f1 is f2
    s1 = f1.acquire_series({"k": "v"})
    s2 = f2.acquire_series({"k": "v"})
    assert s1 is s2
    s1.increment(1)
    f1.release_series(s1)
    assert b'shared{k="v"} 1' in m.render()
    f2.release_series(s2)
    assert m.render() == b""  # a family without series is not printed
    m.release_family(f1)
    m.release_family(f2)
    assert "shared" not in m.families


def test_pb_utils_metric_objects_release_on_garbage_collection() -> None:
    registry = custom_metrics_for(None)  # models outside a server use the process-wide registry
    family = pb_utils.MetricFamily("pb_gc_test", "gc", pb_utils.MetricFamily.GAUGE)
    metric = family.Metric(labels={"x": "1"})
    metric.set(4)
    metric.increment(1.5)
    assert metric.value() == 5.5
    with pytest.raises(pb_utils.TritonModelException, match="only supported for a histogram"):
        metric.observe(1)
    with pytest.raises(pb_utils.TritonModelException, match="already exists as a gauge"):
        pb_utils.MetricFamily("pb_gc_test", "gc", pb_utils.MetricFamily.COUNTER)
    assert b'pb_gc_test{x="1"} 5.5' in registry.render()
    del metric
    gc.collect()
    assert b"pb_gc_test" not in registry.render()
    del family
    gc.collect()
    assert "pb_gc_test" not in registry.families


def test_registries_are_per_server() -> None:
    class Owner:  # registries are keyed by the server object's identity
        pass

    a, b = Owner(), Owner()
    assert custom_metrics_for(a) is custom_metrics_for(a)
    assert custom_metrics_for(a) is not custom_metrics_for(b)
    assert custom_metrics_for(None) is custom_metrics_for(None)
