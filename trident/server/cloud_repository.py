"""Model repositories in object storage (``s3://``, ``gs://``, ``as://``) through fsspec.

A :class:`CloudRepository` lists the models under its URL and downloads one model's objects to
a fresh local folder for each load (the repository loads from there and removes the folder
after unload). Every call is blocking: the repository makes them in worker threads. A model's
fingerprint is its objects' (path, size, ETag or modification time), so polling reloads only
the models whose objects changed.

URL forms (Triton's):

- ``s3://bucket/prefix``; ``s3://host:port/bucket/prefix`` for another S3 endpoint (HTTP; write
  ``s3://https://host:port/bucket/prefix`` for HTTPS). Credentials and region come from the
  standard AWS environment variables and files (``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``,
  ``AWS_SESSION_TOKEN``, ``AWS_DEFAULT_REGION``, ``~/.aws/credentials``, ``AWS_PROFILE``).
- ``gs://bucket/prefix``: credentials from ``GOOGLE_APPLICATION_CREDENTIALS`` (or the machine's
  default account); ``STORAGE_EMULATOR_HOST`` points at an emulator (anonymous access).
- ``as://account/container/prefix``: the key from ``AZURE_STORAGE_KEY`` (Triton's), or a
  connection string in ``AZURE_STORAGE_CONNECTION_STRING``; else the default Azure credential.

A download logs what it fetches (objects, bytes), its progress at most every
``TRIDENT_LOAD_PROGRESS_SECS`` seconds (5 by default) while it runs, and its time and rate
when it ends (:class:`DownloadProgress`).
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from trident import DISTRIBUTION
from trident.errors import internal, unsupported

log = logging.getLogger("trident.repository")

SCHEMES = ("s3://", "gs://", "as://")
MAX_OBJECTS = 100_000  # objects listed under one repository URL
MAX_MODEL_BYTES = 64 << 30  # bytes downloaded for one model
_S3_ENDPOINT = re.compile(r"s3://(?:(https?)://)?([A-Za-z0-9.\-]+):([0-9]+)/(.+)")
#: scheme -> (fsspec protocol, package, pip extra)
_PROTOCOLS = {"s3": ("s3", "s3fs", "s3"), "gs": ("gcs", "gcsfs", "gcs"), "as": ("abfs", "adlfs", "azure")}

Fingerprint = tuple[tuple[str, int, str], ...]

PROGRESS_ENV = "TRIDENT_LOAD_PROGRESS_SECS"
PROGRESS_SECS = 5.0  # a download in progress is reported at most this often


def progress_interval(env: dict[str, str] | None = None) -> float:
    """Seconds between a download's progress lines: ``TRIDENT_LOAD_PROGRESS_SECS`` (a positive
    number), else 5; a value that is not one is logged and the default used."""
    raw = (os.environ if env is None else env).get(PROGRESS_ENV, "").strip()
    if not raw:
        return PROGRESS_SECS
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not value > 0 or value == float("inf"):
        log.warning("ignoring %s=%r: expected a positive number of seconds; using %g", PROGRESS_ENV, raw,
                    PROGRESS_SECS)
        return PROGRESS_SECS
    return value


def describe_size(size: int) -> str:
    """``12582912`` as ``12.0 MiB`` (bytes below 1 KiB as such)."""
    value = float(size)
    for unit in ("bytes", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{size} bytes" if unit == "bytes" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{size} bytes"  # unreachable


class DownloadProgress:
    """The bytes downloaded for one model, logged at most every ``every`` seconds (from the
    thread that downloads: :meth:`add` is called as bytes arrive)."""

    def __init__(self, name: str, total: int, every: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.name = name
        self.total = total
        self.every = every
        self.done = 0
        self._clock = clock
        self.started = self._last = clock()
        self.lines = 0  # progress lines written

    def add(self, count: int) -> None:
        """``count`` more bytes arrived; a progress line when ``every`` seconds passed since the last."""
        if count <= 0:
            return
        self.done += count
        now = self._clock()
        if now - self._last >= self.every and self.done < self.total:
            self._last = now
            self.lines += 1
            percent = 100 * self.done // self.total if self.total else 100
            log.info("downloading '%s': %s of %s (%d%%) in %.1f s", self.name, describe_size(self.done),
                     describe_size(self.total), percent, now - self.started)

    def finished(self, objects: int) -> None:
        """The last line: what was downloaded, the time and the rate."""
        elapsed = self._clock() - self.started
        rate = describe_size(int(self.done / elapsed)) + "/s" if elapsed > 0 else "-"
        log.info("downloaded '%s': %d object(s), %s in %.3f s (%s)", self.name, objects, describe_size(self.done),
                 elapsed, rate)

    def callback(self, size: int) -> Any:
        """An fsspec callback for one object of ``size`` bytes that forwards its progress here;
        its ``rest()`` counts what the store did not report (a store that reports nothing)."""
        from fsspec.callbacks import Callback

        progress = self

        class Forward(Callback):  # type: ignore[misc]
            seen = 0

            def call(self, *args: Any, **kwargs: Any) -> None:
                value = int(self.value or 0)
                if value > self.seen:
                    progress.add(value - self.seen)
                    self.seen = value

            def rest(self) -> None:
                if size > self.seen:
                    progress.add(size - self.seen)
                    self.seen = size

        return Forward()


#: Triton's variables naming the folder that local copies go in, by URL scheme
MOUNT_DIRECTORY_ENV = {"s3": "TRITON_AWS_MOUNT_DIRECTORY", "gs": "TRITON_GCS_MOUNT_DIRECTORY",
                       "as": "TRITON_AZURE_MOUNT_DIRECTORY"}


def mount_directory_env(url: str) -> str:
    """The environment variable that names where ``url``'s local copies go (Triton's)."""
    return MOUNT_DIRECTORY_ENV.get(url.partition("://")[0], "")


def is_cloud_url(path: str) -> bool:
    """Whether a ``--model-repository`` value names object storage."""
    return path.startswith(SCHEMES)


@dataclass(frozen=True)
class CloudLocation:
    """A parsed repository URL: fsspec protocol, root path (bucket/prefix), filesystem options."""

    url: str
    protocol: str
    root: str
    options: dict[str, Any] = field(default_factory=dict, compare=False)


def parse_cloud_url(url: str, env: dict[str, str] | None = None) -> CloudLocation:
    """Parse an ``s3://``, ``gs://`` or ``as://`` URL. Raises TritonError(INVALID_ARG)."""
    from trident.errors import invalid_arg

    env = dict(os.environ) if env is None else env
    scheme, _, rest = url.partition("://")
    rest = rest.strip("/")
    options: dict[str, Any] = {}
    if scheme == "s3":
        m = _S3_ENDPOINT.fullmatch(url.rstrip("/"))
        if m:
            options["endpoint_url"] = f"{m.group(1) or 'http'}://{m.group(2)}:{m.group(3)}"
            rest = m.group(4).strip("/")
        if env.get("AWS_DEFAULT_REGION") or env.get("AWS_REGION"):
            options["client_kwargs"] = {"region_name": env.get("AWS_DEFAULT_REGION") or env.get("AWS_REGION")}
    elif scheme == "gs":
        if env.get("STORAGE_EMULATOR_HOST"):
            options["token"] = "anon"
            options["endpoint_url"] = env["STORAGE_EMULATOR_HOST"]
    elif scheme == "as":
        account, _, rest = rest.partition("/")
        if not account:
            raise invalid_arg(f"model repository '{url}': expected as://account/container/path")
        if env.get("AZURE_STORAGE_CONNECTION_STRING"):
            options["connection_string"] = env["AZURE_STORAGE_CONNECTION_STRING"]
        else:
            options["account_name"] = account
            if env.get("AZURE_STORAGE_KEY"):
                options["account_key"] = env["AZURE_STORAGE_KEY"]
            else:
                options["anon"] = False  # the default Azure credential chain
    else:
        raise invalid_arg(f"model repository '{url}': unknown scheme '{scheme}://' (s3://, gs://, as://)")
    if not rest or rest.startswith("."):
        raise invalid_arg(f"model repository '{url}': no bucket (or container) named")
    return CloudLocation(url, _PROTOCOLS[scheme][0], rest, options)


def _reason(url: str, e: BaseException) -> str:
    """A load failure's reason for a storage error (no credentials shown)."""
    status = getattr(e, "status_code", None) or getattr(getattr(e, "response", None), "status_code", None)
    first_line = (str(e).strip().splitlines() or [""])[0][:300]
    if isinstance(e, FileNotFoundError) or status == 404:
        return f"model repository '{url}': the bucket or path does not exist"
    if isinstance(e, PermissionError) or status in (401, 403):
        return f"model repository '{url}': access denied (check the credentials): {first_line}"
    return f"model repository '{url}': {type(e).__name__}: {first_line}"


class CloudRepository:
    """One repository URL in object storage; ``cache`` is the parent of the local copies."""

    def __init__(self, url: str, cache: Path) -> None:
        """Raises TritonError(INVALID_ARG) for a URL that does not parse."""
        self.location = parse_cloud_url(url)
        self.url = url
        self.cache = cache
        self._fs: Any = None

    def _filesystem(self) -> Any:
        if self._fs is None:
            scheme = self.url.partition("://")[0]
            protocol, package, extra = _PROTOCOLS[scheme]
            try:
                import fsspec

                if protocol == "gcs":  # the plain JSON-API client: no gRPC probe of the bucket's layout
                    from gcsfs.core import GCSFileSystem

                    self._fs = GCSFileSystem(skip_instance_cache=True, **self.location.options)
                else:
                    self._fs = fsspec.filesystem(protocol, skip_instance_cache=True, **self.location.options)
            except ImportError as e:
                raise unsupported(f"model repository '{self.url}' needs the '{package}' package ({e}); install "
                                  f'it with pip install "{DISTRIBUTION}[{extra}]"') from None
            except Exception as e:
                raise internal(_reason(self.url, e)) from None
        return self._fs

    def _objects(self, prefix: str) -> dict[str, dict[str, Any]]:
        """Relative path -> object info under ``root/prefix``. Raises TritonError."""
        fs = self._filesystem()
        base = f"{self.location.root}/{prefix}".rstrip("/")
        try:
            fs.invalidate_cache()
            found = fs.find(base, detail=True, withdirs=False, maxdepth=None)
            if not found and not prefix:
                fs.ls(self.location.root.split("/")[0])  # no such bucket: FileNotFoundError
        except Exception as e:
            raise internal(_reason(self.url, e)) from None
        if len(found) > MAX_OBJECTS:
            raise internal(f"model repository '{self.url}': over {MAX_OBJECTS} objects")
        out: dict[str, dict[str, Any]] = {}
        strip = len(base) + 1
        for path, info in found.items():
            path = path.lstrip("/")
            if not path.startswith(base + "/") or path.endswith("/"):
                continue
            rel = path[strip:]
            if _safe(rel):
                out[rel] = info
        return out

    def list_models(self) -> dict[str, Fingerprint]:
        """Model name -> fingerprint of every model folder under the URL. Blocking.

        Raises TritonError(INTERNAL) with the reason (no such bucket, access denied...)."""
        by_model: dict[str, list[tuple[str, int, str]]] = {}
        for rel, info in self._objects("").items():
            name, sep, inner = rel.partition("/")
            if not sep or name.startswith("."):
                continue  # a file at the repository's top level
            by_model.setdefault(name, []).append(_entry(inner, info))
        return {name: tuple(sorted(entries)) for name, entries in by_model.items()}

    def download(self, name: str) -> tuple[Path, Fingerprint]:
        """Copy model ``name``'s objects to a fresh folder ``<cache>/<tmp>/<name>``; returns it
        and the fingerprint of what was copied. Blocking. The caller removes the folder's
        parent after unload.

        Raises TritonError(INTERNAL) with the reason, leaving nothing behind."""
        objects = self._objects(name)
        if not objects:
            raise internal(f"model repository '{self.url}': model '{name}' has no objects")
        total = sum(int(info.get("size") or 0) for info in objects.values())
        if total > MAX_MODEL_BYTES:
            raise internal(f"model '{name}' in '{self.url}' is {total} bytes; at most {MAX_MODEL_BYTES}")
        self.cache.mkdir(parents=True, exist_ok=True)
        parent = Path(tempfile.mkdtemp(prefix=f"{name[:40]}-", dir=self.cache))
        folder = parent / name
        fs = self._filesystem()
        log.info("downloading '%s' from %s/%s: %d object(s), %s", name, self.url.rstrip("/"), name, len(objects),
                 describe_size(total))
        progress = DownloadProgress(name, total, progress_interval())
        try:
            folder.mkdir()
            for rel, info in objects.items():
                target = folder.joinpath(*PurePosixPath(rel).parts)
                target.parent.mkdir(parents=True, exist_ok=True)
                callback = progress.callback(int(info.get("size") or 0))
                fs.get_file(f"{self.location.root}/{name}/{rel}", str(target), callback=callback)
                callback.rest()
            progress.finished(len(objects))
        except BaseException as e:
            shutil.rmtree(parent, ignore_errors=True)
            if isinstance(e, Exception):
                raise internal(_reason(self.url, e)) from None
            raise
        return folder, tuple(sorted(_entry(rel, info) for rel, info in objects.items()))

    def read_text(self, name: str, relative: str) -> str | None:
        """The text of one object of model ``name`` (None when it does not exist). Blocking."""
        fs = self._filesystem()
        try:
            with fs.open(f"{self.location.root}/{name}/{relative}", "rb") as f:
                data = f.read(1 << 20)
            return str(data.decode("utf-8", errors="replace"))
        except FileNotFoundError:
            return None
        except Exception as e:
            raise internal(_reason(self.url, e)) from None


def _safe(rel: str) -> bool:
    parts = PurePosixPath(rel).parts
    return bool(parts) and not any(p in ("..", ".", "") for p in parts) and "\\" not in rel and "\0" not in rel \
        and all(len(p.encode()) <= 255 for p in parts)


def _entry(rel: str, info: dict[str, Any]) -> tuple[str, int, str]:
    """(path, size, version tag): the ETag where the store gives one, else the modification time."""
    tag = info.get("ETag") or info.get("etag") or info.get("md5Hash") or info.get("etag_") or ""
    if not tag:
        tag = str(info.get("LastModified") or info.get("mtime") or info.get("updated") or info.get("last_modified") or "")
    return rel, int(info.get("size") or 0), str(tag)
