"""A store written by release 05565f7 reads back byte for byte (issue 44): the proof that a
refactor of the store, the codecs or the file-system model changes no on-disk behaviour.

tests/fixtures/store-v1/ was written once by `lmz add` of that release
(tests/fixtures/make_store_v1.py); tests/fixtures/store-v1.json holds the size and SHA-256 of every
original file, taken from the source files, not through the store. These tests only read the
store, through public seams (the `lmz` command as a user runs it, and the reader API the mount
uses), and always a copy of it: opening a store may write beside the catalog, and the committed
files must never change.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from lmzfs.cli import main as lmz_main
from lmzfs.reader import Archive
from lmzfs.reader.api import StoreError

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
FIXTURE = FIXTURES / "store-v1"
MANIFEST = json.loads((FIXTURES / "store-v1.json").read_text())
ROOT = Path(__file__).resolve().parents[2]
EXPECTED = {f"{model}/{path}": f for model, m in MANIFEST["models"].items() for path, f in m["files"].items()}


def tree_digests(root: Path) -> dict[str, str]:
    return {p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


FIXTURE_BEFORE = tree_digests(FIXTURE)      # at collection, before any test has run


def copy_of_fixture(dest: Path) -> Path:
    shutil.copytree(FIXTURE, dest)
    return dest


def lmz(store: Path, *args: str) -> subprocess.CompletedProcess:
    """`lmz --store STORE ARGS...` in a process of its own, as a user runs it (bytes out)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    env.pop("LMZ_STORE", None)
    return subprocess.run([sys.executable, "-m", "lmzfs", "--store", str(store), *args], cwd=ROOT, env=env,
                          capture_output=True, timeout=120)


def in_parallel(fn, items):
    """fn over items, a few at a time: each `lmz` process spends most of its time starting."""
    with ThreadPoolExecutor(max_workers=min(8, max(2, len(os.sched_getaffinity(0))))) as pool:
        return list(pool.map(fn, items))


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> Path:
    return copy_of_fixture(tmp_path_factory.mktemp("fixture") / "store-v1")


def test_the_fixture_holds_the_models_and_files_its_manifest_names():
    assert MANIFEST["lmzfs_commit"].startswith("05565f7")
    assert (FIXTURE / "FORMAT").read_text() == "lmzfs-store 1\n"
    assert FIXTURE_BEFORE == MANIFEST["store_files"]
    assert len(MANIFEST["models"]) == 10 and len(EXPECTED) == 22


def test_a_store_written_by_release_05565f7_reads_back_byte_for_byte_through_lmz_cat(store):
    def cat(spec: str) -> tuple[str, int, int, str, bytes]:
        r = lmz(store, "cat", spec)
        return spec, r.returncode, len(r.stdout), hashlib.sha256(r.stdout).hexdigest(), r.stderr

    for spec, rc, size, digest, stderr in in_parallel(cat, sorted(EXPECTED)):
        assert (rc, stderr) == (0, b""), f"lmz cat {spec}"
        assert (size, digest) == (EXPECTED[spec]["size"], EXPECTED[spec]["sha256"]), f"lmz cat {spec}"


def test_lmz_verify_finds_the_store_of_release_05565f7_sound(store):
    r = lmz(store, "verify")
    assert r.returncode == 0, (r.stdout + r.stderr).decode()
    assert b"22 file(s)" in r.stdout and r.stdout.rstrip().endswith(b"ok")


def test_lmz_ls_json_lists_exactly_the_models_and_files_of_the_manifest(store, capsys):
    r = lmz(store, "ls", "--json")
    assert r.returncode == 0, r.stderr.decode()
    models = {m["model"]: m for m in json.loads(r.stdout)}
    assert sorted(models) == sorted(MANIFEST["models"])
    for name, m in models.items():
        files = MANIFEST["models"][name]["files"]
        assert m["files"] == len(files)
        assert m["logical_bytes"] == sum(f["size"] for f in files.values())
    # the chains the adds made: the older checkpoint of each pair is stored as deltas
    assert {name: m["depends_on"] for name, m in models.items() if m["depends_on"]} == {
        "run/step-1": ["run/step-2"], "run/step-2": ["run/step-3"], "tiny-gguf": ["tiny-gguf-ft"]}

    for model in sorted(MANIFEST["models"]):     # `lmz ls MODEL --json`, in this process: its entry point
        capsys.readouterr()
        assert lmz_main(["--store", str(store), "ls", model, "--json"]) == 0
        listed = {f["path"]: {"size": f["size"], "sha256": f["sha256"]} for f in json.loads(capsys.readouterr().out)}
        assert listed == MANIFEST["models"][model]["files"], model


def test_the_reader_api_serves_every_file_of_the_store_of_release_05565f7_byte_for_byte(store):
    archive = Archive(store, cache_bytes=0, workers=0)     # every chunk decoded afresh
    try:
        entries = {f"{e.model}/{e.path}": e for e in archive.files()}
        assert sorted(entries) == sorted(EXPECTED)
        for spec, e in entries.items():
            assert (e.size, e.sha256) == (EXPECTED[spec]["size"], EXPECTED[spec]["sha256"]), spec
            with archive.open(e) as r:
                data = r.pread(0, e.size + 1)
            assert (len(data), hashlib.sha256(data).hexdigest()) == (e.size, EXPECTED[spec]["sha256"]), spec
    finally:
        archive.close()


def test_reads_at_odd_offsets_of_the_store_of_release_05565f7_give_the_same_bytes(store):
    """Reads that start and end inside chunks (and inside segments of segmented ones), as a mount
    serves them, through a reader with read-ahead and a small cache."""
    archive = Archive(store, cache_bytes=1 << 20, workers=2)
    try:
        for e in archive.files():
            spec = f"{e.model}/{e.path}"
            with archive.open(e) as r:
                h, pos, step = hashlib.sha256(), 0, 4093
                while pos < e.size:
                    piece = r.pread(pos, step)
                    assert piece, f"{spec}: short read at {pos}"
                    h.update(piece)
                    pos += len(piece)
                    step = 4093 if step > 60000 else step * 3
                assert r.pread(e.size, 10) == b""
            assert (pos, h.hexdigest()) == (EXPECTED[spec]["size"], EXPECTED[spec]["sha256"]), spec
    finally:
        archive.close()


@pytest.mark.parametrize("argv", [["ls"], ["cat", "tiny-llm/config.json"], ["verify"]])
def test_a_store_whose_format_says_version_2_is_refused_with_one_clear_line(tmp_path, argv):
    copy = copy_of_fixture(tmp_path / "store-v2")
    (copy / "FORMAT").write_text("lmzfs-store 2\n")
    r = lmz(copy, *argv)
    line = f"{copy}: store format version 2 is not supported (this lmzfs reads version 1)"
    assert (r.returncode, r.stdout, r.stderr.decode()) == (2, b"", f"lmz: {line}\n")
    with pytest.raises(StoreError) as exc:
        Archive(copy, workers=0)
    assert str(exc.value) == line


def test_the_committed_fixture_is_unchanged_after_the_tests():
    """Last in this file: every test above read a copy, never the committed store."""
    assert tree_digests(FIXTURE) == FIXTURE_BEFORE == MANIFEST["store_files"]
    assert sorted(p.relative_to(FIXTURE).as_posix() for p in FIXTURE.rglob("*")) == \
        ["FORMAT", "catalog.sqlite", "packs", "packs/pack-00000004.lmzp"]
