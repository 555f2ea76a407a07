"""--trace-config mode=opentelemetry exports one span per traced request over OTLP/HTTP.

The collector is a small HTTP server in the test that records what the real OTLP exporter
(opentelemetry-exporter-otlp-proto-http) posts, decoded with opentelemetry-proto.
"""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from e2e.conftest import start_server
from e2e.models import write_identity
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest


class Collector(ThreadingHTTPServer):
    def __init__(self) -> None:
        self.requests: list[ExportTraceServiceRequest] = []
        self.paths: list[str] = []
        collector = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's naming
                body = self.rfile.read(int(self.headers["Content-Length"]))
                collector.paths.append(self.path)
                collector.requests.append(ExportTraceServiceRequest.FromString(body))
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                return None

        super().__init__(("127.0.0.1", 0), Handler)


def test_spans_reach_an_otlp_collector(tmp_path):
    collector = Collector()
    thread = threading.Thread(target=collector.serve_forever, daemon=True)
    thread.start()
    repo = tmp_path / "repo"
    write_identity(repo, "FP32", "ident")
    url = f"http://127.0.0.1:{collector.server_address[1]}/v1/traces"
    s = start_server("--trace-config=mode=opentelemetry", f"--trace-config=opentelemetry,url={url}",
                     "--trace-config=opentelemetry,resource=deployment=test",
                     "--trace-config=rate=1", "--trace-config=level=TIMESTAMPS", repo=repo)
    try:
        x = np.ones((1, 2), np.float32)
        h = httpclient.InferenceServerClient(s.http_url)
        inp = httpclient.InferInput("INPUT0", [1, 2], "FP32")
        inp.set_data_from_numpy(x)
        h.infer("ident", [inp], request_id="via-http")
        h.close()
        g = grpcclient.InferenceServerClient(s.grpc_url)
        ginp = grpcclient.InferInput("INPUT0", [1, 2], "FP32")
        ginp.set_data_from_numpy(x)
        g.infer("ident", [ginp], request_id="via-grpc")
        g.close()
    finally:
        assert s.stop() == 0  # shutdown flushes the batch span processor
        collector.shutdown()
    spans = [span for req in collector.requests for rs in req.resource_spans
             for ss in rs.scope_spans for span in ss.spans]
    assert collector.paths and set(collector.paths) == {"/v1/traces"}
    assert len(spans) == 2
    resource = {a.key: a.value.string_value for a in collector.requests[0].resource_spans[0].resource.attributes}
    assert resource["deployment"] == "test"
    by_request = {}
    for span in spans:
        attrs = {a.key: a.value for a in span.attributes}
        assert attrs["triton.model_name"].string_value == "ident"
        by_request[attrs["triton.request_id"].string_value] = span
        events = [e.name for e in span.events]
        assert events[0] == "REQUEST_START" and events[-1] == "REQUEST_END"
        assert "COMPUTE_START" in events and "COMPUTE_END" in events
        assert span.end_time_unix_nano >= span.start_time_unix_nano > 0
    assert set(by_request) == {"via-http", "via-grpc"}
