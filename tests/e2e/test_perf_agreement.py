"""``python -m trident.perf.agreement``'s parts that need neither wrk nor h2load: the paired
differences, the parsing of both tools' output, and the side-by-side run (perf's load generator
and another client against a real trident at the same time, perf counted over the other's run).

The side-by-side test uses Python's ``http.client`` as the "reference" tool: a real client on a
real server; the figures are not asserted beyond being measured and consistent.
"""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from tests.e2e.conftest import RunningServer, start_server
from trident.perf import agreement
from trident.perf.wire import Tensor, http_infer_request
from trident.perf.worker import WorkerSpec


def test_paired_differences_are_run_by_run_medians_with_quartiles():
    # perf 10% above in every pair, while the machine's speed halves from run to run
    refs = [1000.0, 500.0, 250.0, 125.0, 1000.0]
    ours = [r * 1.1 for r in refs]
    text = agreement._paired(ours)(refs)
    assert text.startswith("+10.0% (+10..+10)")
    # the difference of the medians would say +10% too, but not for skewed pairs
    assert agreement._paired([2.0, 1.0, 1.0])([1.0, 1.0, 1.0]) == "+0.0%"
    assert agreement._paired([1.0])([0.0]) == "n/a"


def test_reference_outputs_are_parsed(tmp_path: Path):
    assert agreement._wrk_result("WRK 5000 2000000 150\n", "") == (2500.0, 0.15)
    with pytest.raises(RuntimeError, match="boom"):
        agreement._wrk_result("", "boom")
    (tmp_path / "log").write_text("1\t200\t100\n2\t200\t300\n3\t200\t200\nnot a line\n")
    out = "requests: 3 total, 3 started, 3 done, 3 succeeded, 0 failed, 0 errored, 0 timeout\n"
    assert agreement._h2load_result(str(tmp_path), out, "", 1.5) == (2.0, 0.2)
    with pytest.raises(RuntimeError, match="refused"):
        agreement._h2load_result(str(tmp_path), "", "connect refused", 1.0)


@pytest.fixture(scope="module")
def server():
    s = start_server()
    yield s
    s.stop()


def test_side_by_side_counts_perf_over_the_other_clients_run(server: RunningServer, tmp_path: Path):
    host, port = server.http_url.rsplit(":", 1)
    x = np.arange(16, dtype=np.float32)
    request = http_infer_request(server.http_url, "identity_fp32", "", [Tensor("INPUT0", "FP32", (16,), x.tobytes())],
                                 ["OUTPUT0"])
    client = tmp_path / "client.py"
    head, _, body = request.partition(b"\r\n\r\n")
    headers = dict(line.split(": ", 1) for line in head.decode().split("\r\n")[1:])
    client.write_text(textwrap.dedent(f"""
        import http.client, sys, time
        conn = http.client.HTTPConnection({host!r}, {port})
        n, end = 0, time.monotonic() + float(sys.argv[1])
        while time.monotonic() < end:
            conn.request("POST", "/v2/models/identity_fp32/infer", body={body!r}, headers={headers!r})
            reply = conn.getresponse()
            reply.read()
            assert reply.status == 200, reply.status
            n += 1
        print("CLIENT", n)
    """))
    spec = WorkerSpec("http", host, int(port), (request,))
    rate, p50, cpu, out, err = agreement._side_by_side(spec, 2, [sys.executable, str(client), "1.0"], None, 1.0)
    assert err == "" and out.startswith("CLIENT ")
    assert int(out.split()[1]) > 10  # the other client was answered while perf ran
    assert rate > 10 and 0 < p50 < 1000 and cpu > 0
