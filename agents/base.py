"""The repository agent interface: code that runs when a model loads and unloads.

An agent is a :class:`RepositoryAgent` subclass. One instance serves one model load, from its
``LOAD`` action to its ``UNLOAD_COMPLETE`` (or ``LOAD_FAIL``), so per-model state may live on
``self``. Each action is a blocking call made in a worker thread, never on the event loop; an
agent may read and write files, hash, decrypt, convert. It gets an :class:`AgentModel`: the
model's name, the versions being loaded, the agent's parameters from ``config.pbtxt``, the
original config and the location of the model's files as the previous agent left them. To hand
the loader different files (a decrypted or converted copy), ``LOAD`` calls
:meth:`AgentModel.copy_location` or :meth:`AgentModel.new_location`, writes there, and calls
:meth:`AgentModel.set_location`; every folder made that way is removed once the model has
unloaded (or its load failed). To fail, raise :class:`AgentError` (or any exception): the
load fails with the agent's name and the message.

Triton's order (``tritonrepoagent.h``): ``LOAD`` to each agent in config order (a failure
stops the chain), then ``LOAD_COMPLETE`` or ``LOAD_FAIL`` to each agent that got ``LOAD``, in
reverse order; ``UNLOAD`` in config order, the model unloads, ``UNLOAD_COMPLETE`` in reverse.
"""

from __future__ import annotations

import enum
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import ClassVar

from trident.protocol.generated.inference import ModelConfig


class Action(enum.IntEnum):
    """Triton's TRITONREPOAGENT_ActionType, in lifecycle order."""

    LOAD = 0
    LOAD_COMPLETE = 1
    LOAD_FAIL = 2
    UNLOAD = 3
    UNLOAD_COMPLETE = 4


class AgentError(Exception):
    """An agent refuses the model; the message becomes the load failure's reason."""


@dataclass
class AgentModel:
    """What an agent sees of the model it acts on (Triton's TRITONREPOAGENT_AgentModel)."""

    name: str
    #: the versions this load selects (numbers of the version folders)
    versions: list[int]
    #: this agent's ``parameters`` from ``model_repository_agents`` (original config)
    parameters: dict[str, str]
    #: the model's original configuration (as read from the repository, before auto-complete)
    config: ModelConfig
    #: where the model's files are now (the repository folder, or the previous agent's copy)
    location: Path
    _owned: list[Path] = field(default_factory=list, repr=False)

    def new_location(self) -> Path:
        """A fresh empty folder named like the model, removed after the model unloads."""
        parent = Path(tempfile.mkdtemp(prefix=f"trident-agent-{self.name[:40]}-"))
        self._owned.append(parent)
        folder = parent / self.name
        folder.mkdir()
        return folder

    def copy_location(self) -> Path:
        """A copy of the current location (files hard-linked where possible, else copied),
        removed after the model unloads. Replace files in it by writing new ones (never edit a
        hard-linked file in place: it is the repository's file)."""
        folder = self.new_location()
        shutil.copytree(self.location, folder, dirs_exist_ok=True, copy_function=_link_or_copy, symlinks=False)
        return folder

    def set_location(self, folder: Path) -> None:
        """The loader (and the next agent) takes the model's files from ``folder``."""
        self.location = Path(folder)

    def file(self, relative: str) -> Path:
        """``relative`` (a '/'-separated path) inside the current location.

        Raises AgentError for an absolute path or one that leaves the model's folder."""
        p = PurePosixPath(relative)
        if not relative or p.is_absolute() or any(part in ("..", "") for part in p.parts) or "\\" in relative \
                or "\0" in relative:
            raise AgentError(f"invalid file path '{relative[:200]}': it must be relative and inside the model folder")
        target = self.location.joinpath(*p.parts)
        root = self.location.resolve()
        if root != target.resolve() and root not in target.resolve().parents:
            raise AgentError(f"file path '{relative[:200]}' leaves the model folder")
        return target


def _link_or_copy(src: str, dst: str) -> None:
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def replace_file(path: Path, data: bytes) -> None:
    """Write ``data`` as a new file at ``path`` (unlinking first: it may be a hard link to the
    repository's file, which must stay as it is)."""
    path.unlink(missing_ok=True)
    path.write_bytes(data)


class RepositoryAgent:
    """Base class of repository agents; override :meth:`model_action`.

    ``name`` is the agent's name in ``model_repository_agents``. Actions the agent has nothing
    to do for simply return.
    """

    name: ClassVar[str] = ""

    def model_action(self, action: Action, model: AgentModel) -> None:
        """Act on ``model`` for ``action``. Blocking (runs in a worker thread).

        Raises AgentError (or any exception) to fail the load (``LOAD``); failures on the other
        actions are logged (the load or unload has already been decided)."""
