#!/usr/bin/env python3
"""Issue 46: a Hugging Face hub cache taken in with one command, against the cache itself.

    .venv/bin/python bench/hf_cache.py --json OUT.json [--lmz LMZFS_CLI] [--lmzip LMZIP_CLI]
        [--loaders-python PYTHON]

Runs in the project's venv (it imports lmzfs.testing.hfcache and huggingface_hub); bench/run.py runs
it as its `hf_cache` section. The cache is `lmzfs.testing.hfcache.build_cache`: huggingface_hub's
layout built offline from real files, two revisions of all-MiniLM-L6-v2 (safetensors,
pytorch_model.bin, tokenizer and JSON files; the newer one with every weight drifted a little) and
the quire tagger. Measures, in bytes allocated on disk (`du`):

- the cache; `lmz add --hf-cache` of it into an empty store (goal: at most 0.60x the cache);
- `lmz add` of each snapshot alone, each into its own empty store, beside that snapshot's blobs;
- lmzip's archive of the cache directory (`lmz compress` of lmzip's own CLI, bench/.venv), when
  --lmzip names it; n/a otherwise;
- with --loaders-python (a Python with torch, transformers and sentence-transformers: bench/run.py
  passes bench/.venv's, which has them for the real-loaders section): bench/hf_load.py on the
  cache and on the mount's .hf/hub view, --runs times: outputs compared, load seconds.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import describe, du_bytes, log, run  # noqa: E402

HERE = Path(__file__).resolve().parent
GOAL = 0.60          # issue 46: the store of the whole cache at most this many times the cache's bytes


def blob_bytes(snapshot: Path) -> int:
    """Bytes on disk of the blobs a snapshot's links point at, each once."""
    blobs = {os.path.realpath(os.path.join(d, f)) for d, _, fs in os.walk(snapshot) for f in fs}
    return sum(os.stat(b).st_blocks * 512 for b in blobs)


def stores(lmz: list[str], built, work: Path) -> dict:
    from huggingface_hub import scan_cache_dir
    cache = built.root
    out: dict = {"cache_du": du_bytes(cache), "cache_size_on_disk": scan_cache_dir(cache).size_on_disk}
    store = work / "store"
    t = time.monotonic()
    said = run([*lmz, "--store", store, "add", "--hf-cache", cache], timeout=3600)
    out.update(store_du=du_bytes(store), add_seconds=time.monotonic() - t, said=said.strip()[-2000:])
    out["ratio"] = out["store_du"] / out["cache_du"]
    out["goal"] = GOAL
    out["goal_met"] = out["ratio"] <= GOAL
    out["snapshots"] = []
    for rev in built.revisions:
        snapshot = rev.snapshot(cache)
        alone = work / f"alone-{rev.commit[:12]}"
        run([*lmz, "--store", alone, "add", snapshot], timeout=3600)
        out["snapshots"].append({"repo": rev.repo_id, "commit": rev.commit, "refs": list(rev.refs),
                                 "logical": sum(len(d) for d in rev.files.values()),
                                 "blob_du": blob_bytes(snapshot), "store_du": du_bytes(alone)})
    return out


def lmzip_archive(lmzip: Path | None, cache: Path, work: Path) -> dict:
    if lmzip is None:
        return {"error": "lmzip is not installed in bench/.venv (bash bench/setup.sh installs it)"}
    out = work / "cache.lmz"
    t = time.monotonic()
    run([lmzip, "compress", "-q", "-f", cache, out], timeout=3600)
    return {"bytes": out.stat().st_size, "seconds": time.monotonic() - t,
            "version": run([lmzip, "--version"], timeout=60).strip()}


def loads(python: Path, cache: Path, store: Path, work: Path, runs: int) -> dict:
    """bench/hf_load.py under PYTHON, RUNS times: the cache, then the mount's .hf/hub view, each load in a fresh process."""
    from lmzfs.testing.hfcache import MINILM
    from lmzfs.testing.mount import mounted
    mnt = work / "mnt"
    mnt.mkdir()
    said = []
    with mounted(mnt, store):
        for i in range(runs):
            out = work / f"load-{i}.json"
            run([python, HERE / "hf_load.py", "--original", cache, "--view", mnt / ".hf" / "hub",
                 "--repo", MINILM, "--json", out], timeout=1800)
            said.append(json.loads(out.read_text()))
    res: dict = {"runs": runs, "dropped_page_cache": all(s["dropped_page_cache"] for s in said),
                 "identical": {k: all(s["identical"][k] for s in said) for k in ("hidden", "emb")},
                 "versions": said[0]["versions"]}
    for where in ("original", "view"):
        for key in ("automodel_s", "sentence_transformer_s"):
            xs = [s["times"][where][key] for s in said]
            res[f"{where}_{key}"] = {"median": statistics.median(xs), "max": max(xs)}
    return res


def lmzip_cli() -> Path | None:
    """lmzip's `lmz`: the one beside the Python running the bench (bench/.venv under `make bench`),
    else bench/.venv's; None when neither venv has lmzip (ours is also called `lmz`)."""
    import common
    for cli in dict.fromkeys([common.LMZIP_CLI, HERE / ".venv" / "bin" / "lmz"]):
        python = cli.parent / "python"
        if cli.exists() and python.exists() and subprocess.run(
                [python, "-c", "import importlib.metadata as m; m.version('lmzip')"], capture_output=True).returncode == 0:
            return cli
    return None


def loaders_present(python: Path) -> bool:
    return subprocess.run([python, "-c", "import torch, transformers, sentence_transformers"],
                          capture_output=True).returncode == 0


def measure(work: Path, lmz: list[str], lmzip: Path | None, loaders: Path | None, runs: int) -> dict:
    """loaders: the Python that runs bench/hf_load.py (None: the loads are n/a)."""
    import huggingface_hub

    from lmzfs.testing.hfcache import build_cache
    log("hf cache: building it from the corpus (lmzfs.testing.hfcache)")
    built = build_cache(work / "huggingface" / "hub")
    res: dict = {"huggingface_hub": huggingface_hub.__version__}
    log("hf cache: lmz add --hf-cache, and each snapshot alone")
    res.update(stores(lmz, built, work))
    log("hf cache: lmzip's archive of the cache directory")
    try:
        res["lmzip"] = lmzip_archive(lmzip, built.root, work)
    except Exception as exc:
        res["lmzip"] = {"error": describe(exc)}
    if loaders is None:
        res["loads"] = {"error": "no Python with torch, transformers and sentence-transformers was given"}
    elif not loaders_present(loaders):
        res["loads"] = {"error": f"torch, transformers or sentence-transformers is missing from {loaders}"}
    else:
        log("hf cache: transformers and sentence-transformers by name, the cache and the view")
        try:
            res["loads"] = loads(loaders, built.root, work / "store", work, runs)
        except Exception as exc:
            res["loads"] = {"error": describe(exc)}
    return res


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", type=Path, required=True)
    ap.add_argument("--lmz", type=Path, help="our CLI (default: this Python's `-m lmzfs`)")
    ap.add_argument("--lmzip", type=Path, help="lmzip's CLI (its `lmz`); without it the lmzip row is n/a")
    ap.add_argument("--loaders-python", type=Path,
                    help="time bench/hf_load.py under this Python (it needs torch, transformers, sentence-transformers)")
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--tmpdir", type=Path)
    args = ap.parse_args()
    lmz = [str(args.lmz)] if args.lmz else [sys.executable, "-m", "lmzfs"]
    with tempfile.TemporaryDirectory(prefix="lmz-hf-", dir=args.tmpdir) as tmp:
        res = measure(Path(tmp), lmz, args.lmzip, args.loaders_python, args.runs)
    args.json.write_text(json.dumps(res, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
