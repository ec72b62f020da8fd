"""What pack and unpack report: sizes, saving, codec use, speed, the file's SHA-256."""
from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path


@dataclass
class CodecUse:
    chunks: int = 0
    plain_bytes: int = 0
    payload_bytes: int = 0


class _Rates:
    """Figures both reports derive from their sizes and time."""
    archive_bytes: int
    plain_bytes: int
    seconds: float

    @property
    def saved_pct(self) -> float:
        return 100.0 * (1 - self.archive_bytes / self.plain_bytes) if self.plain_bytes else 0.0

    @property
    def mb_per_s(self) -> float:
        return self.plain_bytes / self.seconds / 1e6 if self.seconds > 0 else 0.0


@dataclass
class PackReport(_Rates):
    source: str
    dest: str
    format: str = "opaque"         # container format of the source, from parse_file
    plain_bytes: int = 0           # size of the source file
    archive_bytes: int = 0         # size of the archive written
    chunks: int = 0
    codecs: dict[str, CodecUse] = field(default_factory=dict)
    seconds: float = 0.0
    sha256: str = ""

    def to_json(self) -> dict:
        d = asdict(self)
        d = {"operation": "pack", **d, "saved_bytes": self.plain_bytes - self.archive_bytes,
             "saved_pct": round(self.saved_pct, 3), "mb_per_s": round(self.mb_per_s, 3)}
        d["seconds"] = round(self.seconds, 6)
        return d


@dataclass
class UnpackReport(_Rates):
    source: str
    dest: str
    archive_bytes: int = 0
    plain_bytes: int = 0
    chunks: int = 0
    seconds: float = 0.0
    sha256: str = ""

    def to_json(self) -> dict:
        return {"operation": "unpack", **asdict(self), "seconds": round(self.seconds, 6),
                "saved_pct": round(self.saved_pct, 3), "mb_per_s": round(self.mb_per_s, 3)}


def write_report(path: str | os.PathLike, report: PackReport | UnpackReport) -> None:
    """Write the report as JSON; replaced atomically so a reader never sees half of one."""
    p = Path(path)
    tmp = p.with_name(f".{p.name}.part")
    tmp.write_text(json.dumps(report.to_json(), indent=1) + "\n")
    os.replace(tmp, p)
