import pytest

from trident.errors import TritonError
from trident.observability.trace import TraceSettings


def test_defaults_and_model_override_falls_back_to_global():
    t = TraceSettings()
    assert t.get()["trace_level"] == ["OFF"] and t.get()["trace_rate"] == "1000"
    t.update("", {"trace_rate": "10", "trace_level": ["TIMESTAMPS", "TENSORS"]})
    assert t.get("m")["trace_rate"] == "10"
    t.update("m", {"trace_rate": 5})
    assert t.get("m")["trace_rate"] == "5" and t.get()["trace_rate"] == "10"
    t.update("m", {"trace_rate": None})
    assert t.get("m")["trace_rate"] == "10"


@pytest.mark.parametrize("change", [{"trace_level": ["LOUD"]}, {"trace_rate": "x"}, {"trace_count": "-2"},
                                    {"nope": "1"}, {"trace_level": ["OFF", "TIMESTAMPS"]}, {"trace_rate": ["1", "2"]}])
def test_bad_settings(change):
    with pytest.raises(TritonError) as e:
        TraceSettings().update("", change)
    assert e.value.code.name == "INVALID_ARG"


def test_global_cannot_be_cleared():
    with pytest.raises(TritonError):
        TraceSettings().update("", {"trace_rate": None})
