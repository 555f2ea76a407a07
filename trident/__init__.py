"""trident: a Triton-compatible inference server on trio structured concurrency.

In-process use (no sockets)::

    async with trident.open_server(trident.ServerOptions(model_repositories=["/models"])) as server:
        response = await server.infer(trident.InferenceRequest("add_sub", [...]))
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"
#: the distribution name on the package index (the import name and the command are ``trident``;
#: ``trident`` on the public index is an unrelated project)
DISTRIBUTION = "trident-inference"

_LAZY = {
    "open_server": ("trident.server", "open_server"),
    "start_server": ("trident.server.threaded", "start_server"),
    "ServerThread": ("trident.server.threaded", "ServerThread"),
    "Server": ("trident.server", "Server"),
    "ServerOptions": ("trident.options", "ServerOptions"),
    "InferenceRequest": ("trident.types", "InferenceRequest"),
    "InferenceResponse": ("trident.types", "InferenceResponse"),
    "RequestedOutput": ("trident.types", "RequestedOutput"),
    "Tensor": ("trident.types", "Tensor"),
    "TritonError": ("trident.errors", "TritonError"),
}

__all__ = ["__version__", *_LAZY]


def __getattr__(name: str) -> Any:
    """Import the public API on first use, so ``import trident`` stays light."""
    try:
        module, attr = _LAZY[name]
    except KeyError:
        raise AttributeError(f"module 'trident' has no attribute {name!r}") from None
    import importlib

    return getattr(importlib.import_module(module), attr)
