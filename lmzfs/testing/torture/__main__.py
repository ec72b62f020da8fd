"""python -m lmzfs.testing.torture [--seconds N] [--sample] [--json PATH]: issue 48's torture run.

Prepares a store from real corpus files once, then runs each family's cases, each on a fresh
copy in a forked child bounded by a timeout, splitting the time budget across the families,
and prints one table (and the outcomes as JSON with --json). Exit 1 if any wrong byte was
served, a model was lost, a traceback or a hang was seen; 0 otherwise."""
from __future__ import annotations

import argparse
import json
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path

from lmzfs.testing.torture import access, crashes, damage, hostile, load
from lmzfs.testing.torture.prepared import prepare
from lmzfs.testing.torture.runner import FAMILIES, Row, run_case, table

MODULES = {"damage": damage, "crashes": crashes, "hostile": hostile, "access": access, "load": load}
SHARES = {"damage": 0.4, "crashes": 0.4, "hostile": 0.2}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m lmzfs.testing.torture", description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=1200, help="the whole run's budget (default 1200)")
    ap.add_argument("--sample", action="store_true", help="a few cases of each family (about a minute)")
    ap.add_argument("--json", type=Path, help="write every row and failing outcome here")
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--families", default=",".join(FAMILIES), help="comma-separated subset")
    ap.add_argument("--work", type=Path, help="work directory (default: a new one under /tmp, removed after)")
    args = ap.parse_args(argv)
    seed = args.seed if args.seed is not None else random.randrange(1 << 31)
    families = [f for f in args.families.split(",") if f]
    work = args.work or Path(tempfile.mkdtemp(prefix="lmz-torture-"))
    started = time.monotonic()
    print(f"torture: seed {seed}, {'sample' if args.sample else f'{args.seconds:.0f} s budget'}, work {work}", flush=True)
    try:
        prep = prepare(work / "prepared")
        print(f"torture: prepared store in {time.monotonic() - started:.0f} s "
              f"({len(prep.expected)} files of {len({k.rsplit('/', 1)[0] for k in prep.expected})} models)", flush=True)
        rows = []
        budget = max(0.0, args.seconds - (time.monotonic() - started))
        load_secs = min(60.0, max(10.0, 0.1 * budget))
        fixed = (load_secs + 30 if "load" in families else 0) + (15 if "access" in families else 0)
        rest = max(0.0, budget - fixed)
        shares = {f: SHARES[f] for f in families if f in SHARES}
        total_share = sum(shares.values()) or 1
        for fam in FAMILIES:
            if fam not in families:
                continue
            rng = random.Random(f"{seed}-{fam}")
            scratch = work / "cases" / fam
            row = Row(fam)
            mod = MODULES[fam]
            gen = mod.cases(prep, scratch, rng, args.sample, load_secs) if fam == "load" else \
                mod.cases(prep, scratch, rng, args.sample)
            deadline = None if args.sample or fam not in shares else \
                time.monotonic() + rest * shares[fam] / total_share
            for case in gen:
                if deadline is not None and time.monotonic() >= deadline:
                    break
                if deadline is not None:
                    case = type(case)(case.name, case.run, min(case.timeout, max(30.0, deadline - time.monotonic() + 60)))
                o = run_case(case, scratch)
                row.add(o)
                if o.wrong_bytes or o.models_lost or o.traceback or o.hang or o.problems:
                    print(f"  {fam}: {o.name}: wrong {o.wrong_bytes} lost {o.models_lost} (named {o.named_lost}) "
                          f"tb {o.traceback is not None} hang {o.hang} {o.problems[:2]} {o.info}"[:600], flush=True)
            shutil.rmtree(scratch, ignore_errors=True)
            rows.append(row)
            print(f"torture: {fam}: {row.tally['cases']} cases in {row.tally['seconds']:.0f} s", flush=True)
        print()
        print(table(rows))
        for row in rows:
            if row.info:
                print(f"{row.family}: " + ", ".join(f"{k} {v}" for k, v in sorted(row.info.items())))
        print(f"total {time.monotonic() - started:.0f} s, seed {seed}")
        if args.json:
            args.json.write_text(json.dumps({"seed": seed, "sample": args.sample, "seconds": time.monotonic() - started,
                                             "rows": [r.to_json() for r in rows]}, indent=1, default=str))
        bad = any(r.tally[k] for r in rows for k in ("wrong_bytes", "models_lost", "tracebacks", "hangs"))
        return 1 if bad else 0
    finally:
        if args.work is None:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
