#!/usr/bin/env python3
"""Measure lmzfs against its competitors on the same real model files, in the same run.

Run it with the benchmark venv (bench/setup.sh creates it):

    bench/.venv/bin/python bench/compare.py [FILE_OR_CORPUS_NAME ...] [--runs 3] [--mount-read] [--json OUT]

For each file and each tool: stored bytes, saved % of the file's bytes (100 * (1 - stored/original)),
encode and decode MB/s (decimal MB of the ORIGINAL file per second; median and min over --runs).

  lmzfs store    /work/main/.venv/bin/lmz --store TMP add DIR --name X; stored bytes from
                 `lmz --store TMP ls --json`; the store directory's du is reported beside it
  lmzip store    lmzip's `lmz add --store TMP` (what its mount serves); stored bytes from `lmz models --json`
  lmzip archive  lmzip's `lmz compress` / `lmz decompress`, default options
  zipnn          ZipNN's Python API in this process (byte mode, streaming, as its file scripts do)
  zstd -3, -19   the zstd CLI, default threads (one)

Every measurement is file to file with the input in the page cache: CLI tools are timed as whole
processes (their start-up is included, and reported separately as startup_s in the JSON), ZipNN
as read + compress + write in this process. Archive tools are decoded to a file and checked
byte for byte (SHA-256) on the first run. Stores have no decoder besides their mount: their decode
column is filled by --mount-read, which also reads the plain file from the page cache and checks
the mounted bytes (SHA-256) on the first run.

A tool that fails (for instance an unfinished lmzfs CLI) is reported as "n/a" with its error;
the other columns are still measured.
"""
from __future__ import annotations

import argparse
import contextlib
import hashlib
import importlib.metadata
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Iterator

REPO = Path(__file__).resolve().parent.parent
LMZFS_PY = Path(os.environ.get("LMZFS_PYTHON", REPO / ".venv" / "bin" / "python"))
LMZFS_CLI = Path(os.environ.get("LMZFS_CLI", REPO / ".venv" / "bin" / "lmz"))
LMZIP_CLI = Path(sys.prefix) / "bin" / "lmz"   # lmzip's `lmz`, from the venv running this script
READ_SIZE = 1 << 20                              # sequential reads of 1 MiB
MOUNT_TIMEOUT_S = 60
COMMAND_TIMEOUT_S = 1800


class ToolError(RuntimeError):
    """A tool could not do what was asked; the message says why."""


# ----------------------------------------------------------------------------- helpers


def run(argv: list, *, timeout: float = COMMAND_TIMEOUT_S) -> str:
    """Run a command; return its stdout, or raise ToolError with the tail of its stderr."""
    argv = [str(a) for a in argv]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    except FileNotFoundError:
        raise ToolError(f"{argv[0]} not found") from None
    except subprocess.TimeoutExpired:
        raise ToolError(f"{' '.join(argv)} took more than {timeout:.0f} s") from None
    if done.returncode != 0:
        tail = (done.stderr.strip() or done.stdout.strip())[-400:]
        shown = " ".join(Path(a).name if a.startswith("/") else a for a in argv)   # paths by name only
        raise ToolError(f"`{shown}` exited {done.returncode}: {tail}")
    return done.stdout


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(READ_SIZE):
            h.update(block)
    return h.hexdigest()


def read_sequential(path: Path) -> tuple[int, float]:
    """Read a whole file front to back in 1 MiB reads; return (bytes, seconds)."""
    buf = bytearray(READ_SIZE)
    view = memoryview(buf)
    total = 0
    start = time.perf_counter()
    with open(path, "rb", buffering=0) as f:
        while n := f.readinto(view):
            total += n
    return total, time.perf_counter() - start


def du_bytes(root: Path) -> int:
    """Allocated bytes under root, like `du -s -B1`: blocks of every file and directory, hard links once."""
    seen: set[tuple[int, int]] = set()
    total = 0
    for dirpath, dirnames, filenames in os.walk(root):
        for name in [".", *dirnames, *filenames]:
            st = os.lstat(os.path.join(dirpath, name))
            if (st.st_dev, st.st_ino) not in seen:
                seen.add((st.st_dev, st.st_ino))
                total += st.st_blocks * 512
    return total


def one_file_dir(src: Path, work: Path) -> Path:
    """A directory holding only `src` (hard-linked, or copied across file systems): what `add DIR` gets."""
    d = work / "model"
    d.mkdir()
    try:
        os.link(src, d / src.name)
    except OSError:
        shutil.copyfile(src, d / src.name)
    return d


def find_served_file(mnt: Path, model: str, filename: str) -> Path:
    """The file a mount serves for `model`: MNT/<model>/<file> by convention, else found by name."""
    for candidate in (mnt / model / filename, mnt / filename):
        if candidate.is_file():
            return candidate
    for dirpath, _dirs, files in os.walk(mnt):
        if filename in files:
            return Path(dirpath) / filename
    raise ToolError(f"{filename} is not served anywhere under the mount")


def _unmount_lazily(mnt: Path) -> None:
    for helper in ("fusermount3", "fusermount"):
        if shutil.which(helper):
            subprocess.run([helper, "-u", "-z", str(mnt)], capture_output=True)
            return


@contextlib.contextmanager
def mounted(mount_argv: list, umount_argv: list, mnt: Path, log: Path) -> Iterator[float]:
    """Run a mount command, wait until MNT is a mount point, yield the seconds that took.

    Works for servers that stay in the foreground and for ones that daemonize. The exit path
    always unmounts: the tool's own umount first, then a lazy fusermount if anything is left, and
    a foreground server that does not leave by itself is terminated (only the process started here).
    """
    mnt.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    with open(log, "wb") as out:
        proc = subprocess.Popen([str(a) for a in mount_argv], stdin=subprocess.DEVNULL, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)
    try:
        while not os.path.ismount(mnt):
            rc = proc.poll()
            if rc not in (None, 0):
                raise ToolError(f"mount exited {rc}: {log.read_text(errors='replace').strip()[-400:]}")
            if time.perf_counter() - start > MOUNT_TIMEOUT_S:
                raise ToolError(f"{mnt} was not mounted after {MOUNT_TIMEOUT_S} s")
            time.sleep(0.005)
        yield time.perf_counter() - start
    finally:
        with contextlib.suppress(ToolError):
            run(umount_argv, timeout=60)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if os.path.ismount(mnt):
            _unmount_lazily(mnt)


def cli_startup_s(argv: list) -> float | None:
    """Seconds a CLI takes to print its help: the fixed cost inside each of its timed runs."""
    best = None
    for _ in range(3):
        start = time.perf_counter()
        try:
            run(argv, timeout=60)
        except ToolError:
            return None
        best = min(best or 1e9, time.perf_counter() - start)
    return best


def version_of(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


# ----------------------------------------------------------------------------- adapters


@dataclass
class Encoded:
    """What compressing one file produced."""
    stored_bytes: int
    artifact: Path                      # the archive file, or the store directory
    notes: dict = field(default_factory=dict)


@dataclass
class MountRead:
    ready_s: float                      # mount command started -> mount point live
    read_s: float                       # sequential 1 MiB reads of the whole served file


class Tool:
    """One competitor. Archive tools decompress to a file; store tools serve through a mount."""
    name: str
    kind: str                           # "archive" or "store"
    cli: list | None = None             # for the start-up measurement

    def version(self) -> str:
        raise NotImplementedError

    def prepare(self) -> None:
        """Untimed set-up before the first run (imports and the like)."""

    def compress(self, src: Path, work: Path) -> Encoded:
        raise NotImplementedError

    def decompress(self, enc: Encoded, work: Path) -> Path:
        raise NotImplementedError(f"{self.name} has no decoder besides its mount")

    def read_through_mount(self, enc: Encoded, src: Path, work: Path, verify_sha256: str | None) -> MountRead:
        raise NotImplementedError(f"{self.name} has no mount")


@dataclass
class CliArchive(Tool):
    """A command that turns a file into one archive file, and one that turns it back."""
    name: str
    encode_argv: Callable[[Path, Path], list]     # (src, archive) -> argv
    decode_argv: Callable[[Path, Path], list]     # (archive, out) -> argv
    version_fn: Callable[[], str]
    cli: list | None = None
    suffix: str = ".out"
    kind: str = "archive"

    def version(self) -> str:
        return self.version_fn()

    def compress(self, src: Path, work: Path) -> Encoded:
        archive = work / (src.name + self.suffix)
        run(self.encode_argv(src, archive))
        return Encoded(archive.stat().st_size, archive)

    def decompress(self, enc: Encoded, work: Path) -> Path:
        out = work / "decoded"
        run(self.decode_argv(enc.artifact, out))
        return out


@dataclass
class ZipNNArchive(Tool):
    """ZipNN's Python API, byte mode, streaming in 1 MiB chunks: what its zipnn_compress_file script does.

    Byte mode needs an element type. "auto" takes the dominant float type of a safetensors file,
    and float32 for anything else (on GGUF Q4_1 it beats ZipNN's default bfloat16: 3.7% vs 0.9%).
    ZipNN's compress rewrites its input buffer in place, so every run gets a fresh one.
    """
    name: str = "zipnn"
    dtype: str = "auto"
    kind: str = "archive"

    def version(self) -> str:
        return f"zipnn {version_of('zipnn')}"

    def prepare(self) -> None:
        import zipnn  # noqa: F401  (pulls in torch: seconds that belong to no run)

    def _dtype_for(self, src: Path) -> str:
        if self.dtype != "auto":
            return self.dtype
        return safetensors_float_dtype(src) or "float32"

    def compress(self, src: Path, work: Path) -> Encoded:
        from zipnn import ZipNN
        dtype = self._dtype_for(src)
        data = bytearray(src.read_bytes())
        packed = ZipNN(bytearray_dtype=dtype, is_streaming=True).compress(data)
        archive = work / (src.name + ".znn")
        archive.write_bytes(packed)
        return Encoded(archive.stat().st_size, archive, {"dtype": dtype})

    def decompress(self, enc: Encoded, work: Path) -> Path:
        from zipnn import ZipNN
        out = work / "decoded"
        out.write_bytes(ZipNN(bytearray_dtype=enc.notes["dtype"], is_streaming=True)
                        .decompress(enc.artifact.read_bytes()))
        return out


def safetensors_float_dtype(path: Path) -> str | None:
    """ZipNN's name for the float type holding most of a safetensors file's bytes, or None."""
    names = {"F32": "float32", "BF16": "bfloat16", "F16": "float16"}
    try:
        with open(path, "rb") as f:
            n = int.from_bytes(f.read(8), "little")
            if not 2 <= n <= 100 << 20:
                return None
            header = json.loads(f.read(n))
    except (OSError, ValueError):
        return None
    by_dtype: dict[str, int] = {}
    for key, t in header.items():
        if key != "__metadata__" and isinstance(t, dict) and "data_offsets" in t:
            lo, hi = t["data_offsets"]
            by_dtype[t.get("dtype", "")] = by_dtype.get(t.get("dtype", ""), 0) + hi - lo
    best = max(by_dtype, key=by_dtype.get, default=None)
    return names.get(best)


@dataclass
class CliStore(Tool):
    """A store CLI: add a model directory, read its stored size from a JSON listing, mount it.

    The argv builders take the store directory first; `stored_of` picks the model's stored
    bytes out of the parsed listing.
    """
    name: str
    add_argv: Callable[[Path, Path, str], list]     # (store, dir, model) -> argv
    list_argv: Callable[[Path], list]               # (store) -> argv printing JSON
    stored_of: Callable[[object, str, int], tuple[int, dict]]   # (listing, model, file size) -> (bytes, notes)
    mount_argv: Callable[[Path, Path], list]        # (store, mountpoint) -> argv
    umount_argv: Callable[[Path, Path], list]       # (store, mountpoint) -> argv
    version_fn: Callable[[], str]
    cli: list | None = None
    model: str = "bench-model"
    kind: str = "store"

    def version(self) -> str:
        return self.version_fn()

    def compress(self, src: Path, work: Path) -> Encoded:
        model_dir = one_file_dir(src, work)
        store = work / "store"
        run(self.add_argv(store, model_dir, self.model))
        listing = json.loads(run(self.list_argv(store)))
        stored, notes = self.stored_of(listing, self.model, src.stat().st_size)
        notes["store_du_bytes"] = du_bytes(store)
        return Encoded(stored, store, notes)

    def read_through_mount(self, enc: Encoded, src: Path, work: Path, verify_sha256: str | None) -> MountRead:
        mnt = work / "mnt"
        with mounted(self.mount_argv(enc.artifact, mnt), self.umount_argv(enc.artifact, mnt),
                     mnt, work / "mount.log") as ready_s:
            served = find_served_file(mnt, self.model, src.name)
            n, read_s = read_sequential(served)
            if n != src.stat().st_size:
                raise ToolError(f"mount served {n} bytes of {src.stat().st_size}")
            if verify_sha256 and sha256_file(served) != verify_sha256:
                raise ToolError("mount served different bytes (SHA-256 mismatch)")
        return MountRead(ready_s, read_s)


def _lmzfs_stored(listing, model: str, size: int) -> tuple[int, dict]:
    for entry in listing:
        if entry.get("model") == model:
            notes = {"reported_saved_pct": entry.get("saved_pct")}
            if entry.get("logical_bytes") != size:
                notes["logical_bytes_mismatch"] = entry.get("logical_bytes")
            return int(entry["stored_bytes"]), notes
    raise ToolError(f"`lmz ls --json` does not list {model!r}")


def _lmzip_stored(listing, model: str, size: int) -> tuple[int, dict]:
    for entry in listing:
        if entry.get("name") == model:
            notes = {}
            if entry.get("original_size") != size:
                notes["original_size_mismatch"] = entry.get("original_size")
            return int(entry["stored_size"]), notes
    raise ToolError(f"`lmz models --json` does not list {model!r}")


def _cli_version(argv: list, prefix: str = "") -> Callable[[], str]:
    """The first line of `argv`'s output, or just its first dotted version number when prefix is given."""
    def get() -> str:
        try:
            text = run(argv, timeout=60).strip()
        except ToolError as exc:
            return f"unknown ({exc})"
        m = re.search(r"v?(\d+\.\d+(?:\.\d+)?)", text)
        return f"{prefix} {m.group(1)}" if prefix and m else (text.splitlines() or ["unknown"])[0]
    return get


def lmzfs_store() -> CliStore:
    """Ours. `--store` is a global option, before the subcommand."""
    lmz = LMZFS_CLI
    return CliStore(
        name="lmzfs store",
        add_argv=lambda store, d, m: [lmz, "--store", store, "add", d, "--name", m],
        list_argv=lambda store: [lmz, "--store", store, "ls", "--json"],
        stored_of=_lmzfs_stored,
        mount_argv=lambda store, mnt: [lmz, "--store", store, "mount", mnt],
        umount_argv=lambda store, mnt: [lmz, "--store", store, "umount", mnt],
        version_fn=_cli_version([lmz, "--version"]),
        cli=[lmz, "--help"],
    )


def lmzip_store() -> CliStore:
    """lmzip's store: `--store` belongs to each subcommand; its mount stays in the foreground."""
    lmz = LMZIP_CLI
    return CliStore(
        name="lmzip store",
        add_argv=lambda store, d, m: [lmz, "add", "--store", store, "--name", m, "-q", d],
        list_argv=lambda store: [lmz, "models", "--store", store, "--json"],
        stored_of=_lmzip_stored,
        mount_argv=lambda store, mnt: [lmz, "mount", "--store", store, "-q", mnt],
        umount_argv=lambda store, mnt: [lmz, "umount", "-q", mnt],
        version_fn=lambda: f"lmzip {version_of('lmzip')}",
        cli=[lmz, "--help"],
    )


def lmzip_archive() -> CliArchive:
    lmz = LMZIP_CLI
    return CliArchive(
        name="lmzip archive",
        encode_argv=lambda src, out: [lmz, "compress", "-q", "-f", src, out],
        decode_argv=lambda arc, out: [lmz, "decompress", "-q", "-f", arc, out],
        version_fn=lambda: f"lmzip {version_of('lmzip')}",
        cli=[lmz, "--help"],
        suffix=".lmz",
    )


def zstd_cli(level: int) -> CliArchive:
    return CliArchive(
        name=f"zstd -{level}",
        encode_argv=lambda src, out: ["zstd", "-q", "-f", f"-{level}", src, "-o", out],
        decode_argv=lambda arc, out: ["zstd", "-q", "-f", "-d", arc, "-o", out],
        version_fn=_cli_version(["zstd", "--version"], "zstd"),
        cli=["zstd", "--version"],
        suffix=".zst",
    )


def all_tools() -> list[Tool]:
    return [lmzfs_store(), lmzip_store(), lmzip_archive(), ZipNNArchive(), zstd_cli(3), zstd_cli(19)]


# ----------------------------------------------------------------------------- measuring


@dataclass
class Rate:
    """MB/s over runs: the original file's bytes divided by each run's seconds."""
    seconds: list[float] = field(default_factory=list)
    mbps_median: float | None = None
    mbps_min: float | None = None

    def finish(self, nbytes: int) -> None:
        if self.seconds:
            rates = [nbytes / 1e6 / s for s in self.seconds]
            self.mbps_median, self.mbps_min = statistics.median(rates), min(rates)

    def cell(self) -> str:
        if self.mbps_median is None:
            return "—"
        fmt = lambda v: f"{v:,.1f}" if v < 10 else f"{v:,.0f}"   # noqa: E731
        return f"{fmt(self.mbps_median)} ({fmt(self.mbps_min)})"


@dataclass
class ToolResult:
    tool: str
    kind: str
    version: str
    stored_bytes: int | None = None
    saved_pct: float | None = None
    encode: Rate = field(default_factory=Rate)
    decode: Rate = field(default_factory=Rate)        # for stores: the read through a fresh mount
    mount_ready_s: list[float] = field(default_factory=list)
    lossless_checked: bool = False
    startup_s: float | None = None
    notes: dict = field(default_factory=dict)
    error: str | None = None                          # encode failed: the row is n/a
    decode_error: str | None = None


@dataclass
class FileResult:
    name: str
    path: str
    bytes: int
    sha256: str
    tools: list[ToolResult] = field(default_factory=list)
    page_cache_read: Rate | None = None


def describe(exc: BaseException) -> str:
    text = str(exc).strip().replace("\n", " ")
    return text if isinstance(exc, ToolError) else f"{type(exc).__name__}: {text}"


def measure_tool(tool: Tool, src: Path, size: int, digest: str, runs: int, mount_read: bool,
                 tmp: Path) -> ToolResult:
    res = ToolResult(tool.name, tool.kind, tool.version())
    try:
        tool.prepare()
    except Exception as exc:
        res.error = describe(exc)
        return res
    if tool.cli:
        res.startup_s = cli_startup_s(tool.cli)
    sizes = []
    for i in range(runs):
        work = Path(tempfile.mkdtemp(prefix="run-", dir=tmp))
        try:
            try:
                start = time.perf_counter()
                enc = tool.compress(src, work)
                res.encode.seconds.append(time.perf_counter() - start)
            except Exception as exc:  # fail soft: this tool is n/a, the others go on
                res.error = describe(exc)
                break
            sizes.append(enc.stored_bytes)
            res.notes.update(enc.notes)
            if res.decode_error or (tool.kind == "store" and not mount_read):
                continue
            try:
                verify = digest if i == 0 else None
                if tool.kind == "archive":
                    start = time.perf_counter()
                    out = tool.decompress(enc, work)
                    res.decode.seconds.append(time.perf_counter() - start)
                    if verify and sha256_file(out) != verify:
                        raise ToolError("decoded file differs from the original (SHA-256 mismatch)")
                else:
                    mr = tool.read_through_mount(enc, src, work, verify)
                    res.decode.seconds.append(mr.read_s)
                    res.mount_ready_s.append(mr.ready_s)
                res.lossless_checked = res.lossless_checked or verify is not None
            except Exception as exc:
                res.decode_error = describe(exc)
        finally:
            shutil.rmtree(work, ignore_errors=True)
    if sizes:
        res.stored_bytes = sizes[-1]
        res.saved_pct = 100.0 * (1 - res.stored_bytes / size)
        if len(set(sizes)) > 1:
            res.notes["stored_bytes_per_run"] = sizes
    res.encode.finish(size)
    res.decode.finish(size)
    return res


def measure_file(name: str, src: Path, tools: list[Tool], runs: int, mount_read: bool, tmp: Path,
                 log: Callable[[str], None]) -> FileResult:
    size = src.stat().st_size
    digest = sha256_file(src)             # also puts the file in the page cache
    fr = FileResult(name, str(src), size, digest)
    if mount_read:
        fr.page_cache_read = Rate()
        read_sequential(src)
        for _ in range(runs):
            fr.page_cache_read.seconds.append(read_sequential(src)[1])
        fr.page_cache_read.finish(size)
    for tool in tools:
        log(f"{name}: {tool.name} ...")
        r = measure_tool(tool, src, size, digest, runs, mount_read, tmp)
        fr.tools.append(r)
        log(f"{name}: {tool.name}: " + (f"n/a: {r.error}" if r.error else
            f"saved {r.saved_pct:.2f}%, encode {r.encode.cell()}, decode {r.decode.cell()} MB/s"
            + (f" (decode n/a: {r.decode_error})" if r.decode_error else "")))
    return fr


# ----------------------------------------------------------------------------- reporting


def note_text(r: ToolResult) -> str:
    parts = []
    if r.error:
        return f"n/a: {r.error[:200]}"
    if "store_du_bytes" in r.notes:
        parts.append(f"store dir du {r.notes['store_du_bytes']:,} B")
    if "dtype" in r.notes:
        parts.append(f"dtype {r.notes['dtype']}")
    if "stored_bytes_per_run" in r.notes:
        parts.append(f"sizes vary: {r.notes['stored_bytes_per_run']}")
    for key in ("logical_bytes_mismatch", "original_size_mismatch"):
        if key in r.notes:
            parts.append(f"{key} {r.notes[key]}")
    if r.decode_error:
        parts.append(f"decode n/a: {r.decode_error[:200]}")
    elif r.kind == "store" and r.decode.seconds:
        parts.append("decode = read through a fresh mount")
    if r.lossless_checked:
        parts.append("round trip SHA-256 ok")
    return "; ".join(parts)


def markdown(files: list[FileResult], meta: dict) -> str:
    out = [f"# lmzfs vs competitors ({meta['date']})", "",
           f"{meta['machine']}; runs per cell: {meta['runs']}. MB/s are decimal MB of the original file "
           f"per second, median (min) over runs, file to file, input in the page cache; CLI runs include "
           f"process start-up.", ""]
    busy = max(meta["loadavg_at_start"], meta["loadavg_at_end"])
    if busy > 0.5:
        out += [f"**Warning: the machine was busy (1-min load average up to {busy:.1f}), so the MB/s "
                f"columns are noisy; the byte counts are not affected.**", ""]
    for fr in files:
        out += [f"## {fr.name}: `{Path(fr.path).name}` ({fr.bytes:,} B)", "",
                "| tool | stored bytes | saved % | encode MB/s | decode MB/s | notes |",
                "|---|---:|---:|---:|---:|---|"]
        for r in fr.tools:
            if r.error:
                out.append(f"| {r.tool} | n/a | n/a | n/a | n/a | {note_text(r)} |")
            else:
                out.append(f"| {r.tool} | {r.stored_bytes:,} | {r.saved_pct:.2f} | {r.encode.cell()} | "
                           f"{r.decode.cell()} | {note_text(r)} |")
        if fr.page_cache_read is not None:
            out += ["", "Sequential read of the whole file, 1 MiB reads:", "",
                    "| reader | MB/s | mount ready (s) | notes |", "|---|---:|---:|---|",
                    f"| plain file, page cache | {fr.page_cache_read.cell()} | — | |"]
            for r in fr.tools:
                if r.kind != "store":
                    continue
                if r.error or r.decode_error:
                    out.append(f"| {r.tool} mount | n/a | n/a | {(r.error or r.decode_error)[:200]} |")
                else:
                    ready = statistics.median(r.mount_ready_s)
                    out.append(f"| {r.tool} mount (fresh) | {r.decode.cell()} | {ready:.2f} | "
                               f"{'SHA-256 ok' if r.lossless_checked else ''} |")
        out.append("")
    versions = dict.fromkeys(meta["versions"].values())      # each distinct version once, in order
    out += ["Versions: " + "; ".join(versions), ""]
    return "\n".join(out)


# ----------------------------------------------------------------------------- main


def resolve_input(arg: str) -> tuple[str, Path]:
    """A path, or a corpus name fetched through the project's own venv (lmzfs.testing.corpus)."""
    p = Path(arg)
    if p.is_file():
        return p.stem, p.resolve()
    code = "import sys; from lmzfs.testing.corpus import fetch; print(fetch(sys.argv[1]))"
    try:
        return arg, Path(run([LMZFS_PY, "-c", code, arg], timeout=3600).strip())
    except ToolError as exc:
        raise SystemExit(f"{arg}: not a file, and not a corpus name ({exc})") from None


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    return f"{cpu}, {os.cpu_count()} CPUs, Linux {platform.release()}, Python {platform.python_version()}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("files", nargs="*", default=["minilm", "smollm2"],
                    help="model files, or corpus names (default: minilm smollm2)")
    ap.add_argument("--runs", type=int, default=3, help="runs per measurement (default 3)")
    ap.add_argument("--mount-read", action="store_true",
                    help="also read each file through fresh lmzfs and lmzip mounts, and from the page cache")
    ap.add_argument("--json", type=Path, metavar="OUT", help="write every number to this JSON file")
    ap.add_argument("--out", type=Path, metavar="MD", help="also write the Markdown report to this file")
    ap.add_argument("--tools", help="comma-separated subset of: " + ", ".join(t.name for t in all_tools()))
    ap.add_argument("--zipnn-dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"])
    ap.add_argument("--tmpdir", type=Path, help="where stores, archives and mounts go (default: system temp)")
    args = ap.parse_args(argv)
    if args.runs < 1:
        ap.error("--runs must be at least 1")

    tools = all_tools()
    for t in tools:
        if isinstance(t, ZipNNArchive):
            t.dtype = args.zipnn_dtype
    if args.tools:
        wanted = [w.strip() for w in args.tools.split(",") if w.strip()]
        unknown = set(wanted) - {t.name for t in tools}
        if unknown:
            ap.error(f"unknown tools: {', '.join(sorted(unknown))}")
        tools = [t for t in tools if t.name in wanted]

    def log(msg: str) -> None:
        print(f"[compare] {msg}", file=sys.stderr, flush=True)

    inputs = [resolve_input(f) for f in args.files]
    meta = {
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "machine": machine(),
        "runs": args.runs,
        "loadavg_at_start": os.getloadavg()[0],
        "mount_read": args.mount_read,
        "versions": {t.name: t.version() for t in tools},
        "lmzfs_cli": str(LMZFS_CLI),
        "lmzip_cli": str(LMZIP_CLI),
    }
    results = []
    with tempfile.TemporaryDirectory(prefix="lmz-bench-", dir=args.tmpdir) as tmp:
        for name, path in inputs:
            results.append(measure_file(name, path, tools, args.runs, args.mount_read, Path(tmp), log))

    meta["loadavg_at_end"] = os.getloadavg()[0]
    report = markdown(results, meta)
    print(report)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(report)
        log(f"wrote {args.out}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"meta": meta, "files": [asdict(r) for r in results]}, indent=1) + "\n")
        log(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
