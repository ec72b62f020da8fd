"""PyTorch zip checkpoints (torch.save >= 1.6), parsed from the zip structures, never unpickled.

Only the central directory is trusted to list entries; each entry's local header is then read
to find where its data starts. Every offset and size is checked against the file, and the
pieces (local headers, data, data descriptors, central directory, ZIP64 records, EOCD) must not
overlap. Bytes no structure accounts for become "opaque" segments, so the file still tiles.
Each storage entry gets the dtype its archive's data.pkl names for it (torchpickle: read from the
opcodes, never run), when that pickle is stored uncompressed and at most MAX_PICKLE bytes.
"""
from __future__ import annotations

import re
import struct
from dataclasses import dataclass
from typing import BinaryIO

from .bounds import too_many
from .segments import FileLayout, FormatError, Segment
from .torchpickle import storage_dtypes

_EOCD_SIG = b"PK\x05\x06"
_Z64_LOCATOR_SIG = b"PK\x06\x07"
_Z64_EOCD_SIG = b"PK\x06\x06"
_CDH_SIG = b"PK\x01\x02"
_LFH_SIG = b"PK\x03\x04"
_DD_SIG = b"PK\x07\x08"
_EOCD_LEN, _LOCATOR_LEN, _Z64_EOCD_MIN, _CDH_LEN, _LFH_LEN = 22, 20, 56, 46, 30
_MAX_COMMENT = 0xFFFF
MAX_CENTRAL_DIR = 256 << 20
MAX_PICKLE = 64 << 20           # a data.pkl read for its storages' dtypes (a large model's is a few MB)
_TENSOR_ENTRY = re.compile(r".+/data/[^/]+")   # torch.save writes <archive>/data/<storage key>


class NotTorchZip(FormatError):
    """A well-formed zip that is not a PyTorch checkpoint (no data.pkl): not an error, just not ours."""


@dataclass(frozen=True)
class _Entry:
    name: str
    method: int
    flags: int
    crc: int
    csize: int
    usize: int
    lho: int          # local header offset
    zip64: bool       # sizes or offset came from a ZIP64 extra field


@dataclass(frozen=True)
class _Piece:
    offset: int
    length: int
    kind: str
    name: str | None = None
    what: str = ""    # for error messages


def _read_at(path: str, f: BinaryIO, size: int, off: int, n: int, what: str) -> bytes:
    if off < 0 or n < 0 or off + n > size:
        raise FormatError(path, f"{what} [{off}, {off + n}) lies outside the {size}-byte file")
    f.seek(off)
    b = f.read(n)
    if len(b) != n:
        raise FormatError(path, f"file truncated while reading {what} at offset {off}")
    return b


def _find_eocd(path: str, f: BinaryIO, size: int) -> int:
    # The EOCD is the last record, followed only by its own comment; search the tail backwards
    # for a signature whose comment length ends exactly at the end of the file.
    tail_len = min(size, _EOCD_LEN + _MAX_COMMENT)
    tail = _read_at(path, f, size, size - tail_len, tail_len, "end of central directory search area")
    i = tail.rfind(_EOCD_SIG)
    while i >= 0:
        if i + _EOCD_LEN <= tail_len:
            (clen,) = struct.unpack_from("<H", tail, i + 20)
            if i + _EOCD_LEN + clen == tail_len:
                return size - tail_len + i
        i = tail.rfind(_EOCD_SIG, 0, i)
    raise FormatError(path, "no end of central directory record")


@dataclass(frozen=True)
class _Directory:
    count: int
    cd_offset: int
    cd_size: int
    pieces: tuple[_Piece, ...]   # EOCD and, for ZIP64, its locator and record


def _read_directory(path: str, f: BinaryIO, size: int) -> _Directory:
    eocd = _find_eocd(path, f, size)
    rec = _read_at(path, f, size, eocd, _EOCD_LEN, "EOCD")
    disk, cd_disk, n_disk, count, cd_size, cd_offset, clen = struct.unpack_from("<4H2IH", rec, 4)
    pieces = [_Piece(eocd, _EOCD_LEN + clen, "header", what="EOCD")]
    loc_off = eocd - _LOCATOR_LEN
    is_z64 = loc_off >= 0 and _read_at(path, f, size, loc_off, 4, "ZIP64 locator") == _Z64_LOCATOR_SIG
    if is_z64:
        loc = _read_at(path, f, size, loc_off, _LOCATOR_LEN, "ZIP64 locator")
        _, z64_off, n_disks = struct.unpack_from("<IQI", loc, 4)
        if z64_off + _Z64_EOCD_MIN > loc_off:
            raise FormatError(path, f"ZIP64 EOCD offset {z64_off} is not before its locator at {loc_off}")
        z = _read_at(path, f, size, z64_off, _Z64_EOCD_MIN, "ZIP64 EOCD")
        if z[:4] != _Z64_EOCD_SIG:
            raise FormatError(path, f"no ZIP64 EOCD signature at offset {z64_off}")
        rec_size, _, _, disk, cd_disk, n_disk, count, cd_size, cd_offset = struct.unpack_from(
            "<QHHIIQQQQ", z, 4)
        if rec_size < _Z64_EOCD_MIN - 12 or z64_off + 12 + rec_size > loc_off:
            raise FormatError(path, f"ZIP64 EOCD record size {rec_size} is inconsistent")
        pieces += [_Piece(z64_off, 12 + rec_size, "header", what="ZIP64 EOCD"),
                   _Piece(loc_off, _LOCATOR_LEN, "header", what="ZIP64 locator")]
        if n_disks > 1:   # some writers put 0 here, meaning the same thing as 1
            raise FormatError(path, f"ZIP64 locator says the archive spans {n_disks} disks")
    if disk or cd_disk or n_disk != count:
        raise FormatError(path, "multi-disk zip archives are not supported")
    if cd_offset + cd_size > size:
        raise FormatError(path, f"central directory [{cd_offset}, {cd_offset + cd_size}) runs past the "
                                f"end of the {size}-byte file")
    if cd_size > MAX_CENTRAL_DIR:
        raise FormatError(path, f"central directory of {cd_size} bytes exceeds {MAX_CENTRAL_DIR}")
    if count * _CDH_LEN > cd_size:
        raise FormatError(path, f"{count} entries cannot fit in a {cd_size}-byte central directory")
    why = too_many(count, size, "zip entries")
    if why:
        raise FormatError(path, why)
    pieces.append(_Piece(cd_offset, cd_size, "header", what="central directory"))
    return _Directory(count, cd_offset, cd_size, tuple(pieces))


def _zip64_extra(path: str, extra: bytes, name: str, usize: int, csize: int, lho: int
                 ) -> tuple[int, int, int, bool]:
    # Only the fields whose 32-bit slot is 0xFFFFFFFF are present, in this fixed order.
    i = 0
    while i + 4 <= len(extra):
        hid, hlen = struct.unpack_from("<HH", extra, i)
        body = extra[i + 4:i + 4 + hlen]
        if len(body) != hlen:
            raise FormatError(path, f"entry {name!r} extra field overruns its extra data")
        if hid == 0x0001:
            vals, j = [], 0
            for v in (usize, csize, lho):
                if v == 0xFFFFFFFF:
                    if j + 8 > hlen:
                        raise FormatError(path, f"entry {name!r} ZIP64 extra field is too short")
                    v = struct.unpack_from("<Q", body, j)[0]
                    j += 8
                vals.append(v)
            return vals[0], vals[1], vals[2], True
        i += 4 + hlen
    if 0xFFFFFFFF in (usize, csize, lho):
        raise FormatError(path, f"entry {name!r} needs a ZIP64 extra field but has none")
    return usize, csize, lho, False


def _entries(path: str, cd: bytes, count: int) -> list[_Entry]:
    out, i = [], 0
    for k in range(count):
        if i + _CDH_LEN > len(cd) or cd[i:i + 4] != _CDH_SIG:
            raise FormatError(path, f"central directory entry {k} at +{i} is missing or malformed")
        (flags, method, crc, csize, usize, nlen, xlen, clen, lho) = struct.unpack_from(
            "<8xHH4xIIIHHH8xI", cd, i)
        end = i + _CDH_LEN + nlen + xlen + clen
        if end > len(cd):
            raise FormatError(path, f"central directory entry {k} overruns the directory")
        raw = cd[i + _CDH_LEN:i + _CDH_LEN + nlen]
        name = raw.decode("utf-8" if flags & 0x800 else "cp437", errors="replace")
        extra = cd[i + _CDH_LEN + nlen:i + _CDH_LEN + nlen + xlen]
        usize, csize, lho, z64 = _zip64_extra(path, extra, name, usize, csize, lho)
        if flags & 0x1:
            raise FormatError(path, f"entry {name!r} is encrypted")
        out.append(_Entry(name, method, flags, crc, csize, usize, lho, z64))
        i = end
    if i != len(cd):
        raise FormatError(path, f"central directory has {len(cd) - i} bytes after its {count} entries")
    return out


def _descriptor_len(path: str, f: BinaryIO, size: int, e: _Entry, at: int) -> int:
    # A data descriptor follows the data when flag bit 3 is set: optional signature, CRC, then
    # sizes of 4 or 8 bytes. Accept exactly the layout whose fields match the central directory.
    avail = min(24, size - at)
    b = _read_at(path, f, size, at, avail, f"data descriptor of {e.name!r}")
    for sig in (True, False):
        base = 4 if sig else 0
        if sig and b[:4] != _DD_SIG:
            continue
        for fmt in ("<IQQ", "<III"):
            n = struct.calcsize(fmt)
            if base + n <= avail and struct.unpack_from(fmt, b, base) == (e.crc, e.csize, e.usize):
                return base + n
    raise FormatError(path, f"entry {e.name!r} has no data descriptor matching its central directory")


def _entry_pieces(path: str, f: BinaryIO, size: int, e: _Entry) -> list[_Piece]:
    lfh = _read_at(path, f, size, e.lho, _LFH_LEN, f"local header of {e.name!r}")
    if lfh[:4] != _LFH_SIG:
        raise FormatError(path, f"no local header signature for {e.name!r} at offset {e.lho}")
    nlen, xlen = struct.unpack_from("<HH", lfh, 26)
    raw = _read_at(path, f, size, e.lho + _LFH_LEN, nlen, f"local name of {e.name!r}")
    if raw.decode("utf-8" if e.flags & 0x800 else "cp437", errors="replace") != e.name:
        raise FormatError(path, f"local header name {raw!r} differs from central directory {e.name!r}")
    data = e.lho + _LFH_LEN + nlen + xlen
    if data + e.csize > size:
        raise FormatError(path, f"entry {e.name!r} data [{data}, {data + e.csize}) runs past the end of "
                                f"the {size}-byte file")
    out = [_Piece(e.lho, data - e.lho, "header", what=f"local header of {e.name!r}")]
    if e.method != 0:
        kind = "opaque"   # compressed bytes have no tensor structure we could use
    elif _TENSOR_ENTRY.fullmatch(e.name):
        kind = "tensor"
    else:
        kind = "header"
    if e.method == 0 and e.csize != e.usize:
        raise FormatError(path, f"stored entry {e.name!r} has compressed size {e.csize} != {e.usize}")
    out.append(_Piece(data, e.csize, kind, e.name if kind == "tensor" else None, f"data of {e.name!r}"))
    if e.flags & 0x8:
        at = data + e.csize
        out.append(_Piece(at, _descriptor_len(path, f, size, e, at), "header",
                          what=f"data descriptor of {e.name!r}"))
    return out


def _typed(s: Segment, dtypes: dict[str, dict[str, tuple[str, int]]]) -> Segment:
    """A storage entry's segment with the dtype its archive's data.pkl gives its key."""
    if s.kind != "tensor" or s.name is None or "/data/" not in s.name:
        return s
    prefix, _, key = s.name.rpartition("/data/")
    dtype, itemsize = dtypes.get(prefix + "/", {}).get(key, (None, 0))
    if dtype is None or s.length % itemsize:
        return s
    return Segment(s.offset, s.length, s.kind, s.name, dtype, None, itemsize)


def zip_entry_count(path: str, f: BinaryIO, size: int) -> int:
    """How many entries the zip's directory declares, once its records are known to be in bounds;
    FormatError otherwise. What a zip reader may be handed without reading a hostile directory."""
    return _read_directory(path, f, size).count


def parse_torch_zip(path: str, f: BinaryIO, size: int) -> FileLayout:
    """Split a PyTorch zip checkpoint into header, tensor, opaque (and gap) segments.

    Raises NotTorchZip (a FormatError) for a valid zip without a data.pkl entry.
    """
    d = _read_directory(path, f, size)
    cd = _read_at(path, f, size, d.cd_offset, d.cd_size, "central directory")
    entries = _entries(path, cd, d.count)
    if not any(e.name == "data.pkl" or e.name.endswith("/data.pkl") for e in entries):
        raise NotTorchZip(path, "zip archive has no data.pkl entry")
    pieces = list(d.pieces)
    dtypes: dict[str, dict[str, tuple[str, int]]] = {}      # archive prefix -> storage key -> dtype
    for e in entries:
        own = _entry_pieces(path, f, size, e)
        pieces += own
        if e.name.endswith("data.pkl") and e.method == 0 and e.usize <= MAX_PICKLE:
            data = own[1]
            raw = _read_at(path, f, size, data.offset, data.length, f"data of {e.name!r}")
            dtypes[e.name[:-len("data.pkl")]] = storage_dtypes(raw)
    pieces.sort(key=lambda p: (p.offset, p.length))

    segs: list[Segment] = []
    pos = 0
    prev: _Piece | None = None
    for p in pieces:
        if p.offset < pos:
            assert prev is not None
            raise FormatError(path, f"{p.what} at offset {p.offset} overlaps {prev.what} ending at {pos}")
        if p.offset > pos:
            segs.append(Segment(pos, p.offset - pos, "opaque"))   # bytes no record accounts for
        if p.length:
            segs.append(_typed(Segment(p.offset, p.length, p.kind, p.name), dtypes))
        pos, prev = p.offset + p.length, p
    if pos != size:   # the EOCD ends the file by construction, so this is a bug, not bad input
        raise AssertionError(f"zip pieces end at {pos}, file size is {size}")
    return FileLayout("pytorch-zip", size, tuple(segs))
