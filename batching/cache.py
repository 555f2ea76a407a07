"""The response cache (``--cache-config local,size=N`` and ``response_cache { enable: true }``).

Like Triton's ``local`` cache: a server-wide LRU of successful responses bounded by bytes,
keyed by a 64-bit hash of the model name, version and the request's inputs (name, datatype,
shape and data). trident also hashes the requested outputs and their parameters
(classification), so two requests asking for different outputs never share an entry. A hit
answers without queueing or executing; a response larger than the whole cache is not stored.

Statistics: :meth:`ResponseCache.statistics` for the server-wide figures; the per-model
``cache_hit`` / ``cache_miss`` durations live in :class:`trident.observability.stats.StatsRecorder` (hit:
the lookup; miss: the lookup plus the insertion, as in Triton).
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from trident.protocol.datatypes import serialize_bytes
from trident.types import InferenceRequest, InferenceResponse, ParamValue, Tensor

_ENTRY_OVERHEAD = 128  # bytes accounted per entry besides its tensors
_TENSOR_OVERHEAD = 64


@dataclass(frozen=True, slots=True)
class CacheConfig:
    """``--cache-config`` settings of the one supported cache, ``local``."""

    size: int


def parse_cache_config(entries: Iterable[str]) -> CacheConfig | None:
    """``--cache-config <cache>,<key>=<value>`` entries -> the local cache config (None: no cache).

    Raises ValueError for a malformed entry, a cache other than ``local`` (redis is not
    provided) or a missing/invalid ``size``.
    """
    settings: dict[str, str] = {}
    for entry in entries:
        cache, sep, kv = entry.partition(",")
        key, eq, value = kv.partition("=")
        if not sep or not eq or not cache or not key:
            raise ValueError(f"--cache-config expects <cache_name>,<key>=<value>, got '{entry}'")
        if cache != "local":
            raise ValueError(f"response cache '{cache}' is not supported; trident provides 'local' "
                             "(--cache-config local,size=<bytes>)")
        settings[key] = value
    if not settings:
        return None
    unknown = sorted(set(settings) - {"size"})
    if unknown:
        raise ValueError(f"unknown setting(s) {unknown} for the local response cache (it takes 'size')")
    if "size" not in settings:
        raise ValueError("the local response cache needs 'size' (--cache-config local,size=<bytes>)")
    try:
        size = int(settings["size"])
    except ValueError:
        raise ValueError(f"invalid local response cache size '{settings['size']}'") from None
    if size < 0:
        raise ValueError(f"invalid local response cache size '{settings['size']}'")
    return CacheConfig(size)


def request_key(model_name: str, version: int | str, request: InferenceRequest) -> int:
    """The 64-bit cache key of ``request`` for one model version."""
    h = hashlib.blake2b(digest_size=8)
    h.update(f"{model_name}\0{version}\0".encode())
    for tensor in sorted(request.inputs, key=lambda t: t.name):
        h.update(f"{tensor.name}\0{tensor.datatype}\0{','.join(map(str, tensor.shape))}\0".encode())
        if tensor.datatype == "BYTES":
            h.update(serialize_bytes(tensor.data))
        else:
            h.update(np.ascontiguousarray(tensor.data).reshape(-1).view(np.uint8).data)
    for wanted in request.outputs:
        params = ",".join(f"{k}={v!r}" for k, v in sorted(wanted.parameters.items()) if k != "binary_data")
        h.update(f"out\0{wanted.name}\0{params}\0".encode())
    return int.from_bytes(h.digest(), "little")


@dataclass(frozen=True, slots=True)
class _Entry:
    outputs: tuple[Tensor, ...]
    parameters: tuple[tuple[str, ParamValue], ...]
    nbytes: int


@dataclass(frozen=True, slots=True)
class CacheStatistics:
    """Server-wide figures of the response cache."""

    capacity: int
    used: int
    entries: int
    lookups: int
    hits: int
    misses: int
    inserts: int
    evictions: int

    @property
    def utilization(self) -> float:
        return self.used / self.capacity if self.capacity else 0.0


class ResponseCache:
    """An LRU of responses bounded by ``capacity`` bytes. Used from the trio thread only."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._entries: OrderedDict[int, _Entry] = OrderedDict()
        self._used = 0
        self._lookups = self._hits = self._misses = self._inserts = self._evictions = 0

    @classmethod
    def from_config(cls, config: CacheConfig | None) -> ResponseCache | None:
        return None if config is None else cls(config.size)

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: int) -> bool:
        return key in self._entries

    def lookup(self, key: int) -> InferenceResponse | None:
        """A fresh response built from the entry for ``key`` (None on a miss)."""
        self._lookups += 1
        entry = self._entries.get(key)
        if entry is None:
            self._misses += 1
            return None
        self._entries.move_to_end(key)
        self._hits += 1
        return InferenceResponse(
            outputs=[Tensor(t.name, t.datatype, t.shape, t.data, dict(t.parameters)) for t in entry.outputs],
            parameters=dict(entry.parameters),
        )

    def insert(self, key: int, response: InferenceResponse) -> bool:
        """Store a copy of a successful ``response``; evict least recently used entries to fit.

        Returns False (storing nothing) for an error response, an existing key or a response
        larger than the cache.
        """
        if response.error is not None or key in self._entries:
            return False
        outputs = tuple(
            Tensor(t.name, t.datatype, t.shape, t.data.copy(), dict(t.parameters))
            for t in response.outputs
        )
        nbytes = _ENTRY_OVERHEAD + sum(t.nbytes + _TENSOR_OVERHEAD for t in outputs)
        if nbytes > self.capacity:
            return False
        while self._used + nbytes > self.capacity and self._entries:
            _, old = self._entries.popitem(last=False)
            self._used -= old.nbytes
            self._evictions += 1
        params = tuple((k, v) for k, v in response.parameters.items() if k != "triton_final_response")
        self._entries[key] = _Entry(outputs, params, nbytes)
        self._used += nbytes
        self._inserts += 1
        return True

    def statistics(self) -> CacheStatistics:
        return CacheStatistics(self.capacity, self._used, len(self._entries), self._lookups, self._hits,
                               self._misses, self._inserts, self._evictions)
