import subprocess
import sys

import pytest

from trident.cli import build_parser, options_from_args
from trident.options import EXAMPLE_REPOSITORY


def parse(*argv):
    return options_from_args(build_parser().parse_args(["serve", *argv]))


def test_defaults_follow_tritonserver():
    o = parse()
    assert (o.http_port, o.grpc_port, o.metrics_port) == (8000, 8001, 8002)
    assert o.model_control_mode == "none" and o.repository_poll_secs == 15 and o.exit_timeout_secs == 30
    assert o.http_max_input_size == 64 * 1024 * 1024 and o.strict_readiness is True
    assert o.model_repositories == [str(EXAMPLE_REPOSITORY)]


def test_flags():
    o = parse("--model-repository=/a", "--model-repository", "/b", "--model-control-mode=explicit",
              "--load-model=x", "--load-model", "y", "--allow-grpc=false", "--strict-readiness", "0",
              "--log-verbose=2", "--backend-config=python,shm-default-byte-size=1024",
              "--backend-config=default-max-batch-size=16", "--strict-model-config=true")
    assert o.model_repositories == ["/a", "/b"] and o.load_models == ["x", "y"]
    assert o.allow_grpc is False and o.strict_readiness is False and o.log_verbose == 2
    assert o.backend_config["python"]["shm-default-byte-size"] == "1024"
    assert o.default_max_batch_size == 16 and o.disable_auto_complete_config is True


def test_busy_polling_is_on_by_default_and_bounded():
    assert parse().busy_poll_us == 100
    assert parse("--busy-poll-us=0").busy_poll_us == 0
    assert parse("--busy-poll-us", "10000").busy_poll_us == 10_000


@pytest.mark.parametrize("argv", [["--bogus"], ["--http-port=abc"], ["--http-port=70000"], ["--allow-http=maybe"],
                                  ["--model-control-mode=sometimes"], ["--load-model=x"],
                                  ["--model-control-mode=explicit", "--load-model=*", "--load-model=y"],
                                  ["--backend-config=python"], ["--busy-poll-us=-1"], ["--busy-poll-us=10001"],
                                  ["--busy-poll-us=0.5"]])
def test_bad_input_is_one_line_error(argv):
    proc = subprocess.run([sys.executable, "-m", "trident", "serve", *argv], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("trident: error:")


# Every flag of the current tritonserver's --help, with a value it accepts. Read from
# triton-inference-server/server src/command_line_parser.cc at commit 5fd6bc48 (2025, the newest
# copy that could be read: the 2.74 release itself could not), which is 2.51's --help (read off
# the real binary) plus --grpc-infer-thread-count and --grpc-max-response-pool-size; with
# --http-max-input-size and --allow-client-shm, which later tritonserver releases have and
# trident implements.
TRITONSERVER_FLAGS = {
    "--allow-cpu-metrics": "true", "--allow-gpu-metrics": "false", "--allow-grpc": "true", "--allow-http": "true",
    "--allow-metrics": "true", "--allow-sagemaker": "false", "--allow-vertex-ai": "false",
    "--backend-config": "python,shm-default-byte-size=16777216", "--backend-directory": "/opt/tritonserver/backends",
    "--buffer-manager-thread-count": "4", "--cache-config": "local,size=1048576",
    "--cache-directory": "/opt/tritonserver/caches", "--cuda-memory-pool-byte-size": "0:67108864",
    "--cuda-virtual-address-size": "0:1073741824", "--disable-auto-complete-config": None,
    "--enable-peer-access": "true", "--exit-on-error": "true", "--exit-timeout-secs": "30",
    "--grpc-address": "0.0.0.0", "--grpc-header-forward-pattern": "x-.*", "--grpc-http2-max-ping-strikes": "2",
    "--grpc-http2-max-pings-without-data": "2", "--grpc-http2-min-recv-ping-interval-without-data": "300000",
    "--grpc-infer-allocation-pool-size": "8", "--grpc-infer-response-compression-level": "none",
    "--grpc-infer-thread-count": "2", "--grpc-max-response-pool-size": "16",
    "--http-max-input-size": "67108864", "--allow-client-shm": "false",
    "--grpc-keepalive-permit-without-calls": "false", "--grpc-keepalive-time": "7200000",
    "--grpc-keepalive-timeout": "20000", "--grpc-max-connection-age": "0", "--grpc-max-connection-age-grace": "0",
    "--grpc-port": "8001", "--grpc-restricted-protocol": "model-repository:admin-key=secret",
    "--grpc-root-cert": "", "--grpc-server-cert": "", "--grpc-server-key": "", "--grpc-use-ssl": "false",
    "--grpc-use-ssl-mutual": "false", "--host-policy": "gpu0,numa-node=0", "--http-address": "0.0.0.0",
    "--http-header-forward-pattern": "x-.*", "--http-port": "8000",
    "--http-restricted-api": "model-repository:admin-key=secret", "--http-thread-count": "8", "--id": "triton",
    "--load-model": "add_sub", "--log-error": "true", "--log-file": "", "--log-format": "default",
    "--log-info": "true", "--log-verbose": "0", "--log-warning": "true", "--metrics-address": "0.0.0.0",
    "--metrics-config": "summary_latencies=true", "--metrics-interval-ms": "2000", "--metrics-port": "8002",
    "--min-supported-compute-capability": "6.0", "--model-config-name": "h100", "--model-control-mode": "explicit",
    "--model-load-gpu-limit": "0:0.5", "--model-load-retry-count": "0", "--model-load-thread-count": "4",
    "--model-namespacing": "false", "--model-repository": "/models", "--model-store": "/more-models",
    "--pinned-memory-pool-byte-size": "268435456", "--rate-limit": "off", "--rate-limit-resource": "R1:10",
    "--repoagent-directory": "/opt/tritonserver/repoagents", "--repository-poll-secs": "15",
    "--response-cache-byte-size": "1048576", "--reuse-grpc-port": "false", "--reuse-http-port": "false",
    "--sagemaker-port": "8080", "--sagemaker-safe-port-range": "8000-8002", "--sagemaker-thread-count": "8",
    "--strict-model-config": "false", "--strict-readiness": "true", "--trace-config": "rate=1000",
    "--trace-count": "-1", "--trace-file": "/tmp/trace.json", "--trace-level": "TIMESTAMPS",
    "--trace-log-frequency": "0", "--trace-rate": "1000", "--vertex-ai-default-model": "m",
    "--vertex-ai-port": "8080", "--vertex-ai-thread-count": "8",
}


def test_every_tritonserver_flag_is_accepted():
    argv = [flag if value is None else f"{flag}={value}" for flag, value in TRITONSERVER_FLAGS.items()]
    o = parse(*argv)
    assert o.model_repositories == ["/models", "/more-models"] and o.load_models == ["add_sub"]
    assert o.http_header_forward_pattern == "x-.*" and o.grpc_header_forward_pattern == "x-.*"
    ignored = {flag for flag, _, _ in o.ignored_flags}
    assert "--backend-directory" in ignored and "--pinned-memory-pool-byte-size" in ignored
    assert all(why for _, _, why in o.ignored_flags)
    assert not ignored & {"--http-port", "--trace-rate", "--response-cache-byte-size", "--grpc-keepalive-time",
                          "--grpc-max-connection-age", "--grpc-max-connection-age-grace"}
    assert {"--grpc-infer-thread-count", "--grpc-max-response-pool-size"} <= ignored
    # the deprecated ones become the settings that replaced them, before the explicit ones
    assert o.cache_config == ["local,size=1048576", "local,size=1048576"]
    assert o.trace_config == ["level=TIMESTAMPS", "rate=1000", "count=-1", "triton,file=/tmp/trace.json",
                              "triton,log-frequency=0", "rate=1000"]


def test_help_shows_tritonservers_groups_and_every_flag():
    import os

    proc = subprocess.run([sys.executable, "-m", "trident", "serve", "--help"], capture_output=True, text=True,
                          timeout=60, env={**os.environ, "COLUMNS": "400"})
    assert proc.returncode == 0
    for group in ("Server:", "Logging:", "Model Repository:", "HTTP:", "GRPC:", "Sagemaker:", "Vertex:", "Metrics:",
                  "Tracing:", "Backend:", "Repository Agent:", "Response Cache:", "Rate Limiter:",
                  "Memory/Device Management:", "DEPRECATED:"):
        assert f"\n{group}\n" in proc.stdout, group
    for flag in TRITONSERVER_FLAGS:
        assert flag in proc.stdout, flag
    assert "(default: 8000)" in proc.stdout and "ignored: backends are Python modules" in proc.stdout


def test_tritonserver_command_is_trident_serve():
    proc = subprocess.run([sys.executable, "-c", "import sys; from trident.cli import tritonserver_main; "
                           "sys.exit(tritonserver_main(['--http-port=abc']))"], capture_output=True, text=True,
                          timeout=60)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and lines[0].startswith("tritonserver: error:")
    assert "http-port" in lines[0]
    proc = subprocess.run([sys.executable, "-c", "import sys; from trident.cli import tritonserver_main; "
                           "sys.exit(tritonserver_main(['--help']))"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and proc.stdout.startswith("usage: tritonserver [-h]")
    assert "--pinned-memory-pool-byte-size" in proc.stdout


# ---- every value form tritonserver's --help documents ------------------------------------------

# (argv, what it sets): each accepted, as tritonserver accepts it
VALUE_FORMS = [
    # tritonserver reads these names in any case
    (["--model-control-mode=EXPLICIT"], lambda o: o.model_control_mode == "explicit"),
    (["--model-control-mode", "Poll"], lambda o: o.model_control_mode == "poll"),
    (["--model-control-mode=none"], lambda o: o.model_control_mode == "none"),
    (["--rate-limit=EXECUTION_COUNT"], lambda o: o.rate_limit == "execution_count"),
    (["--rate-limit=Off"], lambda o: o.rate_limit == "off"),
    (["--grpc-infer-response-compression-level=HIGH"], lambda o: o.grpc_infer_response_compression_level == "high"),
    (["--grpc-infer-response-compression-level=Medium"],
     lambda o: o.grpc_infer_response_compression_level == "medium"),
    (["--grpc-infer-response-compression-level=low"], lambda o: o.grpc_infer_response_compression_level == "low"),
    # tritonserver's --metrics-interval-ms is a float
    (["--metrics-interval-ms=0.5"], lambda o: o.metrics_interval_ms == 0.5),
    (["--metrics-interval-ms=2000"], lambda o: o.metrics_interval_ms == 2000),
    # --log-verbose: true/false in any case, or an integer level
    (["--log-verbose=true"], lambda o: o.log_verbose == 1),
    (["--log-verbose=FALSE"], lambda o: o.log_verbose == 0),
    (["--log-verbose=3"], lambda o: o.log_verbose == 3),
    (["--log-format=default"], lambda o: o.log_format == "default"),
    (["--log-format=ISO8601"], lambda o: o.log_format == "ISO8601"),
    # tritonserver clamps a negative exit timeout to 0
    (["--exit-timeout-secs=-1"], lambda o: o.exit_timeout_secs == 0),
    (["--grpc-max-connection-age=30000", "--grpc-max-connection-age-grace=5000"],
     lambda o: (o.grpc_max_connection_age, o.grpc_max_connection_age_grace) == (30000, 5000)),
    (["--rate-limit-resource=R1:10"], lambda o: o.rate_limit_resources == ["R1:10"]),
    (["--rate-limit-resource=R1:10:0"], lambda o: o.rate_limit_resources == ["R1:10:0"]),
    (["--backend-config=python,shm-default-byte-size=16777216"],
     lambda o: o.backend_config == {"python": {"shm-default-byte-size": "16777216"}} and not o.ignored_flags),
    (["--backend-config=default-max-batch-size=8"], lambda o: o.default_max_batch_size == 8 and not o.ignored_flags),
    (["--cache-config=local,size=1048576"], lambda o: o.cache_config == ["local,size=1048576"]),
    (["--metrics-config=summary_latencies=true", "--metrics-config=summary_quantiles=0.5:0.05,0.9:0.01",
      "--metrics-config=counter_latencies=false", "--metrics-config=histogram_latencies=true"],
     lambda o: len(o.metrics_config) == 4),
    (["--http-restricted-api=model-repository,model-config:admin-key=secret"],
     lambda o: o.http_restricted_api == ["model-repository,model-config:admin-key=secret"]),
    (["--grpc-restricted-protocol=shared-memory,statistics:admin-key=secret"],
     lambda o: o.grpc_restricted_protocol == ["shared-memory,statistics:admin-key=secret"]),
    # --trace-config: global settings, a mode (any case) and its settings; levels in any case
    (["--trace-config=rate=100", "--trace-config=count=-1", "--trace-config=level=timestamps",
      "--trace-config=level=Tensors"],
     lambda o: o.trace_config == ["rate=100", "count=-1", "level=TIMESTAMPS", "level=TENSORS"]),
    (["--trace-config=level=OFF"], lambda o: o.trace_config == ["level=OFF"]),
    (["--trace-config=level=true"], lambda o: o.trace_config == ["level=TIMESTAMPS"]),
    (["--trace-config=mode=Triton", "--trace-config=Triton,file=/tmp/trace.json",
      "--trace-config=TRITON,log-frequency=10"],
     lambda o: o.trace_config == ["mode=triton", "triton,file=/tmp/trace.json", "triton,log-frequency=10"]),
    (["--trace-config=mode=OpenTelemetry", "--trace-config=OpenTelemetry,url=http://127.0.0.1:4318/v1/traces",
      "--trace-config=opentelemetry,resource=service.name=trident"],
     lambda o: o.trace_config == ["mode=opentelemetry", "opentelemetry,url=http://127.0.0.1:4318/v1/traces",
                                  "opentelemetry,resource=service.name=trident"]),
    (["--trace-level=tensors", "--trace-level=timestamps"], lambda o: o.trace_config == ["level=TENSORS",
                                                                                           "level=TIMESTAMPS"]),
    (["--trace-level=MAX"], lambda o: o.trace_config == ["level=TIMESTAMPS"]),
    (["--model-control-mode=explicit", "--load-model=*"], lambda o: o.load_models == ["*"]),
    (["--model-load-retry-count=2", "--model-namespacing=true", "--buffer-manager-thread-count=0",
      "--pinned-memory-pool-byte-size=268435456", "--http-thread-count=8", "--grpc-infer-allocation-pool-size=8"],
     lambda o: len(o.ignored_flags) == 6),
    # ignored flags: each form tritonserver documents
    (["--host-policy=gpu0,numa-node=0", "--host-policy=gpu0,cpu-cores=0-3"], lambda o: len(o.ignored_flags) == 2),
    (["--model-load-gpu-limit=0:0.5"], lambda o: o.ignored_flags[0][:2] == ("--model-load-gpu-limit", "0:0.5")),
    (["--cuda-memory-pool-byte-size=0:67108864", "--cuda-virtual-address-size=1:1073741824"],
     lambda o: len(o.ignored_flags) == 2),
    (["--sagemaker-safe-port-range=8000-8002"], lambda o: len(o.ignored_flags) == 1),
    (["--min-supported-compute-capability=7.5"], lambda o: len(o.ignored_flags) == 1),
    (["--grpc-infer-thread-count=2", "--grpc-infer-thread-count=128", "--grpc-max-response-pool-size=1"],
     lambda o: len(o.ignored_flags) == 3),
]


@pytest.mark.parametrize(("argv", "sets"), VALUE_FORMS, ids=[" ".join(argv) for argv, _ in VALUE_FORMS])
def test_every_documented_value_form_is_accepted(argv, sets):
    assert sets(parse(*argv))


@pytest.mark.parametrize("value", ["true", "TRUE", "True", "on", "ON", "1", "false", "FALSE", "off", "Off", "0"])
@pytest.mark.parametrize("flag", ["--allow-http", "--strict-readiness", "--exit-on-error", "--log-info",
                                  "--grpc-keepalive-permit-without-calls", "--allow-metrics", "--enable-peer-access",
                                  "--model-namespacing", "--allow-sagemaker", "--allow-vertex-ai"])
def test_booleans_take_tritonservers_forms_in_any_case(flag, value):
    o = parse(f"{flag}={value}")
    expected = value.lower() in ("true", "on", "1")
    attr = flag[2:].replace("-", "_")
    if hasattr(o, attr):
        assert getattr(o, attr) is expected
    else:  # an ignored flag: accepted, logged with the value as given
        assert (flag, value) in [(f, v) for f, v, _ in o.ignored_flags]


# (argv, a word of the one-line error) for values tritonserver refuses too
REFUSED = [
    (["--grpc-max-connection-age=-1"], "--grpc-max-connection-age"),
    (["--grpc-max-connection-age=soon"], "--grpc-max-connection-age"),
    (["--grpc-max-connection-age-grace=-5"], "--grpc-max-connection-age-grace"),
    (["--grpc-max-connection-age-grace=later"], "--grpc-max-connection-age-grace"),
    (["--grpc-infer-thread-count=1"], "range 2 to 128"),
    (["--grpc-infer-thread-count=129"], "range 2 to 128"),
    (["--grpc-infer-thread-count=many"], "--grpc-infer-thread-count"),
    (["--grpc-max-response-pool-size=0"], "at least 1"),
    (["--host-policy=gpu0"], "<policy_name>,<setting>=<value>"),
    (["--sagemaker-safe-port-range=8000"], "<integer>-<integer>"),
    (["--model-load-gpu-limit=0:half"], "--model-load-gpu-limit"),
    (["--cuda-memory-pool-byte-size=64MB"], "--cuda-memory-pool-byte-size"),
    (["--min-supported-compute-capability=ampere"], "--min-supported-compute-capability"),
    (["--enable-peer-access=maybe"], "--enable-peer-access"),
    (["--log-verbose=loud"], "--log-verbose"),
    (["--metrics-interval-ms=-1"], "--metrics-interval-ms"),
    (["--metrics-interval-ms=often"], "--metrics-interval-ms"),
    (["--http-max-input-size=0"], "--http-max-input-size"),
    (["--model-control-mode=sometimes"], "--model-control-mode"),
    (["--grpc-infer-response-compression-level=max"], "--grpc-infer-response-compression-level"),
    (["--backend-config=,shm-default-byte-size=1"], "--backend-config"),
    (["--backend-config=python,shm-default-byte-size="], "--backend-config"),
    (["--backend-config=default-max-batch-size=many"], "default-max-batch-size"),
]


@pytest.mark.parametrize(("argv", "word"), REFUSED, ids=[" ".join(argv) for argv, _ in REFUSED])
def test_values_tritonserver_refuses_are_one_line_errors(argv, word):
    proc = subprocess.run([sys.executable, "-m", "trident", "serve", *argv], capture_output=True, text=True, timeout=60)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    assert lines[0].startswith("trident: error:") and word in lines[0]


def test_backend_config_settings_nothing_reads_are_logged_as_ignored():
    o = parse("--backend-config=python,shm-growth-byte-size=1048576", "--backend-config=python,execution-mode=process",
              "--backend-config=tensorflow,version=2", "--backend-config=onnxruntime,default-max-batch-size=8",
              "--backend-config=fil,default-max-batch-size=2", "--backend-config=stub-timeout-seconds=30",
              "--backend-config=default-max-batch-size=4")
    ignored = {value: why for flag, value, why in o.ignored_flags if flag == "--backend-config"}
    assert set(ignored) == {"python,shm-growth-byte-size=1048576", "tensorflow,version=2", "stub-timeout-seconds=30"}
    python = ignored["python,shm-growth-byte-size=1048576"]
    assert "python backend reads no setting 'shm-growth-byte-size'" in python and "shm-default-byte-size" in python
    assert "no 'tensorflow' backend" in ignored["tensorflow,version=2"] and "onnxruntime" in ignored["tensorflow,version=2"]
    assert "global setting 'stub-timeout-seconds'" in ignored["stub-timeout-seconds=30"]
    # what is read is kept as given
    assert o.backend_config["python"] == {"shm-growth-byte-size": "1048576", "execution-mode": "process"}
