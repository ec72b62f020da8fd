"""Settings for `lmz` and the mount service: defaults, the config file, the environment, flags.

    /etc/lmzfs/config.toml   (another file: $LMZ_CONFIG)

    store       = "/var/lib/lmzfs"     # where models are stored
    mountpoint  = "/srv/models"        # where `lmz mount` / `lmz umount` act when given none
    cache_size  = "512M"               # decoded-chunk cache: bytes, or a string like "512M", "2G"
                                       # (default: 1/8 of the usable memory, 32M to 256M)
    workers     = 8                    # parallel decodes (default: the usable CPUs)
    allow_other = false                # let other users read the mount
    readahead   = true                 # decode ahead of sequential readers
    chain_depth = 4                    # `lmz add`: the most references a read of a chunk follows
                                       # (1 to 15; longer chains are re-anchored)
    remote      = "s3://bucket/models" # mount this remote store instead of `store` (docs/remote.md)
    remote_endpoint   = "https://s3.example.net"   # an S3-compatible engine (else $AWS_ENDPOINT_URL, else AWS)
    remote_cache_dir  = "/var/cache/lmzfs"         # fetched ranges and snapshots of the remote
    remote_cache_size = "20G"          # bytes of fetched ranges kept on disk
    remote_poll       = "30s"          # how often a mount looks for a newer snapshot ("0": never)
    remote_timeout    = "30s"          # the most a read waits for the engine, retries included

Precedence, highest first: command-line flags, the environment ($LMZ_STORE, for the store only),
the config file, the defaults. A missing default config file is fine; a missing file named by
$LMZ_CONFIG, an unknown key, a value of the wrong type or a bad size is a StoreError naming the
file, the key and the reason.
"""
from __future__ import annotations

import os
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from lmzfs.hostresources import MAX_CACHE, default_cache_size
from lmzfs.store.layout import StoreError, user_store_dir

DEFAULT_CONFIG = Path("/etc/lmzfs/config.toml")
CONFIG_ENV = "LMZ_CONFIG"
STORE_ENV = "LMZ_STORE"
DEFAULT_CACHE_SIZE = MAX_CACHE       # on a host with 2 GiB or more to use; see default_cache_size

KEYS = ("store", "mountpoint", "cache_size", "workers", "allow_other", "readahead", "chain_depth", "remote",
        "remote_endpoint", "remote_cache_dir", "remote_cache_size", "remote_poll", "remote_timeout")
REMOTE_DEFAULTS = {"remote": None, "remote_endpoint": None, "remote_cache_dir": None,
                   "remote_cache_size": 20 << 30, "remote_poll": 30.0, "remote_timeout": 30.0}
DEFAULT_CHAIN_DEPTH = 4
# A reader refuses chains longer than the catalog's MAX_CHAIN_HOPS (16): a cap stays below it.
MAX_CHAIN_DEPTH = 15
# keys of earlier releases, refused with what to do instead
REMOVED_KEYS = {"decoder": "removed: chunks are always decoded in threads; delete the line"}


def parse_seconds(text: str | int | float) -> float:
    """"30s", "2m", "1h", "500ms", 45 -> seconds; ValueError otherwise."""
    if isinstance(text, bool):
        raise ValueError(f"not a duration: {text!r}")
    if isinstance(text, (int, float)):
        value = float(text)
    else:
        m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|)\s*", text.lower())
        if not m:
            raise ValueError(f"not a duration: {text!r} (use e.g. 30s, 2m, 1h)")
        value = float(m.group(1)) * {"ms": 0.001, "s": 1, "": 1, "m": 60, "h": 3600}[m.group(2)]
    if value < 0:
        raise ValueError(f"not a duration: {text!r} (negative)")
    return value


def parse_size(text: str) -> int:
    """"512M", "2G", "1.5GiB", "4096" -> bytes (powers of 1024); ValueError otherwise."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(i?b)?\s*", text.lower())
    if not m:
        raise ValueError(f"not a size: {text!r} (use e.g. 512M or 2G)")
    return int(float(m.group(1)) * 1024 ** " kmgt".index(m.group(2) or " "))


@dataclass
class Settings:
    """The effective settings, and where each came from: "flag", "env", "config" or "default"."""
    store: Path
    mountpoint: Path | None = None
    cache_size: int = DEFAULT_CACHE_SIZE
    workers: int | None = None           # None: the usable CPUs (hostresources.usable_cpus)
    allow_other: bool = False
    readahead: bool = True
    chain_depth: int = DEFAULT_CHAIN_DEPTH
    remote: str | None = None            # a remote store's URL: mount it instead of `store`
    remote_endpoint: str | None = None
    remote_cache_dir: Path | None = None  # None: ~/.cache/lmzfs/remote/NAME
    remote_cache_size: int = 20 << 30
    remote_poll: float = 30.0
    remote_timeout: float = 30.0
    config_file: Path | None = None      # the file that was read, if any
    sources: dict[str, str] = field(default_factory=dict)

    def as_dict(self) -> dict:
        """For `lmz doctor --json`: every key with its value (paths as strings) and source."""
        out = {}
        for key in KEYS:
            value = getattr(self, key)
            out[key] = {"value": str(value) if isinstance(value, Path) else value,
                        "source": self.sources.get(key, "default")}
        return out


def config_path() -> tuple[Path, bool]:
    """(the config file to read, whether it was named explicitly by $LMZ_CONFIG)."""
    named = os.environ.get(CONFIG_ENV)
    return (Path(named).expanduser(), True) if named else (DEFAULT_CONFIG, False)


def load_config(path: Path | None = None, *, required: bool | None = None) -> tuple[dict, Path | None]:
    """The validated keys of the config file (converted: paths, byte counts) and the file read.

    Without *path*: $LMZ_CONFIG (must exist) or /etc/lmzfs/config.toml (may be missing)."""
    if path is None:
        path, explicit = config_path()
    else:
        explicit = True
    if required is None:
        required = explicit
    try:
        with open(path, "rb") as f:
            raw = tomllib.load(f)
    except FileNotFoundError:
        if required:
            raise StoreError(f"config {path}: no such file (named by ${CONFIG_ENV})") from None
        return {}, None
    except IsADirectoryError:
        raise StoreError(f"config {path}: is a directory, not a TOML file") from None
    except PermissionError:
        raise StoreError(f"config {path}: permission denied") from None
    except tomllib.TOMLDecodeError as exc:
        raise StoreError(f"config {path}: not valid TOML: {exc}") from None
    except UnicodeDecodeError as exc:
        raise StoreError(f"config {path}: not valid TOML: {exc}") from None
    return {key: _check(path, key, value) for key, value in raw.items()}, path


def _check(path: Path, key: str, value):
    def bad(reason: str) -> StoreError:
        return StoreError(f"config {path}: key {key!r}: {reason}")

    if key in REMOVED_KEYS:
        raise bad(REMOVED_KEYS[key])
    if key not in KEYS:
        raise bad(f"unknown key (known keys: {', '.join(KEYS)})")
    if key in ("store", "mountpoint"):
        if not isinstance(value, str) or not value:
            raise bad(f"must be a non-empty string (a path), not {_show(value)}")
        p = Path(value).expanduser()
        if not p.is_absolute():
            raise bad(f"must be an absolute path, not {value!r}")
        return p
    if key in ("remote", "remote_endpoint"):
        if not isinstance(value, str) or not value:
            raise bad(f"must be a non-empty string (a URL), not {_show(value)}")
        if key == "remote":
            from lmzfs.store.remote.objects import RemoteURL
            try:
                RemoteURL.parse(value)
            except StoreError as exc:
                raise bad(str(exc)) from None
        elif not value.startswith(("http://", "https://")):
            raise bad(f"must be an http(s):// URL, not {value!r}")
        return value
    if key == "remote_cache_dir":
        if not isinstance(value, str) or not value or not Path(value).expanduser().is_absolute():
            raise bad(f"must be an absolute path, not {_show(value)}")
        return Path(value).expanduser()
    if key in ("remote_poll", "remote_timeout"):
        try:
            seconds = parse_seconds(value)
        except ValueError as exc:
            raise bad(str(exc)) from None
        if key == "remote_timeout" and seconds <= 0:
            raise bad("must be more than 0")
        return seconds
    if key in ("cache_size", "remote_cache_size"):
        if isinstance(value, bool) or not isinstance(value, (int, str)):
            raise bad(f"must be a number of bytes or a size like \"512M\", not {_show(value)}")
        if isinstance(value, str):
            try:
                value = parse_size(value)
            except ValueError as exc:
                raise bad(str(exc)) from None
        if value < 0:
            raise bad("must not be negative")
        return value
    if key == "chain_depth":
        if isinstance(value, bool) or not isinstance(value, int):
            raise bad(f"must be an integer, not {_show(value)}")
        if not 1 <= value <= MAX_CHAIN_DEPTH:
            raise bad(f"must be 1 to {MAX_CHAIN_DEPTH}, not {value} (to store a model without deltas, "
                      f"use `lmz add --no-delta`)")
        return value
    if key == "workers":
        if isinstance(value, bool) or not isinstance(value, int):
            raise bad(f"must be an integer, not {_show(value)}")
        if value < 1:
            raise bad(f"must be at least 1, not {value} (to turn read-ahead off, set readahead = false)")
        return value
    if not isinstance(value, bool):               # allow_other, readahead
        raise bad(f"must be true or false, not {_show(value)}")
    return value


def _show(value) -> str:
    kind = {bool: "a boolean", int: "an integer", float: "a float", str: "a string", list: "an array",
            dict: "a table"}.get(type(value), type(value).__name__)
    return f"{kind} ({value!r})"


def resolve(*, store: str | os.PathLike | None = None, mountpoint: str | os.PathLike | None = None,
            cache_size: int | None = None, workers: int | None = None, allow_other: bool | None = None,
            readahead: bool | None = None, chain_depth: int | None = None, config: dict | None = None,
            config_file: Path | None = None, remote: str | None = None, remote_cache_dir=None,
            remote_cache_size: int | None = None, remote_poll: float | None = None) -> Settings:
    """The effective settings. Arguments are the command-line flags (None: not given). The config
    file is loaded unless *config* (already loaded keys) is passed."""
    if config is None:
        config, config_file = load_config()
    flags = {"store": Path(store).expanduser() if store else None,
             "mountpoint": Path(mountpoint).expanduser() if mountpoint else None,
             "cache_size": cache_size, "workers": workers, "allow_other": allow_other, "readahead": readahead,
             "chain_depth": chain_depth, "remote": remote,
             "remote_cache_dir": Path(remote_cache_dir).expanduser().absolute() if remote_cache_dir else None,
             "remote_cache_size": remote_cache_size, "remote_poll": remote_poll}
    defaults = {"store": user_store_dir(), "mountpoint": None, "cache_size": default_cache_size(),
                "workers": None, "allow_other": False, "readahead": True, "chain_depth": DEFAULT_CHAIN_DEPTH,
                **REMOTE_DEFAULTS}
    env = {"store": Path(os.environ[STORE_ENV]).expanduser()} if os.environ.get(STORE_ENV) else {}
    values, sources = {}, {}
    for key in KEYS:
        for source, layer in (("flag", flags), ("env", env), ("config", config)):
            if layer.get(key) is not None:
                values[key], sources[key] = layer[key], source
                break
        else:
            values[key], sources[key] = defaults[key], "default"
    return Settings(**values, config_file=config_file, sources=sources)


def resolve_store(flag: str | os.PathLike | None = None) -> Path:
    """The store directory alone: the flag, else $LMZ_STORE, else the config's, else the default.
    The config file is read only when it can matter."""
    if flag:
        return Path(flag).expanduser()
    if os.environ.get(STORE_ENV):
        return Path(os.environ[STORE_ENV]).expanduser()
    return resolve().store
