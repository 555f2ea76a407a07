"""The agent chain's order of actions, and the built-in agents' checks, without a server."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from trident.agents import (
    Action,
    AgentError,
    AgentModel,
    RepositoryAgent,
    agent_class,
    check_agents,
    lifecycle,
)
from trident.agents.checksum import ChecksumAgent
from trident.agents.convert import ConvertAgent
from trident.agents.decrypt import DecryptAgent, encrypt_file, parse_key, read_key
from trident.errors import Code, TritonError
from trident.protocol.generated.inference import (
    ModelConfig,
    ModelRepositoryAgents,
    ModelRepositoryAgentsAgent,
)

KEY = bytes(range(32))


@pytest.fixture(autouse=True)
def _temporary_copies_in_tmp_path(tmp_path, monkeypatch):
    """Agents called directly (without a chain to remove their copies) write under tmp_path."""
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))


def _model(tmp_path: Path, **params: str) -> AgentModel:
    folder = tmp_path / "m"
    (folder / "1").mkdir(parents=True, exist_ok=True)
    (folder / "1" / "model.py").write_bytes(b"print('hi')\n")
    return AgentModel("m", [1], dict(params), ModelConfig(name="m"), folder)


class Recorder(RepositoryAgent):
    name = "recorder"
    calls: list[str] = []
    copies: list[Path] = []

    def model_action(self, action: Action, model: AgentModel) -> None:
        Recorder.calls.append(f"{model.parameters['tag']}:{action.name}")
        if action == Action.LOAD and model.parameters.get("fail"):
            raise RuntimeError("boom")
        if action == Action.LOAD and model.parameters.get("copy"):
            model.set_location(model.copy_location())
            Recorder.copies.append(model.location)


@pytest.fixture
def recorder(monkeypatch):
    Recorder.calls = []
    Recorder.copies = []
    real = lifecycle.agent_class
    monkeypatch.setattr(lifecycle, "agent_class", lambda name: Recorder if name == "recorder" else real(name))
    return Recorder.calls


def test_load_and_unload_order(tmp_path, recorder):
    m = _model(tmp_path)
    chain = lifecycle.AgentChain("m", [("recorder", {"tag": "a", "copy": "1"}), ("recorder", {"tag": "b"})],
                                 m.config, m.location, [1])
    location = chain.load()
    assert location != m.location and (location / "1" / "model.py").read_bytes() == b"print('hi')\n"
    assert location.name == "m"
    chain.load_complete()
    chain.unload()
    assert location.exists()
    chain.unload_complete()
    assert not location.exists() and (m.location / "1" / "model.py").exists()  # the original stays
    assert recorder == ["a:LOAD", "b:LOAD", "b:LOAD_COMPLETE", "a:LOAD_COMPLETE",
                        "a:UNLOAD", "b:UNLOAD", "b:UNLOAD_COMPLETE", "a:UNLOAD_COMPLETE"]


def test_a_failure_stops_the_chain_and_sends_load_fail_in_reverse(tmp_path, recorder):
    m = _model(tmp_path)
    chain = lifecycle.AgentChain("m", [("recorder", {"tag": "a", "copy": "1"}), ("recorder", {"tag": "b", "fail": "1"}),
                                       ("recorder", {"tag": "c"})], m.config, m.location, [1])
    with pytest.raises(TritonError) as info:
        chain.load()
    assert info.value.message == "repository agent 'recorder' failed to load model 'm': boom"
    assert recorder == ["a:LOAD", "b:LOAD", "b:LOAD_FAIL", "a:LOAD_FAIL"]
    assert len(Recorder.copies) == 1 and not Recorder.copies[0].exists()  # agent a's copy is gone
    assert not Recorder.copies[0].parent.exists()


def test_unknown_agents_and_bounds_are_refused():
    with pytest.raises(TritonError) as info:
        agent_class("nope")
    assert info.value.code is Code.INVALID_ARG and "unable to find repository agent 'nope'" in info.value.message
    assert "checksum" in info.value.message  # the known agents are listed
    many = ModelConfig(name="m", model_repository_agents=ModelRepositoryAgents(
        agents=[ModelRepositoryAgentsAgent(name="checksum")] * 17))
    with pytest.raises(TritonError, match="at most 16"):
        check_agents(many)
    unnamed = ModelConfig(name="m", model_repository_agents=ModelRepositoryAgents(agents=[ModelRepositoryAgentsAgent()]))
    with pytest.raises(TritonError, match="must specify 'name'"):
        check_agents(unnamed)


def test_checksum_md5_and_sha256(tmp_path):
    m = _model(tmp_path)
    data = (m.location / "1" / "model.py").read_bytes()
    m.parameters = {"MD5:1/model.py": hashlib.md5(data).hexdigest().upper(),
                    "SHA256:1/model.py": hashlib.sha256(data).hexdigest()}
    ChecksumAgent().model_action(Action.LOAD, m)
    for params, message in [
        ({"MD5:1/model.py": "0" * 32}, "mismatched MD5 hash for file '1/model.py'"),
        ({"SHA-256:1/model.py": "0" * 64}, "mismatched SHA-256 hash"),
        ({"CRC32:1/model.py": "0"}, "unsupported hash algorithm 'CRC32'"),
        ({"1/model.py": "0"}, "expected '<ALGORITHM>:<path>'"),
        ({"MD5:../../etc/passwd": "0"}, "must be relative and inside the model folder"),
        ({"MD5:/etc/passwd": "0"}, "must be relative"),
        ({"MD5:2/model.py": "0"}, "file '2/model.py'"),
        ({}, "no files to check"),
    ]:
        m.parameters = params
        with pytest.raises(AgentError, match=message.replace("(", r"\(").replace(")", r"\)")):
            ChecksumAgent().model_action(Action.LOAD, m)
    ChecksumAgent().model_action(Action.UNLOAD, m)  # nothing to do on the other actions


def test_checksum_refuses_a_symlink_out_of_the_folder(tmp_path):
    m = _model(tmp_path)
    secret = tmp_path / "secret"
    secret.write_text("x")
    (m.location / "1" / "link").symlink_to(secret)
    m.parameters = {"MD5:1/link": "0" * 32}
    with pytest.raises(AgentError, match="leaves the model folder"):
        ChecksumAgent().model_action(Action.LOAD, m)


def test_decrypt_keys(tmp_path, monkeypatch):
    assert parse_key(KEY.hex().encode()) == KEY
    import base64

    assert parse_key(base64.b64encode(KEY) + b"\n") == KEY
    assert parse_key(KEY[:16]) == KEY[:16]  # raw bytes (from a file)
    with pytest.raises(AgentError, match="16, 24 or 32 bytes"):
        parse_key(b"short")
    with pytest.raises(AgentError, match="must not be in the model configuration"):
        read_key({"key": KEY.hex()})
    with pytest.raises(AgentError, match="no key"):
        read_key({})
    monkeypatch.delenv("NO_SUCH_KEY_VAR", raising=False)
    with pytest.raises(AgentError, match="'NO_SUCH_KEY_VAR' .* is not set"):
        read_key({"key_env": "NO_SUCH_KEY_VAR"})
    big = tmp_path / "big"
    big.write_bytes(b"0" * 5000)
    with pytest.raises(AgentError, match="over 4096 bytes"):
        read_key({"key_file": str(big)})


def test_decrypt_round_trip_and_tampering(tmp_path, monkeypatch):
    m = _model(tmp_path)
    monkeypatch.setenv("UNIT_KEY", KEY.hex())
    m.parameters = {"key_env": "UNIT_KEY"}
    encrypt_file(m.location, "1/model.py", KEY)
    with pytest.raises(TritonError):  # nothing else is encrypted: the renamed file does not decrypt
        blob = (m.location / "1" / "model.py.enc").read_bytes()
        (m.location / "2").mkdir()
        (m.location / "2" / "model.py.enc").write_bytes(blob)
        lifecycle.AgentChain("m", [("decrypt", m.parameters)], m.config, m.location, [1]).load()
    (m.location / "2" / "model.py.enc").unlink()
    owned: list[Path] = []
    model = AgentModel("m", [1], m.parameters, m.config, m.location, owned)
    DecryptAgent().model_action(Action.LOAD, model)
    assert (model.location / "1" / "model.py").read_bytes() == b"print('hi')\n"
    assert not (model.location / "1" / "model.py.enc").exists() and (m.location / "1" / "model.py.enc").exists()
    tampered = bytearray((m.location / "1" / "model.py.enc").read_bytes())
    tampered[-1] ^= 1
    (m.location / "1" / "model.py.enc").write_bytes(bytes(tampered))
    with pytest.raises(AgentError, match="does not decrypt"):
        DecryptAgent().model_action(Action.LOAD, AgentModel("m", [1], m.parameters, m.config, m.location, owned))


def test_convert_refuses_bad_parameters(tmp_path):
    m = _model(tmp_path)
    for params, message in [({"to": "tensorrt"}, "unsupported conversion from 'onnx' to 'tensorrt'"),
                            ({"colour": "red"}, "unknown parameter 'colour'"),
                            ({"source_filename": "../x"}, "invalid source_filename"),
                            ({}, "file '1/model.onnx' does not exist")]:
        m.parameters = params
        with pytest.raises(AgentError, match=message):
            ConvertAgent().model_action(Action.LOAD, m)
    m.parameters = {}
    m.config = ModelConfig(name="m", backend="onnxruntime")
    with pytest.raises(AgentError, match="served by the openvino backend"):
        ConvertAgent().model_action(Action.LOAD, m)


def test_convert_caches_by_content(tmp_path):
    from unit.backends.test_onnxruntime import add_sub_graph

    m = _model(tmp_path)
    add_sub_graph(m.location / "1" / "model.onnx")
    m.config = ModelConfig(name="m", backend="openvino")
    first = AgentModel("m", [1], {}, m.config, m.location)
    ConvertAgent().model_action(Action.LOAD, first)
    assert (first.location / "1" / "model.xml").is_file() and not (first.location / "1" / "model.onnx").exists()
    cache = m.location / ".trident_convert" / "1"
    stamp = (cache / "source.sha256").read_text()
    mtime = (cache / "model.xml").stat().st_mtime_ns
    second = AgentModel("m", [1], {}, m.config, m.location)
    ConvertAgent().model_action(Action.LOAD, second)
    assert (cache / "model.xml").stat().st_mtime_ns == mtime  # taken from the cache
    add_sub_graph(m.location / "1" / "model.onnx", dims=("N", 8))  # a changed model converts again
    ConvertAgent().model_action(Action.LOAD, AgentModel("m", [1], {}, m.config, m.location))
    assert (cache / "source.sha256").read_text() != stamp
    bad = tmp_path / "bad"
    (bad / "1").mkdir(parents=True)
    (bad / "1" / "model.onnx").write_bytes(b"not onnx")
    with pytest.raises(AgentError, match="cannot convert 'model.onnx' to OpenVINO IR"):
        ConvertAgent().model_action(Action.LOAD, AgentModel("bad", [1], {}, m.config, bad))
