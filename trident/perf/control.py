"""Blocking control calls of ``trident perf`` to a KServe v2 server (trident or Triton), over the
protocol being measured: model metadata and config, statistics, system shared-memory
registration, and the Prometheus metrics page.

Each call is bounded by ``timeout_s`` and raises :class:`~trident.perf.wire.PerfError` with a
one-line message (unreachable server, unknown model, an error the server returned).
"""

from __future__ import annotations

import abc
import base64
import json
import socket
import time
import urllib.error
import urllib.request
from typing import Any

from trident.perf.inputs import InputSpec, ModelInfo
from trident.perf.measure import ServerStats, server_stats_from_fields, server_stats_from_json
from trident.perf.wire import H2Connection, PerfError, _field, _varint, decode_fields, grpc_messages

__all__ = ["Control", "open_control", "fetch_metrics"]

_SERVICE = "/inference.GRPCInferenceService/"
_MAX_REPLY = 64 << 20


def http_json(base: str, path: str, body: dict[str, Any] | None, timeout: float, limit: int = _MAX_REPLY) -> Any:
    """GET ``base + path`` (POST ``body`` as JSON when given) and decode the JSON answer.

    Raises PerfError with the server's error message for an HTTP error, and when the server
    cannot be reached."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(base + path, data=data, method="GET" if body is None else "POST",
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            raw = r.read(limit)
    except urllib.error.HTTPError as e:
        text = e.read(4096).decode(errors="replace")
        try:
            text = json.loads(text).get("error", text)
        except ValueError:
            pass
        raise PerfError(f"{path}: HTTP {e.code}: {text}") from None
    except (urllib.error.URLError, OSError) as e:
        raise PerfError(f"cannot reach the server at {base}: {getattr(e, 'reason', e)}") from None
    return json.loads(raw) if raw else {}


class Control(abc.ABC):
    """Common surface of the HTTP and gRPC control clients."""

    @abc.abstractmethod
    def model_info(self, model: str, version: str) -> ModelInfo: ...

    @abc.abstractmethod
    def stats(self, model: str, version: str) -> ServerStats: ...

    @abc.abstractmethod
    def register_system_shm(self, name: str, key: str, size: int) -> None: ...

    @abc.abstractmethod
    def unregister_system_shm(self, name: str) -> None: ...

    @abc.abstractmethod
    def register_cuda_shm(self, name: str, raw_handle: bytes, device_id: int, size: int) -> None: ...

    @abc.abstractmethod
    def unregister_cuda_shm(self, name: str) -> None: ...

    def close(self) -> None:  # noqa: B027 - optional hook: an HTTP control holds no connection
        """Release the connection (the gRPC control's)."""


def _split(url: str, default_port: int) -> tuple[str, int]:
    url = url.split("://", 1)[-1].rstrip("/")
    host, sep, port = url.rpartition(":")
    if not sep:
        return url, default_port
    try:
        return host.strip("[]"), int(port)
    except ValueError:
        raise PerfError(f"bad URL '{url}': the port must be a number") from None


def _info(name: str, version: str, meta_inputs: list[tuple[str, str, list[int]]], outputs: list[str],
          max_batch: int, decoupled: bool) -> ModelInfo:
    inputs = []
    for iname, dtype, shape in meta_inputs:
        dims = tuple(shape[1:]) if max_batch > 0 and shape else tuple(shape)
        inputs.append(InputSpec(iname, dtype, dims))
    return ModelInfo(name, version, tuple(inputs), tuple(outputs), max_batch, decoupled)


class HTTPControl(Control):
    def __init__(self, url: str, timeout_s: float) -> None:
        host, port = _split(url, 8000)
        self.base = f"http://{host}:{port}"
        self.timeout = timeout_s

    def _call(self, path: str, body: dict[str, Any] | None = None) -> Any:
        return http_json(self.base, path, body, self.timeout)

    def model_info(self, model: str, version: str) -> ModelInfo:
        prefix = f"/v2/models/{model}" + (f"/versions/{version}" if version else "")
        meta = self._call(prefix)
        config = self._call(prefix + "/config")
        return _info(model, version, [(i["name"], i["datatype"], [int(d) for d in i["shape"]]) for i in meta["inputs"]],
                     [o["name"] for o in meta.get("outputs", [])], int(config.get("max_batch_size", 0) or 0),
                     bool((config.get("model_transaction_policy") or {}).get("decoupled", False)))

    def stats(self, model: str, version: str) -> ServerStats:
        doc = self._call(f"/v2/models/{model}" + (f"/versions/{version}" if version else "") + "/stats")
        return server_stats_from_json(doc, version)

    def register_system_shm(self, name: str, key: str, size: int) -> None:
        self._call(f"/v2/systemsharedmemory/region/{name}/register", {"key": key, "offset": 0, "byte_size": size})

    def unregister_system_shm(self, name: str) -> None:
        self._call(f"/v2/systemsharedmemory/region/{name}/unregister", {})

    def register_cuda_shm(self, name: str, raw_handle: bytes, device_id: int, size: int) -> None:
        self._call(f"/v2/cudasharedmemory/region/{name}/register",
                   {"raw_handle": {"b64": base64.b64encode(raw_handle).decode()}, "device_id": device_id,
                    "byte_size": size})

    def unregister_cuda_shm(self, name: str) -> None:
        self._call(f"/v2/cudasharedmemory/region/{name}/unregister", {})


class GRPCControl(Control):
    def __init__(self, url: str, timeout_s: float) -> None:
        host, port = _split(url, 8001)
        self.timeout = timeout_s
        self.where = f"{host}:{port}"
        try:
            self.sock = socket.create_connection((host, port), timeout=timeout_s)
        except OSError as e:
            raise PerfError(f"cannot reach the server at {self.where}: {e.strerror or e}") from None
        self.h2 = H2Connection(self.where, keep_data=True)
        self.sock.sendall(self.h2.initiate())

    def _call(self, method: str, message: bytes) -> dict[int, list[object]]:
        stream = self.h2.start(_SERVICE + method)
        self.h2.send_message(stream, message, end=True)
        deadline = time.monotonic() + self.timeout
        try:
            self.sock.sendall(self.h2.outgoing())
            while True:
                self.sock.settimeout(max(0.01, deadline - time.monotonic()))
                data = self.sock.recv(1 << 20)
                if not data:
                    raise PerfError(f"the server at {self.where} closed the connection")
                events = self.h2.receive(data)
                out = self.h2.outgoing()
                if out:
                    self.sock.sendall(out)
                for ev in events:
                    if ev.stream != stream:
                        continue
                    if ev.status != 0:
                        raise PerfError(f"{method}: gRPC status {ev.status}: {ev.message}")
                    body = bytearray(ev.data)
                    msgs = list(grpc_messages(body))
                    return decode_fields(msgs[0]) if msgs else {}
        except TimeoutError:
            raise PerfError(f"{method}: no answer from {self.where} within {self.timeout:g} s") from None
        except OSError as e:
            raise PerfError(f"cannot reach the server at {self.where}: {e.strerror or e}") from None

    def model_info(self, model: str, version: str) -> ModelInfo:
        req = _field(1, model.encode()) + (_field(2, version.encode()) if version else b"")
        meta = self._call("ModelMetadata", req)
        config = decode_fields(self._call("ModelConfig", req).get(1, [b""])[0])  # type: ignore[arg-type]
        inputs = []
        for raw in meta.get(4, []):
            t = decode_fields(raw)  # type: ignore[arg-type]
            shape = _packed(t.get(3, []))
            inputs.append((_s(t, 1), _s(t, 2), shape))
        outputs = [_s(decode_fields(raw), 1) for raw in meta.get(5, [])]  # type: ignore[arg-type]
        policy = decode_fields(config.get(19, [b""])[0])  # type: ignore[arg-type]
        max_batch = int(config.get(4, [0])[0])  # type: ignore[call-overload]
        return _info(model, version, inputs, outputs, max_batch, bool(policy.get(1, [0])[0]))

    def stats(self, model: str, version: str) -> ServerStats:
        reply = self._call("ModelStatistics", _field(1, model.encode()) + (_field(2, version.encode()) if version else b""))
        entries = [decode_fields(raw) for raw in reply.get(1, [])]  # type: ignore[arg-type]
        return server_stats_from_fields(entries, decode_fields, version)

    def register_system_shm(self, name: str, key: str, size: int) -> None:
        self._call("SystemSharedMemoryRegister", _field(1, name.encode()) + _field(2, key.encode())
                   + _varint(4 << 3) + _varint(size))

    def unregister_system_shm(self, name: str) -> None:
        self._call("SystemSharedMemoryUnregister", _field(1, name.encode()))

    def register_cuda_shm(self, name: str, raw_handle: bytes, device_id: int, size: int) -> None:
        self._call("CudaSharedMemoryRegister", _field(1, name.encode()) + _field(2, raw_handle)
                   + _varint(3 << 3) + _varint(device_id) + _varint(4 << 3) + _varint(size))

    def unregister_cuda_shm(self, name: str) -> None:
        self._call("CudaSharedMemoryUnregister", _field(1, name.encode()))

    def close(self) -> None:
        self.sock.close()


def _s(fields: dict[int, list[object]], number: int) -> str:
    v = fields.get(number, [b""])[0]
    return v.decode() if isinstance(v, bytes) else str(v)


def _packed(values: list[object]) -> list[int]:
    out: list[int] = []
    for v in values:
        if isinstance(v, int):
            out.append(v - (1 << 64) if v >= 1 << 63 else v)
            continue
        buf, pos = bytes(v), 0  # type: ignore[call-overload]
        while pos < len(buf):
            n = shift = 0
            while True:
                b = buf[pos]
                pos += 1
                n |= (b & 0x7F) << shift
                shift += 7
                if b < 0x80:
                    break
            out.append(n - (1 << 64) if n >= 1 << 63 else n)
    return out


def open_control(protocol: str, url: str, timeout_s: float = 10.0) -> Control:
    """The control client for ``protocol`` (``http`` or ``grpc``); raises :class:`PerfError`."""
    return HTTPControl(url, timeout_s) if protocol == "http" else GRPCControl(url, timeout_s)


def fetch_metrics(url: str, timeout_s: float = 5.0) -> str:
    """The Prometheus text page at ``url``; raises :class:`PerfError`."""
    if "://" not in url:
        url = "http://" + url
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as r:
            return r.read(_MAX_REPLY).decode(errors="replace")  # type: ignore[no-any-return]
    except (urllib.error.URLError, OSError) as e:
        raise PerfError(f"cannot read metrics at {url}: {getattr(e, 'reason', e)}") from None
