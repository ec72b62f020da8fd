"""Generated safetensors and GGUF headers, honest and hostile, through `lmz add` and `lmz inspect`:
every one is stored and read back exactly (as its container, or as opaque bytes), inspected
without an exception, and within the time and size bounds of lmzfs.formats.bounds.

A short sample runs by default; LMZ_FUZZ_EXAMPLES=10000 runs that many examples of each format
(README: "Tests").
"""
from __future__ import annotations

import itertools
import json
import os
import random
import struct
import tempfile
import time
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lmzfs.formats import parse_file
from lmzfs.formats.bounds import segment_limit
from lmzfs.inspect import inspect_file
from lmzfs.reader import Archive
from lmzfs.store.add import add_model
from lmzfs.store.layout import StorePaths
from lmzfs.testing.hostile import many_tensor_gguf, many_tensor_safetensors

EXAMPLES = int(os.environ.get("LMZ_FUZZ_EXAMPLES", "100"))
SECONDS_PER_FILE = 10.0
FUZZ = settings(max_examples=EXAMPLES, deadline=None, derandomize="LMZ_FUZZ_EXAMPLES" not in os.environ,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

# -- safetensors ----------------------------------------------------------------------------------

def payload(draw, size: int) -> bytes:
    """``size`` bytes of tensor data from one drawn seed: drawing them byte by byte is most of
    what generating an example would cost, and their values do not steer the parsers."""
    return random.Random(draw(st.integers(0, 2 ** 32))).randbytes(size)


DTYPES = ["F32", "F16", "BF16", "I64", "U8", "BOOL", "F8_E4M3", "F4", "f32", "", "X" * 40]
ints = st.one_of(st.integers(0, 300), st.integers(-5, 5), st.integers(0, 2 ** 64 + 5),
                 st.booleans(), st.floats(allow_nan=False), st.none(), st.text(max_size=3))


@st.composite
def safetensors_files(draw) -> bytes:
    n = draw(st.integers(0, 12))
    data = bytearray()
    header: dict = {}
    hostile = draw(st.integers(0, 2)) == 0          # a third of the files lie somewhere
    if draw(st.booleans()):
        values = st.one_of(st.text(max_size=20), ints) if hostile else st.text(max_size=20)
        header["__metadata__"] = draw(st.dictionaries(st.text(max_size=8), values, max_size=4))
    for i in range(n):
        dtype = draw(st.sampled_from(DTYPES if hostile else DTYPES[:8]))
        honest = not hostile or draw(st.integers(0, 3)) > 0
        if honest:
            shape = draw(st.lists(st.integers(0, 40), max_size=3))
            size = {"F32": 4, "F16": 2, "BF16": 2, "I64": 8, "F4": 0}.get(dtype, 1)
            for d in shape:
                size *= d
            offs = [len(data), len(data) + size]
            data += payload(draw, size)
        else:
            shape = draw(st.one_of(st.lists(ints, max_size=4), ints))
            offs = draw(st.one_of(st.lists(ints, max_size=3), ints))
        name = draw(st.one_of(st.just(f"t{i}"), st.text(max_size=12))) if hostile else f"t{i}\x1b\u202e{i}"
        entry = {"dtype": dtype, "shape": shape, "data_offsets": offs}
        if hostile and draw(st.integers(0, 9)) == 0:
            entry = draw(st.one_of(ints, st.lists(ints, max_size=2)))
        header[name] = entry
    text = json.dumps(header).encode()
    if hostile and draw(st.integers(0, 9)) == 0 and len(header) > 1:   # a duplicate key
        text = text[:-1] + b", " + text[1:text.index(b",")] + b"}" if b"," in text else text
    cut = draw(st.integers(0, 15)) if hostile else 15
    if cut == 0:
        text = text[:draw(st.integers(0, len(text)))]
    length = len(text)
    if cut == 1:
        length = draw(st.integers(0, 2 ** 64 - 1))
    tail = bytes(data) + draw(st.binary(max_size=64)) * draw(st.integers(0, 1))
    return struct.pack("<Q", length) + text + tail


# -- GGUF -------------------------------------------------------------------------------------

def gguf_string(raw: bytes, honest: bool, lie: int) -> bytes:
    return struct.pack("<Q", len(raw) if honest else lie) + raw


@st.composite
def gguf_values(draw, depth: int = 0) -> tuple[int, bytes]:
    vtype = draw(st.integers(0, 13))
    if vtype in (0, 1, 7):
        return vtype, draw(st.binary(min_size=1, max_size=1))
    if vtype in (2, 3):
        return vtype, draw(st.binary(min_size=2, max_size=2))
    if vtype in (4, 5, 6):
        return vtype, draw(st.binary(min_size=4, max_size=4))
    if vtype in (10, 11, 12):
        return vtype, draw(st.binary(min_size=8, max_size=8))
    if vtype == 8:
        return vtype, gguf_string(draw(st.binary(max_size=10)), draw(st.booleans()), draw(st.integers(0, 2 ** 64 - 1)))
    if vtype == 9 and depth < 3:
        etype, _ = draw(gguf_values(depth + 1))
        items = [draw(gguf_values(depth + 1)) for _ in range(draw(st.integers(0, 4)))]
        body = b"".join(v for t, v in items if t == etype)
        count = sum(1 for t, _ in items if t == etype)
        if draw(st.integers(0, 5)) == 0:
            count = draw(st.integers(0, 2 ** 64 - 1))
        return vtype, struct.pack("<IQ", etype, count) + body
    return vtype, draw(st.binary(max_size=8))


GGML_BLOCKS = {0: 1, 1: 1, 30: 1, 24: 1, 2: 32, 8: 32, 12: 256}   # ids the generator picks, elements per block
GGML_BYTES = {0: 4, 1: 2, 30: 2, 24: 1, 2: 18, 8: 34, 12: 144}


@st.composite
def gguf_files(draw) -> bytes:
    hostile = draw(st.integers(0, 2)) == 0          # a third of the files lie somewhere
    lie = (lambda: draw(st.integers(0, 5)) == 0) if hostile else (lambda: False)
    version = draw(st.sampled_from([3, 2, 1, 4, 0x03000000])) if lie() else 3
    alignment = 32
    kvs = []
    if draw(st.booleans()):
        alignment = draw(st.sampled_from([0, 3, 1 << 30])) if lie() else draw(st.sampled_from([8, 32, 64]))
        kvs.append(gguf_string(b"general.alignment", True, 0) + struct.pack("<I", 4) + struct.pack("<I", alignment))
    for i in range(draw(st.integers(0, 4))):
        vtype, value = draw(gguf_values()) if hostile else (8, gguf_string(f"value {i}".encode(), True, 0))
        key = draw(st.binary(max_size=12)) if lie() else f"k{i}.\x1b[2J".encode()
        kvs.append(gguf_string(key, True, 0) + struct.pack("<I", vtype) + value)
    n = draw(st.integers(0, 8))
    infos, offset = [], 0
    for i in range(n):
        ggml = draw(st.sampled_from([4, 99, 12])) if lie() else draw(st.sampled_from(sorted(GGML_BLOCKS)))
        block = GGML_BLOCKS.get(ggml, 1)
        dims = [block * draw(st.integers(0 if lie() else 1, 8))] + draw(st.lists(st.integers(1, 8), max_size=2))
        if lie():
            dims = draw(st.lists(st.integers(0, 2 ** 64 - 1), max_size=draw(st.sampled_from([2, 9]))))
        off = draw(st.integers(0, 2 ** 64 - 1)) if lie() else offset
        name = draw(st.binary(max_size=8)) if lie() else f"blk.{i}.\u2028w".encode()
        infos.append(gguf_string(name, True, 0) + struct.pack("<I", len(dims))
                     + b"".join(struct.pack("<Q", d) for d in dims) + struct.pack("<IQ", ggml, off))
        elements = 1
        for d in dims:
            elements *= d
        nbytes = elements // block * GGML_BYTES.get(ggml, 1)
        offset += -(-min(nbytes, 1 << 16) // max(alignment, 1)) * max(alignment, 1)
    tensor_count = draw(st.integers(0, 2 ** 64 - 1)) if lie() else n
    kv_count = draw(st.integers(0, 2 ** 64 - 1)) if lie() else len(kvs)
    head = b"GGUF" + struct.pack("<IQQ", version, tensor_count, kv_count) + b"".join(kvs) + b"".join(infos)
    head += bytes(-len(head) % max(alignment if alignment in (8, 32, 64) else 32, 1))
    data = draw(st.binary(max_size=256)) if lie() else payload(draw, min(offset, 1 << 17))
    raw = head + data
    if lie():
        raw = raw[:draw(st.integers(0, len(raw)))]
    return raw


# -- the check --------------------------------------------------------------------------------

class Workbench:
    """A store and a counter of model names for the examples of a test; a fresh store every
    MODELS_PER_STORE models, so that listing the store stays cheap over a long run."""

    MODELS_PER_STORE = 200

    def __init__(self) -> None:
        self._dir = tempfile.TemporaryDirectory(prefix="lmz-fuzz-")
        self.root = Path(self._dir.name)
        self.names = itertools.count()

    @property
    def store(self) -> StorePaths:
        return StorePaths(self.root / f"store-{self.serial // self.MODELS_PER_STORE}")

    def close(self) -> None:
        self._dir.cleanup()

    def check(self, raw: bytes, filename: str) -> None:
        self.check_file(lambda path: path.write_bytes(raw), filename)

    def check_file(self, write, filename: str) -> None:
        self.serial = next(self.names)
        name = f"m{self.serial}"
        src = self.root / name
        src.mkdir()
        write(src / filename)
        raw = (src / filename).read_bytes()
        t0 = time.perf_counter()
        result = add_model(self.store, src, name, fast=True, workers=1)
        added = time.perf_counter() - t0
        assert added < SECONDS_PER_FILE, f"adding {len(raw)} bytes took {added:.1f} s"
        assert result.logical_bytes == len(raw)
        layout = parse_file(src / filename)
        assert len(layout.segments) <= segment_limit(len(raw))
        archive = Archive(self.store.root, cache_bytes=4 << 20)
        try:
            (entry,) = [e for e in archive.files() if e.model == name]
            with archive.open(entry) as r:
                assert r.pread(0, entry.size) == raw
        finally:
            archive.close()
        t0 = time.perf_counter()
        report = inspect_file(src / filename, sample_bytes=64 << 10, workers=1)
        inspected = time.perf_counter() - t0
        assert inspected < SECONDS_PER_FILE, f"inspecting {len(raw)} bytes took {inspected:.1f} s"
        assert report.size == len(raw) and report.format == layout.format
        assert "\n" not in "".join(report.human_lines())
        json.dumps(report.to_json())
        for p in src.iterdir():
            p.unlink()
        src.rmdir()


@given(st.data())
@FUZZ
def test_generated_safetensors_headers_add_read_back_and_inspect_within_bounds(data):
    bench = _bench("safetensors")
    bench.check(data.draw(safetensors_files()), "model.safetensors")


@given(st.data())
@FUZZ
def test_generated_gguf_headers_add_read_back_and_inspect_within_bounds(data):
    bench = _bench("gguf")
    bench.check(data.draw(gguf_files()), "model.gguf")


@given(st.sampled_from(["safetensors", "gguf"]), st.integers(0, 12_000), st.sampled_from([1, 16]))
@settings(FUZZ, max_examples=max(10, EXAMPLES // 10))
def test_generated_tensor_counts_past_and_within_the_bounds_add_and_inspect_within_bounds(kind, count, unit):
    if kind == "safetensors":
        _bench("counts").check_file(lambda p: many_tensor_safetensors(p, count, tensor_bytes=unit), "m.safetensors")
    else:
        _bench("counts").check_file(lambda p: many_tensor_gguf(p, count, name_bytes=8, elements=unit), "m.gguf")


_BENCHES: dict[str, Workbench] = {}


def _bench(kind: str) -> Workbench:
    if kind not in _BENCHES:
        _BENCHES[kind] = Workbench()
    return _BENCHES[kind]


def teardown_module() -> None:
    for bench in _BENCHES.values():
        bench.close()
    _BENCHES.clear()
