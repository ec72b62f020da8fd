"""LMZ_TRACE_READS: a real mount writes one line per FUSE read it answers (daemon/readtrace.py)."""
from __future__ import annotations

import mmap
from pathlib import Path

import pytest

from lmzfs.daemon.readtrace import COLUMNS
from lmzfs.store.add import add_model
from lmzfs.store.layout import StorePaths
from lmzfs.testing.mount import mounted

pytestmark = pytest.mark.mount


@pytest.fixture(scope="module")
def store(tmp_path_factory, model_dir) -> Path:
    store = tmp_path_factory.mktemp("traced") / "store"
    add_model(StorePaths(store), model_dir, "real")
    return store


def _lines(trace: Path) -> tuple[str, list[list[str]]]:
    header, *rows = trace.read_text().splitlines()
    return header, [row.split("\t") for row in rows]


def test_every_read_of_a_file_is_one_line_and_the_lines_cover_the_file(store, model_dir, tmp_path):
    trace = tmp_path / "reads.tsv"
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    want = (model_dir / "model.gguf").read_bytes()
    with mounted(mnt, store, env={"LMZ_TRACE_READS": str(trace)}):
        assert (mnt / "real" / "model.gguf").read_bytes() == want
    header, rows = _lines(trace)
    assert header == "# " + "\t".join(COLUMNS)
    assert rows and all(len(r) == len(COLUMNS) for r in rows)
    assert {r[2] for r in rows} == {"real/model.gguf"}
    covered = sorted((int(r[3]), int(r[3]) + int(r[5])) for r in rows)
    end = 0
    for start, stop in covered:
        assert start <= end          # no hole between the answered ranges
        end = max(end, stop)
    assert end == len(want)
    assert all(int(r[5]) <= int(r[4]) for r in rows)
    assert {r[7] for r in rows} <= {"inline", "thread"}
    assert sum(int(r[8]) for r in rows) > 0          # a fresh mount decodes what it serves
    assert all(float(r[0]) >= 0 and int(r[6]) >= 0 for r in rows)


def test_mmap_touches_are_traced_and_a_second_mount_appends_to_the_same_file(store, model_dir, tmp_path):
    trace = tmp_path / "reads.tsv"
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    want = (model_dir / "model.safetensors").read_bytes()
    for _ in range(2):
        with mounted(mnt, store, env={"LMZ_TRACE_READS": str(trace)}):
            with open(mnt / "real" / "model.safetensors", "rb") as f, \
                    mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ) as m:
                page = len(want) // 2 // mmap.PAGESIZE * mmap.PAGESIZE
                assert m[page:page + 100] == want[page:page + 100]
    text = trace.read_text().splitlines()
    assert sum(line.startswith("# ") for line in text) == 2
    rows = [line.split("\t") for line in text if not line.startswith("# ")]
    assert any(int(r[3]) <= page < int(r[3]) + int(r[5]) for r in rows)

