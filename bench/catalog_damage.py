#!/usr/bin/env python3
"""Issue 28's goal, measured: damage the catalog of a store of real models (zero one 4 KiB
page, aligned or not, or flip one bit), run the commands a user would, `lmz verify --repair`,
then read every file back through a real mount and compare its SHA-256 with the original's.

    .venv/bin/python bench/catalog_damage.py [--trials 100] [--seed 28] [--models minilm,smollm2,quire]
                                             [--via mount|archive] [--work DIR]

The models come from the corpus cache (lmzfs.testing.corpus); the store also holds a model
added and removed again and a gc, so its catalog has a history. Each trial starts from a fresh
copy of that store (packs hard-linked). Prints one line per failed trial and a summary line;
exit 0 only if every trial recovered every file with no traceback. Takes minutes, so it is not
in the default test suite.
"""
from __future__ import annotations

import argparse
import hashlib
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path

COMMANDS = [["ls"], ["ls", "--json"], ["ls", "smollm2"], ["doctor"], ["verify", "smollm2"], ["gc"]]


def sha256(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def build_store(work: Path, models: list[str]) -> tuple[Path, dict[str, str]]:
    from lmzfs.store.add import add_model
    from lmzfs.store.gc import collect_garbage
    from lmzfs.store.layout import StorePaths
    from lmzfs.store.remove import remove_models
    from lmzfs.testing.corpus import fetch

    store = StorePaths(work / "store")
    expected = {}
    for name in models:
        src = fetch(name)
        add_model(store, src, name, fast=True)
        expected[f"{name}/{src.name}"] = sha256(src)
    first = fetch(models[0])
    add_model(store, first, "scratch", fast=True, chunk_size=256 << 10)
    remove_models(store, ["scratch"])
    collect_garbage(store)
    return store.root, expected


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=100)
    ap.add_argument("--seed", type=int, default=28)
    ap.add_argument("--models", default="minilm,smollm2,quire")
    ap.add_argument("--via", choices=("mount", "archive"), default="mount")
    ap.add_argument("--work", type=Path, help="scratch directory (default: a new temporary one, removed after)")
    args = ap.parse_args(argv)

    from lmzfs.testing.catalogdamage import print_failures, random_damages, run_trial, summary_line

    work = args.work or Path(tempfile.mkdtemp(prefix="lmz-catalog-damage-"))
    try:
        started = time.monotonic()
        prepared, expected = build_store(work, args.models.split(","))
        size = (prepared / "catalog.sqlite").stat().st_size
        print(f"store: {', '.join(args.models.split(','))}; catalog {size} bytes ({size // 4096} pages); "
              f"built in {time.monotonic() - started:.0f} s", flush=True)
        damages = random_damages(size, args.trials, random.Random(args.seed))
        results = []
        started = time.monotonic()
        for i, damage in enumerate(damages):
            r = run_trial(prepared, work / "trial", damage, expected, commands=COMMANDS,
                          mountpoint=work / "mnt" if args.via == "mount" else None)
            results.append(r)
            if not r.ok:
                print_failures([r])
            print(f"\r{i + 1}/{len(damages)} trials", end="", file=sys.stderr, flush=True)
        print(file=sys.stderr)
        print(f"{summary_line(results)} (read back through the {args.via}; "
              f"{time.monotonic() - started:.0f} s)")
        return 0 if all(r.ok for r in results) else 1
    finally:
        if args.work is None:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    sys.exit(main())
