"""Backend registry, resolved lazily: importing this package imports no framework.

Built-in backends are named here by module path and imported only when a model of that
backend loads. Third-party backends register through the entry-point group
``trident.backends`` (name -> ``module:BackendClass``, a :class:`Backend` subclass or
instance); the interface is documented in :mod:`trident.backends.base`.
"""

from __future__ import annotations

import importlib
from importlib import metadata

from trident import DISTRIBUTION
from trident.backends.base import Backend, LoadContext, ModelInstance
from trident.errors import TritonError, unsupported

__all__ = ["Backend", "LoadContext", "ModelInstance", "get_backend", "backend_name_for"]

# backend name -> (module, class, pip extra that provides its framework or None)
_BUILTIN: dict[str, tuple[str, str, str | None]] = {
    "python": ("trident.backends.python.backend", "PythonBackend", None),
    "onnxruntime": ("trident.backends.onnxruntime_backend", "OnnxRuntimeBackend", "onnxruntime"),
    "pytorch": ("trident.backends.pytorch_backend", "PyTorchBackend", "pytorch"),
    "openvino": ("trident.backends.openvino_backend", "OpenVINOBackend", "openvino"),
    "tensorrt": ("trident.backends.tensorrt_backend", "TensorRTBackend", "tensorrt"),
    "tree": ("trident.backends.tree_backend", "TreeBackend", "tree"),
    "fil": ("trident.backends.tree_backend", "TreeBackend", "tree"),
}

# platform -> backend name (Triton's platform spellings)
_PLATFORMS: dict[str, str] = {
    "onnxruntime_onnx": "onnxruntime",
    "pytorch_libtorch": "pytorch",
    "tensorrt_plan": "tensorrt",
    "openvino": "openvino",
    "tensorflow_savedmodel": "tensorflow",
    "tensorflow_graphdef": "tensorflow",
}

#: Triton backends a user may look for that trident does not have yet
_NOT_YET = ("tensorflow", "vllm", "tensorrtllm", "dali")

_cache: dict[str, Backend] = {}


def backend_name_for(backend: str, platform: str) -> str:
    """The backend name for a config's ``backend`` / ``platform`` pair ("" when neither is set)."""
    if backend:
        return backend
    return _PLATFORMS.get(platform, platform)


def _entry_point(name: str) -> Backend | None:
    for ep in metadata.entry_points(group="trident.backends"):
        if ep.name == name:
            cls = ep.load()
            backend = cls() if isinstance(cls, type) else cls
            if not isinstance(backend, Backend):
                raise TypeError(f"entry point '{ep.value}' is not a trident.backends.Backend")
            return backend
    return None


def get_backend(name: str) -> Backend:
    """The backend registered under ``name``; raises TritonError(UNSUPPORTED) if there is none."""
    if name in _cache:
        return _cache[name]
    backend: Backend | None = None
    if name in _BUILTIN:
        module, cls_name, extra = _BUILTIN[name]
        try:
            mod = importlib.import_module(module)
        except ImportError as e:  # the framework is missing
            hint = f'; install it with pip install "{DISTRIBUTION}[{extra}]"' if extra else ""
            raise unsupported(f"backend '{name}' is not available: {e}{hint}") from e
        backend = getattr(mod, cls_name)()
    else:
        try:
            backend = _entry_point(name)
        except Exception as e:
            raise TritonError(unsupported("").code, f"backend '{name}' failed to load: {e}") from e
    if backend is None:
        if name in _NOT_YET:
            raise unsupported(f"backend '{name}' is not supported by trident yet (built in: "
                              f"{', '.join(sorted(_BUILTIN))}; others through 'trident.backends' entry points)")
        raise unsupported(f"unknown backend '{name}'")
    _cache[name] = backend
    return backend
