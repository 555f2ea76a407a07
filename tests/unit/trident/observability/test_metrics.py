from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.parser import text_string_to_metric_families

from trident.observability.metrics import exposition


class Fixed:
    def collect(self):
        c = CounterMetricFamily("nv_inference_request_success", "ok", labels=["model", "version"])
        c.add_metric(["m", "1"], 3)
        g = GaugeMetricFamily("nv_inference_pending_request_count", "pending", labels=["model", "version"])
        g.add_metric(["m", "1"], 2)
        yield c
        yield g


def test_counters_keep_tritons_bare_names():
    reg = CollectorRegistry(auto_describe=False)
    reg.register(Fixed())
    text = exposition(reg).decode()
    assert "# TYPE nv_inference_request_success counter\n" in text
    assert 'nv_inference_request_success{model="m",version="1"} 3.0\n' in text
    assert "_total" not in text
    families = {f.name: f for f in text_string_to_metric_families(text)}
    assert families["nv_inference_pending_request_count"].samples[0].value == 2
    assert families["nv_inference_request_success"].type == "counter"
