"""Hostile input and access (issue 29): races during add, headers that would exhaust memory and
time, a store other users could read, pickles and zip members inspect must flag, names that
would rewrite the terminal."""
from __future__ import annotations

import io
import os
import pickle
import stat
import struct
import threading
import zipfile
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file

from lmzfs.cli import main as lmz
from lmzfs.formats import parse_file
from lmzfs.formats.bounds import MAX_TENSORS, SMALL_TENSOR
from lmzfs.reader import Archive
from lmzfs.store.add import add_model
from lmzfs.store.catalog import Catalog
from lmzfs.store.layout import StoreError, StorePaths
from lmzfs.testing.hostile import many_tensor_gguf, many_tensor_safetensors, within_bounds


def model_names(store: StorePaths) -> list[str]:
    if not store.catalog.exists():
        return []
    cat = Catalog(store.catalog, readonly=True)
    try:
        return [m.name for m in cat.models()]
    finally:
        cat.close()


def all_pack_bytes(store: StorePaths) -> bytes:
    return b"".join(p.read_bytes() for p in sorted(store.packs.glob("pack-*.lmzp")))


def two_file_source(tmp_path: Path) -> Path:
    """a.bin spans several chunks, so that the add is still running when b.bin is swapped."""
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.bin").write_bytes(np.random.default_rng(1).bytes(3 << 20))
    (src / "b.bin").write_bytes(b"the real b.bin\n" * 1000)
    return src


def swap_during_add(store: StorePaths, src: Path, swap) -> BaseException | None:
    """Run add_model on src, calling swap() at its first progress report; the exception it raised."""
    swapped = []

    def progress(done: int, total: int) -> None:
        if not swapped:
            swapped.append(True)
            swap()

    try:
        add_model(store, src, "m", progress=progress, fast=True)
    except BaseException as exc:       # noqa: BLE001 - the test inspects what came out
        return exc
    return None


def last_line(text: str) -> str:
    lines = text.strip().splitlines()
    assert len(lines) == 1, f"expected one line, got {lines!r}"
    return lines[0]


# -- races during add ---------------------------------------------------------------------------

def test_a_file_swapped_for_a_symlink_during_add_is_refused_and_nothing_outside_is_stored(tmp_path):
    secret = tmp_path / "secret"
    secret_bytes = np.random.default_rng(7).bytes(200_000)
    secret.write_bytes(secret_bytes)
    secret.chmod(0o600)
    src = two_file_source(tmp_path)
    store = StorePaths(tmp_path / "store")

    def swap():
        (src / "b.bin").unlink()
        (src / "b.bin").symlink_to(secret)

    exc = swap_during_add(store, src, swap)
    assert isinstance(exc, StoreError)
    assert str(exc) == f"{src}/b.bin was replaced by a symlink while being added; refused, nothing was added"
    assert model_names(store) == []
    assert secret_bytes[:4096] not in all_pack_bytes(store)


def test_a_file_cut_short_during_add_is_one_line_and_adds_nothing(tmp_path):
    src = two_file_source(tmp_path)
    store = StorePaths(tmp_path / "store")

    def cut():
        os.truncate(src / "a.bin", 1 << 20)       # under an mmap this killed the add with SIGBUS

    exc = swap_during_add(store, src, cut)
    assert isinstance(exc, StoreError)
    assert str(exc) == f"{src}/a.bin was cut short while being added; nothing was added, try again when it is stable"
    assert model_names(store) == []
    assert all_pack_bytes(store) == b""       # what the add had appended is cut, its new pack gone


def test_a_file_swapped_for_a_fifo_during_add_is_refused_without_hanging(tmp_path):
    src = two_file_source(tmp_path)
    store = StorePaths(tmp_path / "store")

    def swap():
        (src / "b.bin").unlink()
        os.mkfifo(src / "b.bin")

    outcome: list[BaseException | None] = []
    worker = threading.Thread(target=lambda: outcome.append(swap_during_add(store, src, swap)), daemon=True)
    worker.start()
    worker.join(60)
    if worker.is_alive():      # unblock a hung open() so the thread ends, then fail
        os.close(os.open(src / "b.bin", os.O_WRONLY | os.O_NONBLOCK))
        pytest.fail("lmz add hung on a FIFO")
    assert str(outcome[0]) == (f"{src}/b.bin was replaced by a fifo while being added; refused, "
                               f"nothing was added")
    assert model_names(store) == []


def test_a_file_replaced_by_another_regular_file_during_add_is_refused(tmp_path):
    src = two_file_source(tmp_path)
    store = StorePaths(tmp_path / "store")

    def swap():
        (src / "b.bin.new").write_bytes(b"other bytes")
        os.replace(src / "b.bin.new", src / "b.bin")

    exc = swap_during_add(store, src, swap)
    assert str(exc) == f"{src}/b.bin changed while being added; nothing was added, try again when it is stable"
    assert model_names(store) == []
    assert all_pack_bytes(store) == b""


def test_a_directory_swapped_for_a_symlink_during_add_is_refused(tmp_path):
    src = two_file_source(tmp_path)
    (src / "sub").mkdir()
    (src / "sub" / "c.bin").write_bytes(b"c" * 100)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "c.bin").write_bytes(b"outside the source")
    store = StorePaths(tmp_path / "store")

    def swap():
        (src / "sub" / "c.bin").unlink()
        (src / "sub").rmdir()
        (src / "sub").symlink_to(elsewhere)

    exc = swap_during_add(store, src, swap)
    assert str(exc) == f"{src}/sub/c.bin was replaced by a symlink while being added; refused, nothing was added"
    assert model_names(store) == []


def test_a_symlink_loop_in_the_source_is_a_one_line_error(tmp_path, capsys):
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.bin").write_bytes(b"a")
    (src / "loop").symlink_to(src / "loop")
    assert lmz(["--store", str(tmp_path / "store"), "add", str(src)]) == 2
    err = capsys.readouterr().err
    assert last_line(err) == f"lmz: {src}/loop is a symlink to {src}/loop: a symlink loop"


def test_a_dangling_symlink_in_the_source_is_a_one_line_error(tmp_path, capsys):
    src = tmp_path / "src"
    src.mkdir()
    (src / "gone").symlink_to(src / "nowhere")
    assert lmz(["--store", str(tmp_path / "store"), "add", str(src)]) == 2
    assert last_line(capsys.readouterr().err) == (f"lmz: {src}/gone is a symlink to {src}/nowhere: "
                                                  f"a dangling symlink (its target does not exist)")


# -- headers that claim too much ----------------------------------------------------------------

def parse_within(path: Path, seconds: float, peak_bytes: int):
    with within_bounds("parsing", seconds=seconds, peak_bytes=peak_bytes):
        return parse_file(path)


def test_a_safetensors_of_300k_one_byte_tensors_is_stored_opaque_within_bounds(tmp_path, capsys):
    src = tmp_path / "src"
    src.mkdir()
    f = many_tensor_safetensors(src / "model.safetensors", 300_000)
    layout = parse_within(f, seconds=10, peak_bytes=f.stat().st_size * 4)
    limit = 1024 + 300_000 // 64
    assert (layout.format, layout.segments[0].kind) == ("opaque", "opaque")
    assert layout.error == (f"{f}: 299999 tensor entries exceed the limit of {limit} for 300000 bytes of "
                            f"payload (one per 64 bytes, at most {MAX_TENSORS})")
    store = tmp_path / "store"
    assert lmz(["--store", str(store), "add", "--fast", str(src)]) == 0
    out = capsys.readouterr()
    assert out.err.splitlines()[0] == f"lmz: warning: {layout.error.replace(str(f), f'{src}/model.safetensors')}; " \
                                      f"stored as opaque bytes"
    archive = Archive(store)
    try:
        (entry,) = archive.files()
        with archive.open(entry) as r:
            assert r.pread(0, entry.size) == f.read_bytes()
    finally:
        archive.close()


def test_a_gguf_of_60k_zero_dim_tensors_is_stored_opaque_once_its_data_section_is_known(tmp_path):
    # the whole file (3.84 MB) would allow 61024 tensors; its data section (1.92 MB) allows 31024
    f = many_tensor_gguf(tmp_path / "model.gguf", 60_000, name_bytes=8)
    layout = parse_within(f, seconds=10, peak_bytes=64 << 20)
    assert layout.format == "opaque"
    assert layout.error == (f"{f}: 60000 tensors exceed the limit of 31024 for 1920000 bytes of payload "
                            f"(one per 64 bytes, at most {MAX_TENSORS})")


def test_a_gguf_claiming_more_tensors_than_the_cap_is_refused_before_reading_them(tmp_path):
    f = many_tensor_gguf(tmp_path / "model.gguf", MAX_TENSORS + 1, name_bytes=8, elements=16)
    layout = parse_within(f, seconds=2, peak_bytes=4 << 20)
    assert layout.error == (f"{f}: {MAX_TENSORS + 1} tensors exceed the limit of {MAX_TENSORS} for "
                            f"{f.stat().st_size} bytes of payload (one per 64 bytes, at most {MAX_TENSORS})")


def test_a_safetensors_header_of_a_million_commas_is_refused_before_json_builds_it(tmp_path):
    header = b'{"t":{"dtype":"U8","shape":[' + b"1," * 1_000_000 + b'1],"data_offsets":[0,1]}}'
    f = tmp_path / "model.safetensors"
    f.write_bytes(struct.pack("<Q", len(header)) + header + b"x")
    layout = parse_within(f, seconds=5, peak_bytes=len(header) * 8)
    assert layout.error == f"{f}: header holds 1000003 JSON values, more than the 20480 its 1-byte data area allows"


def test_braces_and_commas_inside_strings_do_not_count_against_the_bounds(tmp_path):
    meta = {"notes": "{,}" * 200_000 + '\\"{'}
    arr = np.arange(1 << 16, dtype=np.float32)
    save_file({"w": arr}, str(tmp_path / "m.safetensors"), metadata=meta)
    layout = parse_file(tmp_path / "m.safetensors")
    assert layout.error is None and [s.name for s in layout.segments if s.kind == "tensor"] == ["w"]


def test_runs_of_small_tensors_become_one_segment_of_their_dtype_and_read_back_exactly(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    tensors = {f"bias{i:04d}": np.full(64, i, dtype=np.float32) for i in range(3000)}
    tensors["big"] = np.arange(SMALL_TENSOR, dtype=np.float32)
    tensors["ids"] = np.arange(10, dtype=np.int64)
    save_file(tensors, str(src / "model.safetensors"))
    layout = parse_file(src / "model.safetensors")
    shape = [(s.kind, s.name, s.dtype, s.length) for s in layout.segments]
    # save_file orders by dtype size, then name: ids, the biases, big
    assert shape[1:] == [("tensor", "ids", "I64", 80), ("tensor", None, "F32", 3000 * 256),
                         ("tensor", "big", "F32", 4 * SMALL_TENSOR)]
    store = StorePaths(tmp_path / "store")
    add_model(store, src, "m")
    archive = Archive(store.root)
    try:
        (entry,) = archive.files()
        with archive.open(entry) as r:
            assert r.pread(0, entry.size) == (src / "model.safetensors").read_bytes()
    finally:
        archive.close()


# -- the store's permissions --------------------------------------------------------------------

def test_a_new_store_is_0700_and_its_files_0600(tmp_path):
    src = two_file_source(tmp_path)
    store = StorePaths(tmp_path / "store")
    add_model(store, src, "m", fast=True)
    modes = {p.relative_to(store.root).as_posix(): stat.S_IMODE(p.stat().st_mode)
             for p in [store.root, *store.root.rglob("*")]}
    assert modes.pop(".") == 0o700 and modes.pop("packs") == 0o700
    assert set(modes) >= {"FORMAT", "catalog.sqlite", "lock", "packs/pack-00000001.lmzp"}
    assert any(name.startswith("catalog.sqlite.copy-") for name in modes)      # the catalog's copy too
    assert {name: mode for name, mode in modes.items() if mode != 0o600} == {}


def test_doctor_reports_a_store_other_users_can_read(tmp_path, capsys, monkeypatch):
    src = two_file_source(tmp_path)
    store = StorePaths(tmp_path / "store")
    add_model(store, src, "m", fast=True)
    store.root.chmod(0o755)
    store.catalog.chmod(0o644)
    monkeypatch.setenv("LMZ_STORE", str(store.root))
    lmz(["doctor"])
    problems = [line for line in capsys.readouterr().out.splitlines() if line.startswith("problem: store")]
    assert problems == [f"problem: store {store.root} is open to other users (drwxr-xr-x; 2 path(s) with group or "
                        f"other permissions): they can read packs and the catalog directly, though the mount "
                        f"refuses them; fix with: chmod -R go= {store.root}"]


# -- inspect: raw pickles, zip members ----------------------------------------------------------

class _CallsSystem:
    def __reduce__(self):
        return (os.system, ("true",))


def inspect_out(capsys, path: Path) -> tuple[int, str]:
    status = lmz(["inspect", str(path)])
    return status, capsys.readouterr().out


@pytest.mark.parametrize("protocol", [0, 2, 5])
def test_a_raw_pickle_whose_reduce_calls_os_system_is_flagged(tmp_path, capsys, protocol):
    f = tmp_path / "pytorch_model.bin"
    f.write_bytes(pickle.dumps({"w": [1.0, 2.0], "x": _CallsSystem()}, protocol=protocol))
    status, out = inspect_out(capsys, f)
    assert status == 1
    assert "  SUSPICIOUS: pytorch_model.bin imports posix.system; unpickling this file would import it" in out


def test_every_pickle_of_a_legacy_torch_file_is_scanned_and_its_storages_are_not(tmp_path, capsys):
    buf = io.BytesIO()
    for obj in (0x1950A86A20F9469CFC6C, 1001, {"protocol_version": 1001}, {"w": ("storage", 0)}, ["0"]):
        pickle.dump(obj, buf, protocol=2)
    clean = buf.getvalue() + struct.pack("<Q", 4) + np.float32([1, 2, 3, 4]).tobytes()
    (tmp_path / "clean.bin").write_bytes(clean)
    status, out = inspect_out(capsys, tmp_path / "clean.bin")
    assert status == 0 and "SUSPICIOUS" not in out and "scan stopped" not in out
    hostile = clean.replace(pickle.dumps({"protocol_version": 1001}, protocol=2),
                            pickle.dumps({"protocol_version": _CallsSystem()}, protocol=2))
    (tmp_path / "hostile.bin").write_bytes(hostile)
    status, out = inspect_out(capsys, tmp_path / "hostile.bin")
    assert status == 1 and "  SUSPICIOUS: hostile.bin imports posix.system" in out


def test_a_file_named_like_a_pickle_that_is_not_one_is_not_reported_as_a_pickle(tmp_path, capsys):
    (tmp_path / "weights.bin").write_bytes(np.random.default_rng(3).bytes(10_000))
    status, out = inspect_out(capsys, tmp_path / "weights.bin")
    assert status == 0 and "pickle" not in out


@pytest.mark.parametrize("member", ["../../.bashrc", "/etc/cron.d/x", "archive\\..\\x", "C:/x"])
def test_a_zip_member_that_climbs_out_is_flagged(tmp_path, capsys, member):
    f = tmp_path / "model.pt"
    with zipfile.ZipFile(f, "w") as z:
        z.writestr("archive/data.pkl", pickle.dumps({"w": 1}, protocol=2))
        z.writestr(member, b"payload")
    status, out = inspect_out(capsys, f)
    assert status == 1
    assert f"  UNSAFE: zip member {member!r} is absolute or climbs out" in out


def test_a_deflated_pickle_entry_whose_stream_is_damaged_is_named_unreadable_not_a_traceback(tmp_path, capsys):
    # found by make torture: zipfile let zlib.error out of a damaged deflate stream
    f = tmp_path / "model.pt"
    payload = pickle.dumps({"w": list(range(2000))}, protocol=2)
    with zipfile.ZipFile(f, "w", compression=zipfile.ZIP_DEFLATED) as z:
        z.writestr("archive/data.pkl", payload)
    data = bytearray(f.read_bytes())
    with zipfile.ZipFile(f) as z:
        info = z.getinfo("archive/data.pkl")
    start = info.header_offset + 30 + len(info.filename.encode()) + len(info.extra)
    data[start:start + 8] = b"\xff" * 8            # block type 3: no deflate stream has it
    f.write_bytes(bytes(data))
    status, out = inspect_out(capsys, f)
    assert "Traceback" not in out
    assert "cannot read the entry: Error -3 while decompressing data" in out


def test_inspect_of_a_fifo_is_refused_without_hanging(tmp_path, capsys):
    os.mkfifo(tmp_path / "fifo")
    assert lmz(["inspect", str(tmp_path / "fifo")]) == 2
    assert last_line(capsys.readouterr().err) == f"lmz: {tmp_path}/fifo: not a regular file (fifo, socket or device)"


# -- names and the terminal ---------------------------------------------------------------------

@pytest.mark.parametrize("char", ["\u202e", "\u2066", "\u0085", "\u2028", "\x1b", "\x9b"])
def test_a_model_name_with_a_line_or_bidi_control_is_refused_in_one_line(tmp_path, capsys, char):
    src = two_file_source(tmp_path)
    assert lmz(["--store", str(tmp_path / "store"), "add", "--name", f"good{char}evil", str(src)]) == 2
    escaped = f"\\x{ord(char):02x}" if ord(char) < 0x100 else f"\\u{ord(char):04x}"
    assert last_line(capsys.readouterr().err) == (f"lmz: model name 'good{escaped}evil' contains the control "
                                                  f"character {escaped}; use plain letters, digits and punctuation")
    assert not (tmp_path / "store").exists()


def test_an_esc_in_a_file_name_is_escaped_in_lmz_ls(tmp_path, capsys):
    src = tmp_path / "src"
    src.mkdir()
    (src / "red\x1b[31mtext\n.bin").write_bytes(b"x" * 100)
    store = str(tmp_path / "store")
    assert lmz(["--store", store, "add", "--fast", "--name", "m", str(src)]) == 0
    capsys.readouterr()
    assert lmz(["--store", store, "ls", "m"]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out
    assert out.splitlines()[1].startswith("red\\x1b[31mtext\\x0a.bin  opaque")


def test_a_file_name_that_is_not_utf8_is_refused_in_one_line_before_anything_is_written(tmp_path, capsys):
    src = tmp_path / "src"
    src.mkdir()
    with open(os.fsencode(src) + b"/\xff\x1b.bin", "wb") as f:
        f.write(b"x")
    assert lmz(["--store", str(tmp_path / "store"), "add", str(src)]) == 2
    assert last_line(capsys.readouterr().err) == ("lmz: file name '\\xff\\x1b.bin' is not valid UTF-8; rename it "
                                                  "(e.g. with convmv) and add again")
    assert not (tmp_path / "store").exists()
