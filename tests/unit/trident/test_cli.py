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


@pytest.mark.parametrize("argv", [["--bogus"], ["--http-port=abc"], ["--http-port=70000"], ["--allow-http=maybe"],
                                  ["--model-control-mode=sometimes"], ["--load-model=x"],
                                  ["--model-control-mode=explicit", "--load-model=*", "--load-model=y"],
                                  ["--backend-config=python"]])
def test_bad_input_is_one_line_error(argv):
    proc = subprocess.run([sys.executable, "-m", "trident", "serve", *argv], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("trident: error:")
