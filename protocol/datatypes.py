"""Triton datatypes: names, numpy dtypes, element sizes and the BYTES wire encoding (sans-IO).

Representation in trident (documented in README "Datatypes"):

* every fixed-size type is a numpy array of the matching dtype, little-endian;
* ``BYTES`` is a numpy ``object`` array whose elements are ``bytes``;
* ``BF16`` has no numpy dtype: it is carried as a ``uint16`` array holding the raw bfloat16
  bit patterns (the upper half of an IEEE float32). :func:`bf16_to_float32` and
  :func:`float32_to_bf16` convert.
"""

from __future__ import annotations

import array
import itertools
import math
import struct
import threading
from collections.abc import Callable, Iterable, Sequence

import numpy as np

# API datatype name -> numpy dtype (BYTES -> object, BF16 -> uint16 bit patterns)
_NP: dict[str, np.dtype] = {
    "BOOL": np.dtype(np.bool_),
    "UINT8": np.dtype("<u1"),
    "UINT16": np.dtype("<u2"),
    "UINT32": np.dtype("<u4"),
    "UINT64": np.dtype("<u8"),
    "INT8": np.dtype("<i1"),
    "INT16": np.dtype("<i2"),
    "INT32": np.dtype("<i4"),
    "INT64": np.dtype("<i8"),
    "FP16": np.dtype("<f2"),
    "FP32": np.dtype("<f4"),
    "FP64": np.dtype("<f8"),
    "BF16": np.dtype("<u2"),
    "BYTES": np.dtype(object),
}

DATATYPES: tuple[str, ...] = tuple(_NP)

# config.pbtxt enum name (TYPE_*) <-> API datatype string
_CONFIG_TO_API = {f"TYPE_{name}": name for name in DATATYPES if name != "BYTES"}
_CONFIG_TO_API["TYPE_STRING"] = "BYTES"
_API_TO_CONFIG = {v: k for k, v in _CONFIG_TO_API.items()}

_SIZES = {name: dt.itemsize for name, dt in _NP.items() if name != "BYTES"}

_NP_TO_API: dict[np.dtype, str] = {
    np.dtype(np.bool_): "BOOL",
    np.dtype(np.uint8): "UINT8",
    np.dtype(np.uint16): "UINT16",
    np.dtype(np.uint32): "UINT32",
    np.dtype(np.uint64): "UINT64",
    np.dtype(np.int8): "INT8",
    np.dtype(np.int16): "INT16",
    np.dtype(np.int32): "INT32",
    np.dtype(np.int64): "INT64",
    np.dtype(np.float16): "FP16",
    np.dtype(np.float32): "FP32",
    np.dtype(np.float64): "FP64",
    np.dtype(object): "BYTES",
}


def is_datatype(name: str) -> bool:
    return name in _NP


def numpy_dtype(datatype: str) -> np.dtype:
    """numpy dtype for an API datatype; raises KeyError for unknown names."""
    return _NP[datatype]


def element_size(datatype: str) -> int | None:
    """Bytes per element, or None for BYTES (variable length)."""
    return _SIZES.get(datatype)


def datatype_of(array: np.ndarray) -> str:
    """API datatype of a numpy array (byte strings and unicode arrays are BYTES)."""
    dt = array.dtype
    api = _NP_TO_API.get(dt)  # the common case: one dict lookup (dtype.name builds a string)
    if api is not None:
        return api
    if dt.kind in ("S", "U", "O"):
        return "BYTES"
    if dt.name == "bfloat16":  # ml_dtypes.bfloat16 (what tritonclient uses)
        return "BF16"
    try:
        return _NP_TO_API[dt.newbyteorder("=") if dt.byteorder == ">" else dt]
    except KeyError:
        raise ValueError(f"unsupported numpy dtype {dt}") from None


def config_to_api(config_type: str) -> str:
    """'TYPE_FP32' -> 'FP32', 'TYPE_STRING' -> 'BYTES'."""
    return _CONFIG_TO_API[config_type]


def api_to_config(datatype: str) -> str:
    """'FP32' -> 'TYPE_FP32', 'BYTES' -> 'TYPE_STRING'."""
    return _API_TO_CONFIG[datatype]


def element_count(shape: Iterable[int]) -> int:
    return math.prod(shape)


# ---- BYTES wire form: each element is a 4-byte little-endian length then the bytes ----

_LEN = struct.Struct("<I")


def serialize_bytes(array: np.ndarray) -> bytes:
    """Row-major BYTES elements as length-prefixed bytes. str elements are UTF-8 encoded."""
    parts = serialize_bytes_parts(array)
    return parts[0] if len(parts) == 1 else b"".join(parts)


def serialize_bytes_parts(array: np.ndarray) -> list[bytes]:
    """:func:`serialize_bytes` in parts of ``FILL_SLICE`` elements each (none for no element):
    each part is made by C code over its elements (numpy for the lengths and the prefixes, one
    join for the payload), and the interpreter can hand the GIL over between two parts, so a
    caller that writes the parts in turn never holds it long (element by element in Python,
    15M elements took ~15 s, with a struct pack per element ~4.5 s; so ~0.4 s)."""
    flat = array.reshape(-1)
    return [_prefixed(flat[start : start + FILL_SLICE].tolist()) for start in range(0, flat.size, FILL_SLICE)]


_NUMPY_PREFIXED = 512  # elements from which _prefixed's numpy way is the faster (measured: 1.0x at 512, 2-3x at 64k)
_JOINABLE = {bytes, bytearray}  # element types joined as they are


def _prefixed(items: list[object]) -> bytes:
    """``items`` as length-prefixed wire elements (str UTF-8 encoded, other objects as their
    str()), by C code only where they are all bytes-like."""
    count = len(items)
    if count < _NUMPY_PREFIXED:  # numpy's setup costs more than it saves
        if not set(map(type, items)) <= _JOINABLE:
            items = [_as_bytes(item) for item in items]
        pack = _LEN.pack
        return b"".join(itertools.chain.from_iterable(zip(map(pack, map(len, items)), items, strict=True)))  # type: ignore[arg-type]
    try:
        payload = b"".join(items)  # type: ignore[arg-type]  # refused (TypeError) for str and others
    except TypeError:
        items = [_as_bytes(item) for item in items]
        payload = b"".join(items)  # type: ignore[arg-type]
    if not payload:  # every element empty (a common padding): the prefixes only
        return bytes(4 * count)
    lengths = np.fromiter(map(len, items), dtype="<u4", count=count)  # type: ignore[arg-type]
    if int(lengths.sum(dtype=np.int64)) != len(payload):  # a memoryview of wider items counts them, not bytes
        return _prefixed([_as_bytes(item) for item in items])
    width = int(lengths[0])
    if bool((lengths == width).all()):  # one width: tokens, ids, hashes
        fixed = np.empty(count, dtype=[("n", "<u4"), ("v", f"V{width}")])
        fixed["n"] = lengths
        fixed["v"] = np.frombuffer(payload, dtype=f"V{width}")
        return fixed.tobytes()
    out = np.empty(4 * count + len(payload), dtype=np.uint8)
    # where each prefix starts: 4 bytes for each element before it plus their payload
    starts = np.arange(0, 4 * count, 4, dtype=np.int64)
    starts[1:] += np.cumsum(lengths[:-1], dtype=np.int64)
    is_payload = np.ones(out.size, dtype=bool)
    prefix_at = (starts[:, None] + np.arange(4)).reshape(-1)
    is_payload[prefix_at] = False
    out[prefix_at] = lengths.view(np.uint8)
    out[is_payload] = np.frombuffer(payload, dtype=np.uint8)
    return out.tobytes()


def _as_bytes(item: object) -> bytes | bytearray:
    if isinstance(item, (bytes, bytearray)):
        return item
    if isinstance(item, str):
        return item.encode("utf-8")
    if isinstance(item, memoryview):
        return item.tobytes()
    return str(item).encode("utf-8")


#: elements put into an object array (or serialized, or let go of) per call with the GIL held:
#: ~0.3-1 ms each on a VM whose first touch of a page is slow (16k elements held it 5-8 ms at a
#: time: making the elements touches fresh interpreter memory); smaller slices cost no more
FILL_SLICE = 1 << 12
#: BYTES elements from which serializing an output leaves the event loop (~5 ms and up)
SERIALIZE_MANY = 1 << 14


def deserialize_bytes(buffer: bytes | bytearray | memoryview, count: int | None = None) -> np.ndarray:
    """Parse length-prefixed BYTES elements into a 1-D object array.

    Elements that all have one length (``count`` given: the usual tokens, ids and hashes, or a
    body of empty strings) are found with one strided numpy read of the length prefixes and
    copied out a slice at a time (~15M empty elements in ~0.2 s); other bodies are walked
    element by element. The array is filled in slices of ``FILL_SLICE`` elements, so a
    thread decoding a large body lets others run between them.

    Raises ValueError when the buffer is truncated, has trailing bytes, or holds a number of
    elements other than ``count`` (when given).
    """
    view = memoryview(buffer).cast("B")
    end = len(view)
    width = _one_width(view, count) if count else None
    if width is not None:
        return _fixed_width(view, count, width)  # type: ignore[arg-type]  # count is given
    items: list[bytes] = []
    offset = 0
    unpack = _LEN.unpack_from
    while offset < end:
        if offset + 4 > end:
            raise ValueError("BYTES element length prefix is truncated")
        (length,) = unpack(view, offset)
        offset += 4
        if offset + length > end:
            raise ValueError("BYTES element is truncated")
        items.append(bytes(view[offset : offset + length]))
        offset += length
        if count is not None and len(items) > count:
            raise ValueError(f"BYTES data holds more than the {count} elements its shape declares")
    if count is not None and len(items) != count:
        raise ValueError(f"BYTES data holds {len(items)} elements, its shape declares {count}")
    total = len(items)
    out = object_array((items[start : start + FILL_SLICE] for start in range(0, total, FILL_SLICE)), total)
    while items:  # the list let go a slice at a time, from its end (freed whole: one long call)
        del items[-FILL_SLICE:]
    return out


WIRE_MIN = 4096  # BYTES elements from which a decoded input is held as WireBytes (fewer: an object array)


class WireBytes:
    """A BYTES tensor's elements in their wire form, checked, with no Python object per element:
    ``count`` elements, each a 4-byte little-endian length then its bytes, filling ``buffer``
    exactly (a view of the request's body or message; holding it keeps that alive).

    A model that reads the elements gets them from :meth:`objects`; one that does not (a BLS
    call forwarding the tensor, an input it ignores) and an output that is an input returned
    unchanged never make them, and the answer carries ``buffer`` as it came.
    """

    __slots__ = ("buffer", "count", "width", "ends")

    def __init__(self, buffer: memoryview, count: int, width: int | None,
                 ends: array.array[int] | None = None) -> None:
        self.buffer = buffer
        self.count = count
        self.width = width  # every element's length when they share one, else None
        self.ends = ends  # (other elements) where each element ends in the buffer

    @classmethod
    def parse(cls, buffer: bytes | bytearray | memoryview, count: int) -> WireBytes:
        """``buffer`` checked to hold exactly ``count`` elements. One strided numpy read when
        the elements share a length; otherwise a walk over the length prefixes (no object made
        per element). Raises ValueError as :func:`deserialize_bytes` does."""
        view = memoryview(buffer).cast("B")
        end = len(view)
        width = _one_width(view, count)
        if width is not None:
            return cls(view, count, width)
        # one element per turn, its end kept (objects() cuts the elements out by C code); the
        # walk never goes past ``count`` elements, so a body of tiny elements costs no more
        ends = array.array("q")
        append = ends.append
        unpack = _LEN.unpack_from
        offset = 0
        try:
            for _ in range(count):
                offset += 4 + unpack(view, offset)[0]
                append(offset)
        except struct.error:  # a length prefix past the end (an element before it cut short)
            offset = -1
        if offset != end:
            raise ValueError(_fault(view, count))
        return cls(view, count, None, ends)

    def objects(self) -> np.ndarray:
        """The elements as a new 1-D object array of ``bytes``, made a slice at a time (see
        :func:`object_array`): elements of one length by one strided numpy read, others cut
        out of a copy of their slice of the buffer by C code (``map`` of slices)."""
        if self.width is not None:
            return _fixed_width(self.buffer, self.count, self.width)
        assert self.ends is not None
        ends = np.frombuffer(self.ends, dtype=np.int64)
        view = self.buffer

        def cut(start: int, stop: int) -> list[bytes]:
            first = int(ends[start - 1]) if start else 0
            piece = bytes(view[first : int(ends[stop - 1])])
            starts = np.empty(stop - start, dtype=np.int64)
            starts[0] = 4
            starts[1:] = ends[start : stop - 1] - (first - 4)
            return list(map(piece.__getitem__, map(slice, starts.tolist(), (ends[start:stop] - first).tolist())))

        count = self.count
        return object_array((cut(start, min(start + FILL_SLICE, count)) for start in range(0, count, FILL_SLICE)),
                            count)


def _one_width(view: memoryview, count: int) -> int | None:
    """The length every one of ``count`` elements in ``view`` has, when they share one and fill
    it exactly (one strided numpy read of the length prefixes); None otherwise."""
    if count <= 0 or len(view) < 4:
        return None
    (width,) = _LEN.unpack_from(view, 0)
    if count * (4 + width) != len(view):
        return None
    lengths = np.ndarray((count,), dtype="<u4", buffer=view, offset=0, strides=(4 + width,))
    return int(width) if bool((lengths == width).all()) else None


def _fault(view: memoryview, count: int) -> str:
    """What is wrong with BYTES data that does not hold ``count`` elements exactly."""
    end = len(view)
    offset = seen = 0
    while offset < end:
        if offset + 4 > end:
            return "BYTES element length prefix is truncated"
        offset += 4 + _LEN.unpack_from(view, offset)[0]
        if offset > end:
            return "BYTES element is truncated"
        seen += 1
        if seen > count:
            return f"BYTES data holds more than the {count} elements its shape declares"
    return f"BYTES data holds {seen} elements, its shape declares {count}"


def _fixed_width(view: memoryview, count: int, width: int) -> np.ndarray:
    """``count`` elements of ``width`` bytes each, every one behind its 4-byte prefix."""
    if not width:
        return object_array(((b"",) * min(FILL_SLICE, count - start) for start in range(0, count, FILL_SLICE)),
                            count)
    # unstructured void items come out as bytes, exactly (numpy's "S" would drop trailing NULs)
    fields = np.ndarray((count,), dtype=f"V{width}", buffer=view, offset=4, strides=(4 + width,))
    return object_array((fields[start : start + FILL_SLICE].tolist() for start in range(0, count, FILL_SLICE)),
                        count)


def object_array(chunks: Iterable[Sequence[object] | np.ndarray], count: int) -> np.ndarray:
    """A 1-D object array of the ``count`` elements ``chunks`` yield (sequences of at most
    ``FILL_SLICE`` elements; a generator, so that making each is Python code).

    Small arrays are made whole. A large one is never allocated whole first: ``np.empty`` of
    an object array writes ``None`` into every element of freshly mapped memory in one call
    that holds the GIL (15M elements: 150-300 ms on first touch, 25-40 ms after); numpy's
    ``fromiter`` takes memory that is zeroed lazily and fills it as the chunks come, and the
    interpreter can hand the GIL over between two chunks (a few ms at most), at ~1.5x the time.
    """
    if count <= FILL_SLICE:
        out = np.empty(count, dtype=object)
        pos = 0
        for chunk in chunks:
            out[pos : pos + len(chunk)] = chunk
            pos += len(chunk)
        return out
    _small_pages_begin()
    try:
        return np.fromiter(itertools.chain.from_iterable(chunks), dtype=object, count=count)
    finally:
        _small_pages_end()


def _huge_page_setter() -> Callable[[bool], bool] | None:
    """numpy's switch of the huge-page advice for its large arrays (it returns the setting it
    replaced); None where this numpy has none."""
    try:
        from numpy._core import multiarray
    except ImportError:
        return None
    setter = getattr(multiarray, "_set_madvise_hugepage", None)
    return setter if callable(setter) else None


_SET_HUGE_PAGES = _huge_page_setter()
_pages_lock = threading.Lock()
_small_page_fills = 0  # object arrays being filled
_huge_pages_before = True


def _small_pages_begin() -> None:
    """An object array is about to be allocated and filled: numpy's arrays made from now on
    (in any thread) get no huge-page advice, until the last such fill ends.

    numpy asks the kernel for huge pages (``madvise``) for an array of 4 MiB and up; its pages
    are then faulted in 2 MiB at a time, each zeroed by the first write to it. An object
    array's elements are written with the GIL held (one C call, ``fromiter``), so each such
    fault holds the GIL: on this project's VMs 5-10 ms each (the host maps the page too), and
    every other client's request waited behind it (10-18 ms victim latency while 15M BYTES
    elements were made). In 4 KiB pages each fault is a few tens of microseconds. Numeric
    arrays allocated meanwhile by other threads get small pages too: slower to fault in
    (more faults), never wrong."""
    global _small_page_fills, _huge_pages_before
    with _pages_lock:
        if _small_page_fills == 0 and _SET_HUGE_PAGES is not None:
            _huge_pages_before = bool(_SET_HUGE_PAGES(False))
        _small_page_fills += 1


def _small_pages_end() -> None:
    """The fill :func:`_small_pages_begin` announced has ended (the last one puts numpy's
    huge-page advice back as it was)."""
    global _small_page_fills
    with _pages_lock:
        _small_page_fills -= 1
        if _small_page_fills == 0 and _SET_HUGE_PAGES is not None:
            _SET_HUGE_PAGES(_huge_pages_before)


def shrink(array: np.ndarray) -> bool:
    """Let go of the elements of an object array a slice of ``FILL_SLICE`` at a time: numpy's
    ``resize`` drops the elements it cuts, where freeing the array drops them all in one call
    that holds the GIL (15M elements: ~25 ms even when they are one object). The caller
    guarantees that nothing else holds the array or a view of it (it made the array, or counted
    the references in interpreted code: counts differ where this module is compiled). The array
    is empty after. Whether it was done (a view, a small array or one of another dtype is left
    as it is)."""
    if array.dtype != object or array.size <= FILL_SLICE or not array.flags.owndata or not array.flags.c_contiguous:
        return False
    size = array.size
    while size:
        size = max(0, size - FILL_SLICE)
        array.resize(size, refcheck=False)  # nothing else sees it: the caller's guarantee
    return True


def to_bytes_array(values: Iterable[object]) -> np.ndarray:
    """An object array of bytes from str/bytes values (str is UTF-8 encoded)."""
    items = [v.encode("utf-8") if isinstance(v, str) else bytes(v) for v in values]  # type: ignore[call-overload]
    out = np.empty(len(items), dtype=object)
    out[:] = items
    return out


def bf16_to_float32(bits: np.ndarray) -> np.ndarray:
    """uint16 bfloat16 bit patterns -> float32 values."""
    return (np.asarray(bits, dtype="<u2").astype("<u4") << 16).view("<f4")


def float32_to_bf16(values: np.ndarray) -> np.ndarray:
    """float32 values -> uint16 bfloat16 bit patterns (round to nearest even)."""
    u = np.asarray(values, dtype="<f4").view("<u4")
    rounding = ((u >> 16) & 1) + 0x7FFF
    return ((u + rounding) >> 16).astype("<u2")
