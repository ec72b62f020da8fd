"""The writable mount (issue 27): `cp` into `lmz mount --writable` against `lmz add` of the same files.

Per model (a corpus file alone in a directory), each run: `lmz add DIR --name MODEL` into a fresh
store, and `cp -r DIR/. MNT/MODEL/` into a fresh writable mount of another fresh store (after
`mkdir MNT/MODEL`), both timed as whole processes, `cp` until the mount has committed every file
(the commits follow each file's last close, which does not wait for them: the spool holds no
record), so its time includes the encoding. Stored bytes: the payload bytes of the chunks the
catalog references (what both ways wrote for the model; dead bytes `lmz gc` would reclaim are not
counted), once the idle mount has also recoded the text chunks its commits coded without zstd's
slow level (fs_text_chunks empty: docs/writable.md, "Costs"); the bytes as committed, and the
seconds that recode took, are kept beside. The bytes served back are checked against the source
on the first run.

Then, on the first run's mount: a 4 KiB write into the middle of the model's largest file (open
O_RDWR, pwrite, close, then until committed); the chunks and payload bytes it added to the
catalog, the seconds until its commit was done, and the 4 KiB read back.

The mixed tree: a corpus model, the standard library's `.py` files of the Python running the bench
(its `sysconfig` stdlib path, without site-packages; a bounded number of files) and the JSON files
found in that standard library and in the bench venv's installed packages (their data files), copied into one model of a fresh writable mount; saved %
beside zstd level 3 of each file on its own (the zstandard module, sizes summed).
"""
from __future__ import annotations

import os
import shutil
import sqlite3
import statistics
import sysconfig
import time
from dataclasses import dataclass
from pathlib import Path

import common
from common import ToolError, describe, du_bytes, files_under, link_dir, log, mounted, run, sha256_file

WRITE_SIZE = 4096
MIXED_PY_FILES = 2000               # bound on the standard library files the mixed tree takes
MIXED_JSON_BYTES = 8 << 20          # and on its JSON
ZSTD_LEVEL = 3
SIZE_GOAL = 0.01                    # cp's stored bytes within 1% of lmz add's
SPEED_GOAL = 0.5                    # cp at least half as fast as lmz add
CHUNK_GOAL = 2                      # a 4 KiB write commits at most two chunks
SPEED_GOAL_MODEL = "astra"          # the model the issue states the speed and write goals for


@dataclass(frozen=True)
class StoredChunks:
    rows: int                       # every chunk row, referenced or not
    payload_bytes: int              # of every row
    live_payload_bytes: int         # of the rows something references


def stored_chunks(store: Path) -> StoredChunks:
    db = sqlite3.connect(f"file:{store / 'catalog.sqlite'}?mode=ro", uri=True)
    try:
        rows, payload = db.execute("SELECT COUNT(*), COALESCE(SUM(length), 0) FROM chunks").fetchone()
        live, = db.execute("SELECT COALESCE(SUM(length), 0) FROM chunks WHERE refs > 0").fetchone()
    finally:
        db.close()
    return StoredChunks(rows, payload, live)


def _lmz(store: Path, *args) -> list:
    return [common.LMZFS_CLI, "--store", store, *args]


def _committed(store: Path, timeout: float = 3600.0) -> None:
    """Wait until the writable mount of `store` has committed every file: its spool holds no record."""
    deadline = time.monotonic() + timeout
    while common.spool_pending(store):
        if time.monotonic() > deadline:
            raise ToolError(f"the mount of {store} did not commit its files within {timeout:.0f} s")
        time.sleep(0.01)


def text_chunks_pending(store: Path) -> int:
    """Chunks a writable mount's commits coded without zstd's slow level and its idle recode has
    not tried it on yet: the rows of `fs_text_chunks` (docs/format.md; none before fs version 2)."""
    db = sqlite3.connect(f"file:{store / 'catalog.sqlite'}?mode=ro", uri=True)
    try:
        return db.execute("SELECT COUNT(*) FROM fs_text_chunks").fetchone()[0]
    except sqlite3.OperationalError:
        return 0
    finally:
        db.close()


def _recoded(store: Path, timeout: float = 3600.0) -> float:
    """Seconds until the mount of `store`, idle, has recoded the text chunks its commits named."""
    t0 = time.monotonic()
    while text_chunks_pending(store):
        if time.monotonic() - t0 > timeout:
            raise ToolError(f"the mount of {store} did not recode its text chunks within {timeout:.0f} s")
        time.sleep(0.05)
    return time.monotonic() - t0


def _timed(argv: list, committed: Path | None = None) -> float:
    """Seconds `argv` took, and then (`committed`: a writable mount's store) its commits."""
    t0 = time.monotonic()
    run(argv)
    if committed is not None:
        _committed(committed)
    return time.monotonic() - t0


def _writable(store: Path, mnt: Path, work: Path):
    return mounted(_lmz(store, "mount", "--writable", mnt), _lmz(store, "umount", mnt), mnt, work / "mount.log")


def _same_bytes(src: Path, served: Path) -> None:
    for f in files_under(src):
        if sha256_file(served / f.relative_to(src)) != sha256_file(f):
            raise ToolError(f"the mount served different bytes for {f.relative_to(src)}")


def _write_into_middle(store: Path, path: Path) -> dict:
    """A 4 KiB write into the middle of a stored file, through the mount: what its commit added."""
    size = path.stat().st_size
    offset = size // 2
    data = bytes(range(256)) * (WRITE_SIZE // 256)
    before = stored_chunks(store)
    t0 = time.monotonic()
    fd = os.open(path, os.O_RDWR)
    try:
        os.pwrite(fd, data, offset)
    finally:
        os.close(fd)
    _committed(store)
    seconds = time.monotonic() - t0
    after = stored_chunks(store)
    with open(path, "rb") as f:
        f.seek(offset)
        if f.read(WRITE_SIZE) != data:
            raise ToolError(f"the 4 KiB written at {offset} of {path.name} did not read back")
    return {"file": path.name, "file_bytes": size, "offset": offset, "close_s": seconds,
            "chunks_added": after.rows - before.rows, "payload_bytes_added": after.payload_bytes - before.payload_bytes}


def measure_model(name: str, src: Path, runs: int, work: Path) -> dict:
    """`lmz add` of src against `cp -r` of it into a writable mount, `runs` times, and the 4 KiB write."""
    files = files_under(src)
    row: dict = {"model": name, "files": [f.name for f in files], "logical_bytes": sum(f.stat().st_size for f in files),
                 "add_s": [], "cp_s": [], "add_stored_bytes": [], "cp_stored_bytes": []}
    for i in range(runs):
        log(f"writable: {name}, run {i + 1} of {runs}")
        common.warm_page_cache([src])
        add_store, mnt_store, mnt = work / f"add-{i}", work / f"mnt-store-{i}", work / "mnt"
        row["add_s"].append(_timed(_lmz(add_store, "add", src, "--name", name)))
        row["add_stored_bytes"].append(stored_chunks(add_store).live_payload_bytes)
        with _writable(mnt_store, mnt, work) as m:
            (m.path / name).mkdir()
            row["cp_s"].append(_timed(["cp", "-r", f"{src}/.", m.path / name], mnt_store))
            row.setdefault("cp_committed_bytes", []).append(stored_chunks(mnt_store).live_payload_bytes)
            row.setdefault("recode_s", []).append(_recoded(mnt_store))
            row["cp_stored_bytes"].append(stored_chunks(mnt_store).live_payload_bytes)
            if i == 0:
                _same_bytes(src, m.path / name)
                largest = max(files, key=lambda f: f.stat().st_size)
                row["write"] = _write_into_middle(mnt_store, m.path / name / largest.name)
        shutil.rmtree(add_store)
        shutil.rmtree(mnt_store)
    return row


def mixed_tree(model: Path, dest: Path, *, py_files: int = MIXED_PY_FILES, json_bytes: int = MIXED_JSON_BYTES) -> dict:
    """Build the mixed tree under dest (model/, stdlib/, json/); what it holds, by part."""
    link_dir(files_under(model), dest / "model")
    stdlib = Path(sysconfig.get_path("stdlib"))
    skip = {"site-packages", "dist-packages", "__pycache__"}
    sources = []
    for dirpath, dirnames, filenames in os.walk(stdlib):
        dirnames[:] = sorted(d for d in dirnames if d not in skip)
        sources += [Path(dirpath) / f for f in sorted(filenames) if f.endswith(".py")]
    for f in sources[:py_files]:
        target = dest / "stdlib" / f.relative_to(stdlib)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(f, target)
    jsons, taken = [], 0
    packages = Path(sysconfig.get_path("purelib"))           # the bench venv's: its packages' JSON data
    for f in _json_files([stdlib], skip) + _json_files([packages], {"__pycache__"}):
        if taken + f.stat().st_size > json_bytes:
            continue
        target = dest / "json" / f"{len(jsons):03d}-{f.name}"
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(f, target)
        jsons.append(f.name)
        taken += f.stat().st_size
    return {"stdlib": str(stdlib), "py_files": min(py_files, len(sources)), "json_files": len(jsons)}


def _json_files(roots: list[Path], skip: set[str]) -> list[Path]:
    """The JSON files under roots (not below directories named in skip), each once, in a stable order."""
    found: dict[Path, None] = {}
    for root in roots:
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames[:] = sorted(d for d in dirnames if d not in skip)
            for name in sorted(filenames):
                if name.endswith(".json"):
                    found.setdefault(Path(dirpath, name).resolve(), None)
    return list(found)


def zstd_per_file(root: Path, level: int = ZSTD_LEVEL) -> dict[str, int]:
    """Bytes of zstd at `level` of each file on its own, summed per part (top-level directory)."""
    import zstandard
    compressor = zstandard.ZstdCompressor(level=level)
    out: dict[str, int] = {}
    for f in files_under(root):
        part = f.relative_to(root).parts[0]
        out[part] = out.get(part, 0) + len(compressor.compress(f.read_bytes()))
    return out


def _stored_by_part(store: Path, model: str) -> dict[str, int]:
    """Payload bytes of the distinct chunks each part's files reference (a chunk two parts share counts in both)."""
    db = sqlite3.connect(f"file:{store / 'catalog.sqlite'}?mode=ro", uri=True)
    try:
        rows = db.execute("SELECT DISTINCT substr(f.path, 1, instr(f.path, '/') - 1), c.id, c.length "
                          "FROM files f JOIN models m ON m.id = f.model JOIN extents e ON e.file = f.id "
                          "JOIN chunks c ON c.id = e.chunk WHERE m.name = ?", (model,)).fetchall()
    finally:
        db.close()
    out: dict[str, int] = {}
    for part, _cid, length in rows:
        out[part] = out.get(part, 0) + length
    return out


def measure_mixed(model: Path, work: Path) -> dict:
    src = work / "mixed-src"
    row = {"model": model.name, **mixed_tree(model, src)}
    logical: dict[str, int] = {}
    counts: dict[str, int] = {}
    for f in files_under(src):
        part = f.relative_to(src).parts[0]
        logical[part] = logical.get(part, 0) + f.stat().st_size
        counts[part] = counts.get(part, 0) + 1
    row.update(logical_bytes=logical, file_counts=counts, zstd_bytes=zstd_per_file(src))
    log(f"writable: mixed tree, {sum(counts.values())} files, {sum(logical.values()):,} B")
    store, mnt = work / "mixed-store", work / "mnt"
    with _writable(store, mnt, work) as m:
        (m.path / "mixed").mkdir()
        row["cp_s"] = _timed(["cp", "-r", f"{src}/.", m.path / "mixed"], store)
        row["committed_stored_bytes"] = _stored_by_part(store, "mixed")
        row["committed_total_bytes"] = stored_chunks(store).live_payload_bytes
        row["recode_s"] = _recoded(store)
        _same_bytes(src, m.path / "mixed")
    row["stored_bytes"] = _stored_by_part(store, "mixed")
    row["stored_total_bytes"] = stored_chunks(store).live_payload_bytes
    row["store_du_bytes"] = du_bytes(store)
    shutil.rmtree(store)
    shutil.rmtree(src)
    return row


def measure(models: dict[str, Path], mixed_model: Path | None, runs: int, work: Path) -> dict:
    out: dict = {"runs": runs, "models": []}
    for name, path in models.items():
        sub = work / name
        sub.mkdir(parents=True)
        src = link_dir([path], sub / "src" / name)
        try:
            out["models"].append(measure_model(name, src, runs, sub))
        except Exception as exc:
            out["models"].append({"model": name, "error": describe(exc)})
        shutil.rmtree(sub, ignore_errors=True)
    if mixed_model is not None:
        sub = work / "mixed"
        sub.mkdir(parents=True)
        try:
            out["mixed"] = measure_mixed(mixed_model, sub)
        except Exception as exc:
            out["mixed"] = {"error": describe(exc)}
        shutil.rmtree(sub, ignore_errors=True)
    return out


# ----------------------------------------------------------------------------- the goals


@dataclass(frozen=True)
class GoalCheck:
    goal: str
    measured: str
    met: bool | None        # None: not measured


def size_ratio(row: dict) -> float | None:
    """cp's stored bytes over lmz add's (first run: both are exact and the same every run)."""
    add, cp = row.get("add_stored_bytes") or [], row.get("cp_stored_bytes") or []
    return cp[0] / add[0] if add and cp and add[0] else None


def speed_ratio(row: dict) -> float | None:
    """Median over runs of (lmz add seconds / cp seconds): cp's throughput as a fraction of add's."""
    pairs = [a / c for a, c in zip(row.get("add_s") or [], row.get("cp_s") or []) if c]
    return statistics.median(pairs) if pairs else None


def saved(stored: int, logical: int) -> float:
    return 100.0 * (1 - stored / logical) if logical else 0.0


def goals(w: dict) -> list[GoalCheck]:
    rows = [r for r in w.get("models", []) if "error" not in r]
    checks = []
    sizes = [(r["model"], size_ratio(r)) for r in rows if size_ratio(r) is not None]
    checks.append(GoalCheck(
        "`cp` of a real model into the mount stores within 1% of `lmz add`",
        ", ".join(f"{m}: {100 * (q - 1):+.3f}%" for m, q in sizes) or "not measured",
        all(abs(q - 1) <= SIZE_GOAL for _, q in sizes) if sizes else None))
    target = next((r for r in rows if r["model"] == SPEED_GOAL_MODEL), None)
    speed = speed_ratio(target) if target else None
    checks.append(GoalCheck(
        f"`cp` of {SPEED_GOAL_MODEL} into the mount ≥ {SPEED_GOAL}× the throughput of `lmz add`",
        "not measured" if speed is None else
        f"{speed:.2f}× (cp {statistics.median(target['cp_s']):.1f} s, add {statistics.median(target['add_s']):.1f} s, "
        f"median of {len(target['cp_s'])} runs)",
        None if speed is None else speed >= SPEED_GOAL))
    write = (target or {}).get("write")
    checks.append(GoalCheck(
        f"a 4 KiB write into the middle of {SPEED_GOAL_MODEL} ({(target or {}).get('logical_bytes', 0) / 1e6:.0f} MB) "
        f"commits at most {CHUNK_GOAL} chunks",
        "not measured" if not write else
        f"{write['chunks_added']} chunk(s), {write['payload_bytes_added']:,} B of new payload; committed "
        f"{write['close_s']:.2f} s after the write",
        None if not write else write["chunks_added"] <= CHUNK_GOAL))
    mixed = w.get("mixed") or {}
    if "stored_total_bytes" in mixed:
        total = sum(mixed["logical_bytes"].values())
        checks.append(GoalCheck(
            "saved % of a mixed tree (a model, Python source, JSON) reported beside zstd -3 per file",
            f"{saved(mixed['stored_total_bytes'], total):.1f}% against zstd -3's "
            f"{saved(sum(mixed['zstd_bytes'].values()), total):.1f}%", True))
    else:
        checks.append(GoalCheck("saved % of a mixed tree reported beside zstd -3 per file",
                                f"n/a: {mixed['error']}" if "error" in mixed else "not measured", None))
    return checks
