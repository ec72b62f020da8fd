"""ONNX models: initializers whose data lies in the file as their elements are tensor segments;
everything else stays header bytes; a malformed or hostile file is stored as opaque bytes."""
from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lmzfs.cli import main as lmz
from lmzfs.formats import FileLayout, FormatError, Segment, parse_file, parse_onnx, parse_open_file
from lmzfs.formats.bounds import tensor_limit
from lmzfs.formats.onnx import MAX_NAME, field_limit
from lmzfs.reader import Archive
from lmzfs.store.add import add_model
from lmzfs.store.layout import StorePaths
from lmzfs.testing.onnxfile import Initializer, external_data_model, field, onnx_bytes


def parse_bytes(raw: bytes) -> FileLayout:
    layout = parse_onnx("mem.onnx", io.BytesIO(raw), len(raw))
    layout.check_tiling()
    return layout


def tensors(layout: FileLayout) -> dict[str, Segment]:
    return {s.name: s for s in layout.segments if s.kind == "tensor"}


RNG = np.random.default_rng(7)
ARRAYS = {
    "w.f32": RNG.normal(0, 0.02, (3, 4)).astype(np.float32),
    "w.f16": RNG.normal(0, 1, 8).astype(np.float16),
    "q.i8": RNG.integers(-128, 128, (2, 3, 4)).astype(np.int8),
    "z.u8": RNG.integers(0, 256, 5).astype(np.uint8),
    "n.i64": np.arange(6, dtype=np.int64).reshape(2, 3),
}


def test_initializers_in_raw_data_are_tensor_segments_holding_exactly_their_bytes():
    raw = onnx_bytes([Initializer(n, a) for n, a in ARRAYS.items()]
                     + [Initializer("w.bf16", RNG.integers(0, 1 << 16, 4).astype(np.uint16), data_type=16)])
    layout = parse_bytes(raw)
    assert layout.format == "onnx"
    found = tensors(layout)
    assert sorted(found) == sorted([*ARRAYS, "w.bf16"])
    for name, a in ARRAYS.items():
        s = found[name]
        assert raw[s.offset:s.end] == a.tobytes()
        assert (s.shape, s.itemsize) == (a.shape, a.itemsize)
    assert [found[n].dtype for n in ("w.f32", "w.f16", "q.i8", "z.u8", "n.i64", "w.bf16")] == \
        ["F32", "F16", "I8", "U8", "I64", "BF16"]
    assert found["w.bf16"].shape == (4,)


def test_packed_float_data_is_a_tensor_and_varint_and_external_data_stay_header():
    f32 = RNG.normal(0, 1, (4, 4)).astype(np.float32)
    raw = onnx_bytes([Initializer("packed", f32, data="float"),
                      Initializer("varints", np.arange(10, dtype=np.int32), data="int32"),
                      Initializer("elsewhere", f32, data="external")])
    found = tensors(parse_bytes(raw))
    assert list(found) == ["packed"]
    assert raw[found["packed"].offset:found["packed"].end] == f32.tobytes()


def test_a_tensor_whose_bytes_disagree_with_its_dims_or_type_stays_header():
    a = np.arange(12, dtype=np.float32)
    short = Initializer("short", a, data_type=11)            # DOUBLE dims, FLOAT bytes: half as many
    unknown = Initializer("string", a, data_type=8)           # STRING has no fixed width
    raw = onnx_bytes([short, unknown, Initializer("fine", a)])
    assert list(tensors(parse_bytes(raw))) == ["fine"]


@pytest.mark.parametrize("raw, reason", [
    (onnx_bytes([Initializer("a", np.zeros(64, np.float32))])[:-40], "truncated|runs past"),
    (field(1, 8) + field(7, field(2, b"g")) + field(7, field(2, b"h")), "expected one graph, found 2"),
    (field(1, 8), "expected one graph, found 0"),
    (field(1, 8) + bytes([0x0B, 0x00]), "wire type 3"),
    (field(1, 8) + bytes([0x00, 0x00]), "field number 0"),
    (field(7, field(5, field(8, b"n" * (MAX_NAME + 1)))), f"a tensor name of {MAX_NAME + 1} bytes"),
    (field(7, b"".join(field(5, field(2, 1)) for _ in range(tensor_limit(0) + 200))), "initializers exceed"),
    (field(1, 8) + field(7, bytes([0x18, 0x01]) * field_limit(1 << 20)), "protobuf fields for"),   # tiny fields
])
def test_a_malformed_or_hostile_onnx_file_is_stored_as_opaque_bytes(tmp_path, raw, reason):
    with pytest.raises(FormatError, match=reason) as excinfo:
        parse_onnx("mem", io.BytesIO(raw), len(raw))
    p = tmp_path / "model.onnx"
    p.write_bytes(raw)
    layout = parse_file(p)
    layout.check_tiling()
    assert (layout.format, layout.error) == ("opaque", f"{p}: {excinfo.value.reason}")


def test_an_onnx_file_is_known_by_its_name(tmp_path):
    raw = onnx_bytes([Initializer("a", ARRAYS["w.f32"])])
    (tmp_path / "model.onnx").write_bytes(raw)
    (tmp_path / "model.bin").write_bytes(raw)
    assert parse_file(tmp_path / "model.onnx").format == "onnx"
    assert (parse_file(tmp_path / "model.bin").format, parse_file(tmp_path / "model.bin").error) == ("opaque", None)


def test_an_onnx_model_is_stored_smaller_than_its_bytes_as_opaque_and_reads_back_exactly(tmp_path, capsys):
    weights = [Initializer(f"layer{i}.weight", RNG.normal(0, 0.02, (256, 512)).astype(np.float32)) for i in range(3)]
    raw = onnx_bytes(weights, nodes=50)
    for name in ("typed/model.onnx", "opaque/model.bin"):
        (tmp_path / name).parent.mkdir()
        (tmp_path / name).write_bytes(raw)
    store = StorePaths(tmp_path / "store")
    add_model(store, tmp_path / "typed", "typed")
    add_model(store, tmp_path / "opaque", "opaque")
    assert lmz(["--store", str(store.root), "ls", "--json"]) == 0
    stored = {m["model"]: m["stored_bytes"] for m in json.loads(capsys.readouterr().out)}
    assert stored["typed"] < 0.97 * stored["opaque"]
    archive = Archive(store.root)
    try:
        for e in archive.files():
            with archive.open(e) as r:
                assert r.pread(0, e.size) == raw
    finally:
        archive.close()
    assert lmz(["--store", str(store.root), "ls", "typed"]) == 0
    assert "model.onnx    onnx" in capsys.readouterr().out


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_damaged_onnx_bytes_never_stop_the_parse_and_typed_tensors_stay_inside_the_file(tmp_path, data):
    raw = bytearray(onnx_bytes([Initializer(n, a) for n, a in ARRAYS.items()]))
    for _ in range(data.draw(st.integers(1, 6))):
        raw[data.draw(st.integers(0, len(raw) - 1))] = data.draw(st.integers(0, 255))
    raw = bytes(raw[:data.draw(st.integers(1, len(raw)))])
    p = tmp_path / "fuzz.onnx"
    p.write_bytes(raw)
    layout = parse_file(p)
    layout.check_tiling()
    for s in layout.segments:
        if s.kind == "tensor" and s.shape is not None:
            assert int(np.prod(s.shape, dtype=object)) * s.itemsize == s.length


def test_inspect_lists_the_initializers_it_types(tmp_path, capsys):
    p = tmp_path / "model.onnx"
    p.write_bytes(onnx_bytes([Initializer(n, a) for n, a in ARRAYS.items()]
                             + [Initializer("varints", np.arange(4, dtype=np.int32), data="int32")]))
    assert lmz(["inspect", "--json", str(p)]) == 0
    report = json.loads(capsys.readouterr().out)
    assert (report["format"], report["tensors"], report["ok"]) == ("onnx", len(ARRAYS), True)
    assert {k: v["tensors"] for k, v in report["dtypes"].items()} == {"F32": 1, "F16": 1, "I8": 1, "U8": 1, "I64": 1}


# -- external data: a model over 2 GB keeps its initializers in files beside it ------------------

def test_external_data_references_cut_the_data_file_into_its_tensors(tmp_path):
    from lmzfs.formats import external_refs
    arrays = {"w.f32": ARRAYS["w.f32"], "q.i8": ARRAYS["q.i8"], "w.f16": ARRAYS["w.f16"]}
    model, data = external_data_model([Initializer(n, a) for n, a in arrays.items()], "model.onnx_data")
    refs = external_refs("m.onnx", io.BytesIO(model), len(model))
    assert [(r.location, r.name, r.dtype, r.shape) for r in refs] == [
        ("model.onnx_data", n, d, a.shape) for (n, a), d in zip(arrays.items(), ("F32", "I8", "F16"))]
    p = tmp_path / "model.onnx_data"
    p.write_bytes(data)
    with open(p, "rb") as f:
        layout = parse_open_file(str(p), f, len(data), refs)
    layout.check_tiling()
    assert layout.format == "onnx-external-data"
    for name, a in arrays.items():
        s = tensors(layout)[name]
        assert (data[s.offset:s.end], s.dtype is not None) == (a.tobytes(), True)
    assert parse_file(p).format == "opaque"          # alone, it is plain bytes


def test_references_past_the_file_or_overlapping_are_left_out():
    from lmzfs.formats.onnx import ExternalRef, external_data_layout
    refs = [ExternalRef("d", 0, 64, "a", "F32", (16,), 4), ExternalRef("d", 32, 64, "overlaps", "F32", (16,), 4),
            ExternalRef("d", 96, 64, "past", "F32", (16,), 4), ExternalRef("d", 64, 32, "b", "I8", (32,), 1)]
    layout = external_data_layout(128, refs)
    layout.check_tiling()
    assert [(s.name, s.offset, s.length) for s in layout.segments] == [("a", 0, 64), ("b", 64, 32), (None, 96, 32)]


def test_an_add_of_a_model_with_external_data_codes_the_data_file_by_dtype(tmp_path, capsys):
    weights = [Initializer(f"layer{i}.weight", RNG.normal(0, 0.02, (256, 512)).astype(np.float32)) for i in range(3)]
    model, data = external_data_model(weights, "../escape/model.onnx_data", align=4096)   # refused: leads out
    model_ok, _ = external_data_model(weights, "sub/model.onnx_data", align=4096)
    for name, onnx in (("typed", model_ok), ("outside", model)):
        (tmp_path / name / "sub").mkdir(parents=True)
        (tmp_path / name / "model.onnx").write_bytes(onnx)
        (tmp_path / name / "sub" / "model.onnx_data").write_bytes(data)
    stored = {}
    for model_name in ("typed", "outside"):     # a store each: the same bytes would be shared
        store = StorePaths(tmp_path / f"store-{model_name}")
        add_model(store, tmp_path / model_name, model_name)
        assert lmz(["--store", str(store.root), "ls", model_name, "--json"]) == 0
        stored[model_name] = {f["path"]: (f["format"], f["stored_bytes"]) for f in json.loads(capsys.readouterr().out)}
        archive = Archive(store.root)
        try:
            for e in archive.files():
                with archive.open(e) as r:
                    assert r.pread(0, e.size) == (tmp_path / e.model / e.path).read_bytes()
        finally:
            archive.close()
    typed, opaque = stored["typed"]["sub/model.onnx_data"], stored["outside"]["sub/model.onnx_data"]
    assert (typed[0], opaque[0]) == ("onnx-external-data", "opaque")
    assert typed[1] < 0.97 * opaque[1]
