"""The security flag audit: every security-relevant flag and combination either works or stops
the start with one clear line. The real server, tritonclient gRPC over TLS (server and mutual),
raw TLS sockets for what tritonclient cannot send, and the command line for refusals.

The audit (README "Security and limits", "Security flags"): TLS (``--grpc-use-ssl``,
``--grpc-use-ssl-mutual``, the certificate flags and their combinations), restricted APIs on
every port (the OpenAI port's are in tests/e2e/test_openai.py), client shared memory, trace and
log files, model control.
"""

from __future__ import annotations

import socket
import ssl
import subprocess
import sys
from pathlib import Path

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from e2e.conftest import start_server
from tritonclient.utils import InferenceServerException

# ---- certificates: one CA signs the server and a client; a second CA signs an intruder --------


def _openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True)


def _ca(folder: Path, name: str) -> tuple[Path, Path]:
    key, cert = folder / f"{name}.key", folder / f"{name}.pem"
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", f"/CN={name}",
             "-keyout", str(key), "-out", str(cert))
    return key, cert


def _signed(folder: Path, name: str, ca: tuple[Path, Path], *extensions: str) -> tuple[Path, Path]:
    key, csr, cert = folder / f"{name}.key", folder / f"{name}.csr", folder / f"{name}.pem"
    ext = folder / f"{name}.ext"
    ext.write_text("\n".join(extensions) + "\n")
    _openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN={name}", "-keyout", str(key), "-out", str(csr))
    _openssl("x509", "-req", "-in", str(csr), "-CA", str(ca[1]), "-CAkey", str(ca[0]), "-CAcreateserial",
             "-days", "1", "-extfile", str(ext), "-out", str(cert))
    return key, cert


@pytest.fixture(scope="module")
def certs(tmp_path_factory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("certs")
    ca = _ca(folder, "ca")
    other_ca = _ca(folder, "other-ca")
    server = _signed(folder, "server", ca, "subjectAltName=DNS:localhost,IP:127.0.0.1",
                     "extendedKeyUsage=serverAuth")
    client = _signed(folder, "client", ca, "extendedKeyUsage=clientAuth")
    intruder = _signed(folder, "intruder", other_ca, "extendedKeyUsage=clientAuth")
    return {"ca": ca[1], "server_key": server[0], "server_cert": server[1], "client_key": client[0],
            "client_cert": client[1], "intruder_key": intruder[0], "intruder_cert": intruder[1]}


def _tls_flags(certs: dict[str, Path], *, root: bool = True) -> list[str]:
    flags = [f"--grpc-server-cert={certs['server_cert']}", f"--grpc-server-key={certs['server_key']}"]
    return [*flags, f"--grpc-root-cert={certs['ca']}"] if root else flags


def _live(port: int, certs: dict[str, Path] | None, who: str | None = "client") -> bool:
    """tritonclient gRPC: is_server_live over TLS (``certs``: trust the CA, present ``who``'s
    certificate unless None) or in plain text (``certs`` None)."""
    kwargs = {}
    if certs is not None:
        kwargs = {"ssl": True, "root_certificates": str(certs["ca"])}
        if who is not None:
            kwargs.update(private_key=str(certs[f"{who}_key"]), certificate_chain=str(certs[f"{who}_cert"]))
    client = grpcclient.InferenceServerClient(f"localhost:{port}", **kwargs)
    try:
        return client.is_server_live(client_timeout=10)
    finally:
        client.close()


def _refused(port: int, certs: dict[str, Path] | None, who: str | None = "client") -> str:
    with pytest.raises(InferenceServerException) as e:
        _live(port, certs, who)
    return str(e.value)


def _plain_text_is_refused(port: int) -> None:
    """A plain-text HTTP/2 preface gets no HTTP/2 answer from a TLS port: the connection is
    closed, or answered with a TLS alert record (content type 21)."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes.fromhex("000000040000000000"))
        try:
            reply = s.recv(64)
        except (ConnectionResetError, TimeoutError):
            reply = b""
    assert reply == b"" or reply[0] == 21, reply


# ---- TLS that works --------------------------------------------------------------------------


@pytest.mark.parametrize("http2", ["trident", "h2"])
def test_mutual_tls_alone_turns_tls_on_and_requires_a_client_certificate(certs, http2):
    """--grpc-use-ssl-mutual=true without --grpc-use-ssl (before: plain text, no client check),
    on both HTTP/2 implementations."""
    server = start_server("--grpc-use-ssl-mutual=true", *_tls_flags(certs), "--allow-http=false",
                          f"--grpc-http2={http2}")
    try:
        assert "TLS, client certificates required" in server.log()
        assert _live(server.grpc_port, certs)
        assert "add_sub" in str(_infer_add_sub(server.grpc_port, certs))
        assert _refused(server.grpc_port, certs, who=None)  # TLS, no client certificate
        assert _refused(server.grpc_port, certs, who="intruder")  # a certificate of another CA
        assert _refused(server.grpc_port, None)  # plain text
        _plain_text_is_refused(server.grpc_port)
        _raw_tls_handshake_fails_without_a_certificate(server.grpc_port, certs)
        assert _live(server.grpc_port, certs)  # the refused clients cost the server nothing
    finally:
        assert server.stop() == 0


def _infer_add_sub(port: int, certs: dict[str, Path]) -> str:
    client = grpcclient.InferenceServerClient(
        f"localhost:{port}", ssl=True, root_certificates=str(certs["ca"]), private_key=str(certs["client_key"]),
        certificate_chain=str(certs["client_cert"]))
    try:
        inputs = [grpcclient.InferInput(name, [1, 16], "FP32") for name in ("INPUT0", "INPUT1")]
        for i in inputs:
            i.set_data_from_numpy(np.ones((1, 16), dtype=np.float32))
        result = client.infer("add_sub", inputs, client_timeout=10)
        assert result.as_numpy("OUTPUT0").tolist() == [[2.0] * 16]
        return result.get_response().model_name
    finally:
        client.close()


def _raw_tls_handshake_fails_without_a_certificate(port: int, certs: dict[str, Path]) -> None:
    context = ssl.create_default_context(cafile=str(certs["ca"]))
    context.set_alpn_protocols(["h2"])
    with socket.create_connection(("127.0.0.1", port), timeout=10) as raw:
        with context.wrap_socket(raw, server_hostname="localhost") as tls:
            # TLS 1.3: the server's refusal of the missing certificate arrives with the first read
            with pytest.raises((ssl.SSLError, ConnectionResetError)):
                tls.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
                if not tls.recv(64):
                    raise ConnectionResetError("closed")


def test_mutual_tls_with_use_ssl_true(certs):
    server = start_server("--grpc-use-ssl=true", "--grpc-use-ssl-mutual=true", *_tls_flags(certs),
                          "--allow-http=false")
    try:
        assert _live(server.grpc_port, certs)
        assert _refused(server.grpc_port, certs, who=None)
    finally:
        server.stop()


def test_server_tls_needs_no_client_certificate_and_refuses_plain_text(certs):
    server = start_server("--grpc-use-ssl=true", *_tls_flags(certs, root=False), "--allow-http=false")
    try:
        assert "(TLS)" in server.log()
        assert _live(server.grpc_port, certs, who=None)
        assert _live(server.grpc_port, certs)  # a certificate the server did not ask for is fine
        assert _refused(server.grpc_port, None)
        _plain_text_is_refused(server.grpc_port)
    finally:
        server.stop()


def test_a_root_certificate_without_mutual_tls_is_logged_as_unused(certs):
    """tritonserver ignores --grpc-root-cert unless client certificates are requested; trident
    says so at start-up instead of saying nothing."""
    server = start_server("--grpc-use-ssl=true", *_tls_flags(certs), "--allow-http=false")
    try:
        assert "ignoring --grpc-root-cert=" in server.log()
        assert "only requested with --grpc-use-ssl-mutual=true" in server.log()
        assert _live(server.grpc_port, certs, who=None)
    finally:
        server.stop()


# ---- TLS settings that would not be honoured: refused at start -------------------------------


def _start_fails(*flags: str) -> tuple[int, str]:
    proc = subprocess.run([sys.executable, "-m", "trident", "serve", "--http-port=0", "--grpc-port=0",
                           "--metrics-port=0", *flags], capture_output=True, text=True, timeout=60)
    return proc.returncode, proc.stderr


@pytest.mark.parametrize(("flags", "message"), [
    (["--grpc-use-ssl=false", "--grpc-use-ssl-mutual=true"], "--grpc-use-ssl=false contradicts --grpc-use-ssl-mutual"),
    (["--grpc-use-ssl-mutual=true", "--grpc-use-ssl=0"], "--grpc-use-ssl=false contradicts --grpc-use-ssl-mutual"),
    (["--grpc-use-ssl-mutual=true", "CERTS-NO-ROOT"], "--grpc-use-ssl-mutual needs --grpc-root-cert"),
    (["--grpc-use-ssl-mutual=true"], "--grpc-use-ssl-mutual needs --grpc-server-cert and --grpc-server-key"),
    (["--grpc-use-ssl=true"], "--grpc-use-ssl needs --grpc-server-cert and --grpc-server-key"),
    (["--grpc-use-ssl=true", "--grpc-server-cert=X"], "--grpc-use-ssl needs --grpc-server-cert and --grpc-server-key"),
    (["CERTS-NO-ROOT"], "--grpc-server-cert and --grpc-server-key given but gRPC TLS is off"),
    (["--grpc-use-ssl=false", "CERTS"], "given but gRPC TLS is off: refusing to serve gRPC in plain text"),
    (["--grpc-root-cert=ROOT"], "--grpc-root-cert given but gRPC TLS is off"),
])
def test_tls_settings_that_would_not_be_honoured_refuse_to_start(certs, flags, message):
    argv = []
    for flag in flags:
        if flag == "CERTS":
            argv += _tls_flags(certs)
        elif flag == "CERTS-NO-ROOT":
            argv += _tls_flags(certs, root=False)
        else:
            argv.append(flag.replace("ROOT", str(certs["ca"])))
    code, stderr = _start_fails(*argv)
    lines = stderr.strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith("trident: error:"), stderr
    assert message in lines[0], lines[0]


def test_tls_flags_mean_nothing_with_grpc_off(certs):
    """--allow-grpc=false: no gRPC port, so its TLS flags are not checked (as tritonserver)."""
    server = start_server("--allow-grpc=false", "--grpc-server-cert=/nonexistent.pem")
    try:
        assert "GRPCInferenceService" not in server.ports
    finally:
        server.stop()


@pytest.mark.parametrize("which", ["server_cert", "server_key", "ca"])
def test_a_certificate_that_cannot_be_loaded_stops_the_start_naming_it(certs, tmp_path, which):
    files = {"server_cert": certs["server_cert"], "server_key": certs["server_key"], "ca": certs["ca"]}
    files[which] = tmp_path / "missing.pem"
    if which == "ca":  # a file that is there but is no certificate
        files[which].write_text("not a certificate\n")
    code, stderr = _start_fails("--grpc-use-ssl-mutual=true", f"--grpc-server-cert={files['server_cert']}",
                                f"--grpc-server-key={files['server_key']}", f"--grpc-root-cert={files['ca']}")
    assert code == 1
    errors = [line for line in stderr.splitlines() if line.startswith("E")]
    assert len(errors) == 1 and "error: creating server: gRPC TLS: cannot load" in errors[0], stderr
    flag = "--grpc-root-cert" if which == "ca" else "--grpc-server-cert"
    assert flag in errors[0] and "address" not in errors[0]


# ---- logs, client shared memory, model control -------------------------------------------------


def test_a_log_file_that_cannot_be_opened_stops_the_start(tmp_path):
    code, stderr = _start_fails(f"--log-file={tmp_path / 'missing' / 'trident.log'}")
    lines = stderr.strip().splitlines()
    assert code == 1 and len(lines) == 1, stderr
    assert lines[0].startswith("error: cannot open --log-file") and "No such file or directory" in lines[0]


def test_a_trace_file_that_cannot_be_written_stops_the_start(tmp_path):
    """Traces are written later; a folder that is missing is found at start, not at the first
    trace (before: one error line per trace, and no traces)."""
    code, stderr = _start_fails(f"--trace-config=triton,file={tmp_path / 'missing' / 'trace.json'}",
                                "--trace-config=level=TIMESTAMPS")
    errors = [line for line in stderr.splitlines() if line.startswith("E")]
    assert code == 1 and len(errors) == 1, stderr
    assert "error: creating server: --trace-config triton,file=" in errors[0] and "does not exist" in errors[0]


def test_the_log_file_gets_the_log_and_the_console_nothing(tmp_path):
    path = tmp_path / "trident.log"
    proc = subprocess.Popen([sys.executable, "-m", "trident", "serve", "--http-port=0", "--grpc-port=0",
                             "--metrics-port=0", f"--log-file={path}"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        import time

        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and "model loading complete" not in (path.read_text() if path.exists()
                                                                                else ""):
            time.sleep(0.1)
        assert "Started HTTPService" in path.read_text()
    finally:
        proc.terminate()
        out, err = proc.communicate(timeout=30)
    assert out == "" and err == ""


def test_client_shared_memory_is_off_by_default_on_both_protocols(example_server):
    register = {"key": "/trident-audit", "offset": 0, "byte_size": 64}
    r = httpx.post(f"http://{example_server.http_url}/v2/systemsharedmemory/region/r/register", json=register)
    assert r.status_code == 501 and "disabled on this server" in r.text
    r = httpx.post(f"http://{example_server.http_url}/v2/cudasharedmemory/region/r/register",
                   json={"raw_handle": {"b64": "AAAA"}, "device_id": 0, "byte_size": 64})
    assert r.status_code == 501 and "disabled on this server" in r.text
    client = grpcclient.InferenceServerClient(example_server.grpc_url)
    try:
        with pytest.raises(InferenceServerException, match="disabled on this server"):
            client.register_system_shared_memory("r", "/trident-audit", 64)
        with pytest.raises(InferenceServerException, match="disabled on this server"):
            client.register_cuda_shared_memory("r", b"\0" * 64, 0, 64)
    finally:
        client.close()


@pytest.mark.parametrize("mode", ["none", "poll"])
def test_model_control_outside_explicit_mode_refuses_load_and_unload(mode, tmp_path, repo_factory):
    server = start_server(f"--model-control-mode={mode}", "--repository-poll-secs=60", repo=repo_factory("add_sub"))
    try:
        for action in ("load", "unload"):
            r = httpx.post(f"http://{server.http_url}/v2/repository/models/add_sub/{action}")
            assert r.status_code == 501 and "explicit model load / unload is not allowed if" in r.text
        client = grpcclient.InferenceServerClient(server.grpc_url)
        try:
            for call in (client.load_model, client.unload_model):
                with pytest.raises(InferenceServerException, match="explicit model load / unload is not allowed if"):
                    call("add_sub")
            assert client.is_model_ready("add_sub")
        finally:
            client.close()
        assert "open to code upload" not in server.log()  # no load API, nothing to upload to
    finally:
        server.stop()


_OPEN = "the model-control API is open to code upload"
_HTTP_FLAG = "--http-restricted-api=model-repository:<key>=<value>"
_GRPC_FLAG = "--grpc-restricted-protocol=model-repository:<key>=<value>"


@pytest.mark.parametrize(("flags", "named"), [
    ((), (_HTTP_FLAG, _GRPC_FLAG)),
    (("--http-restricted-api=model-repository,statistics:admin-key=s",), (_GRPC_FLAG,)),
    (("--http-restricted-api=model-repository:admin-key=s", "--grpc-restricted-protocol=model-repository:k=s"), ()),
], ids=["open", "http-restricted", "both-restricted"])
def test_explicit_model_control_logs_that_it_is_open_to_code_upload(flags, named, repo_factory):
    """Explicit model control with the model-repository API open on a front end: one INFO line
    at start-up naming the flag that restricts each open front end (WARNING only on all
    interfaces; these servers listen on 127.0.0.1); none once both are restricted."""
    server = start_server("--model-control-mode=explicit", *flags, repo=repo_factory("add_sub"))
    try:
        lines = [line for line in server.log().splitlines() if _OPEN in line]
        if not named:
            assert lines == []
            r = httpx.post(f"http://{server.http_url}/v2/repository/models/add_sub/load")
            assert r.status_code == 403 and "expecting header 'admin-key'" in r.text
        else:
            assert len(lines) == 1, lines
            assert lines[0].startswith("I"), lines[0]  # INFO in tritonserver's format
            assert "on all interfaces" not in lines[0]
            assert lines[0].endswith(" and ".join(named)), lines[0]
    finally:
        server.stop()
