"""Model repositories and model lifecycle: scan, load, reload, unload, index, poll.

Every loaded :class:`~trident.server.model.ModelVersion` runs as a task in the repository's nursery
(which outlives the front ends). A load prepares the config in a worker thread, starts every
selected version and only then swaps them in, so a failed (re)load leaves the versions that
were serving untouched and a successful one loses no availability. A reload whose only change
is instance counts (same files, same versions) is applied to the serving versions in place.
Unloading drains. An ensemble loads after its composing models (loading them first when they
have not been loaded; a circular dependency between ensembles fails the load); unloading it
with ``unload_dependents`` unloads the composing models that no other ensemble uses and the user
did not load themselves; unloading a composing model unloads the ensembles that use it, and
loading it again through the API brings them back. The
repository also owns the server-wide rate limiter (``--rate-limit``) and
response cache (``--cache-config``) its model versions share.

Repository agents (``model_repository_agents`` in a model's config) run around a load in
worker threads (:mod:`trident.agents.lifecycle`): LOAD before the config is prepared (an agent
may hand over a copy of the files, which the config is then read from), LOAD_COMPLETE or
LOAD_FAIL after, UNLOAD before the versions stop and UNLOAD_COMPLETE after, then their copies
are removed. A ``--model-repository`` in object storage (``s3://``, ``gs://``, ``as://``,
:mod:`trident.server.cloud_repository`) is listed in a worker thread at start-up, at each poll and
when an explicit load names a model not seen yet; each load downloads the model to a fresh
local folder, removed after unload, and polling reloads a model only when its objects changed.
"""

from __future__ import annotations

import copy
import json
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any, TypeAlias

import trio

from trident import config as cfg
from trident.agents import agent_specs, check_agents
from trident.agents.convert import CACHE_DIR_NAME
from trident.agents.lifecycle import AgentChain, open_chain
from trident.backends import Backend, backend_name_for, get_backend
from trident.batching.cache import ResponseCache, parse_cache_config
from trident.batching.ensemble_plan import EnsemblePlan, build_plan, version_string
from trident.batching.instances import counts_only_change
from trident.batching.rate_limiter import RateLimiter
from trident.config_validation import ENSEMBLE_PLATFORM, confine_model_files, validate_config
from trident.errors import Code, TritonError, internal, invalid_arg, not_found, unavailable, unsupported
from trident.observability.logs import VERBOSE
from trident.protocol.generated.inference import ModelConfig
from trident.server import heap
from trident.server.cloud_repository import CloudRepository, Fingerprint, is_cloud_url, mount_directory_env
from trident.server.devices import gpu_count
from trident.server.model import HostServer, ModelVersion
from trident.server.on_demand import (
    DemandLoad,
    OnDemand,
    Resident,
    choose_evictions,
    give_back_memory,
    options_problem,
    resident_bytes,
)
from trident.types import IndexEntry

if TYPE_CHECKING:
    from trident.options import ServerOptions

log = logging.getLogger("trident.repository")

#: what the repository serves: a model version, or an ensemble version that runs others

#: parent folder of the local copies of cloud models (after Triton's TRITON_<STORE>_MOUNT_DIRECTORY)
CLOUD_CACHE_ENV = "TRIDENT_CLOUD_CACHE_DIR"


@dataclass(frozen=True)
class RemoteModel:
    """A model folder in a cloud repository (what :meth:`ModelRepository.scan` finds there)."""

    url: str
    name: str
    repo: CloudRepository = field(compare=False, hash=False, repr=False)


#: where a model's files are: a local folder, or a folder in object storage
Source: TypeAlias = Path | RemoteModel

#: awaited by a load once its versions are ready, before they serve (see ModelRepository.load):
#: given the final config and the version numbers, it returns to go on or raises to abandon
Gate: TypeAlias = Callable[[ModelConfig, list[int]], Awaitable[None]]


@dataclass
class _Record:
    name: str
    path: Source | None
    versions: dict[int, ModelVersion] = field(default_factory=dict)
    failed: dict[int, str] = field(default_factory=dict)  # version -> reason; -1: the whole model
    unloaded: set[int] = field(default_factory=set)
    fingerprint: tuple[Any, ...] = ()
    lock: trio.Lock = field(default_factory=trio.Lock)
    tmpdir: Path | None = None
    loading: bool = False
    #: load calls of this record under way, from their start (before its lock is taken)
    loads: int = 0
    #: composing models (name, version string) when the record is a loaded ensemble
    composing: list[tuple[str, str]] = field(default_factory=list)
    #: loaded by the user (load API, --load-model, or at start-up), not only as a dependency
    explicit: bool = False
    #: an ensemble unloaded because a composing model was: its composing model names
    suspended: list[str] = field(default_factory=list)
    #: the config (and files) of the last load API call that had one, kept for reloads
    override: tuple[str, dict[str, bytes] | None] | None = None
    #: the repository agents of the serving versions (None without agents)
    agents: AgentChain | None = None
    #: loaded on demand (evictable unless ``explicit``; trident.server.on_demand)
    on_demand: bool = False
    #: the tick of its last lookup (``--model-load-on-demand``: least recently used goes first)
    used: int = 0


def _is_json_object(text: str) -> bool:
    try:
        return isinstance(json.loads(text), dict)
    except ValueError:
        return False


def _without_config(fingerprint: tuple[Any, ...]) -> tuple[Any, ...]:
    """A fingerprint without the model configuration files (config.pbtxt, configs/)."""
    return tuple(e for e in fingerprint if e[0] != "config.pbtxt" and not e[0].startswith("configs"))


def _fingerprint(model_dir: Path) -> tuple[Any, ...]:
    entries = []
    for p in sorted(model_dir.rglob("*")):
        if p.relative_to(model_dir).parts[0] == CACHE_DIR_NAME:
            continue  # the convert agent's cache, written next to the model by its load
        try:
            st = p.stat()
        except OSError:
            continue
        entries.append((str(p.relative_to(model_dir)), st.st_size, st.st_mtime_ns, p.is_dir()))
    return tuple(entries)


class _CircularDependency(TritonError):
    """Ensembles that include each other (passed up unchanged through the chain of loads)."""


def check_model_name(name: str) -> None:
    """Reject names that could escape a repository folder. Raises INVALID_ARG."""
    if (not name or name in (".", "..") or "/" in name or "\\" in name or not name.isprintable()
            or len(name.encode()) > 255):
        shown = name if len(name) <= 80 and name.isprintable() else repr(name[:80]) + "..."
        raise invalid_arg(f"invalid model name '{shown}'")


class ModelRepository:
    """All models of the server's repository paths and the control mode that governs them."""

    def __init__(self, options: ServerOptions, nursery: trio.Nursery, server: HostServer | None = None) -> None:
        self.options = options
        self._nursery = nursery
        self._server = server
        self._records: dict[str, _Record] = {}
        #: server-wide, shared by every model version (None when off / not configured)
        self.rate_limiter = RateLimiter.from_options(options)
        self.response_cache = ResponseCache.from_config(parse_cache_config(options.cache_config))
        self._ensemble_loads = trio.Lock()
        self._closing = False  # unload_all has begun
        #: worker threads for repository agents, cloud listing and downloads, file removal
        self._io_limiter = trio.CapacityLimiter(max(2, options.model_load_thread_count))
        #: each cloud repository's folder of local copies (removed when the server exits)
        self._cloud_caches: list[Path] = []
        self._clouds: list[CloudRepository] = []
        for url in (u for u in options.model_repositories if is_cloud_url(u)):
            parent = os.environ.get(mount_directory_env(url)) or os.environ.get(CLOUD_CACHE_ENV) or None
            try:
                cloud = CloudRepository(url, Path("."))
                if parent:
                    Path(parent).mkdir(parents=True, exist_ok=True)
                cloud.cache = Path(tempfile.mkdtemp(prefix="trident-cloud-", dir=parent))
            except TritonError as e:
                log.error("%s", e.message)
                continue
            except OSError as e:
                log.error("model repository '%s': cannot make its local folder in '%s': %s", url, parent, e)
                continue
            self._cloud_caches.append(cloud.cache)
            self._clouds.append(cloud)
        #: the last listing of each cloud repository (url -> model -> fingerprint)
        self._listing: dict[str, dict[str, Fingerprint]] = {}
        #: why the last listing of a cloud repository failed (url -> reason)
        self._listing_errors: dict[str, str] = {}
        #: the models of the start-up plan whose load has not run yet (LOADING, not unknown)
        self._startup_names: set[str] = set()
        #: the start-up plan is not made yet (the front ends listen before it is)
        self._awaiting_plan = True
        problem = options_problem(options)
        if problem:
            raise invalid_arg(problem)
        #: loads on demand and their budget (``--model-load-on-demand``; None: off)
        self.on_demand = OnDemand(options) if options.model_load_on_demand else None

    # ---- scanning -------------------------------------------------------------------------

    def scan(self) -> dict[str, Source]:
        """Model name -> folder over every repository path (duplicate names are refused).

        Cloud repositories contribute the models of their last listing (see
        :meth:`refresh_cloud`); nothing here blocks on the network."""
        found: dict[str, Source] = {}
        duplicates: set[str] = set()
        clouds = {c.url: c for c in self._clouds}
        for repo in self.options.model_repositories:
            if is_cloud_url(repo):
                cloud = clouds.get(repo)
                for model in sorted(self._listing.get(repo, {})) if cloud is not None else ():
                    if model in found:
                        duplicates.add(model)
                    assert cloud is not None
                    found[model] = RemoteModel(repo, model, cloud)
                continue
            root = Path(repo)
            if not root.is_dir():
                log.error("model repository '%s' is not a directory", repo)
                continue
            for child in sorted(root.iterdir()):
                if not child.is_dir() or child.name.startswith("."):
                    continue
                if child.name in found:
                    duplicates.add(child.name)
                found[child.name] = child
        for name in duplicates:
            log.error("model '%s' appears in more than one model repository; it will not be loaded", name)
            found.pop(name)
            rec = self._record(name, None)
            rec.failed = {-1: "model appears in more than one model repository"}
        return found

    async def refresh_cloud(self) -> None:
        """List every cloud repository again (worker threads). A listing that fails keeps the
        previous one (its models keep serving) and records the reason."""
        async def one(cloud: CloudRepository) -> None:
            try:
                listing = await trio.to_thread.run_sync(cloud.list_models, limiter=self._io_limiter)
            except TritonError as e:
                if self._listing_errors.get(cloud.url) != e.message:
                    log.error("%s", e.message)
                self._listing_errors[cloud.url] = e.message
                return
            self._listing_errors.pop(cloud.url, None)
            self._listing[cloud.url] = listing

        async with trio.open_nursery() as nursery:
            for cloud in self._clouds:
                nursery.start_soon(one, cloud)

    def listing_errors(self) -> dict[str, str]:
        """Cloud repository URL -> why its last listing failed (empty when all were listed)."""
        return dict(self._listing_errors)

    def _not_found_reason(self) -> str:
        """The cloud listing failures, for the load failure of a model not found."""
        return "".join(f": {reason}" for reason in self._listing_errors.values())

    async def _source_fingerprint(self, source: Source) -> tuple[Any, ...]:
        if isinstance(source, RemoteModel):
            return self._listing.get(source.url, {}).get(source.name, ())
        return await trio.to_thread.run_sync(_fingerprint, source, limiter=self._io_limiter)

    async def _source_is_ensemble(self, source: Source) -> bool:
        if isinstance(source, RemoteModel):
            return await trio.to_thread.run_sync(_remote_is_ensemble, source, self.options.model_config_name,
                                                 limiter=self._io_limiter)
        return await trio.to_thread.run_sync(_is_ensemble, source, self.options.model_config_name)

    def _record(self, name: str, path: Source | None) -> _Record:
        rec = self._records.get(name)
        if rec is None:
            rec = self._records[name] = _Record(name, path)
        elif path is not None:
            rec.path = path
        return rec

    async def startup(self) -> None:
        """Load what the control mode says to load at start-up (failures are recorded, not raised)."""
        phases = await self.startup_plan()
        limiter = trio.CapacityLimiter(max(1, self.options.model_load_thread_count))

        async def load_one(name: str) -> None:
            async with limiter:
                try:
                    await self.load_startup_model(name)
                except TritonError as e:
                    _log_unlogged(e)

        # composing models first; then ensembles, which load what they still need themselves
        try:
            for phase in phases:
                async with trio.open_nursery() as nursery:
                    for name in phase:
                        nursery.start_soon(load_one, name)
        finally:
            self._startup_names.clear()
        heap.settle()

    # ---- load / unload --------------------------------------------------------------------

    def check_load(self, name: str, config: str | None = None, files: dict[str, bytes] | None = None) -> None:
        """What the load API refuses before anything is read (see :meth:`load`). Raises TritonError."""
        if self.options.model_control_mode != "explicit":
            raise unsupported("explicit model load / unload is not allowed if polling is enabled"
                              if self.options.model_control_mode == "poll"
                              else "explicit model load / unload is not allowed if model control mode is not EXPLICIT")
        check_model_name(name)
        if files and not config:
            raise invalid_arg(f"failed to load '{name}': file overrides need the 'config' parameter")
        if config is not None and not _is_json_object(config):  # Triton's answer to a bad override
            raise internal(f"failed to load '{name}', failed to poll from model repository")

    def check_unload(self, name: str) -> None:
        """What the unload API refuses before anything is done (see :meth:`unload`). Raises TritonError."""
        if self.options.model_control_mode != "explicit":
            raise unsupported("explicit model load / unload is not allowed if model control mode is not EXPLICIT")
        check_model_name(name)

    async def load(self, name: str, config: str | None = None, files: dict[str, bytes] | None = None,
                   *, gate: Gate | None = None) -> None:
        """The load API (explicit mode only): load or reload ``name``.

        A reload of a loaded model without ``config`` keeps the config (and files) of the last
        load that had one, as Triton does (an unload forgets it). A model that exists only
        through the request's files leaves no entry behind when its load fails.

        ``gate`` (``--workers``: the supervisor's two-phase load) is awaited with the final
        config and versions once they are ready to serve, before they replace what serves: if
        it raises, the new versions are unloaded, nothing changes, and its error is raised.

        Raises TritonError: UNSUPPORTED outside explicit mode; INTERNAL "failed to poll from
        model repository" (Triton's words) for a model in neither the repository nor the
        request, and for a ``config`` that is not a JSON object; INVALID_ARG for a bad name or
        file path, or when the load fails (with the reason).
        """
        self.check_load(name, config, files)
        rec = self._records.get(name)
        if config is None and rec is not None and rec.override is not None:
            config, files = rec.override  # a reload without a config keeps the last override (Triton)
        try:
            await self._load(name, config, files, gate=gate)
            rec = self._records[name]
            rec.explicit = True
            rec.on_demand = False  # pinned: loaded by the user now
            rec.override = (config, files) if config is not None else None
            await self._resume_dependents(name)
        finally:
            heap.settle()  # the new model's objects (a reload's old ones: when they are unloaded)

    async def load_startup_model(self, name: str, *, gate: Gate | None = None) -> None:
        """Load one model of the start-up set (``--workers``: the supervisor drives the start-up
        load, model by model, in every worker; see :meth:`startup_plan`). Raises TritonError."""
        try:
            await self._load(name, gate=gate)
        finally:
            self._startup_names.discard(name)
        self._records[name].explicit = True

    async def startup_plan(self) -> tuple[list[str], list[str]]:
        """The models the control mode loads at start-up, as (composing models and others,
        ensembles): what :meth:`startup` loads, in that order. Lists the repositories."""
        await self.refresh_cloud()
        found = self.scan()
        for name, path in found.items():
            self._record(name, path)
        if self.options.model_control_mode == "explicit":
            wanted = self.options.load_models
            names = list(found) if wanted == ["*"] else wanted
        else:
            names = list(found)
        self._startup_names = {n for n in names if n in found}
        self._awaiting_plan = False
        ensembles = set()
        for name in names:
            where = found.get(name)
            if where is not None and await self._source_is_ensemble(where):
                ensembles.add(name)
        return [n for n in names if n not in ensembles], [n for n in names if n in ensembles]

    async def _resume_dependents(self, name: str) -> None:
        """After ``name`` (re)loaded: check the serving ensembles that use it against it (one
        that no longer fits is unloaded, with the reason), and reload the ensembles unloaded
        because ``name`` was, once all they need is serving. Failures are logged: the load of
        ``name`` itself succeeded."""
        for rec in list(self._records.values()):
            if not rec.versions or name not in {dep for dep, _ in rec.composing}:
                continue
            try:
                for mv in rec.versions.values():
                    mv.refresh()  # an ensemble checks its steps again (other models: nothing)
            except TritonError as e:
                log.error("unloading ensemble '%s': it no longer fits '%s': %s", rec.name, name, e.message)
                await self._unload_record(rec)
                rec.unloaded = set()
                rec.failed = {-1: e.message}
        for rec in list(self._records.values()):
            if name not in rec.suspended or rec.versions:
                continue
            if not all(self._records.get(dep) is not None and self._records[dep].versions for dep in rec.suspended):
                continue
            rec.suspended = []
            try:
                await self._load(rec.name)
            except TritonError as e:
                _log_unlogged(e)

    async def _load(self, name: str, config_json: str | None = None, files: dict[str, bytes] | None = None,
                    chain: tuple[str, ...] = (), gate: Gate | None = None) -> None:
        rec = self._records.get(name)
        created = False
        if rec is None or rec.path is None:
            found = self.scan().get(name)
            if found is None and self._clouds:
                await self.refresh_cloud()  # a model added to a bucket since the last listing
                found = self.scan().get(name)
            if found is None and not files:
                raise internal(f"failed to load '{name}', failed to poll from model repository"
                               f"{self._not_found_reason()}")
            created = rec is None and found is None  # exists only through the request's files
            rec = self._record(name, found)
        rec.loads += 1
        try:
            if not chain and await self._names_an_ensemble(rec, config_json):
                # one ensemble load at a time (with the loads of what it needs, chain non-empty):
                # two ensembles that need each other must not each wait for the other's lock
                async with self._ensemble_loads:
                    await self._load_record(rec, config_json, files, chain, gate)
            else:
                await self._load_record(rec, config_json, files, chain, gate)
        except BaseException:
            if created and not rec.versions and self._records.get(name) is rec:
                del self._records[name]  # no phantom entry for a refused load
            raise
        finally:
            rec.loads -= 1

    async def _load_record(self, rec: _Record, config_json: str | None, files: dict[str, bytes] | None,
                           chain: tuple[str, ...], gate: Gate | None = None) -> None:
        async with rec.lock:
            rec.loading = True
            started = time.monotonic()
            try:
                await self._load_locked(rec, config_json, files, (*chain, rec.name), gate)
            except TritonError as e:
                if not (isinstance(e, _CircularDependency) and chain):  # reported by the ensemble asked for
                    log.error("%s (after %.3f s)", e.message, time.monotonic() - started)
                    e.load_logged = True  # type: ignore[attr-defined]
                raise
            finally:
                rec.loading = False
                self._startup_names.discard(rec.name)  # whichever load ran, the start-up's has

    async def _names_an_ensemble(self, rec: _Record, config_json: str | None) -> bool:
        if config_json:
            try:
                config = cfg.config_from_json(config_json)
            except TritonError:
                return False
            return config.platform == ENSEMBLE_PLATFORM or config.ensemble_scheduling is not None
        if rec.path is None:
            return False
        try:
            return await self._source_is_ensemble(rec.path)
        except TritonError:
            return False

    async def _load_locked(self, rec: _Record, config_json: str | None, files: dict[str, bytes] | None,
                           chain: tuple[str, ...] = (), gate: Gate | None = None) -> None:
        name = rec.name
        started = time.monotonic()
        source = rec.path
        tmpdir: Path | None = None
        remote_fingerprint: tuple[Any, ...] = ()
        agents: AgentChain | None = None
        log.info("loading '%s' from %s", name, _source_text(name, source, files))
        if files:
            tmpdir = _write_override_files(name, files)
            model_dir = tmpdir / name
        elif config_json and source is None:
            raise internal(f"failed to load '{name}', failed to poll from model repository")
        elif isinstance(source, RemoteModel):
            try:
                model_dir, remote_fingerprint = await trio.to_thread.run_sync(source.repo.download, name,
                                                                              limiter=self._io_limiter)
            except TritonError as e:
                rec.failed = {-1: e.message}
                raise invalid_arg(f"load failed for model '{name}': {e.message}") from e
            tmpdir = model_dir.parent
        else:
            assert source is not None
            model_dir = source
        source_dir = model_dir  # before agents: what polling fingerprints
        try:
            agents, model_dir = await self._run_agents(name, model_dir, config_json)
            config, backend = await trio.to_thread.run_sync(self._prepare_config, name, model_dir, config_json)
            available = cfg.list_version_dirs(model_dir)
            versions = cfg.select_versions(config.version_policy, available)
            if not versions:
                raise invalid_arg(
                    f"at least one version must be available under the version policy of model '{name}'"
                )
            ensemble = config.platform == ENSEMBLE_PLATFORM
            plan: EnsemblePlan | None = None
            if ensemble:
                await self._load_dependencies(name, config, chain)
                plan = build_plan(config, lambda model, v: self.get(model, version_string(v)))
        except TritonError as e:
            rec.failed = {-1: e.message}
            await self._discard(agents, tmpdir)
            if isinstance(e, _CircularDependency) and len(chain) > 1:
                raise  # reported once, by the ensemble whose load was asked for
            raise invalid_arg(f"load failed for model '{name}': {e.message}") from e
        except BaseException:  # cancelled (shutdown): the agents' copies and the download go too
            with trio.CancelScope(shield=True):
                await self._discard(agents, tmpdir)
            raise
        if (not ensemble and not files and agents is None and tmpdir is None
                and await self._update_in_place(rec, config, versions, model_dir, gate)):
            log.info("successfully applied the instance counts of '%s' version(s) %s without reloading",
                     name, sorted(versions))
            return
        fresh: dict[int, ModelVersion] = {}
        failures: dict[int, str] = {}

        async def start_version(v: int) -> None:
            mv: ModelVersion
            if backend is None:
                assert plan is not None
                mv = ModelVersion(name, v, copy.deepcopy(config), None, model_dir, server=self._server,
                                  cache=self.response_cache, resolve=self.get)
                mv.use(plan)
            else:
                mv = ModelVersion(name, v, config, backend, model_dir, backend_config=self._backend_config(backend),
                                  server=self._server, rate_limiter=self.rate_limiter, cache=self.response_cache)
            load_started = time.monotonic()
            try:
                await self._nursery.start(mv.serve)
                mv.load_duration_s = time.monotonic() - load_started
            except TritonError as e:
                failures[v] = e.message
            except Exception as e:  # a backend bug must not take the repository down
                failures[v] = f"{type(e).__name__}: {e}"
            else:
                fresh[v] = mv

        async with trio.open_nursery() as nursery:
            for v in versions:
                nursery.start_soon(start_version, v)
        if failures:
            for mv in fresh.values():
                mv.request_unload()
            for mv in fresh.values():
                await mv.stopped.wait()
            await self._discard(agents, tmpdir)
            if not rec.versions:
                rec.failed = dict(failures)
            detail = "; ".join(f"version {v} is at UNAVAILABLE state: {r}" for v, r in sorted(failures.items()))
            raise invalid_arg(f"load failed for model '{name}': {detail}")
        if files:
            fingerprint: tuple[Any, ...] = ()
        elif isinstance(source, RemoteModel):
            fingerprint = remote_fingerprint
        else:
            fingerprint = await trio.to_thread.run_sync(_fingerprint, source_dir, limiter=self._io_limiter)
        if gate is not None:
            try:
                await gate(config, sorted(fresh))
            except BaseException as e:  # abandoned (another worker failed, or cancelled): nothing changes
                with trio.CancelScope(shield=True):
                    for mv in fresh.values():
                        mv.request_unload()
                    for mv in fresh.values():
                        await mv.stopped.wait()
                    await self._discard(agents, tmpdir)
                if isinstance(e, TritonError) and not rec.versions:
                    rec.failed = {-1: e.message}  # as where the load failed: not ready, with the reason
                raise
        if agents is not None:
            await trio.to_thread.run_sync(agents.load_complete, limiter=self._io_limiter)
        # the swap: no checkpoint from here to the end of the record's update
        old = rec.versions
        rec.versions = fresh
        rec.failed = {}
        rec.unloaded = set()
        rec.fingerprint = fingerprint
        old_agents, rec.agents = rec.agents, agents
        stale = rec.tmpdir if rec.tmpdir and rec.tmpdir != tmpdir else None
        self._nursery.start_soon(self._unload_versions, list(old.values()), stale, old_agents)
        rec.tmpdir = tmpdir
        rec.composing = [dep for mv in fresh.values() for dep in mv.composing()]
        log.info("successfully loaded '%s' version(s) %s in %.3f s", name, sorted(fresh), time.monotonic() - started)
        if log.isEnabledFor(VERBOSE):  # --log-verbose: the final (auto-completed) config, as Triton logs it
            for v in sorted(fresh):
                log.log(VERBOSE, "model '%s' version %d config: %s", name, v,
                        json.dumps(cfg.config_to_json(fresh[v].config), sort_keys=True), extra={"verbose": 1})

    async def _run_agents(self, name: str, model_dir: Path, config_json: str | None
                          ) -> tuple[AgentChain | None, Path]:
        """Send LOAD to the model's repository agents (worker threads); returns the chain (None
        without agents) and where the model's files are now.

        Raises TritonError: INVALID_ARG naming an unknown agent, or the agent that failed and
        its message (the agents that got LOAD have had LOAD_FAIL and their copies are gone)."""
        if config_json:
            config = cfg.config_from_json(config_json)
        else:
            config = await trio.to_thread.run_sync(
                lambda: cfg.read_model_config(model_dir, config_name=self.options.model_config_name))
        specs = agent_specs(config)
        if not specs:
            return None, model_dir

        def start() -> tuple[AgentChain, Path]:
            check_agents(config)
            policy = cfg.complete_defaults(config, name).version_policy
            versions = cfg.select_versions(policy, cfg.list_version_dirs(model_dir))
            agents = open_chain(name, specs, config, model_dir, versions)
            return agents, agents.load()

        return await trio.to_thread.run_sync(start, limiter=self._io_limiter)

    async def _discard(self, agents: AgentChain | None, tmpdir: Path | None) -> None:
        """After a failed load: LOAD_FAIL to the agents (their copies go), remove ``tmpdir``."""
        if agents is not None:
            await trio.to_thread.run_sync(agents.load_failed, limiter=self._io_limiter)
        if tmpdir is not None:
            await trio.to_thread.run_sync(shutil.rmtree, tmpdir, True, limiter=self._io_limiter)

    async def _load_dependencies(self, name: str, config: ModelConfig, chain: tuple[str, ...]) -> None:
        """Make sure every composing model of ensemble ``name`` is serving, loading those that
        are not (a model that failed to load is retried only in explicit mode).

        Raises TritonError(INVALID_ARG) for a circular dependency or a composing model that
        cannot be loaded, with the reason.
        """
        assert config.ensemble_scheduling is not None
        wanted = dict.fromkeys(step.model_name for step in config.ensemble_scheduling.step)
        for dep in wanted:
            if dep in chain:
                cycle = " -> ".join((*chain[chain.index(dep):], dep))
                raise _CircularDependency(Code.INVALID_ARG, f"circular dependency between ensembles: {cycle}")
            rec = self._records.get(dep)
            if rec is not None and rec.loading:
                async with rec.lock:  # another task is loading it: wait for that load
                    pass
            if rec is not None and rec.versions:
                continue
            if rec is not None and rec.failed and self.options.model_control_mode != "explicit":
                reason = rec.failed.get(-1) or next(iter(rec.failed.values()))
                raise invalid_arg(f"ensemble '{name}' depends on '{dep}' which failed to load: {reason}")
            if (rec is None or rec.path is None) and dep not in self.scan():
                raise invalid_arg(f"ensemble {name} contains models that are not available or ambiguous: {dep}")
            try:
                await self._load(dep, chain=chain)
            except _CircularDependency:
                raise
            except TritonError as e:
                raise invalid_arg(f"ensemble '{name}' depends on '{dep}' which failed to load: {e.message}") from e

    async def _update_in_place(self, rec: _Record, config: ModelConfig, versions: list[int], model_dir: Path,
                               gate: Gate | None = None) -> bool:
        """Apply ``config`` to the serving versions when only instance counts changed (after
        ``gate``, as a load's swap).

        Returns False (nothing done) when anything else differs: the version set, a model file,
        another config field. Raises INVALID_ARG when an added instance fails to load, and what
        ``gate`` raises (nothing applied).
        """
        serving = rec.versions
        if any(mv.ensemble is not None for mv in serving.values()):
            return False
        if not serving or set(serving) != set(versions) or not rec.fingerprint or rec.tmpdir is not None:
            return False
        if not all(counts_only_change(mv.config, config) and mv.scheduler.supports_instance_update
                   for mv in serving.values()):
            return False
        fingerprint = await trio.to_thread.run_sync(_fingerprint, model_dir)
        if _without_config(fingerprint) != _without_config(rec.fingerprint):
            return False
        if gate is not None:
            await gate(config, sorted(serving))
        try:
            for mv in serving.values():
                await mv.update_instances(config)
        except TritonError as e:
            raise invalid_arg(f"load failed for model '{rec.name}': {e.message}") from e
        rec.fingerprint = fingerprint
        return True

    def _prepare_config(self, name: str, model_dir: Path, config_json: str | None
                        ) -> tuple[ModelConfig, Backend | None]:
        """Read, auto-complete, default and validate a model's config. Blocking (thread).

        The backend is None for an ensemble (it has none; its steps are checked at load).

        Raises TritonError (INVALID_ARG with file:line:col for a bad config.pbtxt, UNSUPPORTED
        for an unknown backend).
        """
        config = cfg.config_from_json(config_json) if config_json else cfg.read_model_config(
            model_dir, config_name=self.options.model_config_name)
        confine_model_files(config, model_dir)  # before any backend opens or imports a file it names
        # name, backend/platform from the files, version policy, instance groups...
        gpus = gpu_count()
        config = cfg.complete_defaults(config, name, gpu_count=gpus, model_dir=model_dir)
        if config.platform == ENSEMBLE_PLATFORM or config.ensemble_scheduling is not None:
            validate_config(config, name, model_dir, gpu_count=gpus)
            return config, None
        backend = get_backend(backend_name_for(config.backend, config.platform))
        if not self.options.disable_auto_complete_config:
            versions = cfg.list_version_dirs(model_dir)
            version_dir = model_dir / str(max(versions)) if versions else None
            config = backend.auto_complete_config(config, model_dir, version_dir)
            config = cfg.complete_defaults(config, name, gpu_count=gpus)
        validate_config(config, name, model_dir, gpu_count=gpus)
        return config, backend

    def _backend_config(self, backend: Backend) -> dict[str, str]:
        merged = dict(self.options.backend_config.get("", {}))
        merged.update(self.options.backend_config.get(backend.name, {}))
        return merged

    # ---- loads on demand (--model-load-on-demand; trident.server.on_demand) ---------------------

    def loads_on_demand(self, name: str) -> bool:
        """Whether a request for ``name`` should load it and wait: loading on demand is on, the
        model serves no version, and the repository holds it (a model of its start-up listing,
        or a folder of a local repository). Only a request that did not find its model asks."""
        if self.on_demand is None:
            return False
        rec = self._records.get(name)
        if rec is not None:
            return not rec.versions and rec.path is not None
        try:
            check_model_name(name)
        except TritonError:
            return False
        return any((Path(r) / name).is_dir() for r in self.options.model_repositories if not is_cloud_url(r))

    async def load_on_demand(self, name: str) -> None:
        """Wait until ``name`` serves, starting its load (in the repository's nursery, shared with
        the requests that arrive meanwhile) unless one is under way; at most
        ``--model-load-on-demand-timeout-secs``, after which the load goes on without this caller.

        Raises TritonError: UNAVAILABLE with the reason when the load fails (and, for
        :data:`~trident.server.on_demand.RETRY_AFTER_FAILURE_S`, at once to the requests that
        follow), or when the wait times out; NOT_FOUND for a model the repository does not hold.
        Cancellation: the caller stops waiting; the load goes on.
        """
        od = self.on_demand
        assert od is not None
        reason = od.recent_failure(name)
        if reason is not None:
            raise unavailable(f"model '{name}' failed to load on demand: {reason}")
        load = od.pending.get(name)
        if load is None:
            load = od.pending[name] = DemandLoad()
            self._nursery.start_soon(self._run_demand_load, name, load)
        with trio.move_on_after(od.timeout_s):
            await load.done.wait()
        if not load.done.is_set():
            raise unavailable(f"model '{name}' is still loading on demand after {od.timeout_s:g} s; "
                              "retry later (--model-load-on-demand-timeout-secs)")
        if load.error is not None:
            if load.unknown:
                raise not_found(f"Request for unknown model: '{name}' is not found")
            raise unavailable(f"model '{name}' failed to load on demand: {load.error}")

    async def _run_demand_load(self, name: str, load: DemandLoad) -> None:
        """One load on demand: make room within the budget, load through the repository's load
        path, measure what it added. Never raises but cancellation (its error goes to ``load``)."""
        od = self.on_demand
        assert od is not None
        try:
            async with od.lock:
                rec = self._records.get(name)
                if rec is None or not rec.versions:
                    if rec is None and name not in self.scan():
                        load.unknown = True
                        raise not_found(f"Request for unknown model: '{name}' is not found")
                    evicted = await self._make_room(name)
                    before = resident_bytes()
                    await self._load(name)
                    heap.settle()
                    rec = self._records[name]
                    rec.on_demand = not rec.explicit
                    od.measured(name, resident_bytes() - before)
                    od.loads += 1
                    if evicted:  # what the unloaded models freed after their unload ended goes back too
                        await trio.to_thread.run_sync(give_back_memory, limiter=self._io_limiter)
                    log.info("loaded '%s' on demand, counted as %d resident bytes (%s)", name, od.sizes[name],
                             self._budget_text())
                od.tick += 1
                rec.used = od.tick
        except TritonError as e:
            load.error = e.message
            if not load.unknown:
                od.load_failures += 1
                od.failures[name] = (time.monotonic(), e.message)
                _log_unlogged(e)
        except Exception as e:  # a bug must not take the repository down: the requests get it
            log.exception("load on demand of '%s' failed", name)
            load.error = f"{type(e).__name__}: {e}"
            od.load_failures += 1
            od.failures[name] = (time.monotonic(), load.error)
        finally:
            od.pending.pop(name, None)
            load.done.set()

    async def _make_room(self, name: str) -> int:
        """Unload the least recently used idle models loaded on demand until ``name`` fits the
        budgets, waiting for a busy one to go idle when the idle ones are not enough. Returns
        how many were unloaded."""
        od = self.on_demand
        assert od is not None
        evicted = 0
        while True:
            composing = {dep for r in self._records.values() if r.versions for dep, _ in r.composing}
            resident = [Resident(r.name, r.used, r.name not in composing and all(
                            mv.inflight.count == 0 for mv in r.versions.values()), od.sizes.get(r.name, 0))
                        for r in self._records.values() if r.on_demand and r.versions and not r.explicit]
            victims, enough = choose_evictions(resident, od.count_budget, od.memory_budget, od.estimate(name))
            for victim in victims:
                rec = self._records[victim]
                nested = list(rec.composing)
                async with rec.lock:
                    await self._unload_record(rec)
                od.evictions += 1
                evicted += 1
                log.info("unloaded '%s', the least recently used model loaded on demand, to make room for '%s'",
                         victim, name)
                if nested:
                    await self._unload_composing(nested)
            if victims:
                await trio.to_thread.run_sync(give_back_memory, limiter=self._io_limiter)
            if enough:
                return evicted
            busy = [r for r in resident if not r.idle and r.name not in composing]
            if busy:  # the least recently used busy one: wait until its requests are done (or a while)
                oldest = self._records[min(busy, key=lambda r: r.used).name]
                with trio.move_on_after(0.05):
                    for mv in list(oldest.versions.values()):
                        await mv.inflight.idle.wait()
            else:
                await trio.sleep(0.05)  # only ensembles' composing models are left: one may go

    def _budget_text(self) -> str:
        od = self.on_demand
        assert od is not None
        loaded = [r for r in self._records.values() if r.on_demand and r.versions]
        parts = [f"{len(loaded)} loaded on demand" + (f" of {od.count_budget}" if od.count_budget else "")]
        if od.memory_budget is not None:
            parts.append(f"{sum(od.sizes.get(r.name, 0) for r in loaded)} of {od.memory_budget} bytes")
        return ", ".join(parts)

    def on_demand_counts(self) -> dict[str, int]:
        """The on-demand counters and gauges (metrics): loads, load failures, evictions, models
        loaded on demand now and the resident bytes their loads added (approximate)."""
        od = self.on_demand
        if od is None:
            return {}
        loaded = [r.name for r in self._records.values() if r.on_demand and r.versions]
        return {"loads": od.loads, "load_failures": od.load_failures, "evictions": od.evictions,
                "loaded": len(loaded), "bytes": sum(od.sizes.get(n, 0) for n in loaded)}

    # ---- a model another process serves (--workers placement) ----------------------------------

    async def read_config(self, name: str, config_json: str | None = None) -> ModelConfig | None:
        """``name``'s config as written (the ``config`` override of a load, else its
        config.pbtxt), before anything completes it; None when there is none to read."""
        if config_json:
            try:
                return cfg.config_from_json(config_json)
            except TritonError:
                return None
        source = self.scan().get(name)
        if source is None and self._clouds:
            await self.refresh_cloud()
            source = self.scan().get(name)
        if source is None:
            return None
        return await trio.to_thread.run_sync(_read_raw_config, source, self.options.model_config_name,
                                             limiter=self._io_limiter)

    def record_failure(self, name: str, reason: str) -> None:
        """A load of ``name`` failed elsewhere (the other workers of ``--workers``): unless it
        serves here, it is recorded as failed with ``reason``, as where the load ran."""
        rec = self._records.get(name) or self._record(name, self.scan().get(name))
        self._startup_names.discard(name)
        if not rec.versions:
            rec.failed = {-1: reason}

    def serving_config(self, name: str) -> tuple[ModelConfig, list[int]] | None:
        """The config and version numbers ``name`` serves with (None when it serves none)."""
        rec = self._records.get(name)
        if rec is None or not rec.versions:
            return None
        versions = sorted(rec.versions)
        return rec.versions[versions[-1]].config, versions

    async def load_remote(self, name: str, config: ModelConfig, versions: list[int], backend: Backend, *,
                          gate: Gate | None = None, explicit: bool = True) -> None:
        """Serve ``versions`` of ``name`` with the final ``config`` another process loaded them
        with, through ``backend`` (a stand-in that holds no instance): metadata, config and
        readiness answer here as there (``--workers`` placement). ``gate`` as in :meth:`load`.
        Raises TritonError when a version fails to start."""
        rec = self._records.get(name)
        if rec is None or rec.path is None:
            found = self.scan().get(name)
            if found is None and self._clouds:
                await self.refresh_cloud()
                found = self.scan().get(name)
            rec = self._record(name, found)
        async with rec.lock:
            rec.loading = True
            try:
                await self._load_remote_locked(rec, config, versions, backend, gate)
                rec.explicit = rec.explicit or explicit
            finally:
                rec.loading = False
                self._startup_names.discard(name)

    async def _load_remote_locked(self, rec: _Record, config: ModelConfig, versions: list[int], backend: Backend,
                                  gate: Gate | None) -> None:
        name = rec.name
        model_dir = rec.path if isinstance(rec.path, Path) else Path(tempfile.gettempdir())
        fresh: dict[int, ModelVersion] = {}
        failures: dict[int, str] = {}

        async def start_version(v: int) -> None:
            mv = ModelVersion(name, v, copy.deepcopy(config), backend, model_dir, server=self._server)
            try:
                await self._nursery.start(mv.serve)
            except TritonError as e:
                failures[v] = e.message
            else:
                fresh[v] = mv

        async with trio.open_nursery() as nursery:
            for v in versions:
                nursery.start_soon(start_version, v)
        try:
            if failures:
                detail = "; ".join(f"version {v} is at UNAVAILABLE state: {r}" for v, r in sorted(failures.items()))
                raise invalid_arg(f"load failed for model '{name}': {detail}")
            if gate is not None:
                await gate(config, sorted(fresh))
        except BaseException as e:
            with trio.CancelScope(shield=True):
                for mv in fresh.values():
                    mv.request_unload()
                for mv in fresh.values():
                    await mv.stopped.wait()
            if isinstance(e, TritonError) and not rec.versions:
                rec.failed = {-1: e.message}
            raise
        source = rec.path
        fingerprint = (await self._source_fingerprint(source)) if source is not None else ()
        old = rec.versions
        rec.versions = fresh
        rec.failed = {}
        rec.unloaded = set()
        rec.fingerprint = fingerprint
        self._nursery.start_soon(self._unload_versions, list(old.values()), None)
        rec.composing = []
        log.info("'%s' version(s) %s are served by another worker; requests for them go there", name, sorted(fresh))

    async def unload(self, name: str, unload_dependents: bool = False) -> None:
        """The unload API (explicit mode only): drain and unload every version of ``name``.

        Returns once the versions are unloaded (at once for a model not in the repository, as
        Triton does). Raises TritonError UNSUPPORTED outside explicit mode, INVALID_ARG for a
        bad name.
        """
        if self.options.model_control_mode != "explicit":
            raise unsupported("explicit model load / unload is not allowed if model control mode is not EXPLICIT")
        check_model_name(name)
        rec = self._records.get(name)
        if rec is None:  # Triton: unloading what is not there succeeds
            log.info("unload of '%s': the model is not in the repository, nothing to do", name)
            return
        composing = list(rec.composing)
        async with rec.lock:
            await self._unload_record(rec)
        rec.explicit = False
        rec.suspended = []
        rec.override = None  # a load after an unload starts from the repository (Triton)
        if unload_dependents:
            await self._unload_composing(composing)

    async def _unload_composing(self, composing: list[tuple[str, str]]) -> None:
        """Unload an unloaded ensemble's composing models that no serving ensemble still uses
        (recursively through nested ensembles)."""
        still_used = {dep for r in self._records.values() if r.versions for dep, _ in r.composing}
        for dep in dict.fromkeys(n for n, _ in composing):
            rec = self._records.get(dep)
            if rec is None or dep in still_used or not rec.versions or rec.explicit:
                continue
            nested = list(rec.composing)
            async with rec.lock:
                await self._unload_record(rec)
            log.info("unloaded '%s', a composing model of an unloaded ensemble (unload_dependents)", dep)
            if nested:
                await self._unload_composing(nested)

    async def _unload_record(self, rec: _Record) -> None:
        """Drain and unload ``rec``'s versions; first the serving ensembles that use it (they
        come back when it is loaded again through the API)."""
        for other in list(self._records.values()):
            composing = {dep for dep, _ in other.composing}
            if other is not rec and other.versions and rec.name in composing:
                await self._unload_record(other)
                other.suspended = sorted(composing)
                log.info("unloaded ensemble '%s': its composing model '%s' is being unloaded", other.name, rec.name)
        started = time.monotonic()
        self._startup_names.discard(rec.name)
        rec.on_demand = False
        old = list(rec.versions.values())
        rec.unloaded = set(rec.versions) | {v for v in rec.failed if v >= 0}
        rec.versions = {}
        rec.failed = {}
        tmp, rec.tmpdir = rec.tmpdir, None
        agents, rec.agents = rec.agents, None
        rec.composing = []
        await self._unload_versions(old, tmp, agents)
        log.info("successfully unloaded '%s' in %.3f s", rec.name, time.monotonic() - started)

    async def _unload_versions(self, versions: list[ModelVersion], tmpdir: Path | None,
                               agents: AgentChain | None = None) -> None:
        """UNLOAD to the agents, drain and stop ``versions``, UNLOAD_COMPLETE, remove the
        copies and ``tmpdir`` (agents and file removal in worker threads)."""
        if agents is not None:
            await trio.to_thread.run_sync(agents.unload, limiter=self._io_limiter)
        for mv in versions:
            mv.request_unload()
        for mv in versions:
            await mv.stopped.wait()
        if agents is not None:
            await trio.to_thread.run_sync(agents.unload_complete, limiter=self._io_limiter)
        if tmpdir is not None:
            await trio.to_thread.run_sync(shutil.rmtree, tmpdir, True, limiter=self._io_limiter)
        if versions and not self._closing:
            heap.settle(unloaded=True)  # what the versions leave in reference cycles is freed now

    async def unload_all(self) -> None:
        """Drain and unload every model (server shutdown: the heap is no longer settled)."""
        self._closing = True
        async with trio.open_nursery() as nursery:
            for rec in list(self._records.values()):
                nursery.start_soon(self._unload_record, rec)
        for cache in self._cloud_caches:
            await trio.to_thread.run_sync(shutil.rmtree, cache, True, limiter=self._io_limiter)

    # ---- polling --------------------------------------------------------------------------

    async def serve_polling(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Rescan every ``repository_poll_secs``: load new and changed models, unload removed ones."""
        task_status.started()
        while True:
            await trio.sleep(self.options.repository_poll_secs)
            await self.poll_once()

    async def poll_once(self) -> None:
        """One rescan (see serve_polling); the heap is settled after loads (trident.server.heap;
        unloads settle it themselves)."""
        changed, removed = await self.poll_plan()
        for name in changed:
            try:
                await self.poll_load(name)
            except TritonError as e:
                _log_unlogged(e)
        if changed:
            heap.settle()
        for name in removed:
            await self.poll_unload(name)

    async def poll_plan(self) -> tuple[list[str], list[str]]:
        """What a rescan finds: (models new or changed since their last load, models gone from
        every repository). Lists the repositories; loads nothing."""
        await self.refresh_cloud()
        found = self.scan()
        changed = []
        for name, path in found.items():
            rec = self._records.get(name)
            if rec is not None and rec.loading:
                continue
            fingerprint = await self._source_fingerprint(path)
            if rec is not None and rec.fingerprint == fingerprint:
                continue
            changed.append(name)
        removed = [n for n, r in self._records.items() if r.path is not None and n not in found]
        return changed, removed

    async def poll_load(self, name: str, *, gate: Gate | None = None) -> None:
        """(Re)load a model a rescan found new or changed (``gate``: as :meth:`load`); its files'
        fingerprint is recorded whatever the outcome, so a failed model is not retried until it
        changes again. Raises TritonError when the load fails."""
        path = self.scan().get(name)
        if path is None and self._clouds:
            await self.refresh_cloud()  # this worker's listing may be older than the planner's
            path = self.scan().get(name)
        if path is None:
            raise not_found(f"model '{name}' is no longer in the model repository")
        fingerprint = await self._source_fingerprint(path)
        rec = self._records.get(name)
        if rec is not None and not rec.fingerprint and rec.failed and rec.path == path:
            rec.fingerprint = fingerprint
        try:
            await self._load(name, gate=gate)
            await self._resume_dependents(name)
        finally:
            self._record(name, path).fingerprint = fingerprint

    async def poll_unload(self, name: str) -> None:
        """Unload a model a rescan found gone from every repository."""
        rec = self._records.get(name)
        if rec is None:
            return
        async with rec.lock:
            await self._unload_record(rec)
        rec.path = None

    # ---- lookups --------------------------------------------------------------------------

    def get(self, name: str, version: str = "") -> ModelVersion:
        """The serving version (highest READY one when ``version`` is "").

        Raises TritonError: NOT_FOUND for an unknown model or version and for a model with no
        version loaded (unloaded, or its versions removed), UNAVAILABLE for a model that failed
        to load (with the reason), that is loading with no version serving yet (the start-up's
        load, the load API's; retryable: the repository holds it) or whose versions are not
        ready yet, INVALID_ARG for a bad version.
        """
        rec = self._records.get(name)
        if rec is None:
            if self._awaiting_plan and self._planned(name):
                raise unavailable(f"model '{name}' is not ready yet: it is loading")
            raise not_found(f"Request for unknown model: '{name}' is not found")
        if self.on_demand is not None:  # least recently used: the lookups' order
            self.on_demand.tick += 1
            rec.used = self.on_demand.tick
        if not rec.versions and self._is_loading(rec):  # retryable: the repository holds it
            raise unavailable(f"model '{name}' is not ready yet: it is loading")
        if not rec.versions and not rec.failed and not rec.unloaded and rec.path is None:
            raise not_found(f"Request for unknown model: '{name}' is not found")
        if version:
            if not version.isdigit():
                raise invalid_arg(f"invalid model version '{version}' for model '{name}'")
            v = int(version)
            mv = rec.versions.get(v)
            if mv is None:
                if self._is_loading(rec):
                    raise unavailable(f"model '{name}' version {v} is not ready yet: the model is loading")
                if v in rec.failed:
                    raise unavailable(f"model '{name}' version {v} is not available: {rec.failed[v]}")
                if v in rec.unloaded:
                    raise unavailable(f"Request for unknown model: '{name}' version {v} is not at ready state")
                raise not_found(f"Request for unknown model: '{name}' version {v} is not found")
            if mv.state != "READY":
                raise unavailable(f"model '{name}' version {v} is not ready (state {mv.state})")
            return mv
        best = None
        for mv in rec.versions.values():
            if mv.state == "READY" and (best is None or mv.version > best.version):
                best = mv
        if best is None:
            if not rec.versions and not rec.failed:  # Triton's 404s: never loaded, or unloaded
                if not rec.unloaded:
                    raise not_found(f"Request for unknown model: '{name}' is not found")
                raise not_found(f"Request for unknown model: '{name}' has no available versions")
            reason = rec.failed.get(-1) or next(iter(rec.failed.values()), "") or "model is not loaded"
            raise unavailable(f"model '{name}' is not available: {reason}")
        return best

    def _is_loading(self, rec: _Record) -> bool:
        """A load of ``rec`` is under way or waits its turn (the load API's, or a start-up
        load of the plan, until that model's load has run)."""
        return rec.loading or rec.loads > 0 or rec.name in self._startup_names

    def _planned(self, name: str) -> bool:
        """Before the start-up plan is made: whether ``name`` will be in it (a model folder of a
        local repository the control mode loads; any valid name while a cloud repository is
        still to be listed). Only unknown models ask, while the server starts."""
        wanted = self.options.load_models
        if self.options.model_control_mode == "explicit" and wanted != ["*"] and name not in wanted:
            return False
        try:
            check_model_name(name)
        except TritonError:
            return False
        return bool(self._clouds) or any((Path(r) / name).is_dir() for r in self.options.model_repositories
                                         if not is_cloud_url(r))

    def names(self) -> list[str]:
        return sorted(self._records)

    def serving(self) -> list[ModelVersion]:
        return [mv for rec in self._records.values() for mv in rec.versions.values()]

    def all_ready(self) -> bool:
        """True when every model that should be serving is (strict readiness)."""
        for rec in self._records.values():
            if rec.failed or rec.loading:
                return False
            if any(mv.state != "READY" for mv in rec.versions.values()):
                return False
        return True

    def index(self, ready: bool = False) -> list[IndexEntry]:
        rows: list[IndexEntry] = []
        for name in sorted(self._records):
            rec = self._records[name]
            versions = {v: (mv.state, mv.reason) for v, mv in rec.versions.items()}
            for v, reason in rec.failed.items():
                if v >= 0:
                    versions[v] = ("UNAVAILABLE", reason)
            for v in rec.unloaded:
                versions.setdefault(v, ("UNAVAILABLE", "unloaded"))
            if not versions:
                if ready:
                    continue
                if -1 in rec.failed:
                    rows.append(IndexEntry(name, "", "UNAVAILABLE", rec.failed[-1]))
                elif self._is_loading(rec):
                    rows.append(IndexEntry(name, "", "LOADING", ""))
                else:
                    rows.append(IndexEntry(name))
                continue
            for v in sorted(versions):
                state, reason = versions[v]
                if ready and state != "READY":
                    continue
                rows.append(IndexEntry(name, str(v), state, reason))
        return rows


def _source_text(name: str, source: Source | None, files: dict[str, bytes] | None) -> str:
    """Where a load reads a model from, as its start line says."""
    if files:
        return "the files of the load request"
    if isinstance(source, RemoteModel):
        return f"{source.url.rstrip('/')}/{name}"
    return str(source) if source is not None else "a config without files"


def _log_unlogged(error: TritonError) -> None:
    """Log a failed load's error unless the load attempt logged it already (with its time)."""
    if not getattr(error, "load_logged", False):
        log.error("%s", error.message)


def _read_raw_config(source: Source, config_name: str = "") -> ModelConfig | None:
    """A model's config as written, from its folder or its cloud objects (None when it has
    none, or it does not parse)."""
    from trident.protocol.pbtxt import parse_pbtxt

    try:
        if isinstance(source, RemoteModel):
            text = None
            if config_name:
                text = source.repo.read_text(source.name, f"configs/{config_name}.pbtxt")
            if text is None:
                text = source.repo.read_text(source.name, cfg.CONFIG_FILENAME)
            return parse_pbtxt(text) if text is not None else None
        return cfg.read_model_config(source, config_name=config_name)
    except (TritonError, OSError):
        return None


def _remote_is_ensemble(source: RemoteModel, config_name: str = "") -> bool:
    """Whether a cloud model's config names an ensemble (reads only its config object)."""
    from trident.protocol.pbtxt import parse_pbtxt

    text = None
    if config_name:
        text = source.repo.read_text(source.name, f"configs/{config_name}.pbtxt")
    if text is None:
        text = source.repo.read_text(source.name, cfg.CONFIG_FILENAME)
    if text is None:
        return False
    try:
        config = parse_pbtxt(text)
    except TritonError:
        return False
    return config.platform == ENSEMBLE_PLATFORM or config.ensemble_scheduling is not None


def _is_ensemble(model_dir: Path, config_name: str = "") -> bool:
    """Whether the folder's config names an ensemble (a config that does not parse: no)."""
    try:
        config = cfg.read_model_config(model_dir, config_name=config_name)
    except (TritonError, OSError):
        return False
    return config.platform == ENSEMBLE_PLATFORM or config.ensemble_scheduling is not None


MAX_OVERRIDE_PATH = 1024  # characters in one ``file:`` override path


def _write_override_files(name: str, files: dict[str, bytes]) -> Path:
    """Write ``file:<version>/<path>`` overrides into a fresh folder; refuse escaping paths."""
    tmp = Path(tempfile.mkdtemp(prefix="trident-override-"))
    root = tmp / name
    root.mkdir()
    try:
        for rel, data in files.items():
            shown = rel if len(rel) <= 80 and rel.isprintable() else repr(rel[:80]) + "..."
            p = PurePosixPath(rel)
            if ("\0" in rel or len(rel) > MAX_OVERRIDE_PATH or any(len(part.encode()) > 255 for part in p.parts)
                    or not rel.isprintable()):
                raise invalid_arg(f"invalid file override path {shown!r} for model '{name}': "
                                  "not a valid file name (control characters, or a name over 255 bytes)")
            if p.is_absolute() or not p.parts or any(part in ("..", "", ".") for part in p.parts) or "\\" in rel:
                raise invalid_arg(f"invalid file override path '{shown}' for model '{name}'")
            target = (root / Path(*p.parts)).resolve()
            if root.resolve() not in target.parents:
                raise invalid_arg(f"file override path '{shown}' escapes the folder of model '{name}'")
            try:
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(data)
            except OSError as e:  # never show the server's temporary path
                raise invalid_arg(f"failed to write file override '{shown}' for model '{name}': "
                                  f"{e.strerror or type(e).__name__}") from None
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return tmp
