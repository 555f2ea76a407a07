"""trident.perf.analyze's decisions: the candidate configs, the Pareto front, the choice."""

from __future__ import annotations

import pytest

from trident.perf.analyze import MAX_CANDIDATES, Point, candidates, choose, pareto_front
from trident.perf.wire import PerfError

BATCHING = {"name": "m", "backend": "python", "max_batch_size": 8, "dynamic_batching": {},
            "instance_group": [{"kind": "KIND_CPU", "count": 1}]}
PLAIN = {"name": "p", "backend": "python", "max_batch_size": 0}
ONNX = {"name": "o", "backend": "onnxruntime", "max_batch_size": 4}


def test_candidates_of_a_batching_model():
    c = candidates(BATCHING, [1, 2], [4, 8], [True, False], [0, 100], [(), (4,)], [0])
    names = [x.name for x in c]
    assert len(names) == len(set(names)) == 2 * 2 * (2 * 2 + 1)
    on = next(x for x in c if x.name == "instances=2,max_batch=4,dynamic(delay=100us,preferred=[4])")
    assert on.config["instance_group"][0]["count"] == 2 and on.config["max_batch_size"] == 4
    assert on.config["dynamic_batching"] == {"max_queue_delay_microseconds": 100, "preferred_batch_size": [4]}
    off = next(x for x in c if x.name == "instances=1,max_batch=8,no-dynamic")
    assert "dynamic_batching" not in off.config
    assert BATCHING["instance_group"][0]["count"] == 1  # the base is not changed


def test_candidates_of_a_model_without_batching_and_threads():
    c = candidates(PLAIN, [1, 3], [8], [True, False], [0, 50], [()], [1, 2])
    assert [x.name for x in c] == ["instances=1", "instances=3"]  # no batching, no threads (python backend)
    assert c[1].config["instance_group"] == [{"kind": "KIND_CPU", "count": 3}]
    o = candidates(ONNX, [1], [4], [False], [0], [()], [1, 2])
    assert [x.config["parameters"]["intra_op_thread_count"] for x in o] == [{"string_value": "1"},
                                                                             {"string_value": "2"}]


def test_sweep_is_bounded():
    with pytest.raises(PerfError, match=str(MAX_CANDIDATES)):
        candidates(BATCHING, list(range(1, 40)), [1, 2, 4, 8], [True], [0, 1], [()], [0])


def pt(name, tput, p99):
    return Point(name, 1, tput, p99 / 2, p99, p99 / 2)


def test_pareto_front_and_choice():
    points = [pt("a", 100, 1000), pt("b", 200, 3000), pt("c", 150, 4000), pt("d", 300, 9000), pt("e", 90, 900)]
    assert [p.candidate for p in pareto_front(points)] == ["e", "a", "b", "d"]
    assert choose(points, 5.0).candidate == "b"  # type: ignore[union-attr]
    assert choose(points, None).candidate == "d"  # type: ignore[union-attr]
    assert choose(points, 0.5) is None
