"""The server side of ``pb_utils`` as model code reaches it: the runtime and how it is found.

A :class:`_Runtime` is what BLS, model management and custom metrics talk to: the in-process
one (:mod:`trident.backends.python._runtime`) or the model-process one
(:mod:`trident.backends.python.isolated.child`). :func:`_current_runtime` finds it through the
calling thread (:class:`_Context`, set while model methods run), then through the model module
on the call stack (threads the model starts itself), then the process default.
"""

from __future__ import annotations

import abc
import contextvars
import sys
from collections.abc import Iterator, Sequence
from typing import Any


class TritonModelException(Exception):
    """The exception model code raises (and that pb_utils raises) to fail a call."""



class _Runtime(abc.ABC):
    """What pb_utils asks of the server that loaded the model (see the module docstring)."""

    #: calls that crossed into the server (BLS, model control) so far; an instance that made
    #: one never runs inline on the event loop again (PythonInstance.inline_safe)
    server_calls: int = 0

    @abc.abstractmethod
    def bls(self, request: Any, decoupled: bool, parents: Sequence[Any]) -> Iterator[Any]:
        """Start a BLS request (a ``pb_utils.InferenceRequest``: pb_utils imports this module, not
        the other way round); iterate the callee's ``pb_utils.InferenceResponse`` objects (errors
        as error responses).

        ``decoupled=False`` yields exactly one response. ``parents`` are the requests whose
        cancellation cancels this one. The iterator may have a ``cancel()`` method.
        """
        raise NotImplementedError

    @abc.abstractmethod
    def load_model(self, model_name: str, config: str, files: dict[str, bytes] | None) -> None:
        raise NotImplementedError

    @abc.abstractmethod
    def unload_model(self, model_name: str, unload_dependents: bool) -> None:
        raise NotImplementedError

    @abc.abstractmethod
    def is_model_ready(self, model_name: str, model_version: str) -> bool:
        raise NotImplementedError

    @abc.abstractmethod
    def metrics(self) -> Any:
        """The custom-metrics registry (``acquire_family`` / ``release_family``)."""
        raise NotImplementedError


MODEL_PACKAGE_PREFIX = "_trident_python_model_"  # the packages model files are imported under
#: (runtime, parents, model) of the model call running in this thread, or in this asyncio task:
#: a context variable, so it is per thread for plain threads and follows the tasks of an
#: instance's asyncio loop (each task starts from a copy of the context it was created in).
#: ``model`` is (name, version) of the instance making the call (what pb_utils.Logger names)
_call_context: contextvars.ContextVar[tuple[_Runtime | None, list[Any], tuple[str, str] | None]] = (
    contextvars.ContextVar("trident_pb_call", default=(None, [], None)))
_package_runtimes: dict[str, _Runtime] = {}
_default_runtime: _Runtime | None = None


def _set_default_runtime(runtime: _Runtime | None) -> None:
    global _default_runtime
    _default_runtime = runtime


def _bind_package(package: str, runtime: _Runtime | None) -> None:
    """Let threads a model starts itself find ``runtime`` through the model's package."""
    if runtime is None:
        _package_runtimes.pop(package, None)
    else:
        _package_runtimes[package] = runtime


class _Context:
    """While active in a thread (or an asyncio task): the runtime, the requests being
    executed (BLS parents) and the model (name, version) executing them."""

    __slots__ = ("runtime", "parents", "model", "_token")

    def __init__(self, runtime: _Runtime | None, parents: Sequence[Any] = (),
                 model: tuple[str, str] | None = None) -> None:
        self.runtime = runtime
        self.parents = list(parents)
        self.model = model
        self._token: contextvars.Token[tuple[_Runtime | None, list[Any], tuple[str, str] | None]] | None = None

    def __enter__(self) -> _Context:
        self._token = _call_context.set((self.runtime, self.parents, self.model))
        return self

    def __exit__(self, *exc: object) -> None:
        if self._token is not None:
            _call_context.reset(self._token)
            self._token = None


def _current_parents() -> list[Any]:
    """The requests of the model call running here (BLS parents); empty outside one."""
    return list(_call_context.get()[1])


def _current_call() -> tuple[tuple[str, str] | None, list[Any]]:
    """(model (name, version), requests) of the model call running here; (None, []) outside one."""
    _, parents, model = _call_context.get()
    return model, parents


def _current_runtime() -> _Runtime | None:
    runtime = _call_context.get()[0]
    if runtime is not None:
        return runtime
    if _package_runtimes:
        frame = sys._getframe(1)
        while frame is not None:
            name = frame.f_globals.get("__name__", "")
            if isinstance(name, str) and name.startswith(MODEL_PACKAGE_PREFIX):
                found = _package_runtimes.get(name.split(".", 1)[0])
                if found is not None:
                    return found
            frame = frame.f_back  # type: ignore[assignment]
    return _default_runtime


def _require_runtime(what: str) -> _Runtime:
    runtime = _current_runtime()
    if runtime is None:
        raise TritonModelException(f"{what} is only available to models loaded by a trident server")
    return runtime
