"""`lmz inspect`: tensor counts and dtype totals agree with the reference readers, pickles are read
but never run, hostile headers are reported in one line, and the saving prediction is right."""
from __future__ import annotations

import io
import json
import pickletools
import struct
import zipfile
from collections import defaultdict
from pathlib import Path

import gguf
import numpy as np
import pytest
from safetensors import safe_open
from safetensors.numpy import save_file

from lmzfs.chunker import FLOAT_CHUNK_SIZE, plan_chunks
from lmzfs.cli import main as lmz
from lmzfs.codecs import encode_chunk
from lmzfs.formats import parse_file
from lmzfs.inspect import inspect_file, scan_pickle
from lmzfs.inspect.saving import SAMPLE_BYTES
from lmzfs.singlefile import pack_file
from lmzfs.testing.corpus import CORPUS


# ---------------------------------------------------------------- hand-made pickles (never loaded)

def unicode_op(s: str) -> bytes:
    b = s.encode()
    return b"X" + struct.pack("<I", len(b)) + b                 # BINUNICODE


def short_unicode_op(s: str) -> bytes:
    b = s.encode()
    return b"\x8c" + bytes([len(b)]) + b                        # SHORT_BINUNICODE


def os_system_pickle(command: str) -> bytes:
    """What a malicious checkpoint holds: REDUCE(os.system, (command,))."""
    return b"\x80\x02" + b"cos\nsystem\n" + unicode_op(command) + b"\x85" + b"R" + b"."


def torch_like_pickle() -> bytes:
    """OrderedDict({"w": _rebuild_tensor_v2(persistent storage 0, 0, (4,), (1,))}), as torch.save writes it."""
    storage = (b"(" + unicode_op("storage") + b"ctorch\nFloatStorage\n" + unicode_op("0") + unicode_op("cpu")
               + b"K\x04" + b"t" + b"Q")                          # MARK ... TUPLE BINPERSID
    tensor = (b"ctorch._utils\n_rebuild_tensor_v2\n" + b"(" + storage + b"K\x00" + b"K\x04\x85" + b"K\x01\x85"
              + b"\x89" + b"ccollections\nOrderedDict\n)R" + b"t" + b"R")
    return b"\x80\x02" + b"ccollections\nOrderedDict\n)R" + b"q\x00" + b"(" + unicode_op("w") + tensor + b"u" + b"."


def stack_global_pickle() -> bytes:
    """Protocol 4: builtins.set, then builtins.eval with its module name fetched from the memo."""
    return (b"\x80\x04" + short_unicode_op("builtins") + b"\x94" + short_unicode_op("set") + b"\x94" + b"\x93\x94"
            + b"0" + b"h\x00" + short_unicode_op("eval") + b"\x93" + b".")


def torch_zip(path: Path, pickle_bytes: bytes) -> Path:
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as z:
        z.writestr("archive/data.pkl", pickle_bytes)
        z.writestr("archive/version", b"3\n")
        z.writestr("archive/data/0", np.arange(4, dtype=np.float32).tobytes())
    return path


def test_the_hand_made_pickles_are_well_formed():
    for p in (os_system_pickle("true"), torch_like_pickle(), stack_global_pickle()):
        pickletools.dis(p, out=io.StringIO())   # raises on malformed opcodes; runs nothing


# ---------------------------------------------------------------- real files against reference readers

def test_minilm_tensor_count_and_dtype_totals_match_safe_open(minilm_path):
    want: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0])
    with safe_open(str(minilm_path), "numpy") as f:
        names = list(f.keys())
        for k in names:
            s = f.get_slice(k)
            n = int(np.prod(s.get_shape()))
            item = np.dtype({"F32": np.float32, "I64": np.int64}[s.get_dtype()]).itemsize
            want[s.get_dtype()] = [want[s.get_dtype()][0] + 1, want[s.get_dtype()][1] + n,
                                   want[s.get_dtype()][2] + n * item]
    r = inspect_file(minilm_path)
    assert (r.format, r.tensors, r.error) == ("safetensors", len(names), None)
    assert {k: [v.tensors, v.elements, v.bytes] for k, v in r.dtypes.items()} == dict(want)
    (n,) = struct.unpack("<Q", minilm_path.read_bytes()[:8])
    assert r.header_bytes == 8 + n and r.padding_bytes == 0 and r.opaque_bytes == 0
    assert r.header_bytes + sum(v.bytes for v in r.dtypes.values()) == r.size


def test_smollm2_tensor_count_and_dtype_totals_match_gguf_reader(smollm2_path):
    reader = gguf.GGUFReader(smollm2_path)
    want: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0])
    for t in reader.tensors:
        w = want[t.tensor_type.name]
        want[t.tensor_type.name] = [w[0] + 1, w[1] + int(t.n_elements), w[2] + int(t.n_bytes)]
    r = inspect_file(smollm2_path)
    assert (r.format, r.tensors, r.error) == ("gguf", len(reader.tensors), None)
    assert {k: [v.tensors, v.elements, v.bytes] for k, v in r.dtypes.items()} == dict(want)
    assert r.details["version"] == 3 and r.details["alignment"] == 32
    assert r.details["metadata"]["general.architecture"] == "llama"
    assert r.header_bytes + r.padding_bytes + sum(v.bytes for v in r.dtypes.values()) == r.size


def test_zero_size_tensors_are_counted_like_safe_open_counts_them(tmp_path):
    p = tmp_path / "z.safetensors"
    save_file({"empty": np.zeros((0, 3), np.float32), "w": np.ones(5, np.float32)}, str(p))
    r = inspect_file(p)
    with safe_open(str(p), "numpy") as f:
        assert r.tensors == len(list(f.keys())) == 2
    assert (r.dtypes["F32"].tensors, r.dtypes["F32"].elements, r.dtypes["F32"].bytes) == (2, 5, 20)


# ---------------------------------------------------------------- pickles

def test_a_torch_zip_whose_pickle_calls_os_system_is_flagged_and_not_executed(tmp_path, capsys):
    marker = tmp_path / "pwned"
    z = torch_zip(tmp_path / "evil.pt", os_system_pickle(f"touch {marker}"))
    assert lmz(["inspect", str(z)]) == 1
    out = capsys.readouterr().out
    assert "SUSPICIOUS: archive/data.pkl imports os.system" in out
    assert not marker.exists()
    r = inspect_file(z)
    assert r.format == "pytorch-zip" and r.tensors == 1
    assert [(p.entry, p.imports, p.suspicious) for p in r.pickles] == [
        ("archive/data.pkl", ["os.system"], ["os.system"])]
    assert r.suspicious == ["archive/data.pkl: os.system"] and not r.ok
    assert not marker.exists()


def test_a_torch_style_checkpoint_imports_only_allowed_names(tmp_path, capsys):
    z = torch_zip(tmp_path / "ok.pt", torch_like_pickle())
    assert lmz(["inspect", str(z), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    (scan,) = out["pickles"]
    assert scan["imports"] == ["collections.OrderedDict", "torch._utils._rebuild_tensor_v2", "torch.FloatStorage"]
    assert scan["suspicious"] == [] and scan["error"] is None and out["ok"] is True
    assert out["details"]["entries"][0] == {"name": "archive/data.pkl", "size": len(torch_like_pickle()),
                                            "stored_size": len(torch_like_pickle()), "method": "stored"}
    assert out["dtypes"] == {"storage": {"tensors": 1, "elements": None, "bytes": 16}}


def test_stack_global_names_are_resolved_through_the_memo():
    scan = scan_pickle(stack_global_pickle(), "x.pkl")
    assert scan.error is None
    assert scan.imports == ["builtins.set", "builtins.eval"] and scan.suspicious == ["builtins.eval"]


def test_an_unresolvable_stack_global_is_suspicious_and_malformed_pickles_stop_cleanly():
    # STACK_GLOBAL over a non-string (an int) cannot be resolved statically: flag it.
    scan = scan_pickle(b"\x80\x04K\x01" + short_unicode_op("system") + b"\x93.", "x.pkl")
    assert scan.suspicious == ["?.system"]
    broken = scan_pickle(os_system_pickle("true")[:14], "x.pkl")   # cut inside the argument
    assert broken.imports == ["os.system"] and broken.error.startswith("malformed pickle")


# ---------------------------------------------------------------- hostile and malformed headers

def _valid_zip_with_bad_directory_offset(tmp_path: Path) -> bytes:
    raw = bytearray(torch_zip(tmp_path / "t.pt", torch_like_pickle()).read_bytes())
    eocd = raw.rfind(b"PK\x05\x06")
    raw[eocd + 16:eocd + 20] = struct.pack("<I", len(raw) * 2)
    return bytes(raw)


@pytest.mark.parametrize("name, make, reason", [
    ("long-header.safetensors", lambda tmp: struct.pack("<Q", 1000) + b'{"a": {}}', "runs past the end"),
    ("bad-offsets.safetensors", lambda tmp: struct.pack("<Q", 54) + b'{"t":{"dtype":"F32","shape":[2],'
                                                                    b'"data_offsets":[0,8]}}' + bytes(4),
     "exceed the data area"),
    ("counts.gguf", lambda tmp: b"GGUF" + struct.pack("<IQQ", 3, 1 << 60, 0) + bytes(64), "cannot fit"),
    ("bad-cd.pt", _valid_zip_with_bad_directory_offset, "central directory"),
])
def test_hostile_headers_are_reported_as_format_errors_without_a_traceback(tmp_path, capsys, name, make, reason):
    p = tmp_path / name
    p.write_bytes(make(tmp_path))
    assert lmz(["inspect", str(p)]) == 1
    captured = capsys.readouterr()
    assert "Traceback" not in captured.out + captured.err
    (line,) = [ln for ln in captured.out.splitlines() if ln.startswith("FormatError:")]
    assert reason in line
    assert lmz(["inspect", str(p), "--json"]) == 1
    out = json.loads(capsys.readouterr().out)
    assert out["format"] == "opaque" and reason in out["error"] and out["ok"] is False


def test_a_truncated_real_gguf_is_a_format_error(tmp_path, smollm2_path):
    p = tmp_path / "cut.gguf"
    with open(smollm2_path, "rb") as f:
        p.write_bytes(f.read(4 << 20))
    r = inspect_file(p)
    assert r.format == "opaque" and "more than the 4194304-byte file" in r.error and r.tensors == 0


def test_safetensors_gaps_between_tensors_are_noted(tmp_path):
    header = (b'{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},'
              b'"b":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}}')
    p = tmp_path / "gap.safetensors"
    p.write_bytes(struct.pack("<Q", len(header)) + header + bytes(12))
    r = inspect_file(p)
    assert r.ok and r.padding_bytes == 4
    assert any("reference safetensors loader refuses" in i for i in r.issues)


def test_a_missing_file_is_one_line_and_exit_status_2(tmp_path, capsys):
    assert lmz(["inspect", str(tmp_path / "nope")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "No such file" in err


# ---------------------------------------------------------------- output and prediction

def test_json_output_is_one_object_with_sha256_and_prediction(minilm_path, capsys):
    assert lmz(["inspect", str(minilm_path), "--json", "--sha256"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["sha256"] == CORPUS["minilm"].sha256
    assert out["format"] == "safetensors" and out["size"] == minilm_path.stat().st_size
    pred = out["prediction"]
    assert set(pred["groups"]) == {"F32", "I64", "header"}
    assert pred["groups"]["F32"]["sampled_bytes"] <= SAMPLE_BYTES + FLOAT_CHUNK_SIZE     # give or take a chunk
    assert pred["stored_bytes"] == sum(g["predicted_stored_bytes"] for g in pred["groups"].values())


def test_human_output_is_a_compact_table(minilm_path, capsys):
    assert lmz(["inspect", str(minilm_path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "safetensors" in lines[0] and "104 tensor(s)" in lines[0]
    header = next(ln for ln in lines if "GROUP" in ln)
    assert header.split() == ["GROUP", "TENSORS", "ELEMENTS", "BYTES", "SAMPLED", "PREDICTED", "SAVED"]
    assert any(ln.split()[:3] == ["F32", "103", "22713216"] for ln in lines)
    assert any(ln.strip().startswith("predicted:") for ln in lines)
    assert len(lines) < 20


def test_the_prediction_is_exact_when_every_group_fits_in_the_sample(tmp_path):
    rng = np.random.default_rng(3)
    p = tmp_path / "small.safetensors"
    save_file({"f": rng.standard_normal(600_000).astype(np.float32),
               "h": rng.standard_normal(300_000).astype(np.float16), "i": np.arange(100, dtype=np.int64)}, str(p))
    r = inspect_file(p)
    layout = parse_file(p)
    data = p.read_bytes()
    exact = sum(len(encode_chunk(data[c.offset:c.offset + c.length], c.hint).payload) for c in plan_chunks(layout))
    assert r.predicted_stored_bytes == exact
    assert all(g.sampled_bytes == g.bytes for g in r.groups)
    packed = pack_file(p, tmp_path / "small.lmz")
    assert r.to_json()["prediction"]["pack_archive_bytes"] == packed.archive_bytes


def test_the_minilm_prediction_is_within_2_points_of_the_real_saving(minilm_path, tmp_path):
    r = inspect_file(minilm_path)
    assert sum(g.sampled_bytes for g in r.groups) < 16 << 20      # a sample, not the whole 91 MB file
    packed = pack_file(minilm_path, tmp_path / "m.lmz")
    predicted_pack_pct = 100 * (1 - r.to_json()["prediction"]["pack_archive_bytes"] / r.size)
    assert abs(predicted_pack_pct - packed.saved_pct) < 2.0


def test_an_lmz_single_file_archive_is_recognised(tmp_path):
    (tmp_path / "f").write_bytes(b"abc" * 1000)
    pack_file(tmp_path / "f", tmp_path / "f.lmz")
    r = inspect_file(tmp_path / "f.lmz")
    assert r.details == {"lmz_archive_plain_size": 3000}
    assert r.issues == ["an lmz single-file archive of a 3000-byte file; `lmz unpack` restores it"]
