"""trident.tritonserver.Options: Triton's options and what trident makes of each (served,
ignored with the reason ``trident serve`` gives for the same flag, or refused), and the requests'
fields that become the server's parameters."""

from __future__ import annotations

import pytest

import trident.tritonserver as tritonserver
from trident.cli import IGNORED_FLAGS
from trident.tritonserver._options import server_options
from trident.tritonserver._request import InferenceRequest


def test_options_map_to_trident_options() -> None:
    o = server_options(tritonserver.Options(
        model_repository="/m", server_id="s", model_control_mode=tritonserver.ModelControlMode.EXPLICIT,
        startup_models=["a"], strict_model_config=True, rate_limiter_mode=tritonserver.RateLimitMode.EXEC_COUNT,
        rate_limiter_resources=[tritonserver.RateLimiterResource("R", 2, 0)], cache_config={"local": {"size": 1024}},
        exit_timeout=7, log_verbose=1, log_format=tritonserver.LogFormat.ISO8601, metrics_interval=500,
        backend_configuration={"python": {"shm-default-byte-size": "1024"}},
        metrics_configuration={"summary": {"summary_latencies": "true"}}))
    assert o.model_repositories == ["/m"] and o.server_id == "s" and o.model_control_mode == "explicit"
    assert o.load_models == ["a"] and o.disable_auto_complete_config and o.rate_limit == "execution_count"
    assert o.rate_limit_resources == ["R:2:0"] and o.cache_config == ["local,size=1024"]
    assert o.exit_timeout_secs == 7.0 and o.log_format == "ISO8601" and o.metrics_interval_ms == 500.0
    # Triton cascades the levels: verbose means info, warnings and errors too
    assert o.log_verbose == 1 and o.log_info and o.log_warning and o.log_error
    assert o.backend_config == {"python": {"shm-default-byte-size": "1024"}}
    assert o.metrics_config == ["summary_latencies=true"]
    assert o.ignored_flags == [] and o.busy_poll_us == 0
    quiet = server_options(tritonserver.Options(model_repository=["/a", "/b"]))
    assert quiet.model_repositories == ["/a", "/b"] and not (quiet.log_info or quiet.log_warning or quiet.log_error)


def test_options_trident_ignores_are_recorded_with_the_reason() -> None:
    o = server_options(tritonserver.Options(model_repository="/m", pinned_memory_pool_size=0, model_namespacing=True,
                                            host_policies={"gpu0": {"numa-node": "0"}}))
    assert o.ignored_flags == [
        ("Options.pinned_memory_pool_size", "0", IGNORED_FLAGS["--pinned-memory-pool-byte-size"]),
        ("Options.model_namespacing", "True", IGNORED_FLAGS["--model-namespacing"]),
        ("Options.host_policies", "{'gpu0': {'numa-node': '0'}}", IGNORED_FLAGS["--host-policy"]),
    ]


@pytest.mark.parametrize("fields, error", [
    ({"model_repository": None}, tritonserver.InvalidArgumentError),
    ({"model_repository": []}, tritonserver.InvalidArgumentError),
    ({"model_repository": 1}, TypeError),
    ({"model_repository": "/m", "server_id": 1}, TypeError),
    ({"model_repository": "/m", "exit_timeout": -1}, tritonserver.InvalidArgumentError),
    ({"model_repository": "/m", "exit_timeout": True}, TypeError),
    ({"model_repository": "/m", "model_control_mode": 9}, tritonserver.InvalidArgumentError),
    ({"model_repository": "/m", "metrics": "yes"}, TypeError),
])
def test_bad_options(fields: dict, error: type[Exception]) -> None:
    with pytest.raises(error):
        server_options(tritonserver.Options(**fields))


class _Model:
    name = "m"
    version = 3


def test_request_fields_become_parameters() -> None:
    request = InferenceRequest(_Model(), request_id="r", flags=3, correlation_id="seq", priority=2, timeout=100,
                               inputs={"X": [1, 2]}, parameters={"p": 1.5})  # type: ignore[arg-type]
    core = request._core()
    assert core.model_name == "m" and core.model_version == "3" and core.id == "r"
    assert core.parameters == {"p": 1.5, "sequence_id": "seq", "sequence_start": True, "sequence_end": True,
                               "priority": 2, "timeout": 100}
    assert core.inputs[0].name == "X" and core.inputs[0].datatype == "INT64" and core.inputs[0].shape == (2,)
    for bad in ({"flags": 4}, {"priority": -1}, {"correlation_id": 1.5}, {"request_id": 5}, {"timeout": True},
                {"parameters": {"x": [1]}}, {"inputs": {1: [1]}}, {"inputs": [1]}):
        with pytest.raises(tritonserver.InvalidArgumentError):
            InferenceRequest(_Model(), **bad)._core()  # type: ignore[arg-type]


def test_the_package_names_tritons() -> None:
    for name in ("Server", "Options", "Model", "InferenceRequest", "InferenceResponse", "Tensor", "MemoryBuffer",
                 "DataType", "MemoryType", "ModelControlMode", "LogFormat", "RateLimitMode", "InstanceGroupKind",
                 "MetricFormat", "MetricKind", "ModelBatchFlag", "ModelTxnPropertyFlag", "DLDeviceType",
                 "RateLimiterResource", "Metric", "MetricFamily", "TritonError", "NotFoundError", "UnknownError",
                 "InternalError", "InvalidArgumentError", "UnavailableError", "AlreadyExistsError",
                 "UnsupportedError"):
        assert hasattr(tritonserver, name), name
    assert issubclass(tritonserver.NotFoundError, tritonserver.TritonError)
    assert tritonserver.DataType.BYTES == 13 and tritonserver.DataType.BF16 == 14
    assert tritonserver.ModelControlMode.EXPLICIT == 2 and tritonserver.MemoryType.GPU == 2
