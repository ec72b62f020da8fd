"""Container parsers: real and synthetic files tile exactly; hostile headers fall back to opaque."""
from __future__ import annotations

import io
import json
import struct
import zipfile
import zlib
from pathlib import Path

import gguf
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from safetensors import safe_open
from safetensors.numpy import save_file

from lmzfs.formats import FileLayout, FormatError, Segment, parse_file
from lmzfs.chunker import ChunkSizes, plan_chunks
from lmzfs.codecs import ChunkHint
from lmzfs.formats.gguf import STRINGS_CUT_SPACING, parse_gguf
from lmzfs.formats.segments import STRINGS
from lmzfs.formats.safetensors import parse_safetensors
from lmzfs.formats.torchzip import parse_torch_zip


# ---------------------------------------------------------------- helpers

def parse_bytes(parser, raw: bytes) -> FileLayout:
    layout = parser("mem", io.BytesIO(raw), len(raw))
    layout.check_tiling()
    return layout


def write(tmp_path: Path, raw: bytes, name: str = "f.bin") -> Path:
    p = tmp_path / name
    p.write_bytes(raw)
    return p


def tensors(layout: FileLayout) -> dict[str, Segment]:
    return {s.name: s for s in layout.segments if s.kind == "tensor"}


def assert_hostile(tmp_path: Path, parser, raw: bytes, reason: str) -> None:
    """The parser raises FormatError naming the reason; parse_file stores the file as opaque."""
    with pytest.raises(FormatError, match=reason) as excinfo:
        parser("mem", io.BytesIO(raw), len(raw))
    p = write(tmp_path, raw)
    layout = parse_file(p)
    layout.check_tiling()
    assert layout.format == "opaque"
    assert layout.error == f"{p}: {excinfo.value.reason}"


def safetensors_bytes(header: dict | bytes, data: bytes = b"") -> bytes:
    h = header if isinstance(header, bytes) else json.dumps(header).encode()
    return struct.pack("<Q", len(h)) + h + data


def gstr(s: str | bytes) -> bytes:
    b = s.encode() if isinstance(s, str) else s
    return struct.pack("<Q", len(b)) + b


def gguf_bytes(kvs: bytes = b"", n_kv: int = 0, infos: bytes = b"", n_tensors: int = 0,
               data: bytes = b"", alignment: int = 32, version: int = 3) -> bytes:
    """A hand-built GGUF: header, raw kv bytes, raw tensor info bytes, padding, data."""
    head = b"GGUF" + struct.pack("<IQQ", version, n_tensors, n_kv) + kvs + infos
    return head + b"\0" * (-len(head) % alignment) + data


def ginfo(name: str, dims: list[int], type_id: int, offset: int) -> bytes:
    return gstr(name) + struct.pack(f"<I{len(dims)}QIQ", len(dims), *dims, type_id, offset)


def small_gguf(path: Path) -> Path:
    w = gguf.GGUFWriter(path, "llama")
    w.add_uint32("test.u32", 7)
    w.add_string("test.str", "héllo")
    w.add_array("test.strs", ["a", "bb", ""])
    w.add_array("test.ints", [1, 2, 3])
    w.add_array("test.nested", [[1, 2], [3]])
    w.add_float64("test.f64", 1.5)
    w.add_bool("test.bool", True)
    w.add_tensor("w_f32", np.arange(12, dtype=np.float32).reshape(3, 4))
    w.add_tensor("w_f16", np.arange(5, dtype=np.float16))
    q = np.arange(2 * 34, dtype=np.uint8).reshape(2, 34)      # 2 rows of one Q8_0 block each
    w.add_tensor("w_q8", q, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    w.add_tensor("w_i32", np.array([1, -1, 3], dtype=np.int32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def small_safetensors(path: Path) -> Path:
    save_file({"a": np.arange(6, dtype=np.float32).reshape(2, 3), "b": np.ones(3, dtype=np.int64),
               "c": np.zeros((0, 4), dtype=np.float16), "d": np.array([True, False])},
              str(path), metadata={"format": "np"})
    return path


def torch_zip_bytes(compress_pkl: bool = False, seekable: bool = True) -> bytes:
    buf = io.BytesIO()

    class Unseekable(io.RawIOBase):   # makes zipfile write data descriptors (flag bit 3)
        def writable(self) -> bool:
            return True

        def write(self, b) -> int:
            return buf.write(b)

    target = buf if seekable else Unseekable()
    with zipfile.ZipFile(target, "w", zipfile.ZIP_STORED) as z:
        z.writestr("archive/data.pkl", b"\x80\x02}q\x00.",
                   compress_type=zipfile.ZIP_DEFLATED if compress_pkl else zipfile.ZIP_STORED)
        z.writestr("archive/byteorder", b"little")
        z.writestr("archive/data/0", np.arange(16, dtype=np.float32).tobytes())
        z.writestr("archive/data/1", np.arange(8, dtype=np.int64).tobytes())
        z.writestr("archive/data/2", b"")
        z.writestr("archive/version", b"3\n")
    return buf.getvalue()


def zip64_bytes(entries: dict[str, bytes]) -> bytes:
    """A stored zip whose every central directory size and offset lives in ZIP64 extra fields."""
    out, cd = bytearray(), bytearray()
    for name, data in entries.items():
        crc, n, lho = zlib.crc32(data), len(data), len(out)
        extra = struct.pack("<HHQQ", 1, 16, n, n)
        out += struct.pack("<4s5H3I2H", b"PK\x03\x04", 45, 0, 0, 0, 0, crc, 0xFFFFFFFF, 0xFFFFFFFF,
                           len(name), len(extra)) + name.encode() + extra + data
        cextra = struct.pack("<HHQQQ", 1, 24, n, n, lho)
        cd += struct.pack("<4s6H3I5H2I", b"PK\x01\x02", 45, 45, 0, 0, 0, 0, crc, 0xFFFFFFFF,
                          0xFFFFFFFF, len(name), len(cextra), 0, 0, 0, 0, 0xFFFFFFFF)
        cd += name.encode() + cextra
    cd_off = len(out)
    out += cd
    z64 = len(out)
    out += struct.pack("<4sQ2H2I4Q", b"PK\x06\x06", 44, 45, 45, 0, 0, len(entries), len(entries),
                       len(cd), cd_off)
    out += struct.pack("<4sIQI", b"PK\x06\x07", 0, z64, 1)
    out += struct.pack("<4s4H2IH", b"PK\x05\x06", 0, 0, 0xFFFF, 0xFFFF, 0xFFFFFFFF, 0xFFFFFFFF, 0)
    return bytes(out)


# ---------------------------------------------------------------- real files

def test_minilm_tiles_exactly_and_agrees_with_safe_open(minilm_path):
    layout = parse_bytes(parse_safetensors, minilm_path.read_bytes())
    assert layout.format == "safetensors" and layout.error is None
    segs = tensors(layout)
    with safe_open(str(minilm_path), "np") as st_file, open(minilm_path, "rb") as raw:
        assert set(segs) == set(st_file.keys())
        for name in segs:
            assert segs[name].shape == tuple(st_file.get_slice(name).get_shape())
        for name in sorted(segs)[::20] + ["embeddings.position_ids"]:
            t = st_file.get_tensor(name)
            s = segs[name]
            raw.seek(s.offset)
            assert raw.read(s.length) == t.tobytes()
            assert s.itemsize == t.dtype.itemsize
            assert s.dtype == {"float32": "F32", "int64": "I64"}[t.dtype.name]


def test_smollm2_tiles_exactly_and_agrees_with_gguf_reader(smollm2_path):
    layout = parse_file(smollm2_path)
    layout.check_tiling()
    assert layout.format == "gguf" and layout.error is None
    reader = gguf.GGUFReader(smollm2_path)
    header = [s for s in layout.segments if s.offset < reader.data_offset]
    assert all(s.kind == "header" for s in header) and header[-1].end == reader.data_offset
    segs = tensors(layout)
    assert set(segs) == {t.name for t in reader.tensors}
    for t in reader.tensors:
        s = segs[t.name]
        assert (s.offset, s.length) == (t.data_offset, t.n_bytes)
        assert s.dtype == t.tensor_type.name
        assert s.shape == tuple(reversed([int(d) for d in t.shape]))
    assert {s.dtype for s in segs.values()} == {"Q4_1", "Q8_0", "F32"}
    assert all(s.itemsize == (4 if s.dtype == "F32" else 0) for s in segs.values())


def _strings_at(raw: bytes) -> tuple[list[bytes], set[int]]:
    """The length-prefixed strings that fill raw exactly, and where each starts."""
    out, starts, pos = [], set(), 0
    while pos < len(raw):
        (n,) = struct.unpack_from("<Q", raw, pos)
        starts.add(pos)
        out.append(raw[pos + 8:pos + 8 + n])
        pos += 8 + n
    assert pos == len(raw)
    return out, starts


def test_smollm2_vocabulary_and_merges_are_segments_of_strings_with_cuts_at_string_starts(smollm2_path):
    layout = parse_file(smollm2_path)
    reader = gguf.GGUFReader(smollm2_path)
    runs = [s for s in layout.segments if s.dtype == STRINGS]
    assert [s.kind for s in runs] == ["header", "header"]
    raw = Path(smollm2_path).read_bytes()[:reader.data_offset]
    for seg, key in zip(runs, ("tokenizer.ggml.tokens", "tokenizer.ggml.merges")):
        field = reader.fields[key]
        strings, starts = _strings_at(raw[seg.offset:seg.end])
        assert strings == [bytes(field.parts[i]) for i in field.data]
        assert seg.cuts and all(c - seg.offset in starts for c in seg.cuts)
        gaps = [b - a for a, b in zip((seg.offset,) + seg.cuts, seg.cuts)]
        assert min(gaps) >= STRINGS_CUT_SPACING and max(gaps) < 2 * STRINGS_CUT_SPACING


def test_chunks_of_a_run_of_strings_end_where_a_string_starts(smollm2_path):
    layout = parse_file(smollm2_path)
    seg = next(s for s in layout.segments if s.dtype == STRINGS)
    for size in (64 << 10, 100_000, 1 << 20):
        plans = [c for c in plan_chunks(layout, ChunkSizes.uniform(size)) if seg.offset <= c.offset < seg.end]
        assert plans[0].offset == seg.offset and plans[-1].offset + plans[-1].length == seg.end
        assert all(c.hint == ChunkHint(STRINGS) for c in plans)
        assert all(c.offset + c.length in seg.cuts for c in plans[:-1])
        assert all(size - STRINGS_CUT_SPACING * 2 < c.length <= size for c in plans[:-1])


def test_a_string_longer_than_a_chunk_is_cut_through_and_every_chunk_still_round_trips():
    from lmzfs.codecs import decode_chunk, encode_chunk
    strings = [b"tok%d" % i for i in range(3000)] + [b"x" * 200_000] + [b"tail%d" % i for i in range(3000)]
    small = [b"a", b"b"]                        # under STRINGS_MIN: stays in the header
    nested = struct.pack("<IQ", 9, 1) + struct.pack("<IQ", 8, 2) + gstr("n1") + gstr("n2")
    kvs = (gstr("big") + struct.pack("<IIQ", 9, 8, len(strings)) + b"".join(gstr(x) for x in strings) +
           gstr("small") + struct.pack("<IIQ", 9, 8, len(small)) + b"".join(gstr(x) for x in small) +
           gstr("nested") + struct.pack("<I", 9) + nested)
    raw = gguf_bytes(kvs, 3)
    layout = parse_gguf("t.gguf", io.BytesIO(raw), len(raw))
    layout.check_tiling()
    runs = [s for s in layout.segments if s.dtype == STRINGS]
    assert len(runs) == 1 and raw[runs[0].offset:runs[0].end] == b"".join(gstr(x) for x in strings)
    plans = [c for c in plan_chunks(layout, ChunkSizes.uniform(64 << 10)) if runs[0].offset <= c.offset < runs[0].end]
    assert sum(c.length for c in plans) == runs[0].length and max(c.length for c in plans) <= 64 << 10
    for c in plans:
        data = raw[c.offset:c.offset + c.length]
        e = encode_chunk(data, c.hint)
        assert e.codec == "strings" and decode_chunk(e.payload, len(data)) == data


def test_two_files_with_one_vocabulary_after_different_metadata_cut_it_into_the_same_chunks():
    vocab = [b"tok%d" % i for i in range(20000)]
    array = gstr("tokenizer.ggml.tokens") + struct.pack("<IIQ", 9, 8, len(vocab)) + b"".join(gstr(x) for x in vocab)
    chunks = []
    for name in ("Q4_1 build", "a much longer name of a Q4_K_M build"):
        raw = gguf_bytes(gstr("general.name") + struct.pack("<I", 8) + gstr(name) + array, 2)
        layout = parse_gguf("t.gguf", io.BytesIO(raw), len(raw))
        chunks.append([raw[c.offset:c.offset + c.length] for c in plan_chunks(layout, ChunkSizes.uniform(64 << 10))
                       if c.hint.dtype == STRINGS])
    assert len(chunks[0]) > 2 and chunks[0] == chunks[1]


# ---------------------------------------------------------------- synthetic safetensors

def test_a_safetensors_file_from_save_file_parses_like_safe_open(tmp_path):
    p = small_safetensors(tmp_path / "s.safetensors")
    layout = parse_file(p)
    assert layout.format == "safetensors"
    layout.check_tiling()
    segs = tensors(layout)
    assert set(segs) == {"a", "b", "d"}            # "c" has no bytes, so no segment
    assert (segs["a"].dtype, segs["a"].shape, segs["a"].itemsize) == ("F32", (2, 3), 4)
    assert (segs["d"].dtype, segs["d"].itemsize) == ("BOOL", 1)
    with safe_open(str(p), "np") as f:
        for name, s in segs.items():
            assert p.read_bytes()[s.offset:s.end] == f.get_tensor(name).tobytes()


def test_a_hand_written_safetensors_file_gets_padding_segments_for_gaps():
    header = {"__metadata__": {"k": "v"},
              "y": {"dtype": "bf16", "shape": [2], "data_offsets": [8, 12]},
              "x": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},
              "z": {"dtype": "F4", "shape": [3], "data_offsets": [12, 14]}}
    h = json.dumps(header).encode() + b"   "       # the header may be space padded
    layout = parse_bytes(parse_safetensors, safetensors_bytes(h, bytes(20)))
    base = 8 + len(h)
    assert [(s.kind, s.offset - base, s.length, s.name) for s in layout.segments[1:]] == [
        ("tensor", 0, 4, "x"), ("padding", 4, 4, None), ("tensor", 8, 4, "y"),
        ("tensor", 12, 2, "z"), ("padding", 14, 6, None)]
    assert tensors(layout)["y"].dtype == "BF16"
    assert tensors(layout)["z"].itemsize == 0       # sub-byte dtype: accepted, no element size


def test_a_header_length_past_the_end_is_a_format_error(tmp_path):
    raw = safetensors_bytes(b'{"__metadata__": {}}')
    raw = struct.pack("<Q", 1000) + raw[8:]
    assert_hostile(tmp_path, parse_safetensors, raw, "header length 1000 runs past the end")


def test_an_absurd_header_length_is_a_format_error(tmp_path):
    raw = struct.pack("<Q", 2**63) + b'{"a": 1}'
    assert_hostile(tmp_path, parse_safetensors, raw, "exceeds the limit")


def test_a_header_that_is_not_json_is_a_format_error(tmp_path):
    assert_hostile(tmp_path, parse_safetensors, safetensors_bytes(b"{not json"), "not valid JSON")


def test_a_header_that_is_json_but_not_an_object_is_a_format_error():
    raw = safetensors_bytes([1, 2], bytes(8))   # no "{" at offset 8, so parse_file sees unknown data
    with pytest.raises(FormatError, match="JSON list, not an object"):
        parse_safetensors("mem", io.BytesIO(raw), len(raw))


@pytest.mark.parametrize("header, reason", [
    ({"x": [1]}, "entry is not an object"),
    ({"__metadata__": {"k": 1}}, "__metadata__ value"),
    ({"__metadata__": [1]}, "__metadata__ is not an object"),
    ({"x": {"dtype": "F32", "shape": [1], "data_offsets": [0]}}, "not a pair of ints"),
    ({"x": {"dtype": "F32", "shape": [1], "data_offsets": [True, 4]}}, "not a pair of ints"),
    ({"x": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]}}, "non-negative ints"),
    ({"x": {"shape": [1], "data_offsets": [0, 4]}}, "no string dtype"),
])
def test_malformed_tensor_entries_are_format_errors(tmp_path, header, reason):
    assert_hostile(tmp_path, parse_safetensors, safetensors_bytes(header, bytes(64)), reason)


def test_duplicate_json_keys_are_a_format_error(tmp_path):
    h = b'{"x": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]}, "x": {"dtype": "U8", ' \
        b'"shape": [1], "data_offsets": [1, 2]}}'
    assert_hostile(tmp_path, parse_safetensors, safetensors_bytes(h, bytes(2)), "duplicate key")


def test_overlapping_tensors_are_a_format_error(tmp_path):
    header = {"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]},
              "b": {"dtype": "F32", "shape": [2], "data_offsets": [8, 16]}}
    assert_hostile(tmp_path, parse_safetensors, safetensors_bytes(header, bytes(16)), "overlap")


def test_offsets_out_of_range_are_a_format_error(tmp_path):
    header = {"x": {"dtype": "U8", "shape": [99], "data_offsets": [0, 99]}}
    assert_hostile(tmp_path, parse_safetensors, safetensors_bytes(header, bytes(64)),
                   r"tensor 'x' data_offsets \[0, 99\] exceed the data area of 64 bytes")


def test_a_shape_that_disagrees_with_the_byte_length_is_a_format_error(tmp_path):
    header = {"x": {"dtype": "F16", "shape": [3, 3], "data_offsets": [0, 16]}}
    assert_hostile(tmp_path, parse_safetensors, safetensors_bytes(header, bytes(16)),
                   "needs 18 bytes but data_offsets span 16")


# ---------------------------------------------------------------- synthetic GGUF

def test_a_gguf_written_by_gguf_writer_parses_like_gguf_reader(tmp_path):
    p = small_gguf(tmp_path / "s.gguf")
    layout = parse_file(p)
    assert layout.format == "gguf" and layout.error is None
    layout.check_tiling()
    segs = tensors(layout)
    reader = gguf.GGUFReader(p)
    for t in reader.tensors:
        assert (segs[t.name].offset, segs[t.name].length) == (t.data_offset, t.n_bytes)
    assert (segs["w_q8"].dtype, segs["w_q8"].shape, segs["w_q8"].itemsize, segs["w_q8"].length) == (
        "Q8_0", (2, 32), 0, 68)
    assert (segs["w_f32"].dtype, segs["w_f32"].shape, segs["w_f32"].itemsize) == ("F32", (3, 4), 4)
    assert (segs["w_i32"].dtype, segs["w_i32"].itemsize) == ("I32", 4)
    assert [s.kind for s in layout.segments].count("padding") >= 1   # tensors are 32-aligned


def test_a_custom_alignment_is_honoured():
    kv = gstr("general.alignment") + struct.pack("<II", 4, 64)
    info = ginfo("t", [16], 0, 0)
    raw = gguf_bytes(kv, 1, info, 1, bytes(64), alignment=64)
    layout = parse_bytes(parse_gguf, raw)
    assert layout.segments[0].length % 64 == 0
    assert tensors(layout)["t"].offset == layout.segments[0].length


@pytest.mark.parametrize("alignment", [0, 3, 48, 2 << 20])
def test_an_alignment_that_is_not_a_small_power_of_two_is_a_format_error(tmp_path, alignment):
    kv = gstr("general.alignment") + struct.pack("<II", 4, alignment)
    assert_hostile(tmp_path, parse_gguf, gguf_bytes(kv, 1), "general.alignment")


@pytest.mark.parametrize("version, reason", [(1, "version 1"), (0x03000000, "big-endian"), (7, "version 7")])
def test_gguf_v1_and_unknown_or_big_endian_versions_are_format_errors(tmp_path, version, reason):
    assert_hostile(tmp_path, parse_gguf, gguf_bytes(version=version), reason)


def test_a_gguf_string_length_of_2_pow_62_is_a_format_error(tmp_path):
    kv = struct.pack("<Q", 2**62) + b"key"
    assert_hostile(tmp_path, parse_gguf, gguf_bytes(kv, 1), "length 4611686018427387904")


def test_a_gguf_string_value_length_of_2_pow_62_is_a_format_error(tmp_path):
    kv = gstr("k") + struct.pack("<IQ", 8, 2**62)
    assert_hostile(tmp_path, parse_gguf, gguf_bytes(kv, 1), "exceeds the")


def test_a_gguf_array_count_larger_than_the_file_is_a_format_error(tmp_path):
    for etype in (0, 8, 9):
        kv = gstr("k") + struct.pack("<IIQ", 9, etype, 2**60)
        assert_hostile(tmp_path, parse_gguf, gguf_bytes(kv, 1), "array 'k'")


def test_deeply_nested_gguf_arrays_are_a_format_error(tmp_path):
    kv = gstr("k") + struct.pack("<I", 9) + struct.pack("<IQ", 9, 1) * 40 + struct.pack("<IQ", 0, 0)
    assert_hostile(tmp_path, parse_gguf, gguf_bytes(kv, 1), "nests arrays")


def test_a_tensor_count_larger_than_the_file_could_hold_is_a_format_error(tmp_path):
    assert_hostile(tmp_path, parse_gguf, gguf_bytes(n_tensors=2**40), "cannot fit")


def test_an_unknown_ggml_type_is_a_format_error(tmp_path):
    raw = gguf_bytes(infos=ginfo("t", [4], 99, 0), n_tensors=1, data=bytes(32))
    assert_hostile(tmp_path, parse_gguf, raw, "unknown ggml type 99")


def test_a_misaligned_tensor_offset_is_a_format_error(tmp_path):
    raw = gguf_bytes(infos=ginfo("t", [4], 0, 4), n_tensors=1, data=bytes(64))
    assert_hostile(tmp_path, parse_gguf, raw, "not a multiple of the alignment 32")


def test_a_gguf_tensor_past_the_end_is_a_format_error(tmp_path):
    raw = gguf_bytes(infos=ginfo("t", [8], 0, 32), n_tensors=1, data=bytes(48))
    assert_hostile(tmp_path, parse_gguf, raw, "runs past the data section")


def test_overlapping_gguf_tensors_are_a_format_error(tmp_path):
    infos = ginfo("a", [16], 0, 0) + ginfo("b", [8], 0, 32)
    assert_hostile(tmp_path, parse_gguf, gguf_bytes(infos=infos, n_tensors=2, data=bytes(64)), "overlap")


def test_a_partial_quant_block_is_a_format_error(tmp_path):
    raw = gguf_bytes(infos=ginfo("t", [31], 8, 0), n_tensors=1, data=bytes(64))
    assert_hostile(tmp_path, parse_gguf, raw, "not a whole number of Q8_0 blocks")


def test_too_many_dimensions_and_duplicate_names_are_format_errors(tmp_path):
    assert_hostile(tmp_path, parse_gguf, gguf_bytes(infos=ginfo("t", [1] * 9, 0, 0), n_tensors=1,
                                                    data=bytes(32)), "9 dimensions")
    infos = ginfo("t", [8], 0, 0) + ginfo("t", [8], 0, 32)
    assert_hostile(tmp_path, parse_gguf, gguf_bytes(infos=infos, n_tensors=2, data=bytes(64)),
                   "duplicate tensor name")


# ---------------------------------------------------------------- truncation

@pytest.mark.parametrize("builder, parser", [(small_gguf, parse_gguf),
                                             (small_safetensors, parse_safetensors)])
def test_a_file_truncated_at_any_point_is_a_format_error_never_a_crash(tmp_path, builder, parser):
    raw = builder(tmp_path / "whole").read_bytes()
    for cut in range(0, len(raw), 7):
        part = raw[:cut]
        try:
            parse_bytes(parser, part)     # a cut inside trailing padding may still be valid
        except FormatError:
            pass
        layout = parse_file(write(tmp_path, part, "cut"))
        layout.check_tiling()
        assert layout.size == cut


def test_a_truncated_torch_zip_never_crashes(tmp_path):
    raw = torch_zip_bytes()
    for cut in range(0, len(raw), 7):
        with pytest.raises(FormatError):
            parse_torch_zip("mem", io.BytesIO(raw[:cut]), cut)
        parse_file(write(tmp_path, raw[:cut])).check_tiling()


# ---------------------------------------------------------------- torch zip

def test_a_torch_style_zip_splits_into_tensor_and_header_segments(tmp_path):
    raw = torch_zip_bytes()
    layout = parse_file(write(tmp_path, raw, "m.pt"))
    assert layout.format == "pytorch-zip" and layout.error is None
    layout.check_tiling()
    segs = tensors(layout)
    assert set(segs) == {"archive/data/0", "archive/data/1"}     # data/2 is empty: no segment
    assert raw[segs["archive/data/0"].offset:segs["archive/data/0"].end] == \
        np.arange(16, dtype=np.float32).tobytes()
    assert all(s.dtype is None and s.itemsize == 0 for s in segs.values())
    assert {s.kind for s in layout.segments} == {"header", "tensor"}


def test_a_compressed_zip_entry_is_one_opaque_segment():
    layout = parse_bytes(parse_torch_zip, torch_zip_bytes(compress_pkl=True))
    assert [s.kind for s in layout.segments].count("opaque") == 1
    assert len(tensors(layout)) == 2


def test_zip_data_descriptors_are_header_segments():
    raw = torch_zip_bytes(seekable=False)
    assert zipfile.ZipFile(io.BytesIO(raw)).infolist()[0].flag_bits & 0x8
    layout = parse_bytes(parse_torch_zip, raw)
    assert raw[tensors(layout)["archive/data/1"].offset:][:64] == np.arange(8, dtype=np.int64).tobytes()


def test_a_zip64_archive_is_parsed_from_its_zip64_records():
    entries = {"archive/data.pkl": b"pickle", "archive/data/0": bytes(range(40))}
    raw = zip64_bytes(entries)
    with zipfile.ZipFile(io.BytesIO(raw)) as z:       # the hand-built archive is a valid zip
        assert {n: z.read(n) for n in z.namelist()} == entries
    segs = tensors(parse_bytes(parse_torch_zip, raw))
    assert raw[segs["archive/data/0"].offset:segs["archive/data/0"].end] == bytes(range(40))


def test_a_zip64_checkpoint_larger_than_4_gib_parses_without_reading_its_data(tmp_path):
    big = (1 << 32) + 100
    name0, name1 = b"archive/data/0", b"archive/data.pkl"
    p = tmp_path / "big.pt"
    with open(p, "wb") as f:
        extra = struct.pack("<HHQQ", 1, 16, big, big)
        f.write(struct.pack("<4s5H3I2H", b"PK\x03\x04", 45, 0, 0, 0, 0, 0, 0xFFFFFFFF, 0xFFFFFFFF,
                            len(name0), len(extra)) + name0 + extra)
        data0 = f.tell()
        f.seek(data0 + big)                           # a hole: the file stays sparse
        lho1 = f.tell()
        f.write(struct.pack("<4s5H3I2H", b"PK\x03\x04", 45, 0, 0, 0, 0, zlib.crc32(b"pk"), 2, 2,
                            len(name1), 0) + name1 + b"pk")
        cd_off = f.tell()
        cd = struct.pack("<4s6H3I5H2I", b"PK\x01\x02", 45, 45, 0, 0, 0, 0, 0, 0xFFFFFFFF, 0xFFFFFFFF,
                         len(name0), 28, 0, 0, 0, 0, 0xFFFFFFFF) + name0
        cd += struct.pack("<HHQQQ", 1, 24, big, big, 0)
        cd += struct.pack("<4s6H3I5H2I", b"PK\x01\x02", 45, 45, 0, 0, 0, 0, zlib.crc32(b"pk"), 2, 2,
                          len(name1), 12, 0, 0, 0, 0, 0xFFFFFFFF) + name1
        cd += struct.pack("<HHQ", 1, 8, lho1)
        f.write(cd)
        z64 = f.tell()
        f.write(struct.pack("<4sQ2H2I4Q", b"PK\x06\x06", 44, 45, 45, 0, 0, 2, 2, len(cd), cd_off))
        f.write(struct.pack("<4sIQI", b"PK\x06\x07", 0, z64, 1))
        f.write(struct.pack("<4s4H2IH", b"PK\x05\x06", 0, 0, 0xFFFF, 0xFFFF, 0xFFFFFFFF, 0xFFFFFFFF, 0))
    with zipfile.ZipFile(p) as z:
        assert z.getinfo("archive/data.pkl").header_offset == lho1
    layout = parse_file(p)
    assert layout.format == "pytorch-zip", layout.error
    seg = tensors(layout)["archive/data/0"]
    assert (seg.offset, seg.length) == (data0, big)


def test_a_zip_without_data_pkl_is_opaque_without_an_error(tmp_path):
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        z.writestr("readme.txt", b"hi")
    layout = parse_file(write(tmp_path, buf.getvalue()))
    assert (layout.format, layout.error) == ("opaque", None)


def test_a_zip_with_its_central_directory_offset_past_the_end_is_a_format_error(tmp_path):
    raw = bytearray(torch_zip_bytes())
    eocd = raw.rfind(b"PK\x05\x06")
    struct.pack_into("<I", raw, eocd + 16, len(raw) + 1000)
    assert_hostile(tmp_path, parse_torch_zip, bytes(raw), "central directory")


def test_a_zip_whose_local_header_is_missing_is_a_format_error(tmp_path):
    raw = bytearray(torch_zip_bytes())
    raw[0:4] = b"PK\x03\x05"                    # parse_file no longer detects it; the parser refuses
    with pytest.raises(FormatError, match="no local header signature"):
        parse_torch_zip("mem", io.BytesIO(bytes(raw)), len(raw))


# ---------------------------------------------------------------- unknown and fuzzed input

def test_unknown_and_empty_files_are_opaque_without_an_error(tmp_path):
    for raw in (b"", b"hello world, not a model", bytes(100)):
        layout = parse_file(write(tmp_path, raw))
        layout.check_tiling()
        assert (layout.format, layout.error) == ("opaque", None)


MAGICS = st.one_of(
    st.just(b"GGUF"), st.just(b"GGUF\x03\x00\x00\x00"), st.just(b"GGUF\x02\x00\x00\x00"),
    st.just(b"PK\x03\x04"),
    st.integers(0, 2**64 - 1).map(lambda n: struct.pack("<Q", n) + b"{"),
    st.integers(0, 600).map(lambda n: struct.pack("<Q", n) + b"{"),
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(prefix=MAGICS, body=st.binary(max_size=600))
def test_arbitrary_bytes_after_a_magic_never_make_parse_file_raise(tmp_path, prefix, body):
    layout = parse_file(write(tmp_path, prefix + body))
    layout.check_tiling()


@pytest.fixture(scope="module")
def valid_small_files(tmp_path_factory) -> list[bytes]:
    d = tmp_path_factory.mktemp("valid")
    return [small_gguf(d / "g.gguf").read_bytes(), small_safetensors(d / "s.st").read_bytes(),
            torch_zip_bytes(), torch_zip_bytes(seekable=False), zip64_bytes({"a/data.pkl": b"x"})]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(which=st.integers(0, 4), edits=st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 255)),
                                               min_size=1, max_size=4))
def test_corrupting_bytes_of_a_valid_file_never_makes_parse_file_raise(tmp_path, valid_small_files,
                                                                       which, edits):
    raw = bytearray(valid_small_files[which])
    for pos, val in edits:
        raw[pos % len(raw)] = val
    layout = parse_file(write(tmp_path, bytes(raw)))
    layout.check_tiling()


def test_a_quantised_scalar_tensor_is_a_format_error_not_a_crash(tmp_path):
    # found by fuzzing: n_dims 0 means one element, which is never a whole Q8_0 block
    raw = gguf_bytes(infos=ginfo("t", [], 8, 0), n_tensors=1, data=bytes(64))
    assert_hostile(tmp_path, parse_gguf, raw, "row of 1 elements")
