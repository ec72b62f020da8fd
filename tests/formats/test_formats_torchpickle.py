"""PyTorch zip checkpoints: each storage gets the dtype data.pkl names for it, read from the
pickle's opcodes (never run), so its bytes are coded as that dtype."""
from __future__ import annotations

import io
import json
import pickletools
import struct
import zipfile
from pathlib import Path

import numpy as np
import pytest

from lmzfs.cli import main as lmz
from lmzfs.formats import parse_file
from lmzfs.formats.torchpickle import storage_dtypes
from lmzfs.store.add import add_model
from lmzfs.store.layout import StorePaths


def text(s: str) -> bytes:
    b = s.encode()
    return b"X" + struct.pack("<I", len(b)) + b                 # BINUNICODE


def binput(i: int) -> bytes:
    return b"q" + bytes([i])


def state_dict_pickle(storages: list[tuple[str, str, int]], *, stack_global: bool = False) -> bytes:
    """{name: _rebuild_tensor_v2((storage pid), 0, (numel,), (1,), False, OrderedDict())} as
    torch.save writes it (protocol 2, each storage class memoized at first use and fetched with
    BINGET after), or with protocol 4's STACK_GLOBAL for the classes."""
    out = bytearray(b"\x80\x04" if stack_global else b"\x80\x02")
    out += b"}" + binput(0) + b"("              # EMPTY_DICT, MARK
    memo: dict[str, int] = {}
    for key, cls, numel in storages:
        if cls in memo:
            klass = b"h" + bytes([memo[cls]])
        else:
            memo[cls] = len(memo) + 1
            klass = ((b"\x8c\x05torch" + b"\x8c" + bytes([len(cls)]) + cls.encode() + b"\x93") if stack_global
                     else b"ctorch\n" + cls.encode() + b"\n") + binput(memo[cls])
        pid = b"(" + text("storage") + klass + text(key) + text("cpu") + b"J" + struct.pack("<i", numel) + b"tQ"
        out += (text(f"w{key}") + b"ctorch._utils\n_rebuild_tensor_v2\n" + b"(" + pid + b"K\x00"
                + b"J" + struct.pack("<i", numel) + b"\x85" + b"K\x01\x85" + b"\x89" + b"}" + b"tR")
    out += b"u."                                 # SETITEMS, STOP
    return bytes(out)


STORAGES = [("0", "FloatStorage", 64), ("1", "LongStorage", 8), ("2", "BFloat16Storage", 32),
            ("3", "FloatStorage", 16), ("4", "CharStorage", 5)]


@pytest.mark.parametrize("stack_global", [False, True])
def test_each_storage_key_gets_the_dtype_of_its_storage_class(stack_global):
    raw = state_dict_pickle(STORAGES, stack_global=stack_global)
    pickletools.dis(raw, out=io.StringIO())       # well formed; nothing is run
    assert storage_dtypes(raw) == {"0": ("F32", 4), "1": ("I64", 8), "2": ("BF16", 2), "3": ("F32", 4),
                                   "4": ("I8", 1)}


def test_a_pickle_cut_short_yields_the_storages_before_the_cut_and_foreign_classes_none():
    raw = state_dict_pickle(STORAGES)
    cut = raw.index(text("w2"))
    assert storage_dtypes(raw[:cut]) == {"0": ("F32", 4), "1": ("I64", 8)}
    assert storage_dtypes(raw.replace(b"ctorch\nLongStorage\n", b"cnumpy\nLongStorage\n")) == {
        "0": ("F32", 4), "2": ("BF16", 2), "3": ("F32", 4), "4": ("I8", 1)}
    assert storage_dtypes(b"not a pickle at all") == {}


def torch_zip(path: Path, storages: list[tuple[str, str, np.ndarray]], *, pickle: bytes | None = None,
              compress_pickle: bool = False) -> Path:
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as z:
        z.writestr("archive/data.pkl", pickle if pickle is not None else
                   state_dict_pickle([(k, cls, a.size) for k, cls, a in storages]),
                   compress_type=zipfile.ZIP_DEFLATED if compress_pickle else zipfile.ZIP_STORED)
        z.writestr("archive/byteorder", b"little")
        for key, _, a in storages:
            z.writestr(f"archive/data/{key}", a.tobytes())
        z.writestr("archive/version", b"3\n")
    return path


RNG = np.random.default_rng(11)


def test_storage_entries_get_their_dtype_and_entries_of_a_foreign_length_do_not(tmp_path):
    storages = [("0", "FloatStorage", RNG.normal(0, 1, 64).astype(np.float32)),
                ("1", "LongStorage", np.arange(8, dtype=np.int64)),
                ("2", "BFloat16Storage", RNG.integers(0, 1 << 16, 33).astype(np.uint16).view(np.uint8)[:65])]
    layout = parse_file(torch_zip(tmp_path / "m.pt", storages))
    layout.check_tiling()
    typed = {s.name: (s.dtype, s.itemsize) for s in layout.segments if s.kind == "tensor"}
    assert typed == {"archive/data/0": ("F32", 4), "archive/data/1": ("I64", 8),
                     "archive/data/2": (None, 0)}       # 65 bytes: not whole BF16 elements
    deflated = parse_file(torch_zip(tmp_path / "d.pt", storages, compress_pickle=True))
    assert {s.dtype for s in deflated.segments if s.kind == "tensor"} == {None}


def test_a_checkpoint_whose_pickle_names_dtypes_stores_smaller_and_reads_back_exactly(tmp_path, capsys):
    storages = [(str(i), "FloatStorage", RNG.normal(0, 0.02, 256 * 512).astype(np.float32)) for i in range(3)]
    (tmp_path / "typed").mkdir()
    (tmp_path / "untyped").mkdir()
    torch_zip(tmp_path / "typed" / "pytorch_model.bin", storages)
    torch_zip(tmp_path / "untyped" / "pytorch_model.bin", storages, pickle=b"\x80\x02}q\x00.")
    stored = {}
    for name in ("typed", "untyped"):
        store = StorePaths(tmp_path / f"store-{name}")
        add_model(store, tmp_path / name, name)
        assert lmz(["--store", str(store.root), "ls", "--json"]) == 0
        stored[name] = json.loads(capsys.readouterr().out)[0]["stored_bytes"]
        assert lmz(["--store", str(store.root), "verify"]) == 0
        assert capsys.readouterr().out.endswith("decoded and checked: ok\n")
    assert stored["typed"] < 0.97 * stored["untyped"]
