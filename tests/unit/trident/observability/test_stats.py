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


def test_records_fold_into_the_counters_in_batches_and_at_a_snapshot():
    """Successes and executions are kept as records and folded (every 256 and at a snapshot):
    the totals are the same as counting each one."""
    from trident.observability.stats import _FOLD_EVERY, StatsRecorder

    s = StatsRecorder("m", "1")
    n = _FOLD_EVERY * 2 + 7
    for i in range(n):
        s.record_success(10 + i, 1, 2, 3, 4)
        s.record_execution(1 + i % 3, 5, 6, 7)
    assert len(s._successes) < _FOLD_EVERY and len(s._executions) < _FOLD_EVERY  # folded on the way
    snap = s.snapshot()
    assert (snap.success.count, snap.success.ns) == (n, sum(10 + i for i in range(n)))
    assert (snap.queue.count, snap.queue.ns, snap.compute_output.ns) == (n, n, 4 * n)
    assert snap.execution_count == n and snap.inference_count == sum(1 + i % 3 for i in range(n))
    assert {b.batch_size: b.compute_infer.count for b in snap.batch_stats} == {1: 173, 2: 173, 3: 173}
    assert snap.last_inference > 0
    assert s.snapshot() == snap  # folding twice adds nothing
