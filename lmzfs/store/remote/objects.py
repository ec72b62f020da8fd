"""The object-store client: one small surface (get, ranged get, put, conditional put, list,
delete) over obstore, with every request under a timeout and retried with backoff.

obstore (Rust's object_store under Python) was chosen because it releases the GIL for the whole
request, so ranged GETs run in parallel from worker threads, and it speaks S3, GCS, Azure and
plain HTTP with conditional PUTs (create-only, If-Match). Credentials come from the environment
(AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN) or, where those are unset, from
boto3's standard chain (~/.aws, SSO, instance roles) when boto3 is installed; the engine's
address from AWS_ENDPOINT_URL or the `remote_endpoint` config key. No error line, log line or
status output ever carries a credential: only the remote's URL, which holds none (a URL with
user:password@ is refused).
"""
from __future__ import annotations

import datetime
import os
import re
from dataclasses import dataclass
from typing import Iterable, Iterator
from urllib.parse import urlsplit

from lmzfs.store.layout import StoreError

DEFAULT_TIMEOUT_S = 30.0      # the most a call waits for the engine, its retries included
DEFAULT_RETRIES = 3           # tries after the first, with exponential backoff from 100 ms
CONNECT_TIMEOUT_S = 5.0


class RemoteError(StoreError):
    """The remote cannot do what was asked: one line for the operator, no credentials."""


class RemoteUnavailable(RemoteError, OSError):
    """The engine did not answer (after retries), or answered with an error it should not have."""

    def __init__(self, message: str):
        RemoteError.__init__(self, message)
        self.errno, self.strerror = 5, message          # EIO, for a read that needed it

    def __str__(self) -> str:
        return self.strerror


class RemoteMissing(RemoteError):
    """No object at that key."""


class RemoteConflict(RemoteError):
    """A conditional write lost: the object exists, or changed since it was read."""


@dataclass(frozen=True)
class RemoteURL:
    """Where a remote store lives: s3://bucket/prefix, or read-only http(s)://host/prefix."""
    scheme: str          # "s3", "http" or "https"
    bucket: str          # s3: the bucket; http(s): host[:port]
    prefix: str          # no leading or trailing slash; "" for the root

    @classmethod
    def parse(cls, text: str) -> "RemoteURL":
        parts = urlsplit(text)
        scheme = parts.scheme.lower()
        if scheme not in ("s3", "http", "https") or not parts.netloc:
            raise RemoteError(f"not a remote store: {text!r} (use s3://BUCKET/PREFIX or https://HOST/PREFIX)")
        if "@" in parts.netloc:
            raise RemoteError("a remote URL may not carry credentials: give them in the environment or ~/.aws")
        if parts.query or parts.fragment:
            raise RemoteError(f"a remote URL has no query or fragment: {text!r}")
        prefix = parts.path.strip("/")
        if any(seg in ("", ".", "..") for seg in prefix.split("/")) and prefix:
            raise RemoteError(f"not a remote store prefix: {parts.path!r}")
        return cls(scheme, parts.netloc, prefix)

    @property
    def writable(self) -> bool:
        return self.scheme == "s3"

    def __str__(self) -> str:
        return f"{self.scheme}://{self.bucket}" + (f"/{self.prefix}" if self.prefix else "")

    def cache_name(self) -> str:
        """A directory name for this remote's cache: readable, and never two remotes the same."""
        import hashlib
        tag = re.sub(r"[^A-Za-z0-9._-]+", "_", f"{self.bucket}_{self.prefix}")[:60]
        return f"{tag}-{hashlib.sha256(str(self).encode()).hexdigest()[:12]}"


@dataclass(frozen=True)
class ObjectInfo:
    key: str
    size: int
    modified: float      # seconds since the epoch
    etag: str | None


def _seconds(td: float) -> datetime.timedelta:
    return datetime.timedelta(seconds=td)


def _endpoint(url: RemoteURL, endpoint: str | None) -> str | None:
    endpoint = endpoint or os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
    return endpoint.rstrip("/") if endpoint else None


class ObjectStore:
    """Thread-safe; every method raises RemoteUnavailable, RemoteMissing or RemoteConflict (all
    StoreError), never an obstore exception."""

    def __init__(self, url: RemoteURL, *, endpoint: str | None = None, timeout: float = DEFAULT_TIMEOUT_S,
                 retries: int = DEFAULT_RETRIES):
        import obstore
        from obstore.store import HTTPStore, S3Store

        self.url = url
        self.timeout = timeout
        self._obs = obstore
        # A request may start until half the timeout has passed since the first try, and each
        # runs at most half of it: whatever the engine does, a call returns within `timeout`.
        half = timeout / 2
        client = {"timeout": f"{half:g}s", "connect_timeout": f"{min(half, CONNECT_TIMEOUT_S):g}s"}
        retry = {"max_retries": retries, "retry_timeout": _seconds(half),
                 "backoff": {"init_backoff": _seconds(0.1), "max_backoff": _seconds(5), "base": 2.0}}
        if url.scheme == "s3":
            ep = _endpoint(url, endpoint)
            if ep is not None and ep.startswith("http://"):
                client["allow_http"] = True
            kwargs = {"prefix": url.prefix or None, "client_options": client, "retry_config": retry}
            if ep is not None:
                kwargs["endpoint"] = ep
            region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
            kwargs["region"] = region or "us-east-1"
            if not os.environ.get("AWS_ACCESS_KEY_ID"):
                provider = _boto3_credentials()
                if provider is not None:
                    kwargs["credential_provider"] = provider
            try:
                self._store = S3Store(url.bucket, **kwargs)
            except Exception as exc:        # a bad configuration value: obstore's own message
                raise RemoteError(f"{url}: {_first_line(exc)}") from None
        else:
            if url.scheme == "http":
                client["allow_http"] = True
            base = f"{url.scheme}://{url.bucket}/" + (url.prefix + "/" if url.prefix else "")
            self._store = HTTPStore.from_url(base, client_options=client, retry_config=retry)

    # -- reads ------------------------------------------------------------------------------------
    def get(self, key: str) -> bytes:
        with self._mapped(key):
            return bytes(self._obs.get(self._store, key).bytes())

    def get_if_changed(self, key: str, etag: str | None) -> tuple[bytes, str | None] | None:
        """(the object, its etag), or None if its etag is still `etag` (a cheap poll)."""
        options = {"if_none_match": etag} if etag else {}
        with self._mapped(key):
            try:
                result = self._obs.get(self._store, key, options=options)
            except Exception as exc:
                if type(exc).__name__ == "NotModifiedError":
                    return None
                raise
            return bytes(result.bytes()), result.meta.get("e_tag")

    def get_range(self, key: str, start: int, end: int) -> memoryview:
        """Bytes [start, end) of the object (a view of the client's buffer, not a copy);
        RemoteUnavailable if fewer came back."""
        with self._mapped(key):
            data = memoryview(self._obs.get_range(self._store, key, start=start, end=end))
        if len(data) != end - start:
            raise RemoteUnavailable(f"{self.url}/{key}: asked for bytes {start}..{end}, got {len(data)}")
        return data

    def get_range_pieces(self, key: str, start: int, end: int, piece: int) -> Iterator[memoryview]:
        """Bytes [start, end) of the object as they arrive, in pieces of at least `piece` bytes (the
        last may be shorter): one ranged GET whose body is handed on while it streams in, so that a
        reader of its first bytes need not wait for its last. RemoteUnavailable if fewer came back."""
        got = 0
        with self._mapped(key):
            result = self._obs.get(self._store, key, options={"range": (start, end)})
            for buf in result.stream(min_chunk_size=piece):
                view = memoryview(buf)
                got += len(view)
                yield view
        if got != end - start:
            raise RemoteUnavailable(f"{self.url}/{key}: asked for bytes {start}..{end}, got {got}")

    def head(self, key: str) -> ObjectInfo:
        with self._mapped(key):
            return _info(self._obs.head(self._store, key))

    def list(self, prefix: str) -> list[ObjectInfo]:
        with self._mapped(prefix):
            out = []
            for batch in self._obs.list(self._store, prefix):
                out.extend(_info(m) for m in batch)
            return out

    # -- writes -----------------------------------------------------------------------------------
    def put(self, key: str, data: bytes | Iterable[bytes], *, create: bool = False, if_match: str | None = None,
            part_bytes: int = 16 << 20, parallel: int = 4) -> str | None:
        """Write the object (multipart, `parallel` parts in flight, for an iterable of buffers);
        create: only if no object has the key; if_match: only if its etag is still that. Returns
        the new etag. RemoteConflict if the condition fails."""
        mode = "create" if create else ({"e_tag": if_match} if if_match else None)
        with self._mapped(key):
            result = self._obs.put(self._store, key, data, mode=mode, chunk_size=part_bytes,
                                   max_concurrency=parallel)
        return result.get("e_tag")

    def delete(self, keys: list[str]) -> None:
        if keys:
            with self._mapped(keys[0]):
                self._obs.delete(self._store, keys)

    # -- errors -----------------------------------------------------------------------------------
    def _mapped(self, key: str):
        return _ErrorMap(self.url, key)


class _ErrorMap:
    def __init__(self, url: RemoteURL, key: str):
        self.where = f"{url}/{key}"

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc is None or isinstance(exc, RemoteError) or not _is_obstore(exc):
            return False
        name = type(exc).__name__
        line = _first_line(exc)
        if name == "NotFoundError" or isinstance(exc, FileNotFoundError):
            raise RemoteMissing(f"{self.where}: no such object") from None
        if name in ("AlreadyExistsError", "PreconditionError") or isinstance(exc, FileExistsError):
            raise RemoteConflict(f"{self.where}: changed by another writer") from None
        if name in ("PermissionDeniedError", "UnauthenticatedError") or isinstance(exc, PermissionError):
            raise RemoteUnavailable(f"{self.where}: access denied by the remote ({name[:-5].lower()}): "
                                    f"check the credentials") from None
        raise RemoteUnavailable(f"{self.where}: the remote did not answer: {line}") from None


def _is_obstore(exc: BaseException) -> bool:
    from obstore.exceptions import BaseError
    return isinstance(exc, (BaseError, OSError))


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    # obstore names the request's URL, never its signature or keys; keep the line short all the same
    return re.sub(r"\s+", " ", text)[:300]


def _info(meta) -> ObjectInfo:
    modified = meta.get("last_modified")
    return ObjectInfo(meta["path"], int(meta["size"]), modified.timestamp() if modified else 0.0, meta.get("e_tag"))


def _boto3_credentials():
    """boto3's credential chain (~/.aws, SSO, instance roles), if boto3 is installed and finds any."""
    try:
        import boto3
        from obstore.auth.boto3 import Boto3CredentialProvider
    except ImportError:
        return None
    session = boto3.Session()
    if session.get_credentials() is None:
        return None
    return Boto3CredentialProvider(session)
