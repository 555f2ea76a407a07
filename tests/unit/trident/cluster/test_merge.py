"""One server's statistics and metrics from N workers'."""

from __future__ import annotations

from trident.cluster.merge import merge_expositions, merge_statistics, stats_from_wire, stats_to_wire
from trident.types import BatchStats, Duration, ModelStatistics


def _stats(name="m", n=1, batch=1, last=5) -> ModelStatistics:
    d = Duration(n, 100 * n)
    return ModelStatistics(name=name, version="1", last_inference=last, inference_count=n * batch,
                           execution_count=n, success=d, fail=Duration(1, 7), queue=d, compute_input=d,
                           compute_infer=d, compute_output=d, cache_hit=Duration(), cache_miss=Duration(),
                           batch_stats=(BatchStats(batch, d, d, d),), cancelled=1,
                           failures=(("REJECTED", 0), ("CANCELED", 1), ("BACKEND", 0), ("OTHER", 0)))


def test_statistics_round_trip_the_wire():
    s = _stats()
    assert stats_from_wire(stats_to_wire(s)) == s


def test_statistics_are_summed_per_version_and_batch_size():
    merged = merge_statistics([[_stats(n=2, batch=1, last=5), _stats("other")], [_stats(n=3, batch=4, last=9)]])
    assert [m.name for m in merged] == ["m", "other"]
    m = merged[0]
    assert m.success == Duration(5, 500) and m.fail == Duration(2, 14) and m.execution_count == 5
    assert m.inference_count == 2 + 12 and m.last_inference == 9 and m.cancelled == 2
    assert [b.batch_size for b in m.batch_stats] == [1, 4]
    assert dict(m.failures)["CANCELED"] == 2


W0 = '''# HELP nv_inference_request_success Number of successful inference requests
# TYPE nv_inference_request_success counter
nv_inference_request_success{model="m",version="1"} 3.0
# HELP nv_inference_pending_request_count pending
# TYPE nv_inference_pending_request_count gauge
nv_inference_pending_request_count{model="m",version="1"} 1.0
# HELP nv_model_load_duration_secs load
# TYPE nv_model_load_duration_secs gauge
nv_model_load_duration_secs{model="m",version="1"} 0.5
# HELP nv_inference_request_summary_us summary
# TYPE nv_inference_request_summary_us summary
nv_inference_request_summary_us{model="m",version="1",quantile="0.99"} 100.0
nv_inference_request_summary_us_count{model="m",version="1"} 3.0
nv_inference_request_summary_us_sum{model="m",version="1"} 200.0
# HELP nv_inference_first_response_histogram_ms first
# TYPE nv_inference_first_response_histogram_ms histogram
nv_inference_first_response_histogram_ms_bucket{model="m",version="1",le="10.0"} 2.0
nv_inference_first_response_histogram_ms_bucket{model="m",version="1",le="+Inf"} 3.0
nv_inference_first_response_histogram_ms_count{model="m",version="1"} 3.0
nv_inference_first_response_histogram_ms_sum{model="m",version="1"} 12.0
# HELP model_temperature a model's own gauge
# TYPE model_temperature gauge
model_temperature{sensor="a"} 40.0
'''


def test_metrics_merge_by_type_and_keep_tritons_names():
    w1 = (W0.replace("} 3.0", "} 4.0").replace("} 1.0\n", "} 2.0\n").replace("} 0.5", "} 0.9")
          .replace("} 100.0", "} 150.0").replace("} 40.0", "} 41.0"))
    text = merge_expositions([W0, w1])
    assert 'nv_inference_request_success{model="m",version="1"} 7.0' in text
    assert "_total" not in text  # Triton's bare counter names
    assert 'nv_inference_pending_request_count{model="m",version="1"} 3.0' in text  # summed
    assert 'nv_model_load_duration_secs{model="m",version="1"} 0.9' in text  # the largest
    assert 'quantile="0.99"} 150.0' in text  # the largest quantile
    assert 'nv_inference_request_summary_us_count{model="m",version="1"} 7.0' in text
    assert 'le="+Inf"} 7.0' in text and 'nv_inference_first_response_histogram_ms_sum{model="m",version="1"} 24.0' in text
    assert 'model_temperature{sensor="a",worker="0"} 40.0' in text  # a model's gauge: per worker
    assert 'model_temperature{sensor="a",worker="1"} 41.0' in text
    assert text.count("# TYPE nv_inference_request_success counter") == 1


def test_a_family_only_one_worker_has_is_kept():
    text = merge_expositions([W0, ""])
    assert 'nv_inference_request_success{model="m",version="1"} 3.0' in text
    assert merge_expositions([]) == ""
