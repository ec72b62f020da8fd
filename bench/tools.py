"""The tools the bench compares, behind one interface: archives (a file in, an archive out, and back)
and stores (a model directory added, served back through a mount).

| tool           | what runs |
|----------------|-----------|
| lmzfs store    | ours: `lmz --store S add DIR --name M` (every codec); bytes from `lmz ls --json`; `lmz mount` |
| lmzfs store --fast | the same with `add --fast` (zstd and byte grouping only; n/a if `add` lacks it) |
| lmzfs pack     | ours: `lmz pack FILE OUT` / `lmz unpack --max-output-bytes N OUT FILE` (n/a if the CLI lacks it) |
| lmzip store    | lmzip's `lmz add --store S` (what its mount serves); bytes from `lmz models --json` |
| lmzip archive  | lmzip's `lmz compress` / `lmz decompress`, default options (a directory is one archive) |
| zipnn          | ZipNN's Python API in-process, byte mode, 1 MiB streaming chunks |
| zstd -3, -19   | the zstd CLI, one thread |

A subject with several files (the quire release chain) is one model for a store and one archive for
lmzip's compress (both may share bytes across files); a per-file archiver compresses each file on its
own and the chain costs the sum.
"""
from __future__ import annotations

import contextlib
import json
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

import common
from common import (LMZIP_CLI, Mount, ToolError, cli_version, du_bytes, help_text, link_dir,
                    mounted, read_sequential, run, sha256_file, version_of, warm_page_cache)


@dataclass
class Subject:
    """What one row of the compression table is about: one file, or a chain of releases."""
    name: str
    files: list[Path]
    note: str = ""

    @property
    def nbytes(self) -> int:
        return sum(f.stat().st_size for f in self.files)


@dataclass
class Encoded:
    stored_bytes: int
    artifact: Path                   # the archive(s) directory, or the store directory
    notes: dict = field(default_factory=dict)


class Tool:
    name: str
    kind: str                        # "archive" or "store"
    ours: bool = False

    def version(self) -> str:
        raise NotImplementedError

    def unavailable(self) -> str | None:
        """Why this tool cannot run here (checked once before any run), or None."""
        return None

    def prepare(self) -> None:
        """Untimed set-up before the first run (imports and the like)."""

    def startup_argv(self) -> list | None:
        """A command whose run time is the tool's fixed start-up cost, or None (in-process tools)."""
        return None

    def encode(self, subject: Subject, work: Path) -> Encoded:
        raise NotImplementedError

    def decode(self, enc: Encoded, subject: Subject, work: Path) -> list[Path]:
        """Decoded files, in subject order (archives only)."""
        raise NotImplementedError(f"{self.name} has no decoder besides its mount")


# ----------------------------------------------------------------------------- archives


class PerFileArchive(Tool):
    """An archiver that takes one file at a time; a subject of several files costs the sum."""
    kind = "archive"
    suffix = ".out"

    def encode_file(self, src: Path, out: Path) -> dict:
        raise NotImplementedError

    def decode_file(self, archive: Path, out: Path, size: int, notes: dict) -> None:
        raise NotImplementedError

    def encode(self, subject: Subject, work: Path) -> Encoded:
        d = work / "enc"
        d.mkdir()
        notes: dict = {}
        total = 0
        for i, src in enumerate(subject.files):
            out = d / f"{i}-{src.name}{self.suffix}"
            notes.update(self.encode_file(src, out))
            total += out.stat().st_size
        if len(subject.files) > 1:
            notes["per_file"] = True
        return Encoded(total, d, notes)

    def decode(self, enc: Encoded, subject: Subject, work: Path) -> list[Path]:
        d = work / "dec"
        d.mkdir()
        outs = []
        for i, src in enumerate(subject.files):
            out = d / src.name
            self.decode_file(enc.artifact / f"{i}-{src.name}{self.suffix}", out, src.stat().st_size, enc.notes)
            outs.append(out)
        return outs


@dataclass
class CliArchive(PerFileArchive):
    """A command that turns a file into one archive file, and one that turns it back.

    With `directory_input`, a subject of several files is handed over as one directory (one archive)."""
    name: str
    encode_argv: Callable[[Path, Path], list]          # (src, archive) -> argv
    decode_argv: Callable[[Path, Path, int], list]     # (archive, out, original size) -> argv
    version_fn: Callable[[], str]
    help_argv: list
    suffix: str = ".out"
    directory_input: bool = False
    ours: bool = False
    needs_subcommand: str = ""                          # n/a when `help_argv` fails: "lmz pack" is missing

    def version(self) -> str:
        return self.version_fn()

    def unavailable(self) -> str | None:
        if self.needs_subcommand and help_text(self.help_argv[:-1]) is None:
            return f"`{self.needs_subcommand}` does not exist in this CLI yet"
        return None

    def startup_argv(self) -> list:
        return self.help_argv

    def encode_file(self, src: Path, out: Path) -> dict:
        run(self.encode_argv(src, out))
        return {}

    def decode_file(self, archive: Path, out: Path, size: int, notes: dict) -> None:
        run(self.decode_argv(archive, out, size))

    def encode(self, subject: Subject, work: Path) -> Encoded:
        if not (self.directory_input and len(subject.files) > 1):
            return super().encode(subject, work)
        src = link_dir(subject.files, work / subject.name.replace(" ", "-"))
        out = work / (src.name + self.suffix)
        run(self.encode_argv(src, out))
        return Encoded(out.stat().st_size, out, {"one_archive": True})

    def decode(self, enc: Encoded, subject: Subject, work: Path) -> list[Path]:
        if not enc.notes.get("one_archive"):
            return super().decode(enc, subject, work)
        out = work / "dec"
        run(self.decode_argv(enc.artifact, out, subject.nbytes))
        return [out / f.name for f in subject.files]


@dataclass
class ZipNNArchive(PerFileArchive):
    """ZipNN's Python API, byte mode, streaming in 1 MiB chunks: what its zipnn_compress_file script does.

    Byte mode needs an element type. "auto" takes the dominant float type of a safetensors file,
    and float32 for anything else (on GGUF Q4_1 it beats ZipNN's default bfloat16: 3.7% vs 0.9%).
    ZipNN's compress rewrites its input buffer in place, so every run gets a fresh one.
    """
    name: str = "zipnn"
    dtype: str = "auto"
    suffix: str = ".znn"

    def version(self) -> str:
        return f"zipnn {version_of('zipnn')}"

    def prepare(self) -> None:
        import zipnn  # noqa: F401  (pulls in torch: seconds that belong to no run)

    def encode_file(self, src: Path, out: Path) -> dict:
        from zipnn import ZipNN
        dtype = self.dtype if self.dtype != "auto" else (safetensors_float_dtype(src) or "float32")
        data = bytearray(src.read_bytes())
        out.write_bytes(ZipNN(bytearray_dtype=dtype, is_streaming=True).compress(data))
        return {f"dtype:{src.name}": dtype}

    def decode_file(self, archive: Path, out: Path, size: int, notes: dict) -> None:
        from zipnn import ZipNN
        dtype = notes[f"dtype:{out.name}"]
        out.write_bytes(ZipNN(bytearray_dtype=dtype, is_streaming=True).decompress(archive.read_bytes()))


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


# ----------------------------------------------------------------------------- stores


@dataclass
class CliStore(Tool):
    """A store CLI: add a model directory, read its stored size from a JSON listing, mount it.

    The argv builders take the store directory first; `stored_of` picks the model's stored
    bytes out of the parsed listing.
    """
    name: str
    add_argv: Callable[[Path, Path, str], list]                  # (store, dir, model) -> argv
    list_argv: Callable[[Path], list]                            # (store) -> argv printing JSON
    stored_of: Callable[[object, str, int], tuple[int, dict]]    # (listing, model, bytes) -> (stored, notes)
    mount_argv: Callable[[Path, Path, list], list]               # (store, mountpoint, extra) -> argv
    umount_argv: Callable[[Path, Path], list]                    # (store, mountpoint) -> argv
    version_fn: Callable[[], str]
    help_argv: list
    ours: bool = False
    files_argv: Callable[[Path, str], list] | None = None       # (store, model) -> argv: per-file charges as JSON
    add_options: list[str] = field(default_factory=list)        # options of `add` this row depends on
    add_help_argv: list | None = None                            # the add subcommand, for `--help`
    # options of `add` that store a model standalone, coded against no other model of the store
    # (lmzfs pairs checkpoints across models; a store without cross-model deltas needs none)
    standalone_options: list[str] = field(default_factory=list)
    model: str = "bench-model"
    kind: str = "store"

    def version(self) -> str:
        return self.version_fn()

    def unavailable(self) -> str | None:
        if self.add_options and self.add_help_argv:
            text = help_text(self.add_help_argv) or ""
            missing = [o for o in self.add_options if o not in text]
            if missing:
                return f"`add {' '.join(missing)}` does not exist in this CLI"
        return None

    def startup_argv(self) -> list:
        return self.help_argv

    def add(self, store: Path, files: list[Path], model: str, work: Path, *, standalone: bool = False) -> None:
        """Add `files` as `model`; `standalone`: neither it nor a stored model is delta-coded
        against the other (what a table that reads one model as if stored alone needs)."""
        src = Path(tempfile.mkdtemp(prefix="src-", dir=work)) / model.replace("/", "_")
        argv = self.add_argv(store, link_dir(files, src), model)
        if standalone and self.standalone_options:
            at = argv.index("add") + 1
            argv = [*argv[:at], *self.standalone_options, *argv[at:]]
        run(argv)

    def encode(self, subject: Subject, work: Path) -> Encoded:
        store = work / "store"
        self.add(store, subject.files, self.model, work)
        listing = json.loads(run(self.list_argv(store)))
        stored, notes = self.stored_of(listing, self.model, subject.nbytes)
        notes["store_du_bytes"] = du_bytes(store)
        if self.files_argv and len(subject.files) > 1:
            # what each file adds, in order: the later releases cost only their new chunks
            notes["charged_per_file"] = {f["path"]: f["stored_bytes"]
                                         for f in json.loads(run(self.files_argv(store, self.model)))}
        return Encoded(stored, store, notes)

    @contextlib.contextmanager
    def mount(self, store: Path, mnt: Path, logfile: Path, extra: list | None = None) -> Iterator[Mount]:
        """A fresh mount of `store` at `mnt`; always unmounted on exit."""
        with mounted(self.mount_argv(store, mnt, list(extra or [])), self.umount_argv(store, mnt), mnt, logfile) as m:
            yield m

    @staticmethod
    def served(mnt: Path, model: str, filename: str) -> Path:
        p = mnt / model / filename
        if not p.is_file():
            raise ToolError(f"{model}/{filename} is not served under the mount")
        return p

    def read_through_mount(self, enc: Encoded, subject: Subject, work: Path, verify: bool) -> tuple[float, float]:
        """(mount ready s, seconds to read every file of the subject) on a fresh mount, store files
        in the page cache; with `verify`, each served file's SHA-256 is checked afterwards."""
        warm_page_cache([enc.artifact])
        with self.mount(enc.artifact, work / "mnt", work / "mount.log") as m:
            total_s = 0.0
            for src in subject.files:
                served = self.served(m.path, self.model, src.name)
                n, s = read_sequential(served)
                if n != src.stat().st_size:
                    raise ToolError(f"mount served {n} bytes of {src.stat().st_size}")
                total_s += s
            if verify:
                for src in subject.files:
                    if sha256_file(self.served(m.path, self.model, src.name)) != sha256_file(src):
                        raise ToolError(f"mount served different bytes for {src.name} (SHA-256 mismatch)")
            return m.ready_s, total_s


def _lmzfs_stored(listing, model: str, size: int) -> tuple[int, dict]:
    for entry in listing:
        if entry.get("model") == model:
            notes = {}
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


def lmzfs_store(*add_options: str) -> CliStore:
    """Ours. `--store` is a global option, before the subcommand; `lmz mount` daemonizes.
    `add_options` (e.g. "--fast") go to `lmz add`; the row is n/a when `lmz add --help` lacks them."""
    lmz = common.LMZFS_CLI
    return CliStore(
        name=" ".join(["lmzfs store", *add_options]), ours=True, add_options=list(add_options),
        add_argv=lambda store, d, m: [lmz, "--store", store, "add", *add_options, d, "--name", m],
        list_argv=lambda store: [lmz, "--store", store, "ls", "--json"],
        stored_of=_lmzfs_stored,
        mount_argv=lambda store, mnt, extra: [lmz, "--store", store, "mount", mnt, *extra],
        umount_argv=lambda store, mnt: [lmz, "--store", store, "umount", mnt],
        version_fn=cli_version([lmz, "--version"]),
        help_argv=[lmz, "--help"],
        files_argv=lambda store, m: [lmz, "--store", store, "ls", m, "--json"],
        add_help_argv=[lmz, "add"],
        standalone_options=["--no-delta"],
    )


def lmzip_store() -> CliStore:
    """lmzip's store: `--store` belongs to each subcommand; its mount stays in the foreground."""
    lmz = LMZIP_CLI
    return CliStore(
        name="lmzip store",
        add_argv=lambda store, d, m: [lmz, "add", "--store", store, "--name", m, "-q", d],
        list_argv=lambda store: [lmz, "models", "--store", store, "--json"],
        stored_of=_lmzip_stored,
        mount_argv=lambda store, mnt, extra: [lmz, "mount", "--store", store, "-q", *extra, mnt],
        umount_argv=lambda store, mnt: [lmz, "umount", "-q", mnt],
        version_fn=lambda: f"lmzip {version_of('lmzip')}",
        help_argv=[lmz, "--help"],
    )


def lmzfs_pack() -> CliArchive:
    """Ours, single-file archives: `lmz pack` / `lmz unpack` (reported n/a while the CLI lacks them)."""
    lmz = common.LMZFS_CLI
    return CliArchive(
        name="lmzfs pack", ours=True, needs_subcommand="lmz pack",
        encode_argv=lambda src, out: [lmz, "pack", src, out],
        decode_argv=lambda arc, out, size: [lmz, "unpack", "--max-output-bytes", str(size), arc, out],
        version_fn=cli_version([lmz, "--version"]),
        help_argv=[lmz, "pack", "--help"],
        suffix=".lmzf",
    )


def lmzip_archive() -> CliArchive:
    lmz = LMZIP_CLI
    return CliArchive(
        name="lmzip archive", directory_input=True,
        encode_argv=lambda src, out: [lmz, "compress", "-q", "-f", src, out],
        decode_argv=lambda arc, out, size: [lmz, "decompress", "-q", "-f", arc, out],
        version_fn=lambda: f"lmzip {version_of('lmzip')}",
        help_argv=[lmz, "--help"],
        suffix=".lmz",
    )


def zstd_cli(level: int) -> CliArchive:
    return CliArchive(
        name=f"zstd -{level}",
        encode_argv=lambda src, out: ["zstd", "-q", "-f", f"-{level}", src, "-o", out],
        decode_argv=lambda arc, out, size: ["zstd", "-q", "-f", "-d", arc, "-o", out],
        version_fn=cli_version(["zstd", "--version"], "zstd"),
        help_argv=["zstd", "--version"],
        suffix=".zst",
    )


def all_tools() -> list[Tool]:
    """Every row of the compression table (ours first). Build them after common.LMZFS_CLI is final."""
    return [lmzfs_store(), lmzfs_store("--fast"), lmzfs_pack(), lmzip_archive(), lmzip_store(), ZipNNArchive(),
            zstd_cli(3), zstd_cli(19)]
