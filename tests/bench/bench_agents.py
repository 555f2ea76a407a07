"""Load-time figures for issue 17 (repository agents, cloud repositories).

1. 20 Python models: start-up load from S3 (moto server on 127.0.0.1) against the same
   repository on local disk, same run (time from start until "model loading complete").
2. A ~100 MB ONNX model (MatMul 5000x5000 float32): load API time without agents, with
   checksum (MD5 / SHA-256), decrypt, convert (first load: conversion; second: cached IR),
   against onnxruntime / openvino without agents. Best of REPEAT loads.

Run: .venv/bin/python tests/bench/bench_agents.py   (from the repository root)
"""

from __future__ import annotations

import hashlib
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

ROOT = Path(__file__).resolve().parents[2] if "tests" in Path(__file__).parts else Path.cwd()
sys.path[:0] = [str(ROOT / "tests"), str(ROOT)]
from e2e.conftest import start_server  # noqa: E402
from e2e.models import IDENTITY_PY  # noqa: E402

from trident.agents.decrypt import encrypt_file  # noqa: E402

REPEAT = 3
IDENTITY = '''name: "{name}"
backend: "python"
max_batch_size: 0
input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] }} ]
'''
KEY = bytes(range(32))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def startup_seconds(**kw) -> float:
    t = time.monotonic()
    server = start_server(timeout=300, **kw)
    took = time.monotonic() - t
    server.stop()
    return took


def cloud_vs_local(tmp: Path) -> None:
    import boto3

    local = tmp / "local"
    for i in range(20):
        name = f"py_{i:02d}"
        (local / name / "1").mkdir(parents=True)
        (local / name / "config.pbtxt").write_text(IDENTITY.format(name=name))
        (local / name / "1" / "model.py").write_text(IDENTITY_PY)
    port = free_port()
    moto = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        time.sleep(3)
        env = {"AWS_ACCESS_KEY_ID": "t", "AWS_SECRET_ACCESS_KEY": "t", "AWS_DEFAULT_REGION": "us-east-1",
               "AWS_EC2_METADATA_DISABLED": "true"}
        s3 = boto3.client("s3", endpoint_url=f"http://127.0.0.1:{port}", aws_access_key_id="t",
                          aws_secret_access_key="t", region_name="us-east-1")
        s3.create_bucket(Bucket="models")
        for p in local.rglob("*"):
            if p.is_file():
                s3.put_object(Bucket="models", Key=f"repo/{p.relative_to(local).as_posix()}", Body=p.read_bytes())
        rows = []
        for _ in range(2):
            rows.append((startup_seconds(repo=local), startup_seconds(repo=f"s3://127.0.0.1:{port}/models/repo", env=env)))
        best_local, best_s3 = min(r[0] for r in rows), min(r[1] for r in rows)
        print(f"20 Python models, start-up to 'model loading complete' (best of 2): local {best_local:.2f} s, "
              f"S3 (moto) {best_s3:.2f} s, added {best_s3 - best_local:+.2f} s")
    finally:
        moto.terminate()
        moto.wait()


def big_onnx(path: Path, n: int = 5000) -> Path:
    w = np.random.default_rng(0).standard_normal((n, n)).astype(np.float32)
    graph = helper.make_graph([helper.make_node("MatMul", ["X", "W"], ["Y"])], "big",
                              [helper.make_tensor_value_info("X", TensorProto.FLOAT, [1, n])],
                              [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [1, n])],
                              [numpy_helper.from_array(w, "W")])
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), str(path))
    return path


def agents(tmp: Path) -> None:
    repo = tmp / "agents"
    src = big_onnx(tmp / "big.onnx")
    data = src.read_bytes()
    size_mb = len(data) / 1e6

    def model(name: str, backend: str, agents: str = "") -> Path:
        (repo / name / "1").mkdir(parents=True)
        (repo / name / "1" / "model.onnx").write_bytes(data)
        block = f"model_repository_agents {{ agents [ {agents} ] }}\n" if agents else ""
        (repo / name / "config.pbtxt").write_text(f'backend: "{backend}"\nmax_batch_size: 0\n{block}')
        return repo / name

    md5, sha = hashlib.md5(data).hexdigest(), hashlib.sha256(data).hexdigest()
    model("ort", "onnxruntime")
    model("ort_md5", "onnxruntime", f'{{ name: "checksum" parameters {{ key: "MD5:1/model.onnx" value: "{md5}" }} }}')
    model("ort_sha256", "onnxruntime",
          f'{{ name: "checksum" parameters {{ key: "SHA256:1/model.onnx" value: "{sha}" }} }}')
    enc = model("ort_decrypt", "onnxruntime", '{ name: "decrypt" parameters { key: "key_env" value: "BENCH_KEY" } }')
    encrypt_file(enc, "1/model.onnx", KEY)
    ov_openvino_onnx = model("ov_onnx", "openvino")
    (ov_openvino_onnx / "config.pbtxt").write_text('backend: "openvino"\nmax_batch_size: 0\n'
                                                   'default_model_filename: "model.onnx"\n')
    model("ov_convert", "openvino", '{ name: "convert" }')
    server = start_server("--model-control-mode=explicit", repo=repo, env={"BENCH_KEY": KEY.hex()}, timeout=120)
    base = f"http://{server.http_url}/v2/repository/models"

    def load_s(name: str) -> float:
        t = time.monotonic()
        r = httpx.post(f"{base}/{name}/load", json={}, timeout=300)
        took = time.monotonic() - t
        assert r.status_code == 200, r.text
        httpx.post(f"{base}/{name}/unload", json={}, timeout=300)
        return took

    try:
        first_convert = load_s("ov_convert")  # converts and fills the cache
        times = {n: min(load_s(n) for _ in range(REPEAT))
                 for n in ("ort", "ort_md5", "ort_sha256", "ort_decrypt", "ov_onnx", "ov_convert")}
    finally:
        server.stop()
    import re

    agent_s: dict[str, list[float]] = {}
    for m in re.finditer(r"repository agent '(\w+)' loaded model '(\w+)' in ([\d.]+) s", server.log()):
        agent_s.setdefault(f"{m.group(1)} ({m.group(2)})", []).append(float(m.group(3)))
    print("agent LOAD time from the server log (first, best):")
    for k, v in agent_s.items():
        print(f"  {k:<28} {v[0]:.3f} s, {min(v):.3f} s")
    print(f"{size_mb:.0f} MB ONNX model, load API time (best of {REPEAT}):")
    print(f"  onnxruntime, no agent   {times['ort']:.3f} s")
    for n, label in (("ort_md5", "checksum MD5"), ("ort_sha256", "checksum SHA-256"), ("ort_decrypt", "decrypt")):
        print(f"  onnxruntime + {label:<16} {times[n]:.3f} s  (added {times[n] - times['ort']:+.3f} s)")
    print(f"  openvino from ONNX, no agent {times['ov_onnx']:.3f} s")
    print(f"  openvino + convert, first load (converts) {first_convert:.3f} s  "
          f"(added {first_convert - times['ov_onnx']:+.3f} s)")
    print(f"  openvino + convert, cached IR {times['ov_convert']:.3f} s  "
          f"(added {times['ov_convert'] - times['ov_onnx']:+.3f} s)")


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as d:
        if os.environ.get("BENCH_PART", "all") in ("all", "cloud"):
            cloud_vs_local(Path(d))
        if os.environ.get("BENCH_PART", "all") in ("all", "agents"):
            agents(Path(d))
