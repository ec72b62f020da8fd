"""This checkout beside an earlier revision: `lmz add` and a cold read through the mount, same run.

    bench/run.py --against REV [--runs N] ...

For a change that should cost no speed (a refactor): the earlier revision's lmzfs/ is taken from
git (`git archive REV`), its compiled tANS loop built beside it, and a CLI written that runs it with
the project's venv, as freeze_lmzfs does for this checkout. Each run adds the same corpus file with
both, alternating which goes first, into a fresh store, then mounts each store and reads the file
front to back cold (the store's own files in the page cache first, as in the mount table). Each
ratio is taken within one run (this checkout / the earlier one), then summarised over runs.
"""
from __future__ import annotations

import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from common import (LMZFS_PY, REPO, ToolError, compile_bytecode, link_dir, log, mounted, read_sequential, run,
                    sha256_file, summary, warm_page_cache)

SUBJECTS = ("astra", "minilm")


def checkout_cli(rev: str, dest: Path) -> tuple[Path, str]:
    """lmzfs/ of `rev` under dest, with its compiled loop built, and a CLI that runs it."""
    commit = run(["git", "-C", REPO, "rev-parse", "--short", rev], timeout=30).strip()
    dest.mkdir(parents=True, exist_ok=True)
    archive = subprocess.run(["git", "-C", str(REPO), "archive", commit, "lmzfs", "setup.py", "pyproject.toml"],
                             capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)
    subprocess.run([str(LMZFS_PY), "setup.py", "-q", "build_ext", "--inplace"], cwd=dest, check=True,
                   capture_output=True, timeout=900)
    compile_bytecode(dest / "lmzfs")      # as freeze_lmzfs does for this checkout
    cli = dest / "lmz"
    cli.write_text("#!/bin/sh\n"
                   f"# lmzfs as it was at {commit}, for a bench run beside this checkout\n"
                   f"export PYTHONPATH='{dest}'${{PYTHONPATH:+:$PYTHONPATH}}\n"
                   "export PYTHONSAFEPATH=1\n"
                   f"exec '{LMZFS_PY}' -m lmzfs \"$@\"\n")
    cli.chmod(0o755)
    probe = run([str(cli), "--version"], timeout=60)
    if not probe:
        raise ToolError(f"the CLI of {commit} does not start")
    return cli, commit


def _add_seconds(cli: Path, store: Path, src: Path) -> float:
    t0 = time.perf_counter()
    run([cli, "--store", store, "add", src, "--name", "m"], timeout=3600)
    return time.perf_counter() - t0


def _cold_read_seconds(cli: Path, store: Path, name: str, work: Path, want: str, check: bool) -> float:
    mnt = work / "mnt"
    warm_page_cache(p for p in store.rglob("*") if p.is_file())
    with mounted([cli, "--store", store, "mount", mnt], [cli, "--store", store, "umount", mnt], mnt,
                 work / "mount.log"):
        path = mnt / "m" / name
        _, seconds = read_sequential(path)
        if check and sha256_file(path) != want:
            raise ToolError(f"{path} read back wrong through the mount")
    return seconds


def measure(rev: str, new_cli: Path, corpus: dict[str, Path], runs: int, tmpdir: Path | None) -> dict:
    """Add MB/s and cold mount read MB/s of each subject with both CLIs, and this/earlier ratios."""
    work = Path(tempfile.mkdtemp(prefix="lmz-against-", dir=tmpdir))
    try:
        old_cli, commit = checkout_cli(rev, work / "earlier")
        clis = {"this": new_cli, "earlier": old_cli}
        out: dict = {"earlier_commit": commit, "runs": runs, "subjects": []}
        for name in SUBJECTS:
            if name not in corpus:
                continue
            f = corpus[name]
            src = link_dir([f], work / "src" / name)
            size, want = f.stat().st_size, sha256_file(f)
            seconds: dict[str, dict[str, list[float]]] = {k: {"add": [], "read": []} for k in clis}
            for r in range(runs):
                order = list(clis) if r % 2 == 0 else list(reversed(clis))
                for which in order:
                    store = work / f"store-{which}"
                    shutil.rmtree(store, ignore_errors=True)
                    seconds[which]["add"].append(_add_seconds(clis[which], store, src))
                    seconds[which]["read"].append(_cold_read_seconds(clis[which], store, f.name, work, want, r == 0))
                    log(f"against {name} run {r + 1} {which}: add {seconds[which]['add'][-1]:.2f} s, "
                        f"read {seconds[which]['read'][-1]:.2f} s")
            row = {"subject": name, "bytes": size}
            for op in ("add", "read"):
                for which in clis:
                    row[f"{op}_{which}_mb_s"] = summary([size / s / 1e6 for s in seconds[which][op]])
                row[f"{op}_ratio"] = summary([b / a for a, b in zip(seconds["this"][op], seconds["earlier"][op])])
            out["subjects"].append(row)
        return out
    finally:
        shutil.rmtree(work, ignore_errors=True)
