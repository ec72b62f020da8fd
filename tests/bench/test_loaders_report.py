"""The real-loaders section of the bench report (bench/report_loaders.py) shows the pyfuse3 floor
beside our mount and lmzip's, and says where even the floor misses a goal."""
from __future__ import annotations

import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))
try:
    import report_loaders
finally:    # bench/ has modules named like common ones: keep them off other tests' path
    sys.path.remove(str(BENCH))

PLAIN, OURS, LMZIP, FLOOR = "plain files", "lmzfs mount", "lmzip mount", "pyfuse3 floor"


def row(name: str, kind: str, ours: float, lmzip: float, floor: float | None) -> dict:
    seconds = {PLAIN: [0.1], OURS: [ours], LMZIP: [lmzip]}
    if floor is not None:
        seconds[FLOOR] = [floor]
    return {"name": name, "kind": kind, "model": "m", "seconds": seconds, "identical": True,
            "speedup_vs_lmzip": lmzip / ours, "times_plain": ours / 0.1,
            "floor_vs_lmzip": None if floor is None else lmzip / floor}


def section(*rows: dict, floor: bool = True) -> str:
    targets = [PLAIN, OURS, LMZIP] + ([FLOOR] if floor else [])
    return "\n".join(report_loaders.loaders_md({"runs": 1, "targets": targets, "rows": list(rows),
                                                "dropped_page_cache": True}))


def test_the_floor_has_its_own_seconds_and_ratio_columns_when_measured():
    text = section(row("q4: cold sequential read", "cold", 0.5, 0.4, 0.2))
    assert "| loader | plain s | ours s | lmzip s | floor s | × lmzip | × plain | floor × lmzip | outputs |" in text
    assert "| q4: cold sequential read | 0.10 (0.10) | 0.50 (0.50) | 0.40 (0.40) | 0.20 (0.20) | 0.80× | 5.00× | " \
           "2.00× | identical |" in text


def test_a_missed_goal_the_floor_meets_says_the_floor_meets_it():
    text = section(row("q4: cold sequential read", "cold", 0.5, 0.4, 0.2))
    assert ("cold and mmap reads ≥ 1.2× lmzip's mount: **NOT met** (lowest 0.80×, q4: cold sequential read); "
            "the pyfuse3 floor meets it on each of the 1 row(s) missed") in text


def test_a_missed_goal_the_floor_also_misses_names_the_floors_lowest_row():
    text = section(row("a: cold sequential read", "cold", 0.5, 0.4, 0.2),
                   row("b: mmap, pages touched in order", "mmap", 0.5, 0.4, 0.36))
    assert ("on 1 of the 2 row(s) missed the pyfuse3 floor itself is below it "
            "(lowest 1.11×, b: mmap, pages touched in order)") in text


def test_a_run_without_the_floor_renders_as_before():
    text = section(row("q4: cold sequential read", "cold", 0.5, 0.4, None), floor=False)
    assert "| loader | plain s | ours s | lmzip s | × lmzip | × plain | outputs |" in text
    assert "floor" not in text
