"""The ``convert`` agent: serve an ONNX model as OpenVINO IR, converted once and cached.

For each version being loaded, ``<version>/model.onnx`` (parameter ``source_filename``) is
converted to OpenVINO IR (``model.xml`` + ``model.bin``) and cached next to the model, in
``<model>/.trident_convert/<version>/`` (parameter ``cache_directory`` puts the cache elsewhere:
``<cache_directory>/<model>/<version>/``); the cache is keyed by the SHA-256 of the ONNX file,
so an unchanged file is not converted again and a changed one is. The loader gets a temporary
copy of the folder with the IR in place of the ONNX file (removed after unload); the model's
config names ``backend: "openvino"``. A repository folder that cannot be written keeps the IR in
the temporary copy only (converted at every load). Parameters: ``from`` (``onnx``), ``to``
(``openvino``), ``compress_to_fp16`` (``false``).
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from pathlib import Path

from trident.agents.base import Action, AgentError, AgentModel, RepositoryAgent
from trident.agents.checksum import file_digest

log = logging.getLogger("trident.agents")

CACHE_DIR_NAME = ".trident_convert"  # next to the model's version folders (ignored by polling)
_STAMP = "source.sha256"


def _convert(onnx: Path, target: Path, fp16: bool) -> None:
    """ONNX file -> ``target/model.xml`` + ``model.bin``. Raises AgentError."""
    try:
        import openvino as ov
    except ImportError as e:
        raise AgentError(f"openvino is not installed ({e}); install it with pip install "
                         '"trident-inference[openvino]"') from None
    try:
        model = ov.Core().read_model(str(onnx))
        ov.save_model(model, str(target / "model.xml"), compress_to_fp16=fp16)
    except Exception as e:  # OpenVINO raises RuntimeError subclasses with the parser's message
        raise AgentError(f"cannot convert '{onnx.name}' to OpenVINO IR: {str(e)[:1000]}") from None


class ConvertAgent(RepositoryAgent):
    name = "convert"

    def model_action(self, action: Action, model: AgentModel) -> None:
        """On LOAD, convert (or take from the cache) and hand the loader the IR. Raises
        AgentError for an unsupported conversion, a missing source file or a failed conversion."""
        if action != Action.LOAD:
            return
        params = model.parameters
        source, target = params.get("from", "onnx").lower(), params.get("to", "openvino").lower()
        if (source, target) != ("onnx", "openvino"):
            raise AgentError(f"unsupported conversion from '{source[:40]}' to '{target[:40]}' "
                             "(supported: from 'onnx' to 'openvino')")
        unknown = sorted(set(params) - {"from", "to", "compress_to_fp16", "source_filename", "cache_directory"})
        if unknown:
            raise AgentError(f"unknown parameter '{unknown[0][:100]}'")
        filename = params.get("source_filename", "model.onnx")
        if "/" in filename or filename in ("", ".", ".."):
            raise AgentError(f"invalid source_filename '{filename[:100]}'")
        fp16 = params.get("compress_to_fp16", "false").lower() in ("1", "true", "yes", "on")
        if model.config.backend not in ("", "openvino"):
            raise AgentError(f"the converted model is served by the openvino backend; the config names "
                             f"backend '{model.config.backend}'")
        origin = model.location
        cache_root = Path(params["cache_directory"]) / model.name if "cache_directory" in params \
            else origin / CACHE_DIR_NAME
        copy = model.new_location()
        shutil.copytree(origin, copy, dirs_exist_ok=True, ignore=shutil.ignore_patterns(CACHE_DIR_NAME),
                        copy_function=_link_or_copy)
        for v in model.versions:
            onnx = origin / str(v) / filename
            if not onnx.is_file():
                raise AgentError(f"file '{v}/{filename}' does not exist in the model folder")
            out = copy / str(v)
            (out / filename).unlink()
            cached = self._cached(onnx, cache_root / str(v), fp16)
            if cached is None:
                _convert(onnx, out, fp16)
            else:
                for name in ("model.xml", "model.bin"):
                    _link_or_copy(cached / name, out / name)
        model.set_location(copy)

    @staticmethod
    def _cached(onnx: Path, folder: Path, fp16: bool) -> Path | None:
        """The cache folder holding the IR of ``onnx`` (converting into it when stale), or None
        when the cache cannot be written."""
        digest = file_digest(str(onnx), "sha256") + (":fp16" if fp16 else "")
        stamp = folder / _STAMP
        try:
            if stamp.read_text() == digest and (folder / "model.xml").is_file() and (folder / "model.bin").is_file():
                return folder
        except OSError:
            pass
        try:
            folder.parent.mkdir(parents=True, exist_ok=True)
            fresh = Path(tempfile.mkdtemp(prefix=".converting-", dir=folder.parent))
        except OSError as e:
            log.warning("convert agent: cannot write the cache '%s' (%s); converting without it", folder, e)
            return None
        try:
            _convert(onnx, fresh, fp16)
            (fresh / _STAMP).write_text(digest)
            shutil.rmtree(folder, ignore_errors=True)
            os.replace(fresh, folder)
        finally:
            shutil.rmtree(fresh, ignore_errors=True)
        return folder


def _link_or_copy(src: str | Path, dst: str | Path) -> None:
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)
