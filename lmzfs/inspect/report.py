"""The result of `lmz inspect`, as JSON and as a compact table."""
from __future__ import annotations

from dataclasses import dataclass, field

from lmzfs.progress import human_bytes

from .pickles import PickleScan
from .saving import GroupPrediction


@dataclass
class DtypeTotals:
    tensors: int = 0
    elements: int | None = 0     # None when unknown (PyTorch storages carry no dtype or shape here)
    bytes: int = 0


@dataclass
class InspectReport:
    path: str
    format: str
    size: int
    error: str | None                       # the FormatError that made parse_file fall back to opaque
    tensors: int = 0
    dtypes: dict[str, DtypeTotals] = field(default_factory=dict)
    header_bytes: int = 0
    padding_bytes: int = 0
    opaque_bytes: int = 0
    details: dict = field(default_factory=dict)
    issues: list[str] = field(default_factory=list)
    pickles: list[PickleScan] = field(default_factory=list)
    unsafe_entries: list[str] = field(default_factory=list)   # zip members named '../x', '/x', 'a\\b'
    groups: list[GroupPrediction] = field(default_factory=list)
    archive_overhead_bytes: int = 0         # what `lmz pack` adds: header, record headers, trailer
    sha256: str | None = None

    @property
    def suspicious(self) -> list[str]:
        return [f"{p.entry}: {ref}" for p in self.pickles for ref in p.suspicious]

    @property
    def ok(self) -> bool:
        return self.error is None and not self.suspicious and not self.unsafe_entries

    @property
    def predicted_stored_bytes(self) -> int:
        return sum(g.predicted_stored_bytes for g in self.groups)

    @property
    def predicted_saved_pct(self) -> float:
        return 100.0 * (1 - self.predicted_stored_bytes / self.size) if self.size else 0.0

    def to_json(self) -> dict:
        return {
            "path": self.path, "format": self.format, "size": self.size, "error": self.error, "ok": self.ok,
            "tensors": self.tensors,
            "dtypes": {k: vars(v) for k, v in self.dtypes.items()},
            "header_bytes": self.header_bytes, "padding_bytes": self.padding_bytes, "opaque_bytes": self.opaque_bytes,
            "details": self.details, "issues": self.issues,
            "pickles": [p.to_json() for p in self.pickles], "suspicious": self.suspicious,
            "unsafe_entries": self.unsafe_entries,
            "prediction": {
                "groups": {g.group: g.to_json() for g in self.groups},
                "sampled_bytes": sum(g.sampled_bytes for g in self.groups),
                "stored_bytes": self.predicted_stored_bytes,
                "pack_archive_bytes": self.predicted_stored_bytes + self.archive_overhead_bytes,
                "saved_pct": round(self.predicted_saved_pct, 3),
            },
            "sha256": self.sha256,
        }

    def human_lines(self) -> list[str]:
        lines = [f"{self.path}: {self.format}, {human_bytes(self.size)} ({self.size} bytes), "
                 f"{self.tensors} tensor(s)"]
        if self.error:
            lines.append(f"FormatError: {self.error} (stored as opaque bytes)")
        shown = {k: v for k, v in self.details.items() if k not in ("entries", "metadata")}
        if shown:
            lines.append("  " + ", ".join(f"{k} {v}" for k, v in shown.items()))
        if self.details.get("metadata"):
            lines.append("  " + ", ".join(f"{k}={v}" for k, v in self.details["metadata"].items()))
        if "entries" in self.details:
            lines.append(f"  zip entries: {len(self.details['entries'])}")
        lines.append(f"  header {human_bytes(self.header_bytes)}, padding {human_bytes(self.padding_bytes)}, "
                     f"opaque {human_bytes(self.opaque_bytes)}")
        rows = [("GROUP", "TENSORS", "ELEMENTS", "BYTES", "SAMPLED", "PREDICTED", "SAVED")]
        for g in self.groups:
            t = self.dtypes.get(g.group)
            rows.append((g.group, str(t.tensors) if t else "-",
                         "-" if t is None or t.elements is None else str(t.elements), human_bytes(g.bytes),
                         human_bytes(g.sampled_bytes), human_bytes(g.predicted_stored_bytes), f"{g.saved_pct:.2f}%"))
        lines += ["  " + line for line in _table(rows)]
        lines.append(f"  predicted: {human_bytes(self.predicted_stored_bytes)} stored, "
                     f"{self.predicted_saved_pct:.2f}% saved")
        for p in self.pickles:
            lines.append(f"  pickle {p.entry}: {len(p.imports)} import(s){': ' if p.imports else ''}"
                         f"{', '.join(p.imports[:12])}{' ...' if len(p.imports) > 12 else ''}")
            if p.error:
                lines.append(f"    scan stopped: {p.error}")
        for p in self.pickles:
            for ref in p.suspicious:
                lines.append(f"  SUSPICIOUS: {p.entry} imports {ref}; unpickling this file would import it")
        for name in self.unsafe_entries:
            lines.append(f"  UNSAFE: zip member {name!r} is absolute or climbs out ('..', '/', '\\'); "
                         f"extracting this file would write outside its directory")
        lines += [f"  note: {i}" for i in self.issues]
        if self.sha256:
            lines.append(f"  sha256 {self.sha256}")
        return lines


def _table(rows: list[tuple[str, ...]]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths))).rstrip()
            for r in rows]
