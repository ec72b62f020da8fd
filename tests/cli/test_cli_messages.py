"""What `lmz` says: add's report on an empty store, progress where stderr is no terminal, doctor
on a mount that met corrupt chunks."""
from __future__ import annotations

import io
import json

from lmzfs import doctor, progress
from lmzfs.cli import main as lmz


def test_a_lone_json_file_into_an_empty_store_reports_no_deltas_and_no_chunks_already_stored(tmp_path, capsys):
    src = tmp_path / "m"
    src.mkdir()
    (src / "config.json").write_text(json.dumps({"a": 1}))
    (src / "copy.json").write_text(json.dumps({"a": 1}))
    assert lmz(["--store", str(tmp_path / "s"), "add", str(src)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("added m: 2 file(s), 16 B; new data stored ")
    assert "% saved), 1 repeated within the add, stored once, " in out
    assert "deltas" not in out and "already in the store" not in out


def test_progress_where_stderr_is_not_a_terminal_is_a_plain_line_every_few_seconds(monkeypatch):
    clock = [100.0]
    monkeypatch.setattr(progress.time, "monotonic", lambda: clock[0])
    out = io.StringIO()
    line = progress.ProgressLine("adding m", out)
    line(1 << 20, 4 << 20)
    assert out.getvalue() == ""
    clock[0] += progress.LOG_INTERVAL
    line(2 << 20, 4 << 20)
    clock[0] += 1
    line(3 << 20, 4 << 20)
    assert out.getvalue().splitlines() == ["adding m:  50.0%  2.0 MiB / 4.0 MiB  409.6 KiB/s  ETA 0:05"]
    line.finish()
    assert "\r" not in out.getvalue()


def test_doctor_counts_corrupt_chunks_a_mount_met_as_a_problem(monkeypatch, tmp_path):
    class Mount:
        mountpoint, source = tmp_path, "lmzfs"
    monkeypatch.setattr(doctor, "lmzfs_mounts", lambda: [Mount()])
    monkeypatch.setattr(doctor, "read_stats", lambda mp, timeout: (None, {"reader": {"corrupt_chunks": 3}}))
    problems: list[str] = []

    class Settings:
        mountpoint = None
    doctor.check_mounts(Settings(), problems)
    assert problems == [f"mount {tmp_path} met 3 corrupt chunk(s) (reads of them got EIO); run: lmz verify"]
