"""The ``--backend-config`` settings trident's backends read: the one table of them.

``--backend-config=<backend>,<key>=<value>`` gives one backend a setting and
``--backend-config=<key>=<value>`` gives it to every backend (a backend sees the global
settings with its own over them: ``LoadContext.backend_config`` and the ``backend_config`` of
``Backend.auto_complete_config``).

Rule: a built-in backend reads those settings only through :func:`setting`, with a key of
:data:`SETTINGS` that lists it among the backends that read it. At start-up ``trident serve``
names every setting given that nothing reads (:func:`unread`): a key its backend does not read,
a global key no backend reads, a backend trident does not have; each is logged as ignored with
what is read instead. ``tests/unit/backends/test_settings.py`` reads the backends' source to
hold them to the rule. Backends of other packages (the ``trident.backends`` entry points) read
what they like; their settings are not checked.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

#: setting -> the built-in backends that read it (as a key of their own or a global one)
SETTINGS: dict[str, tuple[str, ...]] = {
    # the max_batch_size an auto-completed config gets when the model can batch (Triton's)
    "default-max-batch-size": ("onnxruntime", "openvino", "pytorch", "tensorrt", "tree"),
    # refused when true (trident has no global ONNX Runtime thread pool)
    "enable-global-threadpool": ("onnxruntime",),
    # how Python models run by default (a model's TRIDENT_* parameters come first)
    "execution-mode": ("python",),
    "execute-timeout-secs": ("python",),
    "shm-bytes": ("python",),
    "shm-default-byte-size": ("python",),  # Triton's name; the size of each process-mode ring
}

#: other names of built-in backends (config.pbtxt ``backend: "fil"`` is the tree backend)
ALIASES: dict[str, str] = {"fil": "tree"}


def setting(backend_config: Mapping[str, str] | None, key: str) -> str | None:
    """The value of ``key`` in a backend's ``--backend-config`` settings (None: not given).

    Raises KeyError for a key missing from :data:`SETTINGS` (a read the table does not list)."""
    if key not in SETTINGS:
        raise KeyError(f"--backend-config setting '{key}' is not in trident.backends.settings.SETTINGS")
    return (backend_config or {}).get(key)


def reads(backend: str) -> list[str]:
    """The settings the built-in ``backend`` reads, sorted (none for a backend not built in)."""
    backend = ALIASES.get(backend, backend)
    return sorted(key for key, backends in SETTINGS.items() if backend in backends)


def backend_names() -> tuple[list[str], list[str]]:
    """(the built-in backends' names, those other packages register as ``trident.backends``
    entry points). Imports no backend."""
    from importlib import metadata

    from trident.backends import _BUILTIN

    return sorted(_BUILTIN), sorted({ep.name for ep in metadata.entry_points(group="trident.backends")})


def unread(backend_config: Mapping[str, Mapping[str, str]], builtin: Iterable[str],
           other: Iterable[str] = ()) -> list[tuple[str, str]]:
    """``(entry, why)`` for each ``--backend-config`` setting nothing reads.

    ``backend_config`` maps a backend ("" for the global settings) to its settings; ``builtin``
    names trident's own backends, ``other`` those of other packages (not checked). ``entry`` is
    the setting as given on the command line, ``why`` says what is read instead."""
    builtin, other = set(builtin), set(other)
    out: list[tuple[str, str]] = []
    for backend, settings in backend_config.items():
        for key in settings:
            entry = f"{backend},{key}={settings[key]}" if backend else f"{key}={settings[key]}"
            if not backend:
                if key not in SETTINGS:
                    out.append((entry, f"no backend reads a global setting '{key}' (the settings trident's "
                                       f"backends read: {', '.join(sorted(SETTINGS))})"))
            elif backend in other and backend not in builtin:
                continue
            elif backend not in builtin:
                out.append((entry, f"trident has no '{backend}' backend (its backends: "
                                   f"{', '.join(sorted(builtin | other))})"))
            elif key not in reads(backend):
                known = reads(backend)
                out.append((entry, f"the {backend} backend reads no setting '{key}' (it reads: "
                                   f"{', '.join(known) if known else 'none'})"))
    return out
