"""The bench's writable-mount section (bench/writable_table.py) judges issue 27's goals from a
run's own numbers, and report.py renders them."""
from __future__ import annotations

import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))
try:
    import report
    import writable_table
finally:    # bench/ has modules named like common ones (common, tools): keep them off other tests' path
    sys.path.remove(str(BENCH))


def section(cp_stored: int = 1_005_000, cp_s: float = 8.0, chunks_added: int = 2) -> dict:
    """Two models, two runs each: lmz add stores 1,000,000 B in 5 s; the mixed tree saves 60% (zstd: 50%)."""
    def model(name: str) -> dict:
        return {"model": name, "files": [f"{name}.safetensors"], "logical_bytes": 235_000_000,
                "add_s": [5.0, 5.0], "cp_s": [cp_s, cp_s], "add_stored_bytes": [1_000_000] * 2,
                "cp_stored_bytes": [cp_stored] * 2, "cp_committed_bytes": [cp_stored + 300] * 2, "recode_s": [0.25] * 2,
                "write": {"file": f"{name}.safetensors", "file_bytes": 235_000_000, "offset": 117_500_000,
                          "close_s": 1.5, "chunks_added": chunks_added, "payload_bytes_added": 700_000}}
    mixed = {"model": "m.safetensors", "stdlib": "/usr/lib/python3.11", "py_files": 10, "json_files": 1,
             "logical_bytes": {"model": 600, "stdlib": 300, "json": 100},
             "file_counts": {"model": 1, "stdlib": 10, "json": 1},
             "zstd_bytes": {"model": 400, "stdlib": 80, "json": 20},
             "stored_bytes": {"model": 300, "stdlib": 80, "json": 20}, "stored_total_bytes": 400, "cp_s": 2.0,
             "committed_stored_bytes": {"model": 300, "stdlib": 95, "json": 25}, "committed_total_bytes": 420,
             "recode_s": 3.5}
    return {"runs": 2, "models": [model("minilm"), model("astra")], "mixed": mixed}


def verdicts(w: dict) -> list[bool | None]:
    return [c.met for c in writable_table.goals(w)]


def test_a_run_that_meets_every_goal_is_judged_met_on_every_line():
    checks = writable_table.goals(section())
    assert [c.met for c in checks] == [True, True, True, True]
    assert checks[0].measured == "minilm: +0.500%, astra: +0.500%"
    assert checks[1].measured == "0.62× (cp 8.0 s, add 5.0 s, median of 2 runs)"
    assert checks[2].measured == "2 chunk(s), 700,000 B of new payload; committed 1.50 s after the write"
    assert checks[3].measured == "60.0% against zstd -3's 50.0%"


def test_stored_bytes_more_than_one_percent_over_lmz_add_are_not_met():
    assert verdicts(section(cp_stored=1_010_001))[0] is False
    assert verdicts(section(cp_stored=991_000))[0] is True


def test_cp_slower_than_half_of_lmz_add_and_a_write_of_three_chunks_are_not_met():
    got = verdicts(section(cp_s=10.01, chunks_added=3))
    assert got[1:3] == [False, False]
    assert verdicts(section(cp_s=10.0))[1] is True


def test_a_model_that_failed_leaves_its_goals_not_measured_and_its_row_says_why():
    w = section()
    w["models"][1] = {"model": "astra", "error": "ToolError: mount exited 2"}
    del w["mixed"]
    assert verdicts(w)[1:] == [None, None, None]
    page = "\n".join(report.writable_md(w))
    assert "| astra | n/a: ToolError: mount exited 2 |" in page


def test_the_report_renders_the_goal_table_the_model_rows_and_the_mixed_tree_total():
    page = report.writable_md(section())
    assert ("| astra | 235,000,000 | 1,000,000 | 1,005,000 | +0.500% | 1,005,300 | 0.25 (0.25) | 5.00 (5.00) "
            "| 8.00 (8.00) | 0.62 (0.62) |") in page
    assert "| astra | 235,000,000 | 117,500,000 | 2 | 700,000 | 1.50 |" in page
    assert "| **all** | 12 | 1,000 | 420 | 400 | 60.0% | 500 | 50.0% |" in page
    assert "| stdlib | 10 | 300 | 95 | 80 | 73.3% | 80 | 73.3% |" in page
    assert any("cp took 2.0 s, and the idle mount's recode of the text chunks 3.5 s more." in line for line in page)


def test_a_run_from_before_the_idle_recode_renders_its_rows_with_what_it_lacks_as_n_a():
    w = section()
    for m in w["models"]:
        del m["cp_committed_bytes"], m["recode_s"]
    for key in ("committed_stored_bytes", "committed_total_bytes", "recode_s"):
        del w["mixed"][key]
    page = report.writable_md(w)
    assert "| astra | 235,000,000 | 1,000,000 | 1,005,000 | +0.500% | n/a | n/a | 5.00 (5.00) | 8.00 (8.00) | 0.62 (0.62) |" in page
    assert "| **all** | 12 | 1,000 | n/a | 400 | 60.0% | 500 | 50.0% |" in page


def _report_everyday():
    sys.path.insert(0, str(BENCH))
    try:
        import report_everyday
    finally:
        sys.path.remove(str(BENCH))
    return report_everyday


def _everyday_side() -> dict:
    """One side's every row of the everyday section, each second (and read latency) as given."""
    return {"rsync_s": 1.0, "rsync_then_committed_s": 0.0, "small_files_s": 1.0, "small_files_then_committed_s": 0.0,
            "appends_s": 0.1, "appends_then_committed_s": 0.0, "subprocess_writes_s": 0.01,
            "subprocess_writes_then_committed_s": 0.0,
            "read_during_commit": {"reads": 10, "p50_ms": 1.0, "p99_ms": 2.0, "max_ms": 3.0}}


def test_the_everyday_section_judges_issue_47s_goals_from_its_own_numbers():
    report_everyday = _report_everyday()
    side = _everyday_side()
    mount = dict(side, rsync_s=4.0, small_files_s=6.0, appends_s=0.4, subprocess_writes_s=0.3,
                 read_during_commit={"reads": 10, "p50_ms": 1.0, "p99_ms": 25.0, "max_ms": 30.0})
    res = {"tree": "/usr/share/doc", "tree_files": 4000, "ext4": side, "mount": mount,
           "goals": {"rsync_x": 5.0, "small_files_x": 5.0, "appends_s": 0.5, "subprocess_writes_s": 0.2,
                     "read_p99_ms": 20.0, "log_space_x": 1.5},
           "log_space": {"file_bytes": 100, "pack_bytes": 140, "live_payload_bytes": 90, "catalog_bytes": 10}}
    goals = [line for line in report_everyday.everyday_md(res) if line.startswith("Issue 47's goals")][0]
    assert goals.count("**NOT met**") == 3
    assert "≤ 5× ext4: met (4.0×)" in goals and "≤ 5× ext4: **NOT met** (6.0×)" in goals
    assert "≤ 0.5 s: met (0.400 s)" in goals and "≤ 0.2 s: **NOT met** (0.300 s)" in goals
    assert "≤ 20 ms: **NOT met** (25.0 ms)" in goals and "live file bytes after 100 appends: met (1.40×)" in goals


def test_the_everyday_section_judges_many_file_rows_by_each_sides_quickest_run_beside_the_pyfuse3_floor():
    report_everyday = _report_everyday()
    side = _everyday_side()
    mount = dict(side, rsync_s=12.0, small_files_s=6.0)

    def many(ext4, mnt, floor):
        return {name: {"rsync_s": r, "rsync_then_committed_s": 0.5, "small_files_s": s,
                       "small_files_then_committed_s": 0.25} for name, (r, s) in
                (("ext4", ext4), ("mount", mnt), ("floor", floor))}
    # ext4 quick in one run only (0.5 s), slow in the others: the quickest runs are compared
    rounds = [many((0.5, 0.3), (12.0, 6.0), (4.0, 2.0)), many((4.0, 3.0), (14.0, 7.0), (5.0, 2.5)),
              many((3.0, 0.4), (10.0, 5.0), (4.5, 1.5))]
    res = {"tree": "/usr/share/doc", "tree_files": 4000, "ext4": side, "mount": mount, "rounds": rounds,
           "goals": {"rsync_x": 5.0, "small_files_x": 5.0}}
    page = report_everyday.everyday_md(res)
    assert ("| `rsync -a /usr/share/doc` (4,000 files) | 0.500 (3.000, 4.000) | 10.000 (12.000, 14.000) "
            "| 4.000 (4.500, 5.000) | 0.50 | 20.0× | 8.0× | 2.5× |") in page
    assert ("| 5,000 files of 100 bytes: create, write, close | 0.300 (0.400, 3.000) | 5.000 (6.000, 7.000) "
            "| 1.500 (2.000, 2.500) | 0.25 | 16.7× | 5.0× | 3.3× |") in page
    assert "| 20 `echo x >>` appends to a 200 MB file | 0.100 | 0.100 |  | 0.00 | 1.0× |  |  |" in page
    goals = [line for line in page if line.startswith("Issue 47's goals")][0]
    assert "≤ 5× ext4: **NOT met** (20.0×)" in goals and "≤ 5× ext4: **NOT met** (16.7×)" in goals
