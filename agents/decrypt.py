"""The ``decrypt`` agent: serve a model whose files are stored encrypted (AES-GCM).

Every file of the model folder whose name ends in ``.enc`` (parameter ``suffix``) is decrypted
into a temporary copy of the folder under its name without the suffix (``1/model.onnx.enc`` ->
``1/model.onnx``); the loader reads the copy, which is removed after the model unloads. The
key never comes from the config: parameter ``key_file`` names a file holding it, or
``key_env`` an environment variable holding it. A key is 16, 24 or 32 bytes (AES-128/192/256),
given as raw bytes (file only), hex or base64. An encrypted file is a 12-byte nonce followed by
the AES-GCM ciphertext and its 16-byte tag; the additional authenticated data is the file's
path in the folder (``1/model.onnx``), so a file moved to another name does not decrypt.
Make such files with :func:`encrypt_file` or ``python -m trident.agents.decrypt``.
"""

from __future__ import annotations

import argparse
import base64
import binascii
import os
import sys
from pathlib import Path

from trident.agents.base import Action, AgentError, AgentModel, RepositoryAgent, replace_file

NONCE = 12
TAG = 16
MAX_KEY_FILE = 4096  # bytes


def parse_key(raw: bytes) -> bytes:
    """A 16/24/32-byte AES key from hex or base64 text, else raw bytes. Raises AgentError."""
    text = raw.strip()
    for decode in (binascii.unhexlify, lambda t: base64.b64decode(t, validate=True)):
        try:
            key = decode(text)
        except (binascii.Error, ValueError):
            continue
        if len(key) in (16, 24, 32):
            return key
    if len(raw) in (16, 24, 32):
        return raw
    raise AgentError("the key must be 16, 24 or 32 bytes (raw, hex or base64)")


def read_key(parameters: dict[str, str]) -> bytes:
    """The key named by ``key_file`` or ``key_env``. Raises AgentError."""
    if "key" in parameters:
        raise AgentError("the key must not be in the model configuration; name a file (key_file) "
                         "or an environment variable (key_env) that holds it")
    if "key_file" in parameters:
        path = Path(parameters["key_file"])
        try:
            with path.open("rb") as f:
                raw = f.read(MAX_KEY_FILE + 1)
        except OSError as e:
            raise AgentError(f"cannot read key file '{path}': {e.strerror or e}") from None
        if len(raw) > MAX_KEY_FILE:
            raise AgentError(f"key file '{path}' is over {MAX_KEY_FILE} bytes")
        return parse_key(raw)
    if "key_env" in parameters:
        var = parameters["key_env"]
        value = os.environ.get(var)
        if not value:
            raise AgentError(f"environment variable '{var[:100]}' (key_env) is not set")
        return parse_key(value.encode())
    raise AgentError("no key: set parameter 'key_file' (a file holding the key) or 'key_env' "
                     "(an environment variable holding it)")


def encrypt_bytes(data: bytes, key: bytes, relative: str) -> bytes:
    """``data`` encrypted for the file ``relative`` (its path in the model folder, without
    the suffix)."""
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

    nonce = os.urandom(NONCE)
    return nonce + AESGCM(key).encrypt(nonce, data, relative.encode())


def encrypt_file(model_dir: Path, relative: str, key: bytes, suffix: str = ".enc", *, remove: bool = True) -> Path:
    """Encrypt ``model_dir/relative`` to ``model_dir/relative + suffix`` (and remove the plain
    file when ``remove``). Returns the encrypted file's path."""
    plain = model_dir / relative
    target = plain.with_name(plain.name + suffix)
    target.write_bytes(encrypt_bytes(plain.read_bytes(), key, relative))
    if remove:
        plain.unlink()
    return target


def _decryptor(key: bytes):  # type: ignore[no-untyped-def]
    try:
        from cryptography.hazmat.primitives.ciphers.aead import AESGCM
    except ImportError as e:
        raise AgentError(f"the 'cryptography' package is not installed ({e}); "
                         'install it with pip install "trident-inference[agents]"') from None
    return AESGCM(key)


class DecryptAgent(RepositoryAgent):
    name = "decrypt"

    def model_action(self, action: Action, model: AgentModel) -> None:
        """On LOAD, decrypt into a copy and hand it to the loader. Raises AgentError for a
        missing key, no encrypted file, or a file that does not decrypt (wrong key, changed)."""
        if action != Action.LOAD:
            return
        from cryptography.exceptions import InvalidTag

        suffix = model.parameters.get("suffix", ".enc")
        if not suffix.startswith(".") or "/" in suffix or len(suffix) > 32:
            raise AgentError(f"invalid suffix '{suffix[:40]}': it must start with '.'")
        aes = _decryptor(read_key(model.parameters))
        source = model.location
        encrypted = sorted(p for p in source.rglob("*" + suffix) if p.is_file())
        if not encrypted:
            raise AgentError(f"no encrypted files (*{suffix}) in the model folder")
        copy = model.copy_location()
        for path in encrypted:
            relative = path.relative_to(source).as_posix()[: -len(suffix)]
            blob = path.read_bytes()
            if len(blob) < NONCE + TAG:
                raise AgentError(f"file '{relative}{suffix}' is too short to be encrypted")
            try:
                plain = aes.decrypt(blob[:NONCE], blob[NONCE:], relative.encode())
            except InvalidTag:
                raise AgentError(f"file '{relative}{suffix}' does not decrypt: wrong key, or the file "
                                 "was changed or renamed") from None
            replace_file(copy / relative, plain)
            (copy / (relative + suffix)).unlink()
        model.set_location(copy)


def main(argv: list[str] | None = None) -> int:
    """``python -m trident.agents.decrypt --key-file KEY MODEL_DIR FILE...``: encrypt files."""
    p = argparse.ArgumentParser(prog="python -m trident.agents.decrypt",
                                description="Encrypt model files for the 'decrypt' repository agent.")
    p.add_argument("--key-file", required=True, help="file holding the key (16/24/32 bytes: raw, hex or base64)")
    p.add_argument("--keep", action="store_true", help="keep the plain files")
    p.add_argument("--suffix", default=".enc")
    p.add_argument("model_dir", type=Path)
    p.add_argument("files", nargs="+", help="paths inside MODEL_DIR, e.g. 1/model.onnx")
    args = p.parse_args(argv)
    try:
        key = read_key({"key_file": args.key_file})
    except AgentError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    for relative in args.files:
        print(encrypt_file(args.model_dir, relative, key, args.suffix, remove=not args.keep))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
