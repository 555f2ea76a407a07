"""Repository agents end to end: checksum, decrypt, convert and a third-party agent registered
through the ``trident.agents`` entry-point group, on a real server in explicit mode."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from e2e.models import IDENTITY_PY, write_model
from e2e.test_backends_onnxruntime import BOTH
from unit.backends.test_onnxruntime import add_sub_graph

from trident.agents.convert import CACHE_DIR_NAME
from trident.agents.decrypt import encrypt_file

KEY = bytes(range(32))
OTHER_KEY = bytes(range(1, 33))
IDENTITY = '''name: "{name}"
backend: "python"
max_batch_size: 0
input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] }} ]
'''
AGENTS = "model_repository_agents {{ agents [ {agents} ] }}\n"

# a third-party agent package: a module and a .dist-info with its entry points
AGENT_MODULE = '''
from pathlib import Path
from trident.agents import Action, AgentError, RepositoryAgent


class RecordAgent(RepositoryAgent):
    name = "record"

    def model_action(self, action, model):
        log = Path(model.parameters["log"])
        with log.open("a") as f:
            f.write(f"{model.parameters['tag']}:{action.name}\\n")
        if action == Action.LOAD and model.parameters.get("copy"):
            copy = model.copy_location()
            with log.open("a") as f:
                f.write(f"copy:{copy}\\n")
            model.set_location(copy)


class FailingAgent(RepositoryAgent):
    name = "failing"

    def model_action(self, action, model):
        if action == Action.LOAD:
            raise AgentError("refused by the test agent")
'''


def _agent(name: str, **params: str) -> str:
    body = ", ".join(f'{{ key: "{k}" value: "{v}" }}' for k, v in params.items())
    return f'{{ name: "{name}" parameters [ {body} ] }}' if params else f'{{ name: "{name}" }}'


def _identity(repo: Path, name: str, *agents: str) -> Path:
    config = IDENTITY.format(name=name) + (AGENTS.format(agents=", ".join(agents)) if agents else "")
    return write_model(repo, name, config, IDENTITY_PY)


def _onnx(repo: Path, name: str, config: str) -> Path:
    folder = repo / name
    add_sub_graph(folder / "1" / "model.onnx")
    (folder / "config.pbtxt").write_text(config)
    return folder


def _md5(path: Path) -> str:
    return hashlib.md5(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    from e2e.conftest import start_server

    base = tmp_path_factory.mktemp("agents")
    repo = base / "repo"
    plugins = base / "plugins"
    (plugins / "trident_test_agents-1.0.dist-info").mkdir(parents=True)
    (plugins / "trident_test_agents.py").write_text(AGENT_MODULE)
    (plugins / "trident_test_agents-1.0.dist-info" / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: trident-test-agents\nVersion: 1.0\n")
    (plugins / "trident_test_agents-1.0.dist-info" / "entry_points.txt").write_text(
        "[trident.agents]\nrecord = trident_test_agents:RecordAgent\nfailing = trident_test_agents:FailingAgent\n")
    log = base / "actions.log"
    key_file = base / "model.key"
    key_file.write_text(KEY.hex())

    folder = _identity(repo, "checked")
    folder.joinpath("config.pbtxt").write_text(folder.joinpath("config.pbtxt").read_text() + AGENTS.format(agents=_agent(
        "checksum", **{"MD5:1/model.py": _md5(folder / "1" / "model.py"),
                       "SHA256:config.pbtxt.orig": "0" * 64})))
    # the SHA-256 entry must name a file: checked_ok names only the right digests
    ok = _identity(repo, "checked_ok")
    digest = hashlib.sha256((ok / "1" / "model.py").read_bytes()).hexdigest()
    (ok / "config.pbtxt").write_text((ok / "config.pbtxt").read_text() + AGENTS.format(agents=_agent(
        "checksum", **{"MD5:1/model.py": _md5(ok / "1" / "model.py"), "SHA256:1/model.py": digest})))
    _identity(repo, "tampered", _agent("checksum", **{"MD5:1/model.py": "0" * 32}))
    _identity(repo, "recorded", _agent("record", log=str(log), tag="a", copy="1"), _agent("record", log=str(log), tag="b"))
    _identity(repo, "raising", _agent("record", log=str(log), tag="r"), _agent("failing"))
    _identity(repo, "unknown", _agent("no_such_agent"))
    _identity(repo, "key_in_config", _agent("decrypt", key="00" * 32))

    add_sub = 'backend: "onnxruntime"\nmax_batch_size: 0\n'
    encrypted = _onnx(repo, "encrypted", add_sub + AGENTS.format(agents=_agent("decrypt", key_env="TEST_MODEL_KEY")))
    encrypt_file(encrypted, "1/model.onnx", KEY)
    encrypted_file = _onnx(repo, "encrypted_file", add_sub + AGENTS.format(agents=_agent("decrypt", key_file=str(key_file))))
    encrypt_file(encrypted_file, "1/model.onnx", KEY)
    wrong = _onnx(repo, "wrong_key", add_sub + AGENTS.format(agents=_agent("decrypt", key_env="TEST_OTHER_KEY")))
    encrypt_file(wrong, "1/model.onnx", KEY)
    _onnx(repo, "converted", 'backend: "openvino"\nmax_batch_size: 0\n' + AGENTS.format(agents=_agent("convert")))
    # decrypt, then convert the decrypted file: the chain hands each agent the last location
    chained = _onnx(repo, "decrypt_convert", 'backend: "openvino"\nmax_batch_size: 0\n'
                    + AGENTS.format(agents=", ".join([_agent("decrypt", key_env="TEST_MODEL_KEY"), _agent("convert")])))
    encrypt_file(chained, "1/model.onnx", KEY)

    server = start_server("--model-control-mode=explicit", "--load-model=*", repo=repo, env={
        "PYTHONPATH": os.pathsep.join([str(plugins), os.environ.get("PYTHONPATH", "")]),
        "TEST_MODEL_KEY": KEY.hex(), "TEST_OTHER_KEY": OTHER_KEY.hex()})
    yield server, repo, log
    server.stop()


def _index(server) -> dict[str, dict]:
    r = httpx.post(f"http://{server.http_url}/v2/repository/index", json={})
    return {row["name"]: row for row in r.json()}


def _reason(server, name: str) -> str:
    row = _index(server)[name]
    assert row.get("state") == "UNAVAILABLE", row
    return row["reason"]


def _add_sub(infer, server, model: str) -> None:
    a, b = np.ones((2, 4), np.float32), np.arange(8, dtype=np.float32).reshape(2, 4)
    out = infer(server, model, {"INPUT0": a, "INPUT1": b})
    assert out["OUTPUT0"].tolist() == (a + b).tolist() and out["OUTPUT1"].tolist() == (a - b).tolist()


@BOTH
def test_checksum_passes(env, infer):
    server, _, _ = env
    x = np.arange(3, dtype=np.float32)
    assert infer(server, "checked_ok", {"INPUT0": x})["OUTPUT0"].tolist() == x.tolist()


def test_checksum_mismatch_names_the_file(env):
    server, _, _ = env
    reason = _reason(server, "tampered")
    assert "repository agent 'checksum'" in reason and "mismatched MD5 hash for file '1/model.py'" in reason
    reason = _reason(server, "checked")
    assert "config.pbtxt.orig" in reason and "does not exist" in reason


@BOTH
def test_decrypted_models_serve(env, infer):
    server, repo, _ = env
    _add_sub(infer, server, "encrypted")
    _add_sub(infer, server, "encrypted_file")
    assert not (repo / "encrypted" / "1" / "model.onnx").exists()  # the plain file exists only in the copy


def test_bad_keys_fail_with_the_reason(env):
    server, _, _ = env
    assert "does not decrypt: wrong key" in _reason(server, "wrong_key")
    assert "must not be in the model configuration" in _reason(server, "key_in_config")


@BOTH
def test_converted_model_serves_from_the_cache(env, infer):
    server, repo, _ = env
    _add_sub(infer, server, "converted")
    cache = repo / "converted" / CACHE_DIR_NAME / "1"
    assert (cache / "model.xml").is_file() and (cache / "model.bin").is_file()
    client = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        assert client.get_model_metadata("converted", as_json=True)["platform"] == "openvino"
    finally:
        client.close()
    _add_sub(infer, server, "decrypt_convert")


def test_agent_failure_fails_only_its_model(env):
    server, _, log = env
    reason = _reason(server, "raising")
    assert reason.startswith("repository agent 'failing' failed to load model 'raising': refused by the test agent")
    assert [line for line in log.read_text().splitlines() if line.startswith("r:")] == ["r:LOAD", "r:LOAD_FAIL"]
    assert "unable to find repository agent 'no_such_agent'" in _reason(server, "unknown")
    ready = {name for name, row in _index(server).items() if row.get("state") == "READY"}
    assert {"checked_ok", "encrypted", "converted", "recorded"} <= ready


def test_lifecycle_order_and_copy_removed(env):
    server, _, log = env

    def actions() -> list[str]:
        return [line for line in log.read_text().splitlines() if line[:2] in ("a:", "b:")]

    assert actions() == ["a:LOAD", "b:LOAD", "b:LOAD_COMPLETE", "a:LOAD_COMPLETE"]
    copies = [Path(line[5:]) for line in log.read_text().splitlines() if line.startswith("copy:")]
    assert copies and copies[-1].is_dir()
    r = httpx.post(f"http://{server.http_url}/v2/repository/models/recorded/unload", json={})
    assert r.status_code == 200, r.text
    assert actions()[4:] == ["a:UNLOAD", "b:UNLOAD", "b:UNLOAD_COMPLETE", "a:UNLOAD_COMPLETE"]
    assert not copies[-1].exists() and not copies[-1].parent.exists()
    r = httpx.post(f"http://{server.http_url}/v2/repository/models/recorded/load", json={})
    assert r.status_code == 200, r.text
    assert actions()[8:] == ["a:LOAD", "b:LOAD", "b:LOAD_COMPLETE", "a:LOAD_COMPLETE"]


def test_load_api_override_with_an_unknown_agent_is_refused(env):
    server, _, _ = env
    config = {"name": "checked_ok", "backend": "python", "max_batch_size": 0,
              "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [-1]}],
              "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [-1]}],
              "model_repository_agents": {"agents": [{"name": "bogus" * 3}]}}
    r = httpx.post(f"http://{server.http_url}/v2/repository/models/checked_ok/load",
                   json={"parameters": {"config": json.dumps(config)}})
    assert r.status_code == 400 and "unable to find repository agent 'bogusbogusbogus'" in r.json()["error"]
    # the failed reload left the serving version in place
    x = np.ones(2, np.float32)
    client = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        tensor = grpcclient.InferInput("INPUT0", [2], "FP32")
        tensor.set_data_from_numpy(x)
        result = client.infer("checked_ok", [tensor])
        assert result.as_numpy("OUTPUT0").tolist() == x.tolist()
    finally:
        client.close()


def test_module_docs_worked_example_is_valid(tmp_path):
    """The README's encryption command: python -m trident.agents.decrypt."""
    import subprocess
    import sys

    model = tmp_path / "m"
    (model / "1").mkdir(parents=True)
    (model / "1" / "model.onnx").write_bytes(b"plain bytes")
    key = tmp_path / "k"
    key.write_text(KEY.hex())
    out = subprocess.run([sys.executable, "-m", "trident.agents.decrypt", "--key-file", str(key), str(model),
                          "1/model.onnx"], capture_output=True, text=True, check=True)
    assert out.stdout.strip().endswith("model.onnx.enc") and not (model / "1" / "model.onnx").exists()
    bad = subprocess.run([sys.executable, "-m", "trident.agents.decrypt", "--key-file", str(tmp_path / "none"),
                          str(model), "1/model.onnx"], capture_output=True, text=True)
    assert bad.returncode == 2 and "cannot read key file" in bad.stderr
