"""A writable mount codes the text chunks its commits coded quickly again once it is idle
(lmzfs/fsmodel/recodetext.py), through a real FUSE mount: killed inside that recode at each of
its pack session's points, it loses nothing and the next mount finishes the work."""
from __future__ import annotations

from pathlib import Path

import pytest

from lmzfs.admin.verify import verify_store
from lmzfs.store.layout import StorePaths
from lmzfs.testing.mount import mounted, wait_committed, wait_for
from lmzfs.testing.synthetic import live_payload_bytes, log_text, payload_sizes

TEXT = log_text(3000)


def test_a_text_file_written_through_the_mount_is_stored_as_lmz_add_stores_it_once_the_mount_is_idle(tmp_path):
    quick, smallest = payload_sizes(TEXT)
    assert smallest < quick
    store, mnt = tmp_path / "store", tmp_path / "mnt"
    mnt.mkdir()
    with mounted(mnt, store, "--writable") as m:
        (mnt / "logs").mkdir()
        (mnt / "logs" / "train.log").write_bytes(TEXT)
        wait_committed(store)
        wait_for(lambda: live_payload_bytes(store) == smallest, 60, "the idle recode")
        assert (mnt / "logs" / "train.log").read_bytes() == TEXT
        assert "Traceback" not in m.log()
    assert verify_store(StorePaths(store)).ok


# The file's commit runs the mount's first pack session (one chunk: append:1); the recode runs
# the second.
@pytest.mark.parametrize("point", ["append:2", "session-sealed:2", "session-commit:2", "session-committed:2"])
def test_kill_9_inside_the_idle_recode_keeps_the_file_whole_and_the_next_mount_finishes_it(tmp_path, point):
    quick, smallest = payload_sizes(TEXT)
    store, mnt = tmp_path / "store", tmp_path / "mnt"
    mnt.mkdir()
    with mounted(mnt, store, "--writable", env={"LMZ_KILL_AT": point}) as m:
        (mnt / "logs").mkdir()
        (mnt / "logs" / "train.log").write_bytes(TEXT)
        wait_for(lambda: "HERE" in m.log(), 60, f"the recode reaching {point}")
        m.process.kill()
        m.process.wait()
    assert verify_store(StorePaths(store)).ok
    after_kill = live_payload_bytes(store)
    assert after_kill == (smallest if point == "session-committed:2" else quick)
    with mounted(mnt, store, "--writable") as m:
        assert (mnt / "logs" / "train.log").read_bytes() == TEXT
        wait_for(lambda: live_payload_bytes(store) == smallest, 60, "the next mount's recode")
        assert "Traceback" not in m.log()
    assert verify_store(StorePaths(store)).ok
    _read_back(tmp_path, store)


def _read_back(tmp_path: Path, store: Path) -> None:
    mnt = tmp_path / "ro"
    mnt.mkdir()
    with mounted(mnt, store):
        assert (mnt / "logs" / "train.log").read_bytes() == TEXT
