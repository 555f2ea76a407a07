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


# every flag of tritonserver 2.51's --help (read off the real binary), with a value it accepts
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
    "--min-supported-compute-capability": "6.0", "--model-config-name": "", "--model-control-mode": "explicit",
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
    assert not ignored & {"--http-port", "--trace-rate", "--response-cache-byte-size", "--grpc-keepalive-time"}
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
