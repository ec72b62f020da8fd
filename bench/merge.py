#!/usr/bin/env python3
"""Put sections of a later `bench/run.py` run into an earlier run's results, with a note saying so.

    python3 bench/merge.py BASE.json LATER.json SECTION [SECTION ...] --note TEXT --out MERGED.json

For when code that one section measures changed after a full run (the compression table takes
most of an hour; the mount table a quarter): the merged file says which sections came from where,
and `bench/report.py MERGED.json` renders it. The later run's code state is recorded with the note.
`compress:SUBJECT` takes one subject's rows of the compression table (every tool on that file,
measured in the later run), replacing the base's rows of that subject or adding them: for a
corpus file added after a full run.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("base", type=Path)
    ap.add_argument("later", type=Path)
    ap.add_argument("sections", nargs="+")
    ap.add_argument("--note", required=True)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    base, later = json.loads(args.base.read_text()), json.loads(args.later.read_text())
    for name in args.sections:
        section, _, subject = name.partition(":")
        if section not in later:
            raise SystemExit(f"{args.later} has no section {section!r}")
        if not subject:
            base[section] = later[section]
            continue
        rows = [r for r in later[section] if isinstance(r, dict) and r.get("subject") == subject]
        if not rows:
            raise SystemExit(f"{args.later} has no {section} rows of {subject!r}")
        old = base.get(section, [])
        mine = [i for i, r in enumerate(old) if isinstance(r, dict) and r.get("subject") == subject]
        kept = [r for i, r in enumerate(old) if i not in mine]
        if mine:            # where the subject's rows were: the table keeps its order
            at = mine[0]
        else:               # a new subject: single files come before the chains, as a full run orders them
            at = next((i for i, r in enumerate(kept) if " chain" in str(r.get("subject", ""))), len(kept))
        base[section] = kept[:at] + rows + kept[at:]
        corpus = later.get("meta", {}).get("corpus", {})
        if subject in corpus:
            base.setdefault("meta", {}).setdefault("corpus", {})[subject] = corpus[subject]
    code = (later.get("meta", {}).get("code") or {}).get("measured") or {}
    state = f" (lmzfs commit {code.get('commit')}, source hash {code.get('source_sha256')})" if code else ""
    base.setdefault("meta", {}).setdefault("notes", []).append(args.note + state)
    args.out.write_text(json.dumps(base, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
