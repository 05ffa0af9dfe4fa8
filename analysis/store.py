"""Where a sweep's results live: a local directory or a prefix in an object store, through ``pyarrow.fs``
(its S3FileSystem and GcsFileSystem ship in the pyarrow wheel, so no other client is needed).

A location is a path (``results/mine``) or a URI:

- ``s3://bucket/prefix``: AWS S3 or any S3-compatible store (MinIO, Ceph, R2, ...). Query keys:
  ``endpoint_override`` (``host:port``; a URL also sets the scheme), ``scheme`` (``http``/``https``),
  ``region``, ``anonymous`` (``true``: unsigned requests). Without ``endpoint_override`` the AWS
  variables ``AWS_ENDPOINT_URL_S3`` or ``AWS_ENDPOINT_URL`` name the endpoint. Credentials come from
  the AWS chain: ``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY``/``AWS_SESSION_TOKEN``, ``AWS_PROFILE``
  and ``~/.aws``, web identity, the container or instance role.
- ``gs://bucket/prefix`` (or ``gcs://``): Google Cloud Storage; ``endpoint_override``, ``scheme``,
  ``anonymous``, ``project_id``; credentials from Google's default chain
  (``GOOGLE_APPLICATION_CREDENTIALS``, gcloud's application-default login, the instance's account).

Atomic publication: a local file is written under a temporary name and renamed into place. An object
store has no rename, but one PUT (or a completed multipart upload) makes an object appear whole or not
at all, so each object is serialised in memory and written in one call, never appended to; which
objects form a committed attempt is decided by the commit object written after them (analysis.layout).
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from datetime import timedelta
from functools import cached_property, partial
from pathlib import Path, PurePath
from typing import TYPE_CHECKING
from urllib.parse import parse_qsl, urlsplit

from specsweep.errors import StoreError

if TYPE_CHECKING:
    import pyarrow as pa
    import pyarrow.fs as pafs

S3_SCHEMES = ("s3",)
GCS_SCHEMES = ("gs", "gcs")
QUERY_KEYS: dict[str, tuple[str, ...]] = {
    "s3": ("endpoint_override", "scheme", "region", "anonymous"),
    "gs": ("endpoint_override", "scheme", "anonymous", "project_id"),
}
CONNECT_TIMEOUT_S = 10.0
REQUEST_TIMEOUT_S = 120.0
RETRY_ATTEMPTS = 3  # tries of a request with a transient error (throttling, 5xx, resets): the SDK standard
GCS_RETRY_LIMIT_S = 10.0
WRITE_CHECK = ".write-check"

# Substrings of the SDKs' error texts, by what the user must fix.
_UNREACHABLE = ("NETWORK_CONNECTION", "Could not connect", "Couldn't resolve", "UNAVAILABLE", "Timeout")
_DENIED = (
    "ACCESS_DENIED",
    "INVALID_ACCESS_KEY_ID",
    "SIGNATURE_DOES_NOT_MATCH",
    "EXPIRED_TOKEN",
    "PERMISSION_DENIED",
    "UNAUTHENTICATED",
    "HTTP status 403",
)
_NO_BUCKET = ("NO_SUCH_BUCKET", "does not exist", "NOT_FOUND")


def is_uri(location: str | os.PathLike[str]) -> bool:
    """True when ``location`` names an object store (``scheme://...``), not a local path."""
    return isinstance(location, str) and "://" in location


@dataclass(frozen=True)
class ResultStore:
    """A sweep's results location. Keys are '/'-separated paths relative to the location's root."""

    location: str  # as the user wrote it, less any query (for messages and the state-dir key)
    root: str  # the root in ``fs``: an absolute directory, or "bucket/prefix"
    local_dir: Path | None  # the directory when the location is local
    connect: Callable[[], pafs.FileSystem]  # builds ``fs`` at its first use (which may ask the network)
    endpoint: str | None = None  # the object store's endpoint when overridden (for messages)
    anonymous: bool = False  # unsigned requests (?anonymous=true)

    @cached_property
    def fs(self) -> pafs.FileSystem:
        """The pyarrow filesystem, built on first use: opening a store sends no request."""
        with self._errors("connecting"):
            return self.connect()

    @property
    def is_local(self) -> bool:
        return self.local_dir is not None

    @property
    def bucket(self) -> str:
        return self.root.split("/", 1)[0]

    def key(self, rel: str | PurePath) -> str:
        """The path of ``rel`` in ``fs``."""
        rel = str(rel).strip("/")
        return f"{self.root}/{rel}" if rel else self.root

    def describe(self, rel: str | PurePath = "") -> str:
        """``rel`` as the user would write it: OUT/rel or scheme://bucket/prefix/rel."""
        rel = str(rel).strip("/")
        return f"{self.location.rstrip('/')}/{rel}" if rel else self.location

    def local(self, rel: str | PurePath) -> Path:
        """The local file of ``rel`` (local locations only)."""
        if self.local_dir is None:
            raise ValueError(f"{self.location} is not a local directory")
        return self.local_dir / str(rel)

    # --- reading --------------------------------------------------------------------------------------

    def exists(self, rel: str | PurePath) -> bool:
        import pyarrow.fs as pafs

        if self.local_dir is not None:
            return self.local(rel).is_file()
        with self._errors(f"looking up {self.describe(rel)}"):
            return bool(self.fs.get_file_info(self.key(rel)).type == pafs.FileType.File)

    def read_bytes(self, rel: str | PurePath) -> bytes | None:
        """The object's bytes, None when it does not exist."""
        if self.local_dir is not None:
            try:
                return self.local(rel).read_bytes()
            except (FileNotFoundError, IsADirectoryError):
                return None
        with self._errors(f"reading {self.describe(rel)}"):
            try:
                with self.fs.open_input_stream(self.key(rel)) as stream:
                    return bytes(stream.read())
            except FileNotFoundError:
                return None

    def read_table(self, rel: str | PurePath, columns: list[str] | None = None) -> pa.Table | None:
        """A Parquet file as a table; None when absent or not readable Parquet (a damaged file)."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        data = self.read_bytes(rel)
        if data is None:
            return None
        try:
            return pq.read_table(pa.BufferReader(data), columns=columns)
        except (OSError, ValueError, pa.ArrowInvalid):
            return None

    def list_files(self, prefix: str | PurePath) -> list[str]:
        """Every file under ``prefix`` (recursive), as keys relative to the root, sorted; temporary files
        of an unfinished local write are left out."""
        import pyarrow.fs as pafs

        if self.local_dir is not None:
            base = self.local(prefix)
            if not base.is_dir():
                return []
            found = (p for p in base.rglob("*") if p.is_file() and not p.name.endswith(".tmp"))
            return sorted(p.relative_to(self.local_dir).as_posix() for p in found)
        selector = pafs.FileSelector(self.key(prefix), recursive=True, allow_not_found=True)
        with self._errors(f"listing {self.describe(prefix)}"):
            infos = self.fs.get_file_info(selector)
        start = len(self.root) + 1
        return sorted(i.path[start:] for i in infos if i.type == pafs.FileType.File)

    # --- writing --------------------------------------------------------------------------------------

    def write_bytes(self, rel: str | PurePath, data: bytes) -> None:
        """Publish ``data`` at ``rel`` atomically: readers see the old object or the whole new one."""
        if self.local_dir is not None:
            write_local_atomic(self.local(rel), data)
            return
        with self._errors(f"writing {self.describe(rel)}"), self.fs.open_output_stream(self.key(rel)) as out:
            out.write(data)

    def write_table(self, rel: str | PurePath, table: pa.Table) -> None:
        """Publish ``table`` as one Parquet file (zstd), serialised whole before it is written."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        if self.local_dir is not None:
            from analysis.schema import write_parquet_atomic

            write_parquet_atomic(table, self.local(rel))
            return
        sink = pa.BufferOutputStream()
        pq.write_table(table, sink, compression="zstd")
        self.write_bytes(rel, sink.getvalue().to_pybytes())

    def delete(self, rel: str | PurePath) -> None:
        """Remove ``rel``; nothing happens when it is absent."""
        if self.local_dir is not None:
            self.local(rel).unlink(missing_ok=True)
            return
        with self._errors(f"deleting {self.describe(rel)}"), suppress(FileNotFoundError):
            self.fs.delete_file(self.key(rel))

    def publish(self, rel: str | PurePath, source: Path, data: bytes) -> None:
        """Put an attempt's file in place: a local location renames the worker's file when this host
        sees it (else writes ``data``, the bytes that came back with the result); an object store gets
        ``data`` in one PUT and the local staging file is removed."""
        if self.local_dir is not None:
            target = self.local(rel)
            if not source.exists():
                write_local_atomic(source, data)
            target.parent.mkdir(parents=True, exist_ok=True)
            os.replace(source, target)
            return
        self.write_bytes(rel, data)
        source.unlink(missing_ok=True)

    # --- checks ---------------------------------------------------------------------------------------

    def check(self, *, write: bool) -> None:
        """Refuse, before any work, a location that cannot be used: for an object store an unreachable
        endpoint, a missing bucket, missing or rejected credentials (and, with ``write``, a bucket
        this key may not write)."""
        import pyarrow.fs as pafs

        if self.local_dir is not None:
            return
        _check_credentials(self)
        with self._errors("opening the bucket"):
            info = self.fs.get_file_info(self.bucket)
            if info.type == pafs.FileType.NotFound:
                raise _no_bucket(self)
            self.list_files(WRITE_CHECK)  # a listing: HEAD on a bucket is allowed more often than LIST
        if write:
            probe = f"{WRITE_CHECK}-{uuid.uuid4().hex}"
            self.write_bytes(probe, b"")
            self.delete(probe)

    @contextmanager
    def _errors(self, doing: str) -> Iterator[None]:
        """An SDK error becomes one line that says what to fix."""
        try:
            yield
        except StoreError:
            raise
        except OSError as err:
            raise explain(self, err, doing) from None


def explain(store: ResultStore, err: OSError, doing: str) -> StoreError:
    """The StoreError for an SDK error: unreachable endpoint, refused credentials, missing bucket."""
    text = str(err)
    first = text.strip().splitlines()[0] if text.strip() else type(err).__name__
    at = f" at {store.endpoint}" if store.endpoint else ""
    if any(marker in text for marker in _UNREACHABLE):
        return StoreError(
            f"cannot reach the object store{at} while {doing}: {first}",
            where=store.location,
            fix="check the endpoint (the URI's ?endpoint_override=HOST:PORT, or AWS_ENDPOINT_URL) and that "
            "the store is up and reachable from this host",
        )
    if any(marker in text for marker in _DENIED):
        return StoreError(
            f"the object store refused the credentials while {doing}: {first}",
            where=store.location,
            fix=_credentials_fix(store),
        )
    if any(marker in text for marker in _NO_BUCKET) and "bucket" in text.lower():
        return _no_bucket(store)
    return StoreError(
        f"object store error while {doing}: {first}",
        where=store.location,
        fix="check the URI, the credentials and the store's state, then run the command again",
    )


def _no_bucket(store: ResultStore) -> StoreError:
    return StoreError(
        f"bucket {store.bucket!r} does not exist",
        where=store.location,
        fix=f"create it first (e.g. `aws s3 mb {store.location.split('://')[0]}://{store.bucket}`), "
        "or correct the URI",
    )


def _credentials_fix(store: ResultStore) -> str:
    if store.location.startswith(GCS_SCHEMES):
        return "set GOOGLE_APPLICATION_CREDENTIALS to a service-account key that may use the bucket"
    return (
        "set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or AWS_PROFILE) to a key that may read and "
        "write the bucket; add ?anonymous=true for a public bucket"
    )


# Where the AWS SDK's default chain looks for credentials, short of the instance metadata service.
_AWS_CREDENTIAL_VARS = (
    "AWS_ACCESS_KEY_ID",
    "AWS_PROFILE",
    "AWS_WEB_IDENTITY_TOKEN_FILE",
    "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
    "AWS_CONTAINER_CREDENTIALS_FULL_URI",
)


def _check_credentials(store: ResultStore) -> None:
    """Refuse an S3 location for which the AWS chain can find no credentials: none in the environment,
    no shared credentials or config file, and the instance metadata service switched off
    (``AWS_EC2_METADATA_DISABLED=true``). With the service on, an instance role may exist: the first
    request then tells."""
    if not store.location.startswith(S3_SCHEMES) or store.anonymous:
        return
    if any(os.environ.get(name) for name in _AWS_CREDENTIAL_VARS):
        return
    files = (
        os.environ.get("AWS_SHARED_CREDENTIALS_FILE", "~/.aws/credentials"),
        os.environ.get("AWS_CONFIG_FILE", "~/.aws/config"),
    )
    if any(Path(f).expanduser().is_file() for f in files):
        return
    if os.environ.get("AWS_EC2_METADATA_DISABLED", "").lower() != "true":
        return
    raise StoreError(
        "no AWS credentials found (no AWS_ACCESS_KEY_ID, AWS_PROFILE or ~/.aws files, and the instance "
        "metadata service is disabled)",
        where=store.location,
        fix=_credentials_fix(store),
    )


def write_local_atomic(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` via a temporary name in the same directory and a rename."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex}.tmp")
    try:
        tmp.write_bytes(data)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


# --- opening --------------------------------------------------------------------------------------------


def as_store(location: ResultStore | str | os.PathLike[str]) -> ResultStore:
    """``location`` as a store (a store is returned as it is)."""
    return location if isinstance(location, ResultStore) else open_store(location)


def open_store(location: str | os.PathLike[str]) -> ResultStore:
    """The store a path or URI names; a malformed URI is a StoreError."""
    import pyarrow.fs as pafs

    if not is_uri(location):
        path = Path(location)
        return ResultStore(str(location), str(path.absolute()), path, pafs.LocalFileSystem)
    text = str(location)
    parts = urlsplit(text)
    scheme = parts.scheme.lower()
    if scheme == "file":
        path = Path(parts.path)
        return ResultStore(str(path), str(path.absolute()), path, pafs.LocalFileSystem)
    family = "s3" if scheme in S3_SCHEMES else "gs" if scheme in GCS_SCHEMES else None
    if family is None:
        raise StoreError(
            f"unsupported output location scheme {parts.scheme + '://'!r}",
            where=text,
            fix="use a local directory, s3://BUCKET/PREFIX (S3 or an S3-compatible store) or "
            "gs://BUCKET/PREFIX",
        )
    bucket, prefix = parts.netloc, parts.path.strip("/")
    if not bucket or "*" in text or ".." in prefix.split("/"):
        raise StoreError(
            "an object-store URI needs a bucket and a plain prefix (no wildcards, no '..')",
            where=text,
            fix=f"write it as {scheme}://BUCKET/PREFIX",
        )
    query = _query(parts.query, family, text)
    bare = f"{scheme}://{bucket}" + (f"/{prefix}" if prefix else "")
    root = f"{bucket}/{prefix}" if prefix else bucket
    anonymous = query.get("anonymous", "false").lower() == "true"
    if family == "s3":
        endpoint, http = _endpoint(query, ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL"))
        connect = partial(_s3, query, bucket, endpoint, http, anonymous)
    else:
        endpoint, http = _endpoint(query, ())
        connect = partial(_gcs, query, endpoint, http, anonymous)
    return ResultStore(bare, root, None, connect, endpoint, anonymous)


def _query(text: str, family: str, where: str) -> dict[str, str]:
    allowed = QUERY_KEYS[family]
    query = dict(parse_qsl(text, keep_blank_values=True))
    unknown = sorted(set(query) - set(allowed))
    if unknown:
        raise StoreError(
            f"unknown URI option(s) {', '.join(unknown)}",
            where=where,
            fix=f"use only {', '.join(allowed)}",
        )
    if query.get("scheme", "https") not in ("http", "https"):
        raise StoreError(f"scheme={query['scheme']!r} is not http or https", where=where, fix="scheme=https")
    if query.get("anonymous", "false").lower() not in ("true", "false"):
        raise StoreError(
            f"anonymous={query['anonymous']!r} is not true or false", where=where, fix="anonymous=true"
        )
    return query


def _endpoint(query: dict[str, str], env_names: tuple[str, ...]) -> tuple[str | None, str | None]:
    """(host[:port], scheme) from the query's endpoint_override or the first environment variable set."""
    raw = query.get("endpoint_override") or next(
        (os.environ[n] for n in env_names if os.environ.get(n)), None
    )
    if not raw:
        return None, query.get("scheme")
    if "://" in raw:
        parts = urlsplit(raw)
        return parts.netloc + parts.path.rstrip("/"), query.get("scheme") or parts.scheme
    return raw, query.get("scheme")


def _s3(
    query: dict[str, str], bucket: str, endpoint: str | None, scheme: str | None, anonymous: bool
) -> pafs.FileSystem:
    """An S3FileSystem with bounded timeouts and retries. Against AWS itself (no endpoint override) a
    bucket's region, when none is given, is asked of AWS (one HEAD request)."""
    import pyarrow.fs as pafs

    region = query.get("region") or os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
    if not region and endpoint is None:
        try:
            region = pafs.resolve_s3_region(bucket)
        except OSError:
            region = None  # the first real request reports the problem (no bucket, no network)
    return pafs.S3FileSystem(
        anonymous=anonymous,
        region=region or "us-east-1",
        endpoint_override=endpoint,
        scheme=scheme or "https",
        connect_timeout=CONNECT_TIMEOUT_S,
        request_timeout=REQUEST_TIMEOUT_S,
        retry_strategy=pafs.AwsStandardS3RetryStrategy(max_attempts=RETRY_ATTEMPTS),
    )


def _gcs(query: dict[str, str], endpoint: str | None, scheme: str | None, anonymous: bool) -> pafs.FileSystem:
    """A GcsFileSystem whose retries of a failing request stop after GCS_RETRY_LIMIT_S."""
    import pyarrow.fs as pafs

    return pafs.GcsFileSystem(
        anonymous=anonymous,
        endpoint_override=endpoint,
        scheme=scheme or "https",
        project_id=query.get("project_id"),
        retry_time_limit=timedelta(seconds=GCS_RETRY_LIMIT_S),
    )
