"""The compression table: for each subject and each tool, stored bytes, saved %, encode and decode MB/s.

Runs are interleaved (run 1 of every tool, then run 2, ...) so that a noisy stretch of a shared
machine spreads over all tools instead of landing on one. Every measurement is file to file with
the input in the page cache: CLI tools are timed as whole processes (start-up included, and
measured on its own as `startup_s`), ZipNN as read + compress + write in this process. Archives are
decoded to files and checked byte for byte (SHA-256) on the first run. Stores have no decoder but
their mount: their decode column is a sequential 1 MiB read of every file through a fresh mount,
with the store's own files in the page cache, and the served bytes are checked on the first run.

A tool that fails is n/a with its error; everything else is still measured.
"""
from __future__ import annotations

import os
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from common import ToolError, cli_startup_s, code_state, describe, log, rates, sha256_file, warm_page_cache
from tools import Subject, Tool


@dataclass
class ToolRuns:
    tool: str
    kind: str
    ours: bool
    version: str
    stored_bytes: int | None = None
    saved_pct: float | None = None
    encode_s: list[float] = field(default_factory=list)
    decode_s: list[float] = field(default_factory=list)
    mount_ready_s: list[float] = field(default_factory=list)
    stored_bytes_per_run: list[int] = field(default_factory=list)
    lossless_checked: bool = False
    startup_s: float | None = None
    notes: dict = field(default_factory=dict)
    error: str | None = None                 # encode failed: the row is n/a
    decode_error: str | None = None

    def finish(self, nbytes: int) -> dict:
        if self.stored_bytes_per_run:
            self.stored_bytes = self.stored_bytes_per_run[-1]
            self.saved_pct = 100.0 * (1 - self.stored_bytes / nbytes)
        d = dict(self.__dict__)
        d["encode_mbps"] = rates(nbytes, self.encode_s)
        d["decode_mbps"] = rates(nbytes, self.decode_s)
        return d


def _one_run(tool: Tool, subject: Subject, res: ToolRuns, digests: list[str], first: bool, tmp: Path) -> None:
    work = Path(tempfile.mkdtemp(prefix="run-", dir=tmp))
    try:
        warm_page_cache(subject.files)
        try:
            start = time.perf_counter()
            enc = tool.encode(subject, work)
            res.encode_s.append(time.perf_counter() - start)
        except Exception as exc:  # fail soft: this tool is n/a, the others go on
            res.error = describe(exc)
            return
        res.stored_bytes_per_run.append(enc.stored_bytes)
        res.notes.update(enc.notes)
        if res.decode_error:
            return
        os.sync()   # untimed: what was just written is not written back during the decode
        try:
            if tool.kind == "archive":
                start = time.perf_counter()
                outs = tool.decode(enc, subject, work)
                res.decode_s.append(time.perf_counter() - start)
                if first:
                    for out, digest in zip(outs, digests):
                        if sha256_file(out) != digest:
                            raise ToolError(f"decoded {out.name} differs from the original (SHA-256 mismatch)")
            else:
                ready_s, read_s = tool.read_through_mount(enc, subject, work, verify=first)
                res.decode_s.append(read_s)
                res.mount_ready_s.append(ready_s)
            res.lossless_checked = res.lossless_checked or first
        except Exception as exc:
            res.decode_error = describe(exc)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def measure(subjects: list[Subject], tools: list[Tool], runs: int, tmp: Path) -> list[dict]:
    """Every subject with every tool, `runs` times each; one result dict per subject."""
    status = {}
    for tool in tools:
        reason = tool.unavailable()
        if reason is None:
            try:
                tool.prepare()
            except Exception as exc:
                reason = describe(exc)
        startup = None
        if reason is None and tool.startup_argv():
            startup = cli_startup_s(tool.startup_argv())
        status[tool.name] = (reason, tool.version() if reason is None else "n/a", startup)
    out = []
    for subject in subjects:
        code_before = code_state()["source_sha256"]
        digests = [sha256_file(f) for f in subject.files]
        results = {t.name: ToolRuns(t.name, t.kind, t.ours, status[t.name][1], startup_s=status[t.name][2],
                                    error=status[t.name][0]) for t in tools}
        for i in range(runs):
            for tool in tools:
                res = results[tool.name]
                if res.error:
                    continue
                log(f"compress {subject.name}: {tool.name} run {i + 1}/{runs}")
                _one_run(tool, subject, res, digests, i == 0, tmp)
        nbytes = subject.nbytes
        rows = [results[t.name].finish(nbytes) for t in tools]
        for r in rows:
            log(f"compress {subject.name}: {r['tool']}: " + (f"n/a: {r['error']}" if r["error"] else
                f"saved {r['saved_pct']:.2f}%" + (f" (decode n/a: {r['decode_error']})" if r["decode_error"] else "")))
        out.append({"subject": subject.name, "note": subject.note, "bytes": nbytes,
                    "files": [{"name": f.name, "bytes": f.stat().st_size, "sha256": d}
                              for f, d in zip(subject.files, digests)],
                    "tools": rows, "code_before": code_before, "code_after": code_state()["source_sha256"]})
    return out
