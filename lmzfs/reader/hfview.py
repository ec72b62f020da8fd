"""The store in the Hugging Face hub cache's layout, as the mount serves it under `.hf/hub`; no
FUSE in here (the daemon's tree places these items, tests read them directly).

For every model recorded as a revision of a hub repo (store/catalog/hfrows.py):

    hub/models--ORG--NAME/refs/REF                      the commit REF points at (no newline)
    hub/models--ORG--NAME/snapshots/COMMIT/PATH         a symlink ../../blobs/BLOB (one ../ per level)
    hub/models--ORG--NAME/blobs/BLOB                    the file's bytes, once per blob name

as `hf download` leaves it, so huggingface_hub (`scan_cache_dir`, `hf_hub_download` and
`try_to_load_from_cache` with HF_HUB_OFFLINE) and every loader built on it find the models by name.
A blob is named as the cache named it when the model came from one, else by the file's SHA-256.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass

from lmzfs.reader.api import FileEntry

log = logging.getLogger(__name__)

TOP = ".hf"
HUB = f"{TOP}/hub"
FOLDER_PREFIX = {"model": "models", "dataset": "datasets", "space": "spaces"}


@dataclass(frozen=True)
class ViewItem:
    path: str                           # below the mountpoint, "/"-separated: ".hf/hub/models--a--b/..."
    entry: FileEntry | None = None      # a blob: the stored file whose bytes it serves
    target: str | None = None           # a symlink's target
    data: bytes | None = None           # a ref: its bytes
    mtime: float = 0.0


def repo_folder(repo_type: str, repo_id: str) -> str:
    """huggingface_hub's own naming (file_download.repo_folder_name): models--ORG--NAME."""
    return "--".join([FOLDER_PREFIX[repo_type], *repo_id.split("/")])


def hub_items(revisions, files: list[FileEntry]) -> list[ViewItem]:
    """The items of the view, given the catalog's recorded revisions (HfRevisionRow) and the files
    archive.files() lists. A ref claimed by two revisions of a repo goes to the newest model; two
    models recorded with the same repo and commit give the first one's snapshot."""
    by_model: dict[str, list[FileEntry]] = {}
    for e in files:
        by_model.setdefault(e.model, []).append(e)
    items: list[ViewItem] = []
    seen_blobs: set[str] = set()
    seen_snapshots: set[str] = set()
    refs: dict[str, tuple[str, float]] = {}          # ref path -> (commit, mtime), newest model last wins
    for rev in revisions:
        entries = by_model.get(rev.model, [])
        repo = f"{HUB}/{repo_folder(rev.repo_type, rev.repo_id)}"
        snapshot = f"{repo}/snapshots/{rev.commit_hash}"
        newest = max((e.mtime for e in entries), default=0.0)
        for ref in rev.refs:
            refs[f"{repo}/refs/{ref}"] = (rev.commit_hash, newest)
        if snapshot in seen_snapshots:
            log.warning("%s: %s is served from an earlier model of the same commit", rev.model, snapshot)
            continue
        seen_snapshots.add(snapshot)
        for e in entries:
            blob = rev.blobs.get(e.path, e.sha256)
            if f"{repo}/{blob}" not in seen_blobs:
                seen_blobs.add(f"{repo}/{blob}")
                items.append(ViewItem(f"{repo}/blobs/{blob}", entry=e, mtime=e.mtime))
            up = "../" * (e.path.count("/") + 2)
            items.append(ViewItem(f"{snapshot}/{e.path}", target=f"{up}blobs/{blob}", mtime=e.mtime))
    for path, (commit, mtime) in refs.items():
        items.append(ViewItem(path, data=commit.encode(), mtime=mtime))
    return items
