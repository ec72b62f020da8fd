"""damage: bit flips, zeroed 4 KiB pages, truncations and deletions of packs, the catalog, its
copies and a writable mount's spool, each on a fresh copy of the prepared store; and correlated
damage (the same page zeroed in catalog.sqlite and in its newest copy).

After each: every file through `lmz cat` (right bytes or an error), `lmz verify --repair`,
`lmz verify`, `lmz gc`, every file again. A model is lost when, after repair and gc, it does not
read back byte for byte although nothing it needs was destroyed: for damage to a pack (data no
copy holds) only a model that still read right after the damage and no longer does is lost."""
from __future__ import annotations

import os
import random
import re
from pathlib import Path
from typing import Iterator

from lmzfs.testing.catalogdamage import PAGE
from lmzfs.testing.torture import Case, Outcome
from lmzfs.testing.torture.common import fresh_copy, lmz, model_of, read_all, sha, unmount_quietly
from lmzfs.testing.torture.prepared import Prepared

KINDS = ("flip", "zero", "truncate", "delete")
TARGETS = ("pack", "catalog", "copy", "newest-copy", "correlated", "spool", "spool-meta")
WEIGHTS = (4, 4, 2, 2, 2, 1, 1)


def _pick(store: Path, target: str, rng: random.Random) -> list[Path]:
    copies = sorted(store.glob("catalog.sqlite.copy-*"))
    if target == "pack":
        return [rng.choice(sorted((store / "packs").glob("pack-*.lmzp")))]
    if target == "catalog":
        return [store / "catalog.sqlite"]
    if target == "copy":
        return [rng.choice(copies)]
    if target == "newest-copy":
        return [copies[-1]]
    if target == "correlated":
        return [store / "catalog.sqlite", copies[-1]]
    spool = sorted(p for p in (store / "spool").iterdir() if p.name != "mount.lock")
    if target == "spool-meta":      # the record and the journal (CRC-checked), not the data file
        spool = [p for p in spool if p.suffix != ".data"]
    elif target == "spool-data":
        spool = [p for p in spool if p.suffix == ".data"]
    return [rng.choice(spool)]


def apply(paths: list[Path], kind: str, rng: random.Random) -> str:
    """Damage each path the same way (the same offset in each: a correlated page); describe it."""
    size = min(p.stat().st_size for p in paths)
    if kind == "delete":
        for p in paths:
            p.unlink()
        return "deleted"
    if kind == "truncate":
        at = rng.randrange(size) if size else 0
        for p in paths:
            os.truncate(p, at)
        return f"truncated to {at}"
    if kind == "zero":
        at = rng.randrange(max(1, size // PAGE)) * PAGE
        for p in paths:
            with open(p, "r+b") as f:
                f.seek(at)
                f.write(bytes(min(PAGE, max(0, size - at))))
        return f"zeroed page {at // PAGE}"
    at, bit = rng.randrange(max(1, size)), rng.randrange(8)
    for p in paths:
        with open(p, "r+b") as f:
            f.seek(at)
            b = f.read(1)
            if b:
                f.seek(at)
                f.write(bytes([b[0] ^ (1 << bit)]))
    return f"flipped bit {bit} of byte {at}"


LOST_LINE = re.compile(r"^LOST (\S+)", re.M)


def damage_case(prep: Prepared, scratch: Path, target: str, kind: str, seed: int) -> Outcome:
    rng = random.Random(seed)
    spool = target.startswith("spool")
    store = fresh_copy(prep.spool_store if spool else prep.store, scratch / "store")
    paths = _pick(store, target, rng)
    what = apply(paths, kind, rng)
    out = Outcome(f"damage {target} {kind} seed={seed}", info={"what": f"{[p.name for p in paths]} {what}"})
    expected = dict(prep.expected)
    tbs = []
    if spool:
        out.info.update(_mount_spool(prep, store, scratch / "mnt", expected, out))
    before = read_all(store, expected)
    rep = lmz(store, "verify", "--repair")
    ver = lmz(store, "verify")
    gc = lmz(store, "gc")
    after = read_all(store, expected)
    tbs += before.tracebacks + after.tracebacks + [r.any_traceback for r in (rep, ver, gc) if r.any_traceback]
    out.wrong_bytes += len(before.wrong) + len(after.wrong)
    if tbs:
        out.traceback = tbs[0][-3000:]
    data_gone = target == "pack" or (spool and paths[0].suffix == ".data")
    by_model: dict[str, set[str]] = {}
    for key in expected:
        by_model.setdefault(model_of(key), set()).add(key)
    lost = set()
    for model, keys in by_model.items():
        if target == "pack":
            if keys <= before.right and not keys <= after.right:
                lost.add(model)
        elif not keys <= after.right:
            lost.add(model)
    named = set(LOST_LINE.findall(rep.stdout.decode(errors="replace") + rep.stderr))
    out.models_lost = len(lost)
    out.named_lost = len(lost & named)
    out.info["refused_reads"] = len(after.refused)
    out.info["repair_rc"] = rep.rc
    if lost:
        out.info["lost"] = sorted(lost)
        out.info["named"] = sorted(named)
        out.info["refused"] = dict(list(after.refused.items())[:4])
    if not data_gone and target != "pack" and ver.rc != 0:
        out.problems.append(f"verify after repair: rc={ver.rc} {ver.stderr.strip()[-300:]}")
    if gc.rc != 0 and not data_gone:
        out.problems.append(f"gc after repair: rc={gc.rc} {gc.stderr.strip()[-300:]}")
    return out


def _mount_spool(prep: Prepared, store: Path, mnt: Path, expected: dict[str, str], out: Outcome) -> dict:
    """Mount the damaged spool's store writable (it replays and commits the spooled file), read
    the spooled file through the mount, unmount. Its bytes must be the original's or an error."""
    from lmzfs.testing.mount import mounted
    model, path, digest = prep.spooled
    mnt.mkdir(parents=True, exist_ok=True)
    info = {}
    try:
        with mounted(mnt, store, "--writable", timeout=30) as fs:
            f = mnt / model / path
            try:
                got = f.read_bytes()
                if sha(got) == digest:
                    info["spooled"] = "right"
                    expected[f"{model}/{path}"] = digest
                else:
                    info["spooled"] = f"wrong ({len(got)} bytes)"
                    out.wrong_bytes += 1
            except OSError as exc:
                info["spooled"] = f"refused ({exc.strerror})"
            log = fs.log()
            if "Traceback (most recent call last)" in log:
                out.traceback = log[-3000:]
    except AssertionError as exc:
        text = str(exc)
        info["spooled"] = "mount refused"
        if "Traceback (most recent call last)" in text:
            out.traceback = text[-3000:]
    finally:
        unmount_quietly(mnt)
    return info


def cases(prep: Prepared, scratch: Path, rng: random.Random, sample: bool) -> Iterator[Case]:
    if sample:
        plan = [("pack", "flip"), ("catalog", "zero"), ("copy", "truncate"), ("correlated", "zero"),
                ("catalog", "delete"), ("newest-copy", "flip"), ("spool-meta", "flip")]
        for target, kind in plan:
            seed = rng.randrange(1 << 30)
            yield Case(f"damage {target} {kind}", lambda t=target, k=kind, s=seed: damage_case(prep, scratch, t, k, s), 120)
        return
    while True:
        target = rng.choices(TARGETS, WEIGHTS)[0]
        kind = "zero" if target == "correlated" else rng.choice(KINDS)
        seed = rng.randrange(1 << 30)
        yield Case(f"damage {target} {kind}", lambda t=target, k=kind, s=seed: damage_case(prep, scratch, t, k, s), 120)
