"""config.pbtxt: the protobuf text format to and from betterproto2 messages (sans-IO).

The parser is driven by the betterproto2 field metadata of the target message class, so it
handles every message of ``model_config.proto`` (and any other betterproto2 message) without
per-field code. It accepts what Triton's ``google::protobuf::TextFormat`` accepts:

* ``#`` comments; ``,`` or ``;`` after a field;
* nested messages in ``{...}`` or ``<...>``, with an optional ``:`` before them;
* repeated fields as repeated keys (``input {..} input {..}``) or lists
  (``input [ {..}, {..} ]``, ``dims: [1, 2]``); maps as repeated ``{ key: .. value: .. }`` entries;
* enums by name or number; booleans ``true/false/True/False/t/f/1/0``;
* integers in decimal, hex (``0x1F``) and octal (``017``), negative numbers, floats
  (``1e-3``, ``.5``, ``2.0f``, ``inf``, ``-inf``, ``nan``);
* strings in single or double quotes with C escapes (``\\n \\t \\\\ \\" \\' \\xNN \\NNN \\uXXXX
  \\UXXXXXXXX``); adjacent strings are concatenated.

Errors raise :class:`PbtxtError` (``INVALID_ARG``) whose message reads
``<file>:<line>:<column>: <what>`` (line and column start at 1).
"""

from __future__ import annotations

import math
import re
from typing import Any, TypeVar

import betterproto2

from trident.errors import Code, TritonError
from trident.protocol.generated.inference import ModelConfig
from trident.protocol.msgmeta import FieldInfo, MessageInfo, enum_names, enum_values, message_info

M = TypeVar("M", bound=betterproto2.Message)

__all__ = ["PbtxtError", "format_pbtxt", "parse_message", "parse_pbtxt"]


class PbtxtError(TritonError):
    """A config.pbtxt syntax or type error: ``INVALID_ARG`` with ``<file>:<line>:<col>: <what>``."""

    def __init__(self, filename: str, line: int, column: int, reason: str) -> None:
        super().__init__(Code.INVALID_ARG, f"{filename}:{line}:{column}: {reason}")
        self.filename = filename
        self.line = line
        self.column = column
        self.reason = reason


# ---------------------------------------------------------------- tokenizer

# One match per token, whitespace and comments before it skipped. Every character is covered
# by some alternative (``bad`` catches the rest, ``end`` the trailing whitespace), so every
# match succeeds at its first position: finditer never skips input and never backtracks.
_TOKEN_RE = re.compile(
    r"""
    [ \t\r\n\f\v]*(?:\#[^\n]*[ \t\r\n\f\v]*)*
    (?:
     (?P<ident>[A-Za-z_][A-Za-z0-9_]*)
    |(?P<num>(?:[0-9]|\.[0-9])(?:[0-9A-Za-z_.]|(?<=[eE])[+-])*)
    |(?P<str>"(?:[^"\\\n]|\\[^\n])*"|'(?:[^'\\\n]|\\[^\n])*')
    |(?P<sym>[{}<>\[\]:,;\-./])
    |(?P<badstr>["'])
    |(?P<bad>.)
    |(?P<end>\Z)
    )
    """,
    re.VERBOSE | re.DOTALL,
)
_INT_RE = re.compile(r"0[xX][0-9A-Fa-f]+|0[0-7]*|[1-9][0-9]*")
_FLOAT_RE = re.compile(r"(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?[fF]?")
_FLOAT_WORDS = {"inf": math.inf, "infinity": math.inf, "nan": math.nan}
_TRUE = frozenset(("true", "True", "t", "1"))
_FALSE = frozenset(("false", "False", "f", "0"))
_SIMPLE_ESCAPES = {
    "a": 7, "b": 8, "f": 12, "n": 10, "r": 13, "t": 9, "v": 11,
    "\\": 92, "'": 39, '"': 34, "?": 63,
}  # fmt: skip
_ESCAPE_RE = re.compile(r"\\(?:([0-7]{1,3})|x([0-9A-Fa-f]{1,2})|u([0-9A-Fa-f]{4})|U([0-9A-Fa-f]{8})|(.))")
_INT_RANGES = {
    betterproto2.TYPE_INT32: (-(2**31), 2**31 - 1),
    betterproto2.TYPE_SINT32: (-(2**31), 2**31 - 1),
    betterproto2.TYPE_SFIXED32: (-(2**31), 2**31 - 1),
    betterproto2.TYPE_ENUM: (-(2**31), 2**31 - 1),
    betterproto2.TYPE_UINT32: (0, 2**32 - 1),
    betterproto2.TYPE_FIXED32: (0, 2**32 - 1),
    betterproto2.TYPE_INT64: (-(2**63), 2**63 - 1),
    betterproto2.TYPE_SINT64: (-(2**63), 2**63 - 1),
    betterproto2.TYPE_SFIXED64: (-(2**63), 2**63 - 1),
    betterproto2.TYPE_UINT64: (0, 2**64 - 1),
    betterproto2.TYPE_FIXED64: (0, 2**64 - 1),
}
_STRING_TYPES = (betterproto2.TYPE_STRING, betterproto2.TYPE_BYTES)
_FLOAT_TYPES = (betterproto2.TYPE_FLOAT, betterproto2.TYPE_DOUBLE)
_CLOSE = {"{": "}", "<": ">"}
_EOF = ""  # kind of the sentinel token after the last one


class _Parser:
    """Recursive descent over a token list. A token's kind is "ident", "num", "str", the
    symbol itself ("{", ":", ...) or ``_EOF`` for the sentinel that ends the list."""

    __slots__ = ("text", "filename", "kinds", "texts", "starts", "i")

    def __init__(self, text: str, filename: str) -> None:
        self.text = text
        self.filename = filename
        kinds: list[str] = []
        texts: list[str] = []
        starts: list[int] = []
        for m in _TOKEN_RE.finditer(text):
            group = m.lastgroup
            token = m.group(group)  # type: ignore[arg-type]
            start = m.start(group)  # type: ignore[arg-type]
            kind: str = group  # type: ignore[assignment]
            if group == "sym":
                kind = token
            elif group == "end":
                break
            elif group == "bad":
                raise self.error(f'unexpected character "{token}"', start)
            elif group == "badstr":
                raise self.error("unterminated string literal (strings cannot span lines)", start)
            kinds.append(kind)
            texts.append(token)
            starts.append(start)
        kinds.append(_EOF)
        texts.append("")
        starts.append(len(text))
        self.kinds, self.texts, self.starts = kinds, texts, starts
        self.i = 0

    # -- helpers
    def error(self, reason: str, pos: int | None = None) -> PbtxtError:
        if pos is None:
            pos = self.starts[self.i]
        line = self.text.count("\n", 0, pos) + 1
        column = pos - (self.text.rfind("\n", 0, pos) + 1) + 1
        return PbtxtError(self.filename, line, column, reason)

    def found(self) -> str:
        """The current token, described for an error message."""
        return "end of input" if self.kinds[self.i] == _EOF else f'"{self.texts[self.i]}"'

    def take(self, sym: str) -> bool:
        if self.kinds[self.i] == sym:
            self.i += 1
            return True
        return False

    def expect(self, sym: str) -> None:
        if self.kinds[self.i] != sym:
            raise self.error(f'expected "{sym}", found {self.found()}')
        self.i += 1

    # -- messages
    def parse_body(self, target: Any, info: MessageInfo, close: str) -> None:
        kinds = self.kinds
        while True:
            kind = kinds[self.i]
            if kind == close:
                self.i += 1
                return
            if kind != "ident":
                if kind == _EOF:
                    raise self.error(
                        f'expected "{close}" to close message {info.full_name}, found end of input'
                    )
                if kind == "[":
                    raise self.error("extension and Any fields ([...]) are not supported")
                raise self.error(f"expected a field name, found {self.found()}")
            field = info.by_name.get(self.texts[self.i])
            if field is None:
                raise self.error(f'message type "{info.full_name}" has no field named "{self.texts[self.i]}"')
            self.i += 1
            if field.group is not None:
                self.check_oneof(target, info, field)
            if field.is_message:
                self.parse_message_field(target, field)
            else:
                self.parse_scalar_field(target, field)
            kind = kinds[self.i]
            if kind == "," or kind == ";":
                self.i += 1

    def check_oneof(self, target: Any, info: MessageInfo, field: FieldInfo) -> None:
        assert field.group is not None
        for other in info.oneofs[field.group]:
            if other is not field and getattr(target, other.attr) is not None:
                raise self.error(
                    f'field "{field.name}" is specified along with field "{other.name}", '
                    f'another member of oneof "{field.group}"',
                    self.starts[self.i - 1],
                )

    def not_repeated(self, field: FieldInfo) -> PbtxtError:
        return self.error(
            f'field "{field.name}" is not repeated; list syntax is not allowed', self.starts[self.i - 1]
        )

    def parse_message_field(self, target: Any, field: FieldInfo) -> None:
        self.take(":")
        if not self.take("["):
            self.parse_message_value(target, field)
            return
        if not field.repeated:
            raise self.not_repeated(field)
        if self.take("]"):
            return
        while True:
            self.parse_message_value(target, field)
            if self.take("]"):
                return
            self.expect(",")

    def parse_scalar_field(self, target: Any, field: FieldInfo) -> None:
        self.expect(":")
        if not self.take("["):
            value = self.parse_scalar(field)
            if field.repeated:
                getattr(target, field.attr).append(value)
            else:
                setattr(target, field.attr, value)
            return
        if not field.repeated:
            raise self.not_repeated(field)
        values = getattr(target, field.attr)
        if self.take("]"):
            return
        while True:
            values.append(self.parse_scalar(field))
            if self.take("]"):
                return
            self.expect(",")

    def parse_message_value(self, target: Any, field: FieldInfo) -> None:
        close = _CLOSE.get(self.kinds[self.i])
        if close is None:
            raise self.error(f'expected "{{" or "<" to start field "{field.name}", found {self.found()}')
        self.i += 1
        if field.map_key is not None:
            assert field.map_value is not None and field.entry_info is not None
            entry = _MapEntry()
            self.parse_body(entry, field.entry_info, close)
            key = entry.key if entry.key is not None else field.map_key.default()
            value = entry.value
            if value is None:
                value = field.map_value.py_type() if field.map_value.is_message else field.map_value.default()
            getattr(target, field.attr)[key] = value
            return
        if field.repeated:
            msg = field.py_type()
            self.parse_body(msg, message_info(field.py_type), close)
            getattr(target, field.attr).append(msg)
            return
        msg = getattr(target, field.attr)
        if msg is None:  # a second occurrence of a singular message merges into the first
            msg = field.py_type()
            setattr(target, field.attr, msg)
        self.parse_body(msg, message_info(field.py_type), close)

    # -- scalars
    def parse_scalar(self, field: FieldInfo) -> Any:
        ptype = field.proto_type
        pos = self.starts[self.i]
        kind = self.kinds[self.i]
        if kind == _EOF:
            raise self.error(f'expected a value for field "{field.name}", found end of input')
        if ptype in _STRING_TYPES:
            if kind != "str":
                raise self.error(f'expected a string for field "{field.name}", found {self.found()}')
            raw = self.parse_string_bytes()
            if ptype == betterproto2.TYPE_BYTES:
                return raw if isinstance(raw, bytes) else raw.encode("utf-8")
            if isinstance(raw, str):
                return raw
            try:
                return raw.decode("utf-8")
            except UnicodeDecodeError:
                raise self.error(f'string for field "{field.name}" is not valid UTF-8', pos) from None
        if ptype == betterproto2.TYPE_BOOL:
            text = self.texts[self.i]
            if kind == "ident" or kind == "num":
                if text in _TRUE:
                    self.i += 1
                    return True
                if text in _FALSE:
                    self.i += 1
                    return False
            raise self.error(f'expected a boolean for field "{field.name}", found {self.found()}')
        if ptype == betterproto2.TYPE_ENUM:
            if kind == "ident":
                text = self.texts[self.i]
                member = enum_values(field.py_type).get(text)
                if member is None:
                    raise self.error(
                        f'unknown enumeration value "{text}" for field "{field.name}" '
                        f"(enum {field.py_type.__name__})"
                    )
                self.i += 1
                return member
            if kind == "str":
                raise self.error(f'expected an enum value for field "{field.name}", found {self.found()}')
            return field.py_type(self.parse_int(field, pos))
        if ptype in _FLOAT_TYPES:
            return self.parse_float(field)
        return self.parse_int(field, pos)

    def parse_int(self, field: FieldInfo, pos: int) -> int:
        negative = self.take("-")
        text = self.texts[self.i]
        if self.kinds[self.i] != "num" or _INT_RE.fullmatch(text) is None:
            raise self.error(f'expected an integer for field "{field.name}", found {self.found()}')
        if text[:2] in ("0x", "0X"):
            value = int(text, 16)
        elif len(text) > 1 and text[0] == "0":
            value = int(text, 8)
        elif len(text) > 40:  # far out of any range (and past int()'s digit limit)
            raise self.error(f'integer {text[:20]}... out of range for field "{field.name}"', pos)
        else:
            value = int(text)
        self.i += 1
        if negative:
            value = -value
        lo, hi = _INT_RANGES.get(field.proto_type, (-(2**63), 2**64 - 1))
        if not lo <= value <= hi:
            raise self.error(
                f'integer {value} out of range for field "{field.name}" ({field.proto_type})', pos
            )
        return value

    def parse_float(self, field: FieldInfo) -> float:
        negative = self.take("-")
        kind, text = self.kinds[self.i], self.texts[self.i]
        if kind == "ident" and text.lower() in _FLOAT_WORDS:
            value = _FLOAT_WORDS[text.lower()]
        elif kind == "num" and text[:2] in ("0x", "0X") and _INT_RE.fullmatch(text) is not None:
            value = float(int(text, 16))
        elif kind == "num" and _FLOAT_RE.fullmatch(text) is not None:
            value = float(text.rstrip("fF"))
        else:
            raise self.error(f'expected a number for field "{field.name}", found {self.found()}')
        self.i += 1
        return -value if negative else value

    def parse_string_bytes(self) -> str | bytes:
        """Consume one or more adjacent string tokens; str when escape-free, else bytes."""
        parts: list[str | bytes] = []
        escaped = False
        while self.kinds[self.i] == "str":
            body = self.texts[self.i][1:-1]
            if "\\" in body:
                parts.append(self.unescape(body, self.starts[self.i] + 1))
                escaped = True
            else:
                parts.append(body)
            self.i += 1
        if not escaped:
            return "".join(parts)  # type: ignore[arg-type]
        return b"".join(p if isinstance(p, bytes) else p.encode("utf-8") for p in parts)

    def unescape(self, body: str, base: int) -> bytes:
        out = bytearray()
        last = 0
        for m in _ESCAPE_RE.finditer(body):
            out += body[last : m.start()].encode("utf-8")
            last = m.end()
            octal, hexa, u4, u8, other = m.groups()
            if octal is not None:
                code = int(octal, 8)
                if code > 255:
                    raise self.error(f'octal escape "\\{octal}" is out of range', base + m.start())
                out.append(code)
            elif hexa is not None:
                out.append(int(hexa, 16))
            elif u4 is not None or u8 is not None:
                code = int(u4 or u8, 16)
                if code > 0x10FFFF or 0xD800 <= code <= 0xDFFF:
                    raise self.error(f'invalid unicode escape "{m.group()}"', base + m.start())
                out += chr(code).encode("utf-8")
            elif other in _SIMPLE_ESCAPES:
                out.append(_SIMPLE_ESCAPES[other])
            else:
                raise self.error(f'invalid escape sequence "{m.group()}" in string literal', base + m.start())
        out += body[last:].encode("utf-8")
        return bytes(out)


class _MapEntry:
    __slots__ = ("key", "value")

    def __init__(self) -> None:
        self.key: Any = None
        self.value: Any = None


def parse_message(text: str | bytes, message_type: type[M], *, filename: str = "<string>") -> M:
    """Parse protobuf text format into a new ``message_type`` instance.

    Raises :class:`PbtxtError` (``INVALID_ARG``) naming ``filename``, line and column for any
    syntax error, unknown field, unknown enum name, out-of-range number or invalid UTF-8.
    """
    if isinstance(text, (bytes, bytearray, memoryview)):
        raw = bytes(text)
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            prefix = raw[: exc.start]
            line = prefix.count(b"\n") + 1
            column = len(prefix) - (prefix.rfind(b"\n") + 1) + 1
            raise PbtxtError(filename, line, column, "file is not valid UTF-8") from None
    parser = _Parser(text, filename)
    message = message_type()
    parser.parse_body(message, message_info(message_type), _EOF)
    return message


def parse_pbtxt(text: str | bytes, *, filename: str = "<string>") -> ModelConfig:
    """Parse a ``config.pbtxt`` text into a :class:`ModelConfig`. Raises :class:`PbtxtError`."""
    return parse_message(text, ModelConfig, filename=filename)


# ---------------------------------------------------------------- writer

_ESCAPED = {"\n": "\\n", "\r": "\\r", "\t": "\\t", '"': '\\"', "\\": "\\\\"}
_NEEDS_ESCAPE = re.compile(r'[\x00-\x1f\x7f"\\]')


def _quote(value: str | bytes) -> str:
    if isinstance(value, bytes):
        chars = []
        for b in value:
            c = chr(b)
            if c in _ESCAPED:
                chars.append(_ESCAPED[c])
            elif 32 <= b < 127:
                chars.append(c)
            else:
                chars.append(f"\\{b:03o}")
        return '"' + "".join(chars) + '"'
    if _NEEDS_ESCAPE.search(value) is None:
        return f'"{value}"'
    return '"' + _NEEDS_ESCAPE.sub(lambda m: _ESCAPED.get(m.group(), f"\\{ord(m.group()):03o}"), value) + '"'


def _format_scalar(value: Any, field: FieldInfo) -> str:
    ptype = field.proto_type
    if ptype == betterproto2.TYPE_STRING or ptype == betterproto2.TYPE_BYTES:
        return _quote(value)
    if ptype == betterproto2.TYPE_BOOL:
        return "true" if value else "false"
    if ptype == betterproto2.TYPE_ENUM:
        name = enum_names(field.py_type).get(int(value))
        return name if name is not None else str(int(value))
    if ptype in _FLOAT_TYPES:
        return repr(float(value))
    return str(int(value))


def _write(message: betterproto2.Message, indent: str, lines: list[str]) -> None:
    info = message_info(type(message))
    inner = indent + "  "
    for field in info.fields:
        value = getattr(message, field.attr)
        name = field.name
        if field.map_key is not None:
            assert field.map_value is not None
            for key, item in value.items():
                lines.append(f"{indent}{name} {{")
                lines.append(f"{inner}key: {_format_scalar(key, field.map_key)}")
                if field.map_value.is_message:
                    _write_message_field(item, "value", inner, lines)
                else:
                    lines.append(f"{inner}value: {_format_scalar(item, field.map_value)}")
                lines.append(f"{indent}}}")
        elif field.repeated:
            if not value:
                continue
            if field.is_message:
                for item in value:
                    _write_message_field(item, name, indent, lines)
            else:
                lines.append(f"{indent}{name}: [{', '.join(_format_scalar(v, field) for v in value)}]")
        elif field.is_message:
            if value is not None:
                _write_message_field(value, name, indent, lines)
        elif value is None:
            continue
        elif field.has_presence or value != field.default():
            lines.append(f"{indent}{name}: {_format_scalar(value, field)}")


def _write_message_field(value: betterproto2.Message, name: str, indent: str, lines: list[str]) -> None:
    start = len(lines)
    lines.append(f"{indent}{name} {{")
    _write(value, indent + "  ", lines)
    if len(lines) == start + 1:
        lines[start] = f"{indent}{name} {{}}"
    else:
        lines.append(f"{indent}}}")


def format_pbtxt(message: betterproto2.Message) -> str:
    """Protobuf text format for ``message`` (fields in declaration order, defaults omitted).

    :func:`parse_message` of the result gives back an equal message; unknown enum numbers are
    written as numbers, floats with ``repr`` (``inf``, ``nan`` included).
    """
    lines: list[str] = []
    _write(message, "", lines)
    return "\n".join(lines) + "\n" if lines else ""
