"""Repository agents that hook into model load and unload (Triton's repository agents).

Built-in agents: ``checksum`` (:mod:`trident.agents.checksum`), ``decrypt``
(:mod:`trident.agents.decrypt`), ``convert`` (:mod:`trident.agents.convert`). Third-party
agents register through the entry-point group ``trident.agents`` (name ->
``module:AgentClass``, a :class:`RepositoryAgent` subclass); the interface is in
:mod:`trident.agents.base`, the order of actions in :mod:`trident.agents.lifecycle`.
"""

from __future__ import annotations

import importlib
from importlib import metadata

from trident.agents.base import Action, AgentError, AgentModel, RepositoryAgent
from trident.errors import invalid_arg
from trident.protocol.generated.inference import ModelConfig

__all__ = ["Action", "AgentError", "AgentModel", "RepositoryAgent", "agent_class", "check_agents", "agent_specs"]

# agent name -> (module, class)
_BUILTIN: dict[str, tuple[str, str]] = {
    "checksum": ("trident.agents.checksum", "ChecksumAgent"),
    "decrypt": ("trident.agents.decrypt", "DecryptAgent"),
    "convert": ("trident.agents.convert", "ConvertAgent"),
}
ENTRY_POINT_GROUP = "trident.agents"
MAX_AGENTS = 16  # agents on one model
MAX_PARAMETERS = 4096  # parameters of one agent


def agent_class(name: str) -> type[RepositoryAgent]:
    """The agent class registered under ``name`` (built-in first, then the entry points).

    Raises TritonError(INVALID_ARG) naming the agent when there is none, or when the entry
    point does not name a RepositoryAgent subclass.
    """
    if name in _BUILTIN:
        module, cls_name = _BUILTIN[name]
        cls = getattr(importlib.import_module(module), cls_name)
        assert issubclass(cls, RepositoryAgent)
        return cls
    for ep in metadata.entry_points(group=ENTRY_POINT_GROUP):
        if ep.name == name:
            try:
                cls = ep.load()
            except Exception as e:
                raise invalid_arg(f"unable to load repository agent '{name}' ({ep.value}): "
                                  f"{type(e).__name__}: {e}") from e
            if not (isinstance(cls, type) and issubclass(cls, RepositoryAgent)):
                raise invalid_arg(f"repository agent '{name}': entry point '{ep.value}' is not a "
                                  "trident.agents.RepositoryAgent subclass")
            return cls
    known = sorted({*_BUILTIN, *(ep.name for ep in metadata.entry_points(group=ENTRY_POINT_GROUP))})
    raise invalid_arg(f"unable to find repository agent '{name[:100]}' (known agents: {', '.join(known)}; "
                      f"others register through the entry-point group '{ENTRY_POINT_GROUP}')")


def agent_specs(config: ModelConfig) -> list[tuple[str, dict[str, str]]]:
    """The (name, parameters) of each agent in ``config.model_repository_agents``, in order."""
    if config.model_repository_agents is None:
        return []
    return [(a.name, dict(a.parameters)) for a in config.model_repository_agents.agents]


def check_agents(config: ModelConfig) -> None:
    """Check the ``model_repository_agents`` of a config: each agent named, known, within bounds.

    Raises TritonError(INVALID_ARG) naming the agent at fault."""
    specs = agent_specs(config)
    if len(specs) > MAX_AGENTS:
        raise invalid_arg(f"model '{config.name}' names {len(specs)} repository agents; at most {MAX_AGENTS}")
    for name, params in specs:
        if not name:
            raise invalid_arg(f"model '{config.name}': a repository agent must specify 'name'")
        agent_class(name)
        if len(params) > MAX_PARAMETERS:
            raise invalid_arg(f"repository agent '{name}' of model '{config.name}' has {len(params)} "
                              f"parameters; at most {MAX_PARAMETERS}")
