"""One model's chain of repository agents, driven through Triton's order of actions.

:class:`AgentChain` is blocking and knows nothing of trio: the repository calls
:meth:`AgentChain.load` and :meth:`AgentChain.unload` / :meth:`AgentChain.unload_complete` in
worker threads. ``load`` sends ``LOAD`` to each agent in config order; the first failure stops
the chain, and the agents that got ``LOAD`` (the failing one included) get ``LOAD_FAIL`` in
reverse order; when the backend then fails, :meth:`AgentChain.load_failed` does the same. A
successful load ends with :meth:`AgentChain.load_complete` (``LOAD_COMPLETE`` in reverse).
Unloading: ``UNLOAD`` in order, the model's versions stop, ``UNLOAD_COMPLETE`` in reverse,
then every folder the agents made is removed.
"""

from __future__ import annotations

import logging
import shutil
import time
from pathlib import Path

from trident.agents import agent_class
from trident.agents.base import Action, AgentModel, RepositoryAgent
from trident.errors import TritonError, invalid_arg
from trident.protocol.generated.inference import ModelConfig

log = logging.getLogger("trident.agents")

MAX_MESSAGE = 2000  # characters of an agent's failure message kept in the load failure


class AgentChain:
    """The agents of one model load (instances live from LOAD to UNLOAD_COMPLETE)."""

    def __init__(self, model_name: str, specs: list[tuple[str, dict[str, str]]], config: ModelConfig,
                 location: Path, versions: list[int]) -> None:
        """Raises TritonError(INVALID_ARG) naming an unknown agent."""
        self.model_name = model_name
        self.location = location
        self._owned: list[Path] = []
        self._agents: list[tuple[RepositoryAgent, AgentModel]] = []
        self._invoked = 0
        self._done = False
        for name, params in specs:
            agent = agent_class(name)()
            model = AgentModel(model_name, list(versions), dict(params), config, location, self._owned)
            self._agents.append((agent, model))

    @property
    def names(self) -> list[str]:
        return [type(a).name or type(a).__name__ for a, _ in self._agents]

    def load(self) -> Path:
        """``LOAD`` to each agent in order; returns where the loader finds the model's files.

        Raises TritonError(INVALID_ARG) "repository agent '<name>' failed to load model
        '<model>': <message>" after sending LOAD_FAIL (reverse order) and removing the copies.
        """
        location = self.location
        for i, (agent, model) in enumerate(self._agents):
            model.location = location
            self._invoked = i + 1
            started = time.monotonic()
            try:
                agent.model_action(Action.LOAD, model)
                log.info("repository agent '%s' loaded model '%s' in %.3f s", self.names[i], self.model_name,
                         time.monotonic() - started)
            except Exception as e:
                name = self.names[i]
                message = str(e) or type(e).__name__
                self.load_failed()
                raise invalid_arg(f"repository agent '{name}' failed to load model '{self.model_name}': "
                                  f"{message[:MAX_MESSAGE]}") from e
            location = model.location
        self.location = location
        return location

    def load_complete(self) -> None:
        """``LOAD_COMPLETE`` in reverse order (failures are logged)."""
        self._send_reverse(Action.LOAD_COMPLETE, self._invoked)

    def load_failed(self) -> None:
        """``LOAD_FAIL`` in reverse order to the agents that got ``LOAD``; removes the copies."""
        self._send_reverse(Action.LOAD_FAIL, self._invoked)
        self._remove_copies()

    def unload(self) -> None:
        """``UNLOAD`` in config order (failures are logged: the model unloads regardless)."""
        for i, (agent, model) in enumerate(self._agents[:self._invoked]):
            self._send(agent, model, Action.UNLOAD, i)

    def unload_complete(self) -> None:
        """``UNLOAD_COMPLETE`` in reverse order, then removes every folder the agents made."""
        self._send_reverse(Action.UNLOAD_COMPLETE, self._invoked)
        self._remove_copies()

    def _send_reverse(self, action: Action, count: int) -> None:
        for i in reversed(range(count)):
            agent, model = self._agents[i]
            self._send(agent, model, action, i)

    def _send(self, agent: RepositoryAgent, model: AgentModel, action: Action, i: int) -> None:
        try:
            agent.model_action(action, model)
        except Exception as e:
            log.error("repository agent '%s' failed on %s of model '%s': %s", self.names[i], action.name,
                      self.model_name, e)

    def _remove_copies(self) -> None:
        if self._done:
            return
        self._done = True
        for folder in self._owned:
            shutil.rmtree(folder, ignore_errors=True)
        self._owned.clear()


def open_chain(model_name: str, specs: list[tuple[str, dict[str, str]]], config: ModelConfig,
               location: Path, versions: list[int]) -> AgentChain:
    """An :class:`AgentChain` (not yet loaded). Raises TritonError naming an unknown agent."""
    try:
        return AgentChain(model_name, specs, config, location, versions)
    except TritonError:
        raise
    except Exception as e:  # an agent's constructor failed
        raise invalid_arg(f"repository agents of model '{model_name}' could not start: {type(e).__name__}: {e}") from e
