"""Per-model metric families: --metrics-config, summaries, histogram, labels (metric_tags, gpu_uuid)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

from trident.batching.instances import instance_specs
from trident.config import config_from_json
from trident.observability.metrics import ModelStatsCollector, exposition, make_registry
from trident.observability.model_metrics import (
    DEFAULT_QUANTILES,
    LatencyObserver,
    MetricsConfig,
    first_response_buckets,
    model_gpu_uuid,
    model_labels,
    parse_metrics_config,
)
from trident.options import ServerOptions
from trident.server import open_server
from trident.types import InferenceRequest, Tensor


def test_parse_metrics_config_defaults_and_values():
    assert parse_metrics_config([]) == MetricsConfig()
    mc = parse_metrics_config(["summary_latencies=true", "histogram_latencies=1", "counter_latencies=false",
                               "summary_quantiles=0.5:0.05,0.99:0.001"])
    assert mc.summary_latencies and mc.histogram_latencies and not mc.counter_latencies
    assert mc.summary_quantiles == ((0.5, 0.05), (0.99, 0.001))
    assert MetricsConfig().summary_quantiles == DEFAULT_QUANTILES


@pytest.mark.parametrize("entry", ["summary_latencies", "nope=1", "summary_latencies=maybe",
                                   "summary_quantiles=x:1", "summary_quantiles=1.5:0.1"])
def test_parse_metrics_config_rejects(entry):
    with pytest.raises(ValueError):
        parse_metrics_config([entry])


def test_observer_quantiles_and_cumulative_histogram():
    obs = LatencyObserver(MetricsConfig(summary_latencies=True, histogram_latencies=True,
                                        summary_quantiles=((0.5, 0.05), (1.0, 0.0))), (1.0, 10.0))
    assert all(math.isnan(v) for _, v in obs.quantiles(0))
    for us in range(1, 101):
        obs.request(us * 1000, 0, 0, 0, 0)
    assert obs.counts[0] == 100 and obs.sums[0] == pytest.approx(5050)
    assert dict(obs.quantiles(0)) == {0.5: pytest.approx(50.5), 1.0: 100.0}
    for ms in (0.5, 2.0, 20.0):
        obs.first_response(int(ms * 1e6))
    assert obs.histogram() == [("1.0", 1.0), ("10.0", 2.0), ("+Inf", 3.0)]
    assert obs.first_count == 3 and obs.first_sum_ms == pytest.approx(22.5)


def test_observer_off_parts_record_nothing():
    obs = LatencyObserver(MetricsConfig(summary_latencies=False, histogram_latencies=True))
    obs.request(1000, 1, 1, 1, 1)
    assert obs.counts == [0] * 5


def test_first_response_buckets_from_model_metrics():
    config = config_from_json('{"name": "m", "model_metrics": {"metric_control": [{"metric_identifier": '
                              '{"family": "nv_inference_first_response_histogram_ms"}, '
                              '"histogram_options": {"buckets": [50, 1, 10]}}]}}')
    assert first_response_buckets(config) == (1.0, 10.0, 50.0)
    assert first_response_buckets(config_from_json('{"name": "m"}')) == (100.0, 500.0, 2000.0, 5000.0)


def test_gpu_uuid_label_from_instance_metadata():
    config = config_from_json('{"name": "m", "backend": "python", "instance_group": ['
                              '{"kind": "KIND_GPU", "count": 2, "gpus": [1]}, {"kind": "KIND_CPU", "count": 1}]}')
    specs = [(s.kind, s.device) for s in instance_specs(config)]
    uuids = {0: "GPU-aaa", 1: "GPU-bbb"}
    assert model_gpu_uuid(specs, uuids) == "GPU-bbb"
    assert model_gpu_uuid([("KIND_GPU", 0), ("KIND_GPU", 1)], uuids) == "GPU-aaa,GPU-bbb"
    assert model_gpu_uuid([("KIND_CPU", 0)], uuids) == ""
    assert model_gpu_uuid(specs, {}) == ""  # no NVML: no label
    assert model_labels("m", "1", {"team": "a"}, "GPU-bbb") == {"model": "m", "version": "1", "gpu_uuid": "GPU-bbb",
                                                                 "_team": "a"}
    assert model_labels("m", "2") == {"model": "m", "version": "2"}


def _add_sub_request() -> InferenceRequest:
    x = np.arange(16, dtype=np.float32).reshape(1, 16)
    return InferenceRequest(model_name="add_sub", inputs=[Tensor("INPUT0", "FP32", [1, 16], x),
                                                          Tensor("INPUT1", "FP32", [1, 16], x)])


async def test_collector_families_from_a_running_server():
    options = ServerOptions(metrics_config=["summary_latencies=true", "histogram_latencies=true"])
    async with open_server(options) as server:
        for _ in range(3):
            await server.infer(_add_sub_request())
        text = exposition(make_registry(server)).decode()
        families = {f.name: f for f in text_string_to_metric_families(text)}
        labels = {"model": "add_sub", "version": "1"}

        def sample(name: str, **extra: str) -> float:
            want = {**labels, **extra}
            return next(s.value for f in families.values() for s in f.samples
                        if s.name in (name, name + "_total") and s.labels == want)

        assert sample("nv_inference_request_success") == 3
        assert sample("nv_inference_request_failure", reason="CANCELED") == 0
        assert sample("nv_inference_count") == 3
        assert sample("nv_model_load_duration_secs") > 0
        assert sample("nv_inference_queue_summary_us_count") == 3
        assert sample("nv_inference_compute_infer_summary_us", quantile="0.99") > 0
        assert sample("nv_inference_first_response_histogram_ms_count") == 3
        assert families["nv_inference_request_summary_us"].type == "summary"
        assert families["nv_inference_first_response_histogram_ms"].type == "histogram"
        mv = server.repository.get("add_sub", "")
        mv_labels = ModelStatsCollector(server, {0: "GPU-x"}).labels_of(mv)
        assert mv_labels == labels  # KIND_CPU instances: no gpu_uuid
