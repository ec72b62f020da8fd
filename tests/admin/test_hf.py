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
    assert f"{MINILM}@{cache.revision(MINILM, None).commit[:12]} now depends on {MINILM}: " in out
    assert f"{MINILM}: 2 revision(s) added" in out and f"{QUIRE}: 1 revision(s) added" in out


def test_adding_the_cache_again_adds_nothing_and_never_touches_the_cache(cache, whole_store, capsys):
    store, _ = whole_store
    before = {p: p.lstat().st_mtime_ns for p in cache.root.rglob("*")}
    disk = store.disk_bytes()
    assert lmz(["--store", str(store.root), "add", "--hf-cache", str(cache.root)]) == 0
    out = capsys.readouterr().out
    assert "0 revision(s) of 2 repo(s) added" in out and store.disk_bytes() == disk
    assert {p: p.lstat().st_mtime_ns for p in cache.root.rglob("*")} == before


def test_the_view_lays_the_store_out_as_the_cache_was(cache, whole_store):
    from lmzfs.reader.hfview import hub_items
    store, _ = whole_store
    archive = Archive(store.root, workers=0)
    try:
        items = {i.path: i for i in hub_items(archive.hf_revisions(), archive.files())}
    finally:
        archive.close()
    for rev in cache.revisions:
        repo = f"models--{rev.repo_id.replace('/', '--')}"
        for ref in rev.refs:
            assert items[f".hf/hub/{repo}/refs/{ref}"].data == rev.commit.encode()
        for rel in rev.files:
            link = cache.root / repo / "snapshots" / rev.commit / rel
            assert items[f".hf/hub/{repo}/snapshots/{rev.commit}/{rel}"].target == os.readlink(link)
    blobs = {p for p in items if "/blobs/" in p}
    assert blobs == {f".hf/hub/{p.relative_to(cache.root)}" for p in cache.root.glob("*/blobs/*")}


@pytest.mark.mount
def test_through_the_mount_huggingface_hub_finds_every_repo_revision_and_byte(cache, whole_store, tmp_path):
    from lmzfs.testing.mount import mounted
    store, _ = whole_store
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    with mounted(mnt, store.root):
        view = mnt / ".hf" / "hub"
        assert ".hf" not in os.listdir(mnt)          # hidden from the listing, found by name
        got, want = hub.scan_cache_dir(view), hub.scan_cache_dir(cache.root)
        assert got.warnings == [] and got.size_on_disk == want.size_on_disk

        def shape(info):
            return {(r.repo_id, r.size_on_disk, frozenset((v.commit_hash, v.refs, v.size_on_disk,
                                                           frozenset((f.file_name, f.size_on_disk) for f in v.files))
                                                          for v in r.revisions)) for r in info.repos}
        assert shape(got) == shape(want)
        for rev in cache.revisions:
            for rel, data in rev.files.items():
                path = hub.hf_hub_download(rev.repo_id, rel, revision=rev.commit if not rev.refs else None,
                                           cache_dir=view, local_files_only=True)
                assert Path(path).read_bytes() == data
        main = cache.revision(MINILM)
        cached = hub.try_to_load_from_cache(MINILM, "model.safetensors", cache_dir=view)
        assert cached == str(view / f"models--{MINILM.replace('/', '--')}" / "snapshots" / main.commit /
                             "model.safetensors")
        with pytest.raises(OSError):
            (view / "x").write_text("no")


@pytest.mark.mount
@pytest.mark.slow
@pytest.mark.skipif(os.environ.get("LMZ_HF_TRANSFORMERS") != "1", reason="set LMZ_HF_TRANSFORMERS=1 (needs torch, "
                                                                          "transformers, sentence-transformers)")
def test_transformers_and_sentence_transformers_load_by_name_from_the_view_identically(cache, whole_store,
                                                                                      tmp_path):
    import subprocess
    import sys
    from lmzfs.testing.mount import mounted
    store, _ = whole_store
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    script = Path(__file__).parents[2] / "bench" / "hf_load.py"
    with mounted(mnt, store.root):
        done = subprocess.run([sys.executable, str(script), "--original", str(cache.root), "--view",
                               str(mnt / ".hf" / "hub"), "--repo", MINILM], capture_output=True, text=True,
                              timeout=900)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "identical: AutoModel yes, SentenceTransformer yes" in done.stdout


def test_a_model_added_under_another_name_is_served_as_the_repo_id_it_is_given(cache, tmp_path, capsys):
    from lmzfs.reader.hfview import hub_items
    rev = cache.revision(QUIRE)
    src = tmp_path / "tagger"
    src.mkdir()
    for rel, data in rev.files.items():
        (src / rel).write_bytes(data)
    store = tmp_path / "store"
    assert lmz(["--store", str(store), "add", str(src), "--hf-repo", "me/tagger"]) == 0
    assert lmz(["--store", str(store), "add", str(src), "--name", "x", "--hf-repo", "me/a--b"]) == 2
    assert "'me/a--b' is not a Hugging Face repo id" in capsys.readouterr().err
    archive = Archive(store, workers=0)
    try:
        [row] = archive.hf_revisions()
        items = {i.path: i for i in hub_items([row], archive.files())}
    finally:
        archive.close()
    assert row.model == "tagger" and len(row.commit_hash) == 40
    repo = ".hf/hub/models--me--tagger"
    assert items[f"{repo}/refs/main"].data == row.commit_hash.encode()
    for rel, data in rev.files.items():
        import hashlib
        sha = hashlib.sha256(data).hexdigest()
        assert items[f"{repo}/snapshots/{row.commit_hash}/{rel}"].target == f"../../blobs/{sha}"
        assert items[f"{repo}/blobs/{sha}"].entry.size == len(data)


def test_ls_shows_each_models_hugging_face_repo_and_commit(cache, whole_store, capsys):
    import json
    store, _ = whole_store
    main, old = cache.revision(MINILM), cache.revision(MINILM, None)
    old_name = f"{MINILM}@{old.commit[:12]}"
    assert lmz(["--store", str(store.root), "ls", "--json"]) == 0
    rows = {r["model"]: r["hf"] for r in json.loads(capsys.readouterr().out)}
    assert rows[MINILM] == {"repo_type": "model", "repo_id": MINILM, "commit": main.commit, "refs": ["main"]}
    assert rows[old_name] == {"repo_type": "model", "repo_id": MINILM, "commit": old.commit, "refs": []}
    assert rows[QUIRE]["commit"] == cache.revision(QUIRE).commit
    assert lmz(["--store", str(store.root), "ls"]) == 0
    out = capsys.readouterr().out
    listed = out.split("\nHugging Face revisions (served by name under MOUNTPOINT/.hf/hub):\n")[1].split("\n\n")[0]
    assert listed.splitlines() == [f"  {QUIRE} is {QUIRE}@{cache.revision(QUIRE).commit} (main)",
                                   f"  {MINILM} is {MINILM}@{main.commit} (main)",
                                   f"  {old_name} is {MINILM}@{old.commit}"]
    assert lmz(["--store", str(store.root), "ls", MINILM]) == 0
    assert (f"\nHugging Face: {MINILM}@{main.commit} (main), served by name under MOUNTPOINT/.hf/hub\n"
            in capsys.readouterr().out)


@pytest.mark.allow_log_warnings
def test_hf_tables_of_an_unknown_version_are_refused_with_one_line_and_the_models_still_served(
        hf_env, tmp_path, capsys, caplog):
    import logging
    import sqlite3

    from lmzfs.daemon.tree import ROOT_INODE, DirectoryTree
    from lmzfs.store.layout import StoreError
    store = StorePaths(tmp_path / "store")
    assert lmz(["--store", str(store.root), "add", f"hf://{QUIRE}"]) == 0
    capsys.readouterr()
    db = sqlite3.connect(store.catalog)       # as a newer lmzfs would have written them
    db.execute("UPDATE meta SET value = '2' WHERE key = 'hf_version'")
    db.commit()
    db.close()
    said = "the store's Hugging Face tables are version 2; this lmzfs knows versions 1"
    archive = Archive(store.root, workers=0)
    try:
        with pytest.raises(StoreError, match=said):
            archive.hf_revisions()
        tree = DirectoryTree()
        with caplog.at_level(logging.ERROR):
            tree.refresh(archive)
        assert [n.name for n in tree.children(ROOT_INODE)] == [QUIRE.split("/")[0]]    # the model is served
        assert tree.lookup(ROOT_INODE, ".hf") is None or tree.children(tree.lookup(ROOT_INODE, ".hf").inode) == []
        assert [r.getMessage() for r in caplog.records] == [f"the .hf view is left out: {said}"]
    finally:
        archive.close()
    for argv in (["ls"], ["ls", "--json"], ["ls", QUIRE]):
        assert lmz(["--store", str(store.root), *argv]) == 0
        out, err = capsys.readouterr()
        assert err == f"lmz: warning: no Hugging Face revisions shown: {said}\n"
        assert QUIRE in out or "config.json" in out
