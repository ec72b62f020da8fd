"""Damage a store's catalog on purpose, run the commands a user would, repair, and check every
file reads back as it was: the trials behind tests/store/test_catalog_damage.py and
bench/catalog_damage.py.

Each trial works on a fresh copy of a prepared store (packs hard-linked: nothing here writes a
pack), so trials do not disturb each other.
"""
from __future__ import annotations

import contextlib
import hashlib
import io
import os
import random
import shutil
import sys
import traceback
from dataclasses import dataclass, field
from pathlib import Path

from lmzfs.store.layout import StorePaths

PAGE = 4096


@dataclass(frozen=True)
class Damage:
    kind: str        # "zero-page": PAGE zero bytes at `at` (a page start, or not); "flip-bit": one bit at `at`
    at: int
    bit: int = 0

    def describe(self) -> str:
        if self.kind == "zero-page":
            return f"zeroed 4 KiB at {self.at}" + (f" (page {self.at // PAGE})" if self.at % PAGE == 0 else " (unaligned)")
        return f"flipped bit {self.bit} of byte {self.at}"


@dataclass(frozen=True)
class CommandOutcome:
    argv: tuple[str, ...]
    rc: int
    stderr: str
    traceback: str | None       # an exception main() let escape


@dataclass
class TrialResult:
    damage: Damage
    commands: list[CommandOutcome] = field(default_factory=list)
    repair: CommandOutcome | None = None
    differing: list[str] = field(default_factory=list)     # files that did not read back as they were
    sound_after: bool = False       # a second look finds the repaired catalog sound (repair is idempotent)

    @property
    def tracebacks(self) -> list[CommandOutcome]:
        return [c for c in self.commands + [self.repair] if c is not None and
                (c.traceback is not None or "Traceback" in c.stderr)]

    @property
    def multi_line_errors(self) -> list[CommandOutcome]:
        return [c for c in self.commands if len(c.stderr.strip().splitlines()) > 1]

    @property
    def ok(self) -> bool:
        return (not self.tracebacks and not self.multi_line_errors and self.repair is not None
                and self.repair.rc == 0 and not self.differing and self.sound_after)


def damage_file(path: Path, damage: Damage) -> None:
    with open(path, "r+b") as f:
        if damage.kind == "zero-page":
            f.seek(damage.at)
            f.write(bytes(min(PAGE, max(0, path.stat().st_size - damage.at))))
        else:
            f.seek(damage.at)
            byte = f.read(1)[0]
            f.seek(damage.at)
            f.write(bytes([byte ^ (1 << damage.bit)]))


def random_damages(size: int, n: int, rng: random.Random) -> list[Damage]:
    """n damages of a file of `size` bytes: zeroed pages (page 0 and 1 among them, one
    unaligned 4 KiB run in every five) and single-bit flips, half each."""
    pages = max(1, size // PAGE)
    out = []
    for i in range(n):
        if i % 2 == 0:
            if i // 2 < 2:
                at = min(i // 2, pages - 1) * PAGE
            elif i % 10 == 4:
                at = rng.randrange(1, max(2, size - PAGE))
            else:
                at = rng.randrange(pages) * PAGE
            out.append(Damage("zero-page", at))
        else:
            out.append(Damage("flip-bit", rng.randrange(size), rng.randrange(8)))
    return out


def file_digests(store: Path) -> dict[str, str]:
    """MODEL/PATH -> SHA-256 of its bytes as the Archive reader returns them."""
    from lmzfs.testing.storedigests import served_digests
    return served_digests(StorePaths(store), cache_bytes=0)


def mounted_digests(store: Path, mountpoint: Path) -> dict[str, str]:
    """The same, read through a real mount (which is unmounted again however this ends)."""
    from lmzfs.testing.mount import mounted
    mountpoint.mkdir(parents=True, exist_ok=True)
    out = {}
    with mounted(mountpoint, store):
        for dirpath, dirnames, filenames in os.walk(mountpoint):
            dirnames[:] = [d for d in dirnames if not d.startswith(".")]
            for name in filenames:
                full = Path(dirpath) / name
                h = hashlib.sha256()
                with open(full, "rb") as f:
                    while block := f.read(1 << 22):
                        h.update(block)
                out[full.relative_to(mountpoint).as_posix()] = h.hexdigest()
    return out


def run_lmz(argv: list[str]) -> CommandOutcome:
    """`lmz ARGV` in this process, its output captured; an escaping exception is recorded."""
    from lmzfs.cli import main
    out = io.TextIOWrapper(io.BytesIO(), encoding="utf-8")
    err = io.StringIO()
    tb = None
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            rc = main(argv)
        except SystemExit as exc:
            rc = exc.code if isinstance(exc.code, int) else 1
        except BaseException:       # noqa: B036 -- what a user would see as a traceback
            tb = traceback.format_exc()
            rc = 1
    return CommandOutcome(tuple(argv), rc, err.getvalue(), tb)


def fresh_copy(prepared: Path, dest: Path) -> Path:
    """A copy of a prepared store: its catalog files copied, its packs hard-linked."""
    if dest.exists():
        shutil.rmtree(dest)
    (dest / "packs").mkdir(parents=True)
    for p in prepared.iterdir():
        if p.is_file():
            shutil.copy2(p, dest / p.name)
    for p in (prepared / "packs").iterdir():
        os.link(p, dest / "packs" / p.name)
    return dest


def run_trial(prepared: Path, work: Path, damage: Damage, expected: dict[str, str], *,
              commands: list[list[str]], mountpoint: Path | None = None) -> TrialResult:
    """Damage a fresh copy of `prepared`'s catalog, run `commands` on it (each must succeed or
    fail in one line), repair it, and compare every file's SHA-256 with `expected`."""
    store = fresh_copy(prepared, work)
    damage_file(StorePaths(store).catalog, damage)
    result = TrialResult(damage)
    for argv in commands:
        result.commands.append(run_lmz(["--store", str(store), *argv]))
    result.repair = run_lmz(["--store", str(store), "verify", "--repair"])
    try:
        got = mounted_digests(store, mountpoint) if mountpoint is not None else file_digests(store)
    except Exception as exc:        # noqa: BLE001 -- a store that cannot be read is this trial's failure
        got = {}
        result.differing.append(f"(store unreadable: {type(exc).__name__}: {exc})")
    result.differing += sorted(k for k in expected.keys() | got.keys() if expected.get(k) != got.get(k))
    from lmzfs.store.catalog.check import diagnose
    result.sound_after = diagnose(StorePaths(store)).sound
    return result


def summary_line(results: list[TrialResult]) -> str:
    ok = sum(r.ok for r in results)
    tbs = sum(bool(r.tracebacks) for r in results)
    return f"{ok} of {len(results)} trials recovered every file byte-identical; {tbs} with a traceback"


def print_failures(results: list[TrialResult], file=sys.stdout) -> None:
    for r in results:
        if r.ok:
            continue
        print(f"FAILED {r.damage.describe()}:", file=file)
        for c in r.tracebacks:
            print(f"  traceback from lmz {' '.join(c.argv[2:])}:\n{c.traceback or c.stderr}", file=file)
        for c in r.multi_line_errors:
            print(f"  lmz {' '.join(c.argv[2:])} rc={c.rc} stderr={c.stderr!r}", file=file)
        if r.repair is not None and r.repair.rc != 0:
            print(f"  repair rc={r.repair.rc} stderr={r.repair.stderr.strip()!r}", file=file)
        if r.differing:
            print(f"  differing: {', '.join(r.differing)}", file=file)
        if not r.sound_after:
            print("  the catalog is not sound after the repair", file=file)
