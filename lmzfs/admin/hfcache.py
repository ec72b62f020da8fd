"""Taking models in from a Hugging Face hub cache (`~/.cache/huggingface/hub`): one snapshot
(`lmz add SNAPSHOT_DIR`, `lmz add hf://ORG/NAME[@REVISION]`) or the whole cache (`lmz add --hf-cache`).

The cache's layout is huggingface_hub's to define: where the cache is (HF_HUB_CACHE, HF_HOME),
which repos and revisions it holds, their refs and blobs all come from its own cache API
(`scan_cache_dir`), offline. Nothing here writes to the cache.

A snapshot's files are symlinks into its repo's blobs/ (and, with huggingface_hub's shared blob
store, on into the cache's blobs/): the add follows them there and nowhere else. The model records
its origin (repo id, commit, refs, each file's blob name: store/catalog/hfrows.py), from which the
mount serves the cache layout again (reader/hfview.py).
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from lmzfs.store.catalog.hfrows import HfOrigin, HfRevisionRow, load_revisions, record_origin
from lmzfs.store.layout import StoreError, StorePaths

PREFIX = "hf://"


def hub():
    """huggingface_hub, or a StoreError that says how to get it."""
    try:
        import huggingface_hub
    except ImportError:
        raise StoreError("the Hugging Face cache needs huggingface_hub (pip install huggingface_hub)") from None
    return huggingface_hub


def default_cache() -> Path:
    """The cache huggingface_hub itself uses now (HF_HUB_CACHE, else HF_HOME/hub, else ~/.cache/...)."""
    import importlib
    hub()
    constants = importlib.reload(importlib.import_module("huggingface_hub.constants"))   # the environment now
    return Path(constants.HF_HUB_CACHE)


@dataclass(frozen=True)
class Snapshot:
    """One cached revision of a repo, as the add needs it: what the add records of it (its
    repo, commit, refs and blobs: path in the snapshot -> blob name, its symlink's target) and
    where its files are."""
    origin: HfOrigin
    path: Path                          # CACHE/models--ORG--NAME/snapshots/COMMIT
    link_roots: tuple[Path, ...]        # where its symlinks may lead: the repo's blobs/, the shared store
    bytes: int                          # the files' sizes, as an add reads them
    last_modified: float

    def model_name(self) -> str:
        """ORG/NAME for what `main` points at, else ORG/NAME@REF (or @ the commit's first 12 digits)."""
        o = self.origin
        if "main" in o.refs:
            return o.repo_id
        tag = sorted(o.refs)[0].replace("/", "-") if o.refs else o.commit_hash[:12]
        return f"{o.repo_id}@{tag}"


def _link_roots(cache: Path, repo_path: Path) -> tuple[Path, ...]:
    roots = [repo_path / "blobs"]
    try:
        from huggingface_hub.utils import _shared_blobs     # the shared store (huggingface_hub >= 1.x)
        shared = _shared_blobs.shared_blobs_dir(cache)
        if _shared_blobs.is_shared_blobs_dir(shared):
            roots.append(Path(shared))
    except (ImportError, AttributeError):
        pass
    return tuple(r for r in roots if r.is_dir())


def _snapshot(cache: Path, repo, revision) -> Snapshot:
    blobs, size = {}, 0
    for f in revision.files:
        rel = Path(f.file_path).relative_to(revision.snapshot_path).as_posix()
        size += f.size_on_disk
        if Path(f.file_path).is_symlink():
            blobs[rel] = Path(os.readlink(f.file_path)).name
    origin = HfOrigin(repo.repo_id, revision.commit_hash, tuple(sorted(revision.refs)), blobs, repo.repo_type)
    return Snapshot(origin, Path(revision.snapshot_path), _link_roots(cache, Path(repo.repo_path)), size,
                    revision.last_modified)


def scan(cache: Path):
    """huggingface_hub's scan of CACHE; StoreError if there is none."""
    h = hub()
    try:
        return h.scan_cache_dir(cache)
    except h.CacheNotFound:
        raise StoreError(f"no Hugging Face cache at {cache} (set HF_HUB_CACHE or HF_HOME, or give the directory)") \
            from None
    except ValueError as exc:
        raise StoreError(f"{cache}: {exc}") from None


def snapshot_at(path: Path) -> Snapshot | None:
    """The cached revision PATH is the snapshot directory of, or None if it is not one."""
    path = Path(os.path.abspath(path))
    if path.parent.name != "snapshots" or "--" not in path.parent.parent.name or not path.is_dir():
        return None
    cache = path.parent.parent.parent
    for repo in scan(cache).repos:
        if Path(repo.repo_path) == path.parent.parent:
            for rev in repo.revisions:
                if Path(rev.snapshot_path) == path:
                    return _snapshot(cache, repo, rev)
    return None


def parse_hf_spec(spec: str) -> tuple[str, str | None]:
    """hf://ORG/NAME[@REVISION] -> (ORG/NAME, REVISION or None)."""
    rest = spec[len(PREFIX):].strip("/")
    repo_id, _, revision = rest.partition("@")
    if not repo_id or repo_id.count("/") > 1:
        raise StoreError(f"{spec}: give hf://ORG/NAME or hf://ORG/NAME@REVISION")
    return repo_id, revision or None


def resolve(spec: str, cache: Path | None = None) -> Snapshot:
    """The cached snapshot hf://ORG/NAME[@REVISION] names: REVISION a ref (default main), a commit
    hash or its first digits. StoreError if the cache does not hold it."""
    repo_id, revision = parse_hf_spec(spec)
    cache = default_cache() if cache is None else cache
    fetch = f"run `hf download {repo_id}" + (f" --revision {revision}" if revision else "") + "` first"
    info = scan(cache) if cache.is_dir() else None
    repo = next((r for r in info.repos if r.repo_type == "model" and r.repo_id == repo_id), None) if info else None
    if repo is None:
        raise StoreError(f"{repo_id} is not in the Hugging Face cache at {cache}; {fetch}")
    wanted = revision or "main"
    revs = [r for r in repo.revisions if wanted in r.refs] or \
           [r for r in repo.revisions if len(wanted) >= 7 and r.commit_hash.startswith(wanted.lower())]
    if len(revs) != 1:
        known = ", ".join(sorted({*(ref for r in repo.revisions for ref in r.refs),
                                  *(r.commit_hash[:12] for r in repo.revisions)}))
        raise StoreError(f"{repo_id}@{wanted} is not in the Hugging Face cache at {cache} (it holds {known}); {fetch}")
    return _snapshot(cache, repo, revs[0])


def recorder(origin: HfOrigin) -> Callable:
    return lambda tx, model_id: record_origin(tx, model_id, origin)


# -- the whole cache ------------------------------------------------------------------------------

@dataclass
class RepoReport:
    repo_id: str
    cache_bytes: int                   # the repo's blobs on disk, as huggingface_hub counts them
    store_before: int = 0              # the store's bytes on disk before its first revision
    store_after: int = 0
    added: list[str] = field(default_factory=list)      # model names
    skipped: list[str] = field(default_factory=list)    # "NAME: why"


@dataclass
class CacheReport:
    cache: Path
    cache_bytes: int
    repos: list[RepoReport] = field(default_factory=list)
    left_out: list[str] = field(default_factory=list)   # datasets and spaces
    seconds: float = 0.0


def stored_revisions(store: StorePaths) -> list[HfRevisionRow]:
    if not store.exists():
        return []
    from lmzfs.store.catalog import Catalog
    store.check_format()
    catalog = Catalog(store.catalog, readonly=True)
    try:
        return load_revisions(catalog.db)
    finally:
        catalog.close()


def add_cache(store: StorePaths, cache: Path | None, add: Callable[[Snapshot, Callable[[int, int], None]], object],
              progress: Callable[[int, int], None] | None = None,
              report_repo: Callable[[RepoReport], None] | None = None) -> CacheReport:
    """Add every cached revision of every model repo: one repo after another, its revisions oldest
    first (so each newer one pairs with the one before as a delta base); revisions the store holds
    already (same repo and commit) are left alone, so a second run adds only what is new. ``add``
    adds one snapshot (the CLI's add, with its options). Never writes to the cache."""
    cache = default_cache() if cache is None else Path(cache)
    started = time.monotonic()
    info = scan(cache)
    report = CacheReport(Path(info.cache_dir), info.size_on_disk)
    have = {(r.repo_type, r.repo_id, r.commit_hash) for r in stored_revisions(store)}
    repos = sorted(info.repos, key=lambda r: (r.repo_type, r.repo_id))
    report.left_out = [f"{r.repo_type} {r.repo_id}" for r in repos if r.repo_type != "model"]
    plan = [(repo, sorted(repo.revisions, key=lambda v: (v.last_modified, v.commit_hash)))
            for repo in repos if repo.repo_type == "model"]
    total = sum(f.size_on_disk for _, revs in plan for v in revs for f in v.files)
    done = 0
    for repo, revisions in plan:
        rr = RepoReport(repo.repo_id, repo.size_on_disk, store_before=store.disk_bytes() if store.exists() else 0)
        for rev in revisions:
            snap = _snapshot(Path(info.cache_dir), repo, rev)
            if (repo.repo_type, repo.repo_id, rev.commit_hash) in have:
                rr.skipped.append(f"{snap.model_name()}: commit {rev.commit_hash[:12]} is in the store already")
            else:
                base = done
                add(snap, lambda n, _t, base=base: progress and progress(base + n, total))
                rr.added.append(snap.model_name())
            done += snap.bytes
            if progress:
                progress(done, total)
        rr.store_after = store.disk_bytes() if store.exists() else 0
        report.repos.append(rr)
        if report_repo:
            report_repo(rr)
    report.seconds = time.monotonic() - started
    return report
