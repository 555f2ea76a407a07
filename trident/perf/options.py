"""``trident perf`` flags, with perf_analyzer's names, short forms and defaults, and
:class:`PerfOptions`, what the engine runs from.

perf_analyzer's flags that this tool does not implement are still recognised, so that giving
one is a one-line UNSUPPORTED error naming it rather than a parse error.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field

from trident.perf.wire import PerfError

__all__ = ["PerfOptions", "add_perf_arguments", "perf_options", "UNSUPPORTED_FLAGS", "parse_range"]

#: perf_analyzer flags recognised but not implemented here: flag -> takes a value
UNSUPPORTED_FLAGS: dict[str, bool] = {
    "--binary-search": False, "--request-intervals": True, "--sequence-length": True,
    "--sequence-length-variation": True, "--sequence-id-range": True, "--num-of-sequences": True,
    "--service-kind": True, "--model-signature-name": True, "--triton-server-directory": True,
    "--model-repository": True, "--grpc-compression-algorithm": True, "--ssl-grpc-use-ssl": False,
    "--ssl-https-verify-peer": True, "--bls-composing-models": True, "--periodic-concurrency-range": True,
    "--request-period": True, "--request-parameter": True, "--profile-export-file": True,
    "--trace-level": True, "--trace-rate": True, "--trace-count": True, "--log-frequency": True,
    "--serial-sequences": False, "--data-directory": True, "--session-concurrency": True,
}

#: most connections a request-rate run opens per worker process
MAX_CONNECTIONS = 1024
#: most worker processes
MAX_WORKERS = 64


@dataclass
class PerfOptions:
    model: str = ""
    version: str = ""
    url: str = ""
    protocol: str = "http"
    async_mode: bool = False
    streaming: bool = False
    batch_size: int = 1
    shapes: list[str] = field(default_factory=list)
    input_data: str = "random"
    string_length: int = 128
    string_data: str | None = None
    concurrency: tuple[float, float, float] | None = None
    request_rate: tuple[float, float, float] | None = None
    distribution: str = "constant"
    measurement_interval_ms: int = 5000
    measurement_mode: str = "time_windows"
    measurement_request_count: int = 50
    stability_pct: float = 10.0
    max_trials: int = 10
    percentile: float | None = None
    latency_threshold_ms: float = 0.0
    shared_memory: str = "none"
    output_shm_size: int = 102400
    csv_file: str = ""
    collect_metrics: bool = False
    metrics_url: str = ""
    metrics_interval_ms: int = 1000
    verbose: bool = False
    max_threads: int = 0
    workers: int = 0  # 0: auto
    in_process: str = ""
    timeout_s: float = 30.0
    warmup_request_count: int = 0
    json_file: str = ""


def parse_range(text: str, what: str, integer: bool) -> tuple[float, float, float]:
    """``start[:end[:step]]`` (end defaults to start, step to 1); raises :class:`PerfError`."""
    parts = text.split(":")
    if not 1 <= len(parts) <= 3:
        raise PerfError(f"{what} expects start:end:step, got '{text}'")
    try:
        values = [int(p) if integer else float(p) for p in parts]
    except ValueError:
        raise PerfError(f"{what} expects {'integers' if integer else 'numbers'}, got '{text}'") from None
    start = values[0]
    end = values[1] if len(values) > 1 else start
    step = values[2] if len(values) > 2 else 1
    if start <= 0 or step <= 0 or end < 0 or (end and end < start):
        raise PerfError(f"{what} '{text}': start and step must be positive and end at least start")
    return float(start), float(end), float(step)


def _int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid integer value '{text}'") from None


def add_perf_arguments(p: argparse.ArgumentParser) -> None:
    """perf_analyzer's flags (and trident's additions) on ``p``."""
    g = p.add_argument_group("Model and server")
    g.add_argument("-m", dest="model", required=True, help="model to measure")
    g.add_argument("-x", dest="version", default="", help="model version (default: the server's choice)")
    g.add_argument("-u", dest="url", default="", help="server URL (default localhost:8000 for HTTP, "
                   "localhost:8001 for gRPC)")
    g.add_argument("-i", dest="protocol", type=str.lower, choices=["http", "grpc"], default="http",
                   help="protocol")
    g.add_argument("--in-process", dest="in_process", default="", metavar="REPO",
                   help="serve REPO in this process with trident.open_server and call it without sockets")
    lg = p.add_argument_group("Load")
    lg.add_argument("-a", "--async", dest="async_mode", action="store_true", help="asynchronous requests")
    lg.add_argument("--sync", dest="async_mode", action="store_false", help="synchronous requests (default)")
    lg.add_argument("--streaming", action="store_true", help="gRPC ModelStreamInfer (decoupled models)")
    lg.add_argument("-b", dest="batch_size", type=_int, default=1, help="batch size")
    lg.add_argument("--concurrency-range", dest="concurrency", default=None, metavar="START:END:STEP",
                    help="concurrency levels (default 1)")
    lg.add_argument("-t", dest="legacy_concurrency", type=_int, default=None, help=argparse.SUPPRESS)
    lg.add_argument("--request-rate-range", dest="request_rate", default=None, metavar="START:END:STEP",
                    help="request rates (requests per second)")
    lg.add_argument("--request-distribution", dest="distribution", choices=["constant", "poisson"],
                    default="constant", help="arrival times in request-rate mode")
    lg.add_argument("--max-threads", dest="max_threads", type=_int, default=0,
                    help="request-rate mode: connections per worker at most (default 1024)")
    lg.add_argument("--workers", type=_int, default=0,
                    help="load-generator processes (default: 1, more while one saturates a core)")
    d = p.add_argument_group("Data")
    d.add_argument("--shape", dest="shapes", action="append", default=[], metavar="NAME:DIMS",
                   help="shape of a variable-size input, without the batch dimension (repeatable)")
    d.add_argument("--input-data", dest="input_data", default="random", help="random, zero, or a JSON file")
    d.add_argument("-z", dest="zero_input", action="store_true", help="zero input data (same as --input-data=zero)")
    d.add_argument("--string-length", dest="string_length", type=_int, default=128, help="random BYTES length")
    d.add_argument("--string-data", dest="string_data", default=None, help="BYTES input value")
    d.add_argument("--shared-memory", dest="shared_memory", choices=["none", "system", "cuda"], default="none",
                   help="pass inputs and outputs through shared memory")
    d.add_argument("--output-shared-memory-size", dest="output_shm_size", type=_int, default=102400,
                   help="bytes reserved per output in shared memory")
    m = p.add_argument_group("Measurement")
    m.add_argument("-p", "--measurement-interval", dest="measurement_interval_ms", type=_int, default=5000,
                   metavar="MS", help="time window length")
    m.add_argument("--measurement-mode", dest="measurement_mode", choices=["time_windows", "count_windows"],
                   default="time_windows", help="windows by time or by request count")
    m.add_argument("--measurement-request-count", dest="measurement_request_count", type=_int, default=50,
                   help="requests per window in count_windows mode")
    m.add_argument("-s", "--stability-percentage", dest="stability_pct", type=float, default=10.0,
                   help="largest spread (%%) of the last 3 windows' throughput and latency")
    m.add_argument("-r", "--max-trials", dest="max_trials", type=_int, default=10,
                   help="windows per load level before giving up on stability")
    m.add_argument("--percentile", type=_int, default=None, help="stabilize and report on this latency percentile")
    m.add_argument("-l", "--latency-threshold", dest="latency_threshold_ms", type=float, default=0.0, metavar="MS",
                   help="stop raising the load once latency exceeds this")
    m.add_argument("--warmup-request-count", dest="warmup_request_count", type=_int, default=0,
                   help="requests sent before measuring")
    m.add_argument("--timeout", dest="timeout_s", type=float, default=30.0,
                   help="seconds a window may wait for its requests before the run fails")
    o = p.add_argument_group("Output")
    o.add_argument("-f", dest="csv_file", default="", help="write the results as CSV")
    o.add_argument("--json-file", dest="json_file", default="", help="write the results as JSON (trident)")
    o.add_argument("--collect-metrics", dest="collect_metrics", action="store_true",
                   help="read the server's metrics endpoint during each window")
    o.add_argument("--metrics-url", dest="metrics_url", default="", help="default localhost:8002/metrics")
    o.add_argument("--metrics-interval", dest="metrics_interval_ms", type=_int, default=1000, metavar="MS",
                   help="how often metrics are read")
    o.add_argument("-v", "--verbose", action="store_true", help="more output")
    for flag, takes in UNSUPPORTED_FLAGS.items():
        dest = "unsupported__" + flag[2:].replace("-", "_")
        if takes:
            p.add_argument(flag, dest=dest, default=None, nargs="?", const=True, help=argparse.SUPPRESS)
        else:
            p.add_argument(flag, dest=dest, default=None, action="store_const", const=True, help=argparse.SUPPRESS)


def perf_options(args: argparse.Namespace) -> PerfOptions:
    """PerfOptions from parsed arguments; raises :class:`PerfError` for a bad or unsupported one."""
    for key, value in vars(args).items():
        if key.startswith("unsupported__") and value is not None:
            flag = "--" + key[len("unsupported__"):].replace("_", "-")
            raise PerfError(f"UNSUPPORTED: {flag} is not supported by trident perf")
    o = PerfOptions()
    for key in o.__dataclass_fields__:
        if key in ("concurrency", "request_rate", "shapes") or not hasattr(args, key):
            continue
        setattr(o, key, getattr(args, key))
    o.shapes = list(args.shapes)
    if args.zero_input:
        o.input_data = "zero"
    if args.concurrency and args.request_rate:
        raise PerfError("--concurrency-range and --request-rate-range can not be combined")
    if args.request_rate:
        o.request_rate = parse_range(args.request_rate, "--request-rate-range", integer=False)
    elif args.concurrency:
        o.concurrency = parse_range(args.concurrency, "--concurrency-range", integer=True)
    elif args.legacy_concurrency:
        o.concurrency = (float(args.legacy_concurrency),) * 2 + (1.0,)
    else:
        o.concurrency = (1.0, 1.0, 1.0)
    if not o.url:
        o.url = "localhost:8001" if o.protocol == "grpc" else "localhost:8000"
    if o.streaming and o.protocol != "grpc":
        raise PerfError("--streaming needs -i grpc")
    if o.measurement_interval_ms <= 0 or o.measurement_interval_ms > 3_600_000:
        raise PerfError("--measurement-interval must be between 1 and 3600000 ms")
    if o.measurement_request_count <= 0:
        raise PerfError("--measurement-request-count must be positive")
    if o.max_trials < 1 or o.max_trials > 1000:
        raise PerfError("--max-trials must be between 1 and 1000")
    if not 0 < o.stability_pct <= 1000:
        raise PerfError("--stability-percentage must be positive")
    if o.percentile is not None and not 1 <= o.percentile <= 99:
        raise PerfError("--percentile must be between 1 and 99")
    if o.workers < 0 or o.workers > MAX_WORKERS:
        raise PerfError(f"--workers must be between 0 (auto) and {MAX_WORKERS}")
    if o.concurrency and o.concurrency[1] > 100_000 or o.concurrency and o.concurrency[0] > 100_000:
        raise PerfError("--concurrency-range: at most 100000")
    if o.request_rate and max(o.request_rate[:2]) > 10_000_000:
        raise PerfError("--request-rate-range: at most 10000000 requests per second")
    if o.max_threads < 0 or o.max_threads > MAX_CONNECTIONS:
        raise PerfError(f"--max-threads must be between 1 and {MAX_CONNECTIONS}")
    if o.output_shm_size <= 0 or o.output_shm_size > 1 << 30:
        raise PerfError("--output-shared-memory-size must be between 1 byte and 1 GiB")
    if o.warmup_request_count < 0 or o.warmup_request_count > 1_000_000:
        raise PerfError("--warmup-request-count must be between 0 and 1000000")
    return o
