"""Model loads log their progress: where each load reads from, a cloud download's objects,
bytes and progress, and the time each load took (or its failure, with the reason).

Against the local S3 server (moto) the cloud repository tests use, and a local folder.
"""

from __future__ import annotations

import json
import os
import re

import httpx
import pytest
from e2e.conftest import start_server
from e2e.models import IDENTITY_PY, write_identity
from e2e.test_cloud_repository import AWS_ENV, IDENTITY, _moto, _s3, _stop

WEIGHTS = 3 << 20  # bytes of the model's data file: ~48 chunks of the S3 client's reads


@pytest.fixture(scope="module")
def bucket():
    proc, port = _moto()
    client = _s3(port)
    client.create_bucket(Bucket="models")
    client.put_object(Bucket="models", Key="repo/big/config.pbtxt", Body=IDENTITY.format(name="big").encode())
    client.put_object(Bucket="models", Key="repo/big/1/model.py", Body=IDENTITY_PY.encode())
    client.put_object(Bucket="models", Key="repo/big/1/weights.bin", Body=os.urandom(WEIGHTS))
    client.put_object(Bucket="models", Key="repo/broken/config.pbtxt",
                      Body=b'name: "broken"\nbackend: "no_such_backend"\n')
    client.put_object(Bucket="models", Key="repo/broken/1/model.py", Body=b"")
    yield port
    _stop(proc)


def test_cloud_and_local_loads_report_their_progress(bucket, tmp_path):
    local = tmp_path / "local"
    write_identity(local, "FP32", "nearby")
    url = f"s3://127.0.0.1:{bucket}/models/repo"
    server = start_server("--log-format=json", "--model-control-mode=explicit", "--load-model=big",
                          "--load-model=nearby", "--model-repository", str(local), repo=url,
                          env={**AWS_ENV, "TRIDENT_LOAD_PROGRESS_SECS": "0.000001"})
    try:
        # a load that fails: one line with the reason and the time it took
        r = httpx.post(f"http://{server.http_url}/v2/repository/models/broken/load", json={})
        assert r.status_code == 400 and "no_such_backend" in r.json()["error"]
        lines = [json.loads(x) for x in server.log().splitlines()]
    finally:
        server.stop()
    messages = [x["message"] for x in lines]

    def index(pattern: str) -> int:
        found = [i for i, m in enumerate(messages) if re.fullmatch(pattern, m)]
        assert len(found) == 1, (pattern, [m for m in messages if "big" in m or "broken" in m or "nearby" in m])
        return found[0]

    start = index(rf"loading 'big' from s3://127\.0\.0\.1:{bucket}/models/repo/big")
    listed = index(rf"downloading 'big' from s3://127\.0\.0\.1:{bucket}/models/repo/big: 3 object\(s\), 3\.0 MiB")
    progress = [i for i, m in enumerate(messages)
                if re.fullmatch(r"downloading 'big': \d+\.\d (KiB|MiB) of 3\.0 MiB \(\d{1,2}%\) in \d+\.\d s", m)]
    done = index(r"downloaded 'big': 3 object\(s\), 3\.0 MiB in \d+\.\d{3} s \(\d+\.\d (KiB|MiB|GiB)/s\)")
    loaded = index(r"successfully loaded 'big' version\(s\) \[1\] in \d+\.\d{3} s")
    assert progress and start < listed < progress[0] <= progress[-1] < done < loaded
    percents = [int(re.search(r"\((\d+)%\)", messages[i]).group(1)) for i in progress]
    assert percents == sorted(percents) and len(progress) <= WEIGHTS // (64 << 10) + 2  # one per chunk at most
    assert lines[start]["file"].startswith("repository.py:") and lines[listed]["file"].startswith("cloud_repository.py:")
    local_start = index(rf"loading 'nearby' from {re.escape(str(local / 'nearby'))}")
    assert local_start < index(r"successfully loaded 'nearby' version\(s\) \[1\] in \d+\.\d{3} s")
    index(rf"loading 'broken' from s3://127\.0\.0\.1:{bucket}/models/repo/broken")
    failed = index(r"load failed for model 'broken': .*no_such_backend.* \(after \d+\.\d{3} s\)")
    assert lines[failed]["level"] == "ERROR"
