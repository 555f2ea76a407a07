"""Field metadata of betterproto2 messages, and the protobuf JSON mapping built on it (sans-IO).

:func:`message_info` reads a message class's betterproto2 metadata once (proto field names,
types, enums, repeated, maps, oneofs) for the text-format codec in :mod:`.pbtxt` and the JSON
codec here. :func:`message_to_json` / :func:`message_from_json` are protobuf's JSON mapping
with Triton's conventions: proto field names, fields without presence always printed, 64-bit
integers as JSON numbers.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import json
import keyword
import math
from collections.abc import Callable
from typing import Any, TypeVar

import betterproto2

from trident.errors import TritonError, invalid_arg
from trident.protocol.generated.message_pool import default_message_pool

M = TypeVar("M", bound=betterproto2.Message)

__all__ = [
    "FieldInfo",
    "MessageInfo",
    "enum_names",
    "enum_values",
    "message_from_json",
    "message_info",
    "message_to_json",
]


@dataclasses.dataclass(frozen=True, eq=False)
class FieldInfo:
    """One field of a betterproto2 message, as the text and JSON codecs need it.

    ``name`` is the proto field name (``global`` for the Python attribute ``global_``),
    ``json_name`` its lowerCamelCase form, ``py_type`` the element type (message class, enum
    class or builtin). Map fields carry ``map_key``/``map_value`` descriptions of the entry.
    """

    name: str
    attr: str
    json_name: str
    proto_type: str
    py_type: Any
    repeated: bool = False
    group: str | None = None
    has_presence: bool = False
    map_key: FieldInfo | None = None
    map_value: FieldInfo | None = None
    entry_info: MessageInfo | None = None

    @property
    def is_message(self) -> bool:
        return self.proto_type in (betterproto2.TYPE_MESSAGE, betterproto2.TYPE_MAP)

    def default(self) -> Any:
        """The proto3 default of a singular scalar (enum member 0 for enums)."""
        if self.proto_type == betterproto2.TYPE_ENUM:
            return self.py_type(0)
        return _SCALAR_DEFAULTS[self.proto_type]()


@dataclasses.dataclass(frozen=True, eq=False)
class MessageInfo:
    """Fields of a message class in declaration order, by proto name and by JSON name."""

    full_name: str
    fields: tuple[FieldInfo, ...]
    by_name: dict[str, FieldInfo]
    by_json_name: dict[str, FieldInfo]
    oneofs: dict[str, tuple[FieldInfo, ...]]


_SCALAR_DEFAULTS: dict[str, Callable[[], Any]] = {
    betterproto2.TYPE_STRING: str,
    betterproto2.TYPE_BYTES: bytes,
    betterproto2.TYPE_BOOL: bool,
    betterproto2.TYPE_FLOAT: float,
    betterproto2.TYPE_DOUBLE: float,
}
for _t in (
    betterproto2.TYPE_INT32, betterproto2.TYPE_INT64, betterproto2.TYPE_UINT32, betterproto2.TYPE_UINT64,
    betterproto2.TYPE_SINT32, betterproto2.TYPE_SINT64, betterproto2.TYPE_FIXED32, betterproto2.TYPE_FIXED64,
    betterproto2.TYPE_SFIXED32, betterproto2.TYPE_SFIXED64,
):  # fmt: skip
    _SCALAR_DEFAULTS[_t] = int

_INFOS: dict[type, MessageInfo] = {}
_ENUM_VALUES: dict[type, dict[str, Any]] = {}
_ENUM_NAMES: dict[type, dict[int, str]] = {}


def _json_name(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(part[:1].upper() + part[1:] for part in rest)


def _proto_name(attr: str) -> str:
    if attr.endswith("_") and keyword.iskeyword(attr[:-1]):
        return attr[:-1]
    return attr


def message_info(cls: type[betterproto2.Message]) -> MessageInfo:
    """Field metadata of a betterproto2 message class (built once per class, then cached)."""
    info = _INFOS.get(cls)
    if info is not None:
        return info
    url = default_message_pool.type_to_url.get(cls, "")
    full_name = url.rpartition("/")[2] or cls.__name__
    hints = cls._type_hints()
    fields: list[FieldInfo] = []
    for dc_field in dataclasses.fields(cls):  # type: ignore[arg-type]
        meta = betterproto2.FieldMetadata.get(dc_field)
        attr = dc_field.name
        name = _proto_name(attr)
        hint = hints[attr]
        args = getattr(hint, "__args__", None)
        if meta.proto_type == betterproto2.TYPE_MAP:
            assert meta.map_meta is not None and args is not None
            key = FieldInfo("key", "key", "key", meta.map_meta[0].proto_type, args[0])
            value = FieldInfo(
                "value", "value", "value", meta.map_meta[1].proto_type, args[1], has_presence=True
            )
            entry = MessageInfo(
                f"{full_name}.{name}Entry", (key, value), {"key": key, "value": value}, {}, {}
            )
            fields.append(
                FieldInfo(name, attr, _json_name(name), meta.proto_type, None,
                          repeated=True, map_key=key, map_value=value, entry_info=entry)
            )  # fmt: skip
            continue
        py_type = args[0] if args else hint
        presence = bool(meta.optional or meta.group) or meta.proto_type == betterproto2.TYPE_MESSAGE
        fields.append(
            FieldInfo(name, attr, _json_name(name), meta.proto_type, py_type,
                      repeated=bool(meta.repeated), group=meta.group, has_presence=presence and not meta.repeated)
        )  # fmt: skip
    by_json = {f.json_name: f for f in fields}
    by_json.update({f.name: f for f in fields})
    oneofs: dict[str, list[FieldInfo]] = {}
    for f in fields:
        if f.group is not None:
            oneofs.setdefault(f.group, []).append(f)
    info = MessageInfo(
        full_name,
        tuple(fields),
        {f.name: f for f in fields},
        by_json,
        {g: tuple(v) for g, v in oneofs.items()},
    )
    _INFOS[cls] = info
    return info


def enum_values(enum_cls: type) -> dict[str, Any]:
    """Proto value name (``KIND_GPU``, ``TYPE_FP32``) -> member of a betterproto2 enum class."""
    values = _ENUM_VALUES.get(enum_cls)
    if values is None:
        values = {(m.proto_name or m.name): m for m in enum_cls}  # type: ignore[attr-defined]
        _ENUM_VALUES[enum_cls] = values
    return values


def enum_names(enum_cls: type) -> dict[int, str]:
    """Number -> proto value name of a betterproto2 enum class."""
    names = _ENUM_NAMES.get(enum_cls)
    if names is None:
        names = {int(m): name for name, m in enum_values(enum_cls).items()}
        _ENUM_NAMES[enum_cls] = names
    return names


# ---------------------------------------------------------------- JSON mapping

_INT64_TYPES = frozenset(
    (betterproto2.TYPE_INT64, betterproto2.TYPE_UINT64, betterproto2.TYPE_SINT64,
     betterproto2.TYPE_FIXED64, betterproto2.TYPE_SFIXED64)
)  # fmt: skip
_UNSIGNED = frozenset(
    (betterproto2.TYPE_UINT32, betterproto2.TYPE_UINT64, betterproto2.TYPE_FIXED32, betterproto2.TYPE_FIXED64)
)
_FLOAT_TYPES = (betterproto2.TYPE_FLOAT, betterproto2.TYPE_DOUBLE)
_FLOAT_NAMES = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}


def _value_to_json(value: Any, field: FieldInfo) -> Any:
    ptype = field.proto_type
    if ptype == betterproto2.TYPE_MESSAGE:
        return message_to_json(value)
    if ptype == betterproto2.TYPE_ENUM:
        return enum_names(field.py_type).get(int(value), int(value))
    if ptype in _FLOAT_TYPES:
        value = float(value)
        if math.isnan(value):
            return "NaN"
        if math.isinf(value):
            return "Infinity" if value > 0 else "-Infinity"
        return value
    if ptype == betterproto2.TYPE_BYTES:
        return base64.b64encode(value).decode("ascii")
    return value


def message_to_json(message: betterproto2.Message) -> dict[str, Any]:
    """A message as a JSON-ready dict: proto field names in declaration order.

    Scalars, repeated fields and maps are always present (defaults included); unset message
    fields and oneof members are omitted; enums by name (unknown numbers as numbers); 64-bit
    integers as numbers; bytes as base64; NaN/Infinity/-Infinity as strings; map keys as strings.
    """
    out: dict[str, Any] = {}
    for field in message_info(type(message)).fields:
        value = getattr(message, field.attr)
        if field.map_key is not None:
            assert field.map_value is not None
            key_is_bool = field.map_key.proto_type == betterproto2.TYPE_BOOL
            out[field.name] = {
                (("true" if k else "false") if key_is_bool else str(k)): _value_to_json(v, field.map_value)
                for k, v in value.items()
            }
        elif field.repeated:
            out[field.name] = [_value_to_json(v, field) for v in value]
        elif value is not None:
            out[field.name] = _value_to_json(value, field)
    return out


def _json_error(path: str, what: str) -> TritonError:
    return invalid_arg(f"failed to parse model configuration JSON: {path or '<root>'}: {what}")


def _short(raw: Any) -> str:
    text = json.dumps(raw)
    return text if len(text) <= 40 else text[:37] + "..."


def _int_from_json(raw: Any, field: FieldInfo, path: str) -> int:
    value: int | None = None  # stays None for bools and non-integral values
    if isinstance(raw, int) and not isinstance(raw, bool):
        value = raw
    elif isinstance(raw, float) and raw.is_integer():
        value = int(raw)
    elif isinstance(raw, str):
        try:
            value = int(raw, 10)
        except ValueError:
            try:
                number = float(raw)
            except ValueError:
                number = math.nan
            if number.is_integer():
                value = int(number)
    if value is None:
        raise _json_error(path, f"expected an integer, got {_short(raw)}")
    wide = field.proto_type in _INT64_TYPES
    if field.proto_type in _UNSIGNED:
        lo, hi = 0, (2**64 - 1 if wide else 2**32 - 1)
    else:
        lo, hi = (-(2**63), 2**63 - 1) if wide else (-(2**31), 2**31 - 1)
    if not lo <= value <= hi:
        raise _json_error(path, f"integer {value} out of range for {field.proto_type}")
    return value


def _value_from_json(raw: Any, field: FieldInfo, path: str) -> Any:
    ptype = field.proto_type
    if ptype == betterproto2.TYPE_MESSAGE:
        return _message_from_json(field.py_type, raw, path)
    if ptype == betterproto2.TYPE_ENUM:
        if isinstance(raw, str):
            values = enum_values(field.py_type)
            member = values.get(raw, values.get(raw.upper()))
            if member is None:
                raise _json_error(path, f"unknown value {_short(raw)} for enum {field.py_type.__name__}")
            return member
        return field.py_type(_int_from_json(raw, field, path))
    if ptype == betterproto2.TYPE_BOOL:
        if not isinstance(raw, bool):
            raise _json_error(path, f"expected a boolean, got {_short(raw)}")
        return raw
    if ptype == betterproto2.TYPE_STRING:
        if not isinstance(raw, str):
            raise _json_error(path, f"expected a string, got {_short(raw)}")
        return raw
    if ptype == betterproto2.TYPE_BYTES:
        if not isinstance(raw, str):
            raise _json_error(path, f"expected a base64 string, got {_short(raw)}")
        try:
            return base64.b64decode(
                raw.replace("-", "+").replace("_", "/") + "=" * (-len(raw) % 4), validate=True
            )
        except (binascii.Error, ValueError):
            raise _json_error(path, "invalid base64 data") from None
    if ptype in _FLOAT_TYPES:
        if isinstance(raw, (int, float)) and not isinstance(raw, bool):
            return float(raw)
        if isinstance(raw, str):
            if raw in _FLOAT_NAMES:
                return _FLOAT_NAMES[raw]
            try:
                return float(raw)
            except ValueError:
                pass
        raise _json_error(path, f"expected a number, got {_short(raw)}")
    return _int_from_json(raw, field, path)


def _map_key_from_json(key: str, field: FieldInfo, path: str) -> Any:
    if field.proto_type == betterproto2.TYPE_STRING:
        return key
    if field.proto_type == betterproto2.TYPE_BOOL:
        if key not in ("true", "false"):
            raise _json_error(path, f"expected a boolean map key, got {_short(key)}")
        return key == "true"
    return _int_from_json(key, field, path)


def _message_from_json(cls: type[M], raw: Any, path: str) -> M:
    if not isinstance(raw, dict):
        raise _json_error(path, f"expected an object, got {_short(raw)}")
    info = message_info(cls)
    message = cls()
    for key, value in raw.items():
        field = info.by_json_name.get(key)
        sub = f"{path}.{key}" if path else key
        if field is None:
            raise _json_error(path, f'message type "{info.full_name}" has no field named "{key}"')
        if value is None:
            continue
        if field.group is not None:
            for other in info.oneofs[field.group]:
                if other is not field and getattr(message, other.attr) is not None:
                    raise _json_error(
                        sub, f'"{field.name}" and "{other.name}" are both set in oneof "{field.group}"'
                    )
        if field.map_key is not None:
            assert field.map_value is not None
            if not isinstance(value, dict):
                raise _json_error(sub, f"expected an object, got {_short(value)}")
            target = getattr(message, field.attr)
            for k, v in value.items():
                target[_map_key_from_json(k, field.map_key, sub)] = _value_from_json(
                    v, field.map_value, f"{sub}[{json.dumps(k)}]"
                )
        elif field.repeated:
            if not isinstance(value, list):
                raise _json_error(sub, f"expected a list, got {_short(value)}")
            setattr(
                message, field.attr, [_value_from_json(v, field, f"{sub}[{i}]") for i, v in enumerate(value)]
            )
        else:
            setattr(message, field.attr, _value_from_json(value, field, sub))
    return message


def message_from_json(cls: type[M], raw: Any) -> M:
    """A ``cls`` message from parsed JSON (protobuf's JSON mapping, as Triton's parser accepts it).

    Field names in proto (snake_case) or lowerCamelCase form; enums by name (case-insensitive)
    or number; integers as numbers, integral floats or strings; floats also as "NaN",
    "Infinity", "-Infinity"; ``null`` leaves a field unset. Raises INVALID_ARG with the path of
    the offending value for unknown fields, wrong types and out-of-range numbers.
    """
    return _message_from_json(cls, raw, "")
