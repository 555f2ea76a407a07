"""The ``checksum`` agent: the model's files must have the digests the config names.

Parameters as Triton's checksum agent: each key is ``<ALGORITHM>:<relative path>`` and its value
the expected hex digest, e.g. ``key: "MD5:1/model.onnx" value: "d41d8cd9..."``. Algorithms:
``MD5`` (Triton's) and ``SHA256`` (also spelled ``SHA-256``). A mismatch, a missing file or an
unknown algorithm fails the load with the file named. Files are read in 1 MiB chunks.
"""

from __future__ import annotations

import hashlib

from trident.agents.base import Action, AgentError, AgentModel, RepositoryAgent

_ALGORITHMS = {"MD5": "md5", "SHA256": "sha256", "SHA-256": "sha256"}
CHUNK = 1 << 20


def file_digest(path: str, algorithm: str) -> str:
    """The hex digest of the file at ``path`` (hashlib algorithm name)."""
    h = hashlib.new(algorithm)
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            h.update(chunk)
    return h.hexdigest()


class ChecksumAgent(RepositoryAgent):
    name = "checksum"

    def model_action(self, action: Action, model: AgentModel) -> None:
        """On LOAD, check every named file. Raises AgentError for the first problem."""
        if action != Action.LOAD:
            return
        if not model.parameters:
            raise AgentError("no files to check: parameters must be '<ALGORITHM>:<path>' = '<hex digest>'")
        for key, expected in sorted(model.parameters.items()):
            algorithm, sep, relative = key.partition(":")
            if not sep or not relative:
                raise AgentError(f"invalid parameter '{key[:200]}': expected '<ALGORITHM>:<path>' (e.g. MD5:1/model.onnx)")
            hashlib_name = _ALGORITHMS.get(algorithm.upper())
            if hashlib_name is None:
                raise AgentError(f"unsupported hash algorithm '{algorithm[:40]}' for file '{relative[:200]}' "
                                 f"(supported: MD5, SHA256)")
            path = model.file(relative)
            if not path.is_file():
                raise AgentError(f"file '{relative}' named by '{key}' does not exist in the model folder")
            try:
                actual = file_digest(str(path), hashlib_name)
            except OSError as e:
                raise AgentError(f"cannot read file '{relative}': {e.strerror or e}") from None
            if actual != expected.strip().lower():
                raise AgentError(f"mismatched {algorithm.upper()} hash for file '{relative}': "
                                 f"expected {expected.strip()[:128]}, actual {actual}")
