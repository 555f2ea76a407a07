from trident.observability.stats import Duration, StatsRecorder
from trident.protocol import kserve


def test_recorder_snapshot_shapes():
    r = StatsRecorder("m", "1")
    r.record_execution(3, 10, 20, 30)
    r.record_execution(3, 1, 2, 3)
    r.record_execution(1, 5, 5, 5)
    r.record_success(100, 10, 1, 2, 3)
    r.record_failure(50)
    r.record_failure(70, cancelled=True)
    s = r.snapshot()
    assert s.inference_count == 7 and s.execution_count == 3
    assert s.success == Duration(1, 100) and s.fail == Duration(2, 120) and s.cancelled == 1
    assert [b.batch_size for b in s.batch_stats] == [1, 3]
    assert s.batch_stats[1].compute_infer == Duration(2, 22)
    j = kserve.statistics_entry_json(s)  # the HTTP statistics extension's shape
    assert j["name"] == "m" and j["version"] == "1"
    assert set(j["inference_stats"]) == {"success", "fail", "queue", "compute_input", "compute_infer",
                                         "compute_output", "cache_hit", "cache_miss"}
    assert j["inference_stats"]["queue"] == {"count": 1, "ns": 10}
    assert j["batch_stats"][0] == {"batch_size": 1, "compute_input": {"count": 1, "ns": 5},
                                   "compute_infer": {"count": 1, "ns": 5}, "compute_output": {"count": 1, "ns": 5}}
    assert j["last_inference"] > 0
