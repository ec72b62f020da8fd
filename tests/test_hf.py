"""The Hugging Face hub cache: taken in (a snapshot, hf://ORG/NAME, the whole cache) and served
back in its own layout under the mount's .hf/hub, checked with huggingface_hub's own functions.
The cache is built offline in huggingface_hub's layout from real files (lmzfs/testing/hfcache.py)."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from lmzfs.cli import main as lmz
from lmzfs.reader.archive import Archive
from lmzfs.store.layout import StorePaths
from lmzfs.testing.hfcache import MINILM, QUIRE, build_cache

hub = pytest.importorskip("huggingface_hub")


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return build_cache(tmp_path_factory.mktemp("hf") / "hub")


@pytest.fixture
def hf_env(cache, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(cache.root))
    monkeypatch.delenv("HF_HOME", raising=False)
    return cache


@pytest.fixture(scope="module")
def whole_store(cache, tmp_path_factory):
    """The whole cache added with one command, and what it printed."""
    store = tmp_path_factory.mktemp("hfstore") / "store"
    mp = pytest.MonkeyPatch()
    mp.setenv("HF_HUB_CACHE", str(cache.root))
    try:
        import contextlib
        import io
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            assert lmz(["--store", str(store), "add", "--hf-cache"]) == 0
    finally:
        mp.undo()
    return StorePaths(store), out.getvalue()


def stored_bytes(store: StorePaths, model: str) -> dict[str, bytes]:
    archive = Archive(store.root, workers=0)
    try:
        out = {}
        for e in archive.files():
            if e.model == model:
                with archive.open(e) as r:
                    out[e.path] = r.pread(0, e.size)
        return out
    finally:
        archive.close()


def test_a_cache_snapshot_directory_is_added_through_its_blob_symlinks_byte_for_byte(cache, tmp_path, capsys):
    old = cache.revision(MINILM, ref=None)
    store = tmp_path / "store"
    assert lmz(["--store", str(store), "add", str(old.snapshot(cache.root))]) == 0
    name = f"{MINILM}@{old.commit[:12]}"
    assert f"added {name}: 14 file(s)" in capsys.readouterr().out
    assert stored_bytes(StorePaths(store), name) == old.files


def test_a_symlink_out_of_a_snapshot_anywhere_but_its_own_repos_blobs_is_refused(cache, tmp_path, capsys):
    import shutil
    copy = tmp_path / "hub"
    shutil.copytree(cache.root / f"models--{QUIRE.replace('/', '--')}",
                    copy / f"models--{QUIRE.replace('/', '--')}", symlinks=True)
    snap = cache.revision(QUIRE).snapshot(copy)
    outside = tmp_path / "elsewhere.json"
    outside.write_text("{}")
    (snap / "extra.json").symlink_to(outside)
    assert lmz(["--store", str(tmp_path / "store"), "add", str(snap)]) == 2
    err = capsys.readouterr().err
    assert "extra.json is a symlink to" in err and "outside the added directory" in err
    other = cache.root / f"models--{MINILM.replace('/', '--')}" / "blobs"
    (snap / "extra.json").unlink()
    (snap / "extra.json").symlink_to(next(other.iterdir()))
    assert lmz(["--store", str(tmp_path / "store"), "add", str(snap)]) == 2
    assert "outside the added directory" in capsys.readouterr().err


def test_hf_name_adds_what_main_points_at_as_org_name_and_records_repo_and_commit(hf_env, tmp_path, capsys):
    store = StorePaths(tmp_path / "store")
    assert lmz(["--store", str(store.root), "add", f"hf://{QUIRE}"]) == 0
    assert f"added {QUIRE}: 2 file(s)" in capsys.readouterr().out
    main = hf_env.revision(QUIRE)
    assert stored_bytes(store, QUIRE) == main.files
    archive = Archive(store.root, workers=0)
    try:
        [rev] = archive.hf_revisions()
    finally:
        archive.close()
    assert (rev.model, rev.repo_id, rev.commit_hash, rev.refs) == (QUIRE, QUIRE, main.commit, ("main",))
    assert lmz(["--store", str(store.root), "rm", QUIRE]) == 0
    archive = Archive(store.root, workers=0)
    try:
        assert archive.hf_revisions() == []      # the model's rows went with it
    finally:
        archive.close()


def test_a_name_or_revision_not_in_the_cache_is_one_line_saying_to_run_hf_download(hf_env, tmp_path, capsys):
    assert lmz(["--store", str(tmp_path / "s"), "add", "hf://nobody/nothing"]) == 2
    err = capsys.readouterr().err
    assert err == (f"lmz: nobody/nothing is not in the Hugging Face cache at {hf_env.root}; "
                   f"run `hf download nobody/nothing` first\n")
    assert lmz(["--store", str(tmp_path / "s"), "add", f"hf://{MINILM}@v9"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"run `hf download {MINILM} --revision v9` first" in err
    assert not (tmp_path / "s").exists()


def test_the_whole_cache_goes_in_with_one_command_in_at_most_0_60x_of_its_bytes(cache, whole_store):
    store, out = whole_store
    info = hub.scan_cache_dir(cache.root)
    assert store.disk_bytes() <= 0.60 * info.size_on_disk
    names = {MINILM: cache.revision(MINILM), f"{MINILM}@{cache.revision(MINILM, None).commit[:12]}":
             cache.revision(MINILM, None), QUIRE: cache.revision(QUIRE)}
    for name, rev in names.items():
        assert stored_bytes(store, name) == rev.files
    # oldest first: the newer revision is stored whole, the older one as deltas against it
    assert f"{MINILM}@{cache.revision(MINILM, None).commit[:12]} now depends on {MINILM}" in out \
        or "recoded as deltas" in out
    assert f"{MINILM}: 2 revision(s) added" in out and f"{QUIRE}: 1 revision(s) added" in out


def test_adding_the_cache_again_adds_nothing_and_never_touches_the_cache(cache, whole_store, capsys):
    store, _ = whole_store
    before = {p: p.lstat().st_mtime_ns for p in cache.root.rglob("*")}
    disk = store.disk_bytes()
    assert lmz(["--store", str(store.root), "add", "--hf-cache", str(cache.root)]) == 0
    out = capsys.readouterr().out
    assert "0 revision(s) of 2 repo(s) added" in out and store.disk_bytes() == disk
    assert {p: p.lstat().st_mtime_ns for p in cache.root.rglob("*")} == before
