"""Single-file archives (`lmz pack` / `lmz unpack`): exact bytes, round trips, refusal of every kind
of damage with nothing published, destinations, limits, reports and bounded memory."""
from __future__ import annotations

import hashlib
import json
import os
import struct
import subprocess
import sys
import tempfile
import zlib
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from safetensors.numpy import save_file

import lmzfs
from lmzfs.cli import main as lmz
from lmzfs.codecs import ChunkHint, encode_chunk
from lmzfs.singlefile import (DestinationExists, InvalidArchive, OutputLimitExceeded, SourceChanged, UsageError,
                              pack_file, unpack_file)

# The documented layout (docs/format.md), spelled out independently of lmzfs/singlefile/format.py.
MAGIC = b"LMZ1\r\n\x1a\n"
HEADER, RECORD, TRAILER = 24, 12, 64
UNLIMITED = 1 << 62


def crc(b: bytes) -> int:
    return zlib.crc32(b) & 0xFFFFFFFF


def doc_header(size: int, version: int = 1, flags: int = 0) -> bytes:
    body = MAGIC + struct.pack("<HHQ", version, flags, size)
    return body + struct.pack("<I", crc(body))


def doc_trailer(count: int, size: int, payload: int, sha: bytes) -> bytes:
    body = b"LMZT" + struct.pack("<QQQ", count, size, payload) + sha
    return body + struct.pack("<I", crc(body))


def records(archive: bytes) -> list[tuple[int, int, int]]:
    """(record offset, plain length, payload length) of each record, walking the documented layout."""
    (size,) = struct.unpack_from("<Q", archive, 12)
    out, pos, done = [], HEADER, 0
    while done < size:
        plain, payload, _ = struct.unpack_from("<III", archive, pos)
        out.append((pos, plain, payload))
        pos += RECORD + payload
        done += plain
    return out


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def pack_bytes(tmp_path: Path, data: bytes, name: str = "src.bin") -> bytes:
    src, archive = tmp_path / name, tmp_path / f"{name}.lmz"
    src.write_bytes(data)
    pack_file(src, archive)
    return archive.read_bytes()


def assert_refused(tmp_path: Path, archive: bytes, match: str, error=InvalidArchive) -> None:
    """Unpacking ``archive`` raises ``error`` and leaves nothing in the destination directory."""
    d = tmp_path / "refused"
    d.mkdir(exist_ok=True)
    src = d / "in.lmz"
    src.write_bytes(archive)
    with pytest.raises(error, match=match):
        unpack_file(src, d / "out", max_output_bytes=UNLIMITED)
    assert sorted(p.name for p in d.iterdir()) == ["in.lmz"]   # no destination, no temporary file
    src.unlink()


def multi_chunk_model(path: Path) -> Path:
    """A safetensors file of three chunks: random F32 (stored raw-ish) and compressible BF16-like data."""
    rng = np.random.default_rng(7)
    save_file({"a": rng.standard_normal(300_000).astype(np.float32),
               "b": (rng.standard_normal(400_000) * 0.01).astype(np.float32).view(np.uint32).astype(np.uint16)},
              str(path))
    return path


# ---------------------------------------------------------------- exact bytes

def test_an_empty_file_packs_to_exactly_the_documented_88_bytes(tmp_path):
    archive = pack_bytes(tmp_path, b"")
    assert archive == doc_header(0) + doc_trailer(0, 0, 0, hashlib.sha256(b"").digest())
    assert len(archive) == 88


def test_a_one_byte_file_is_a_header_one_record_and_a_trailer(tmp_path):
    payload = encode_chunk(b"x", ChunkHint()).payload
    archive = pack_bytes(tmp_path, b"x")
    assert archive == (doc_header(1) + struct.pack("<III", 1, len(payload), crc(b"x")) + payload
                       + doc_trailer(1, 1, len(payload), hashlib.sha256(b"x").digest()))


def test_records_tile_the_file_in_order_and_the_archive_size_adds_up(tmp_path):
    src = multi_chunk_model(tmp_path / "m.safetensors")
    report = pack_file(src, tmp_path / "m.lmz")
    archive = (tmp_path / "m.lmz").read_bytes()
    recs = records(archive)
    assert len(recs) == report.chunks >= 3
    assert sum(p for _, p, _ in recs) == src.stat().st_size
    assert len(archive) == HEADER + sum(RECORD + n for _, _, n in recs) + TRAILER == report.archive_bytes
    assert archive[-TRAILER:] == doc_trailer(len(recs), src.stat().st_size, sum(n for _, _, n in recs),
                                             bytes.fromhex(sha(src)))


# ---------------------------------------------------------------- round trips

@pytest.mark.parametrize("fixture", ["minilm_path", "smollm2_path"])
def test_the_real_minilm_and_smollm2_files_round_trip_byte_for_byte(request, tmp_path, fixture):
    src: Path = request.getfixturevalue(fixture)
    packed = pack_file(src, tmp_path / "model.lmz")
    unpacked = unpack_file(tmp_path / "model.lmz", tmp_path / "model.out", max_output_bytes=src.stat().st_size)
    assert sha(tmp_path / "model.out") == sha(src) == packed.sha256 == unpacked.sha256
    assert packed.archive_bytes == (tmp_path / "model.lmz").stat().st_size == unpacked.archive_bytes
    assert packed.format == ("safetensors" if fixture == "minilm_path" else "gguf")
    assert sum(u.plain_bytes for u in packed.codecs.values()) == src.stat().st_size
    assert packed.saved_pct > (15 if fixture == "minilm_path" else 3)


@pytest.mark.parametrize("data", [
    b"", b"\x00", b"\xff" * 3,
    os.urandom(3 << 20),                                            # random: raw payloads
    bytes(5 << 19),                                                 # zeros spanning chunks
    struct.pack("<Q", 1 << 60) + b'{"a": 1}' + os.urandom(100),     # hostile safetensors header
    struct.pack("<Q", 30) + b'{"t":{"dtype":"F32","shape":[2],"data_offsets":[0,9]}}',
    b"GGUF" + struct.pack("<IQQ", 3, 1 << 62, 1 << 62),             # hostile GGUF counts
    b"PK\x03\x04" + os.urandom(200),                                # a zip that is not one
], ids=["empty", "one-zero", "three-ff", "random-3MiB", "zeros-2.5MiB", "hostile-safetensors",
        "bad-safetensors-offsets", "hostile-gguf", "fake-zip"])
def test_odd_and_hostile_files_round_trip(tmp_path, data):
    archive = pack_bytes(tmp_path, data)
    (tmp_path / "a.lmz").write_bytes(archive)
    unpack_file(tmp_path / "a.lmz", tmp_path / "out", max_output_bytes=len(data))
    assert (tmp_path / "out").read_bytes() == data


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.one_of(st.binary(max_size=4096),
                      st.binary(max_size=2048).map(lambda b: struct.pack("<Q", len(b)) + b"{" + b)))
def test_arbitrary_small_files_round_trip(data):
    with tempfile.TemporaryDirectory() as d:
        src, archive, out = Path(d) / "f", Path(d) / "f.lmz", Path(d) / "g"
        src.write_bytes(data)
        packed = pack_file(src, archive)
        unpack_file(archive, out, max_output_bytes=len(data))
        assert out.read_bytes() == data
        assert packed.archive_bytes == archive.stat().st_size


def test_lmzfs_exports_pack_file_and_unpack_file():
    from lmzfs import __version__, singlefile
    assert __version__ == lmzfs.__version__
    assert lmzfs.pack_file is singlefile.pack_file and lmzfs.unpack_file is singlefile.unpack_file
    with pytest.raises(AttributeError):
        lmzfs.no_such_thing  # noqa: B018


# ---------------------------------------------------------------- damage is refused, nothing published

def test_every_truncation_of_a_small_archive_is_refused(tmp_path):
    archive = pack_bytes(tmp_path, b"hello, world")
    for n in range(len(archive)):
        assert_refused(tmp_path, archive[:n], "truncated" if n else "truncated: the 24-byte header")


def test_truncation_at_many_points_of_a_multi_chunk_archive_is_refused(tmp_path):
    src = multi_chunk_model(tmp_path / "m.safetensors")
    pack_file(src, tmp_path / "m.lmz")
    archive = (tmp_path / "m.lmz").read_bytes()
    cuts = {0, 1, 7, 8, 23, 24, 25, len(archive) - TRAILER, len(archive) - 1}
    for pos, _, payload in records(archive):
        cuts |= {pos, pos + 1, pos + RECORD - 1, pos + RECORD, pos + RECORD + payload // 2, pos + RECORD + payload - 1}
    cuts |= {len(archive) * i // 23 for i in range(23)}
    for n in sorted(cuts):
        assert_refused(tmp_path, archive[:n], "truncated")


def test_a_flipped_byte_in_any_payload_is_refused(tmp_path):
    src = multi_chunk_model(tmp_path / "m.safetensors")
    pack_file(src, tmp_path / "m.lmz")
    archive = (tmp_path / "m.lmz").read_bytes()
    for i, (pos, _, payload) in enumerate(records(archive)):
        for at in (pos + RECORD + payload // 2, pos + RECORD + payload - 1):
            damaged = bytearray(archive)
            damaged[at] ^= 0x04
            assert_refused(tmp_path, bytes(damaged), f"chunk {i}")


def test_a_flipped_byte_anywhere_in_the_header_or_the_trailer_is_refused(tmp_path):
    archive = pack_bytes(tmp_path, os.urandom(1000))
    for at in [*range(HEADER), *range(len(archive) - TRAILER, len(archive))]:
        damaged = bytearray(archive)
        damaged[at] ^= 0x01
        assert_refused(tmp_path, bytes(damaged), "magic|version|checksum|trailer|truncated|chunk 0")


def test_a_wrong_sha256_under_a_valid_trailer_crc_is_refused(tmp_path):
    data = b"some model bytes"
    archive = pack_bytes(tmp_path, data)
    (pos, _, payload), = records(archive)
    forged = archive[:-TRAILER] + doc_trailer(1, len(data), payload, hashlib.sha256(b"other").digest())
    assert_refused(tmp_path, forged, "SHA-256 of the unpacked data")


def test_trailing_data_after_the_trailer_is_refused(tmp_path):
    archive = pack_bytes(tmp_path, b"abc")
    assert_refused(tmp_path, archive + b"\x00", "trailing data")
    assert_refused(tmp_path, archive + archive, "trailing data")


def test_an_unknown_version_is_refused_as_unsupported(tmp_path):
    archive = pack_bytes(tmp_path, b"abc")
    assert_refused(tmp_path, doc_header(3, version=2) + archive[HEADER:], "unsupported archive format version 2")
    assert_refused(tmp_path, doc_header(3, flags=1) + archive[HEADER:], "unknown header flags")


def test_files_that_are_not_archives_are_refused_by_magic(tmp_path, minilm_path):
    assert_refused(tmp_path, minilm_path.read_bytes()[:4096], "not an lmz single-file archive")
    assert_refused(tmp_path, b"LMZ2" + bytes(100), "not an lmz single-file archive")


def test_chunk_tables_that_do_not_tile_the_declared_size_are_refused(tmp_path):
    data = os.urandom(3000)
    archive = pack_bytes(tmp_path, data)
    body = archive[HEADER:]
    assert_refused(tmp_path, doc_header(2999) + body, "runs past the declared size")
    assert_refused(tmp_path, doc_header(3001) + body, "the trailer follows chunk 0 at plain offset 3000, but the "
                                                      "header declares 3001 bytes")
    (pos, plain, payload), = records(archive)
    zero = archive[:pos] + struct.pack("<III", 0, payload, 0) + archive[pos + RECORD:]
    assert_refused(tmp_path, zero, "plain length 0")
    shorter = archive[:pos] + struct.pack("<III", plain - 1, payload, 0) + archive[pos + RECORD:]
    assert_refused(tmp_path, doc_header(plain - 1) + shorter[HEADER:], "chunk 0")


def test_absurd_lengths_are_refused_before_anything_is_allocated(tmp_path):
    huge = doc_header(1 << 40)
    assert_refused(tmp_path, huge + struct.pack("<III", 0xFFFFFFFF, 10, 0), "plain length 4294967295")
    assert_refused(tmp_path, huge + struct.pack("<III", 1 << 20, 0xFFFFFFFF, 0), "payload length 4294967295")
    assert_refused(tmp_path, doc_header(UNLIMITED), "truncated: header of chunk 0")
    assert_refused(tmp_path, doc_header((1 << 64) - 1), "unpacks to 18446744073709551615 bytes", OutputLimitExceeded)


def test_a_failed_unpack_leaves_an_existing_destination_untouched_even_with_overwrite(tmp_path):
    archive = bytearray(pack_bytes(tmp_path, os.urandom(5000)))
    archive[HEADER + RECORD + 100] ^= 0xFF
    (tmp_path / "bad.lmz").write_bytes(archive)
    (tmp_path / "out").write_bytes(b"precious")
    with pytest.raises(InvalidArchive, match="chunk 0"):
        unpack_file(tmp_path / "bad.lmz", tmp_path / "out", max_output_bytes=UNLIMITED, overwrite=True)
    assert (tmp_path / "out").read_bytes() == b"precious"
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".part")]


# ---------------------------------------------------------------- destinations and limits

def test_existing_destinations_are_refused_without_overwrite_and_replaced_with_it(tmp_path, capsys):
    src, archive, out = tmp_path / "src", tmp_path / "a.lmz", tmp_path / "out"
    src.write_bytes(b"new contents")
    archive.write_bytes(b"old archive")
    out.write_bytes(b"old output")
    assert lmz(["pack", str(src), str(archive)]) == 2
    assert "exists; pass --overwrite" in capsys.readouterr().err
    assert archive.read_bytes() == b"old archive"
    with pytest.raises(DestinationExists):
        pack_file(src, archive)
    assert lmz(["pack", str(src), str(archive), "--overwrite"]) == 0
    assert lmz(["unpack", str(archive), str(out), "--max-output-bytes", "1M"]) == 2
    assert out.read_bytes() == b"old output"
    assert lmz(["unpack", str(archive), str(out), "--max-output-bytes", "1M", "--overwrite"]) == 0
    assert out.read_bytes() == b"new contents"


def test_a_max_output_bytes_below_the_file_size_is_refused_with_nothing_written(tmp_path, capsys):
    data = os.urandom(10_000)
    (tmp_path / "a.lmz").write_bytes(pack_bytes(tmp_path, data))
    with pytest.raises(OutputLimitExceeded, match="10000 bytes, more than --max-output-bytes 9999"):
        unpack_file(tmp_path / "a.lmz", tmp_path / "out", max_output_bytes=9999)
    assert lmz(["unpack", str(tmp_path / "a.lmz"), str(tmp_path / "out"), "--max-output-bytes", "9K"]) == 1
    assert "more than --max-output-bytes 9216" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.lmz", "src.bin", "src.bin.lmz"]
    unpack_file(tmp_path / "a.lmz", tmp_path / "out", max_output_bytes=10_000)
    assert (tmp_path / "out").read_bytes() == data


def test_unpack_requires_max_output_bytes(tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        lmz(["unpack", str(tmp_path / "a.lmz"), str(tmp_path / "out")])
    assert exc.value.code == 2
    assert "--max-output-bytes" in capsys.readouterr().err


def test_missing_sources_and_directory_destinations_are_usage_errors(tmp_path, capsys):
    (tmp_path / "f").write_bytes(b"x")
    with pytest.raises(UsageError, match="no such file"):
        pack_file(tmp_path / "missing", tmp_path / "a.lmz")
    with pytest.raises(UsageError, match="is a directory"):
        pack_file(tmp_path, tmp_path / "a.lmz")
    with pytest.raises(UsageError, match="is a directory"):
        pack_file(tmp_path / "f", tmp_path, overwrite=True)
    with pytest.raises(UsageError, match="no such directory"):
        pack_file(tmp_path / "f", tmp_path / "nowhere" / "a.lmz")
    with pytest.raises(UsageError, match="no such directory for the report"):
        pack_file(tmp_path / "f", tmp_path / "a.lmz", report=tmp_path / "nowhere" / "r.json")
    os.mkfifo(tmp_path / "fifo")
    with pytest.raises(UsageError, match="not a regular file"):
        pack_file(tmp_path / "fifo", tmp_path / "a.lmz")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f", "fifo"]
    assert lmz(["unpack", str(tmp_path / "missing"), str(tmp_path / "o"), "--max-output-bytes", "1G"]) == 2
    assert capsys.readouterr().err.count("\n") == 1


def test_corrupt_input_is_one_line_on_stderr_and_exit_status_1(tmp_path, capsys):
    (tmp_path / "a.lmz").write_bytes(pack_bytes(tmp_path, b"abc")[:-1])
    assert lmz(["unpack", str(tmp_path / "a.lmz"), str(tmp_path / "out"), "--max-output-bytes", "1G"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("lmz: truncated: trailer") and err.count("\n") == 1 and "Traceback" not in err


def test_a_source_that_changes_while_packing_is_refused(tmp_path):
    src = multi_chunk_model(tmp_path / "m.safetensors")

    def grow(done: int, total: int) -> None:
        with open(src, "ab") as f:
            f.write(b"\0")

    with pytest.raises(SourceChanged):
        pack_file(src, tmp_path / "m.lmz", progress=grow)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.safetensors"]


def test_reports_give_sizes_saving_codecs_speed_and_sha256(tmp_path, capsys):
    src = multi_chunk_model(tmp_path / "m.safetensors")
    assert lmz(["pack", str(src), str(tmp_path / "m.lmz"), "--report", str(tmp_path / "pack.json")]) == 0
    assert "% saved" in capsys.readouterr().out
    p = json.loads((tmp_path / "pack.json").read_text())
    assert p["operation"] == "pack" and p["format"] == "safetensors"
    assert p["plain_bytes"] == src.stat().st_size and p["archive_bytes"] == (tmp_path / "m.lmz").stat().st_size
    assert p["saved_bytes"] == p["plain_bytes"] - p["archive_bytes"]
    assert p["saved_pct"] == round(100 * p["saved_bytes"] / p["plain_bytes"], 3)
    assert sum(c["chunks"] for c in p["codecs"].values()) == p["chunks"]
    assert p["chunks"] == len(records((tmp_path / "m.lmz").read_bytes()))
    assert p["sha256"] == sha(src) and p["seconds"] > 0 and p["mb_per_s"] > 0
    assert lmz(["unpack", str(tmp_path / "m.lmz"), str(tmp_path / "out"), "--max-output-bytes", "1G",
                "--report", str(tmp_path / "unpack.json")]) == 0
    u = json.loads((tmp_path / "unpack.json").read_text())
    assert u["operation"] == "unpack" and u["sha256"] == p["sha256"] and u["plain_bytes"] == p["plain_bytes"]
    assert u["chunks"] == p["chunks"] and u["mb_per_s"] > 0


# ---------------------------------------------------------------- bounded memory

# VmHWM, not ru_maxrss: Linux carries ru_maxrss across execve, so a child would report the
# forking pytest process's own peak.
_PEAK_RSS_CHILD = """
import re, sys
from lmzfs import pack_file, unpack_file
op, a, b = sys.argv[1:4]
if op == "pack":
    pack_file(a, b)
else:
    unpack_file(a, b, max_output_bytes=1 << 40)
print(int(re.search(r"VmHWM:\\s*(\\d+) kB", open("/proc/self/status").read()).group(1)) * 1024)
"""


def test_packing_and_unpacking_a_300_MB_file_stays_under_150_MB_of_memory(tmp_path):
    # A mostly sparse file (zero pages cost no disk), with random 64 KiB blocks so that every
    # codec path runs; peak RSS must not grow with the file.
    src = tmp_path / "big.bin"
    size = 300 * 10**6
    with open(src, "wb") as f:
        f.truncate(size)
        for off in range(0, size - (64 << 10), 8 << 20):
            f.seek(off)
            f.write(os.urandom(64 << 10))
    peaks = {}
    for op, a, b in (("pack", src, tmp_path / "big.lmz"), ("unpack", tmp_path / "big.lmz", tmp_path / "big.out")):
        done = subprocess.run([sys.executable, "-c", _PEAK_RSS_CHILD, op, str(a), str(b)], capture_output=True,
                              text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        peaks[op] = int(done.stdout)
    assert (tmp_path / "big.out").stat().st_size == size
    assert sha(tmp_path / "big.out") == sha(src)
    assert peaks["pack"] < 150e6 and peaks["unpack"] < 150e6, peaks
    print(f"peak RSS: {peaks}")
