"""The `lmz` command line: argument parsing and output only; every operation lives below."""
from __future__ import annotations

import argparse
import functools
import json
import os
import re
import sqlite3
import sys
from pathlib import Path

from lmzfs import __version__
from lmzfs.errors import CorruptChunk
from lmzfs.malloc import tune_malloc
from lmzfs.printable import printable
from lmzfs.progress import ProgressLine, human_bytes
from lmzfs.singlefile.errors import SingleFileError
from lmzfs.servicecli import add_commands as add_service_commands
from lmzfs.remotecli import add_push_command, add_remote_option
from lmzfs.servicecli import add_mount_arguments, cmd_mount, cmd_umount   # mount, umount, doctor, stats
from lmzfs.store.layout import StoreError, StorePaths


def parse_size(text: str) -> int:
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(i?b)?\s*", text.lower())
    if not m:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (use e.g. 512M or 2G)")
    return int(float(m.group(1)) * 1024 ** " kmgt".index(m.group(2) or " "))


def _chain_depth(text: str) -> int:
    from lmzfs.config import MAX_CHAIN_DEPTH
    if not text.isdigit() or not 1 <= int(text) <= MAX_CHAIN_DEPTH:
        raise argparse.ArgumentTypeError(f"not a chain depth: {text!r} (1 to {MAX_CHAIN_DEPTH})")
    return int(text)


def _store(args) -> StorePaths:
    from lmzfs.config import resolve_store        # --store, else $LMZ_STORE, else the config's, else default
    return StorePaths(resolve_store(args.store))


def cmd_add(args) -> int:
    from lmzfs.admin import hfcache
    store = _store(args)
    if args.hf_cache is not None:
        if args.path is not None:
            raise StoreError("give either a PATH or --hf-cache, not both")
        return _add_hf_cache(args, store, Path(args.hf_cache) if args.hf_cache else None)
    if args.path is None:
        raise StoreError("give the directory (or file, or hf://ORG/NAME) to add, or --hf-cache")
    if args.path.startswith(hfcache.PREFIX):
        snap = hfcache.resolve(args.path)
    else:
        snap = hfcache.snapshot_at(Path(args.path)) if _looks_like_snapshot(args.path) else None
    if snap is not None:
        if args.hf_repo:
            raise StoreError(f"{args.path} is a snapshot of {snap.origin.repo_id}; --hf-repo is for other directories")
        return _add_one(args, store, snap.path, args.name or snap.model_name(), snap.link_roots,
                        hfcache.recorder(snap.origin))
    record = None
    if args.hf_repo:
        from lmzfs.store.catalog.hfrows import HfOrigin, check_origin
        check_origin(origin := HfOrigin(args.hf_repo))
        record = hfcache.recorder(origin)
    return _add_one(args, store, Path(args.path), args.name, (), record)


def _looks_like_snapshot(path: str) -> bool:
    p = Path(os.path.abspath(path))
    return p.parent.name == "snapshots" and "--" in p.parent.parent.name


def _add_one(args, store: StorePaths, src: Path, name: str | None, link_roots, record, progress=None) -> int:
    from lmzfs.config import resolve
    from lmzfs.store.add import add_model
    depth = args.chain_depth if args.chain_depth is not None else resolve(store=args.store).chain_depth
    own = progress is None
    progress = progress or ProgressLine(f"adding {printable(name or src.name)}")
    try:
        r = add_model(store, src, name, progress=progress, fast=args.fast, chunk_size=args.chunk_size,
                      segments=args.segments, base=args.base, delta=args.delta, chain_depth=depth,
                      link_roots=link_roots, also_record=record)
    finally:
        if own:
            progress.finish()
    for warning in r.warnings:
        print(f"lmz: warning: {printable(warning)}", file=sys.stderr)
    saved = 100.0 * (1 - r.new_payload_bytes / r.logical_bytes) if r.logical_bytes else 0.0
    chain_line = _chain_line(r)
    if chain_line:
        print(printable(chain_line))
    if r.siblings.chunks:
        t = r.siblings
        print(f"deltas within the model: {t.chunks} chunk(s) coded against the same tensor of an earlier file: "
              f"{human_bytes(t.bytes_alone)} -> {human_bytes(t.bytes_after)}, "
              f"{human_bytes(t.bytes_alone - t.bytes_after)} saved")
    print(printable(f"added {r.name}: {r.files} file(s), {human_bytes(r.logical_bytes)}; new data stored "
                    f"{human_bytes(r.new_payload_bytes)} ({saved:.2f}% saved)" + _shared_clause(r)
                    + f", {r.seconds:.1f} s"))
    return 0


def _add_hf_cache(args, store: StorePaths, cache: Path | None) -> int:
    from lmzfs.admin import hfcache
    if args.name or args.base or args.hf_repo:
        raise StoreError("--hf-cache names each model after its repo: --name, --base and --hf-repo do not apply")
    progress = ProgressLine("adding the Hugging Face cache")

    def add(snap, step):
        progress.finish()          # the bar gives way to each add's lines, and comes back after
        _add_one(args, store, snap.path, snap.model_name(), snap.link_roots, hfcache.recorder(snap.origin),
                 progress=lambda done, total: step(done, total) if total else None)

    def report_repo(rr):
        progress.finish()
        grew = rr.store_after - rr.store_before
        print(printable(f"{rr.repo_id}: {len(rr.added)} revision(s) added"
                        + (f", {len(rr.skipped)} already in the store" if rr.skipped else "")
                        + f"; {human_bytes(rr.cache_bytes)} in the cache -> the store grew by {human_bytes(grew)}"
                        + (f" ({grew / rr.cache_bytes:.2f}x)" if rr.cache_bytes else "")))
    try:
        report = hfcache.add_cache(store, cache, add, progress, report_repo)
    finally:
        progress.finish()
    for what in report.left_out:
        print(printable(f"left out {what}: only model repos are added"))
    added = sum(len(r.added) for r in report.repos)
    before = sum(r.cache_bytes for r in report.repos)
    grew = sum(r.store_after - r.store_before for r in report.repos)
    print(printable(f"hf cache {report.cache}: {added} revision(s) of {len(report.repos)} repo(s) added, "
                    f"{human_bytes(before)} of model repos in the cache -> the store grew by {human_bytes(grew)}"
                    + (f" ({grew / before:.2f}x)" if before else "") + f", {report.seconds:.1f} s"))
    print("the cache is untouched; once `lmz verify` is clean, `hf cache rm model/ORG/NAME` (or removing the repo "
          "directories) reclaims it, and the mount's .hf/hub serves it (docs/operations.md)")
    return 0


def _shared_clause(r) -> str:
    parts = []
    if r.reused_chunks:
        parts.append(f"{r.reused_chunks} chunk(s) already in the store")
    if r.repeated_chunks:
        parts.append(f"{r.repeated_chunks} repeated within the add, stored once")
    return ", " + ", ".join(parts) if parts else ""


def _chain_line(r) -> str:
    """What `lmz add` did about deltas: the stored model that now depends on the new one, and what
    recoding it saved; "" when there was nothing to pair with (an empty store, no tensors)."""
    if not r.delta:
        return "deltas: none (--no-delta): stored standalone, no other model changed"
    if r.base is None:
        if not r.stored_models or not r.tensors:
            return ""
        return "deltas: no stored model has tensors of the same names, dtypes and shapes; no other model changed"
    b, t = r.base, r.recoded
    how = "given by --base" if b.explicit else "chosen: the same family or most recent of the stored models that match"
    line = (f"deltas: {r.name} is stored whole; paired with {b.model} ({how}; {human_bytes(b.matched_bytes)} of "
            f"{human_bytes(b.tensor_bytes)} of tensors match): ")
    if not t.chunks:
        return line + f"no chunk of {b.model} codes smaller as a delta against it (identical chunks are shared)"
    line += (f"{b.model} now depends on {r.name}: {t.chunks} chunk(s) of it were recoded as deltas: "
             f"{human_bytes(t.bytes_before)} -> {human_bytes(t.bytes_after)}, "
             f"{human_bytes(t.bytes_before - t.bytes_after)} saved")
    if t.reanchored:
        line += (f"; {t.reanchored} chunk(s) re-anchored to keep chains within the depth cap "
                 f"({human_bytes(t.reanchor_before)} -> {human_bytes(t.reanchor_after)})")
    return line + _reclaim_clause(r.reclaimed)


def _reclaim_clause(g) -> str:
    """What became of the recoded chunks' old payloads (add.py reclaims them after its commit)."""
    if g is None:
        return ""
    if g.left_for_gc:
        return (f"; the packs are open in a mount, so their old payloads stay until `lmz gc` "
                f"(which will reclaim {human_bytes(g.left_for_gc)})")
    return f"; their old payloads were dropped from the packs ({human_bytes(g.reclaimed)} reclaimed)"


def cmd_ls(args) -> int:
    from lmzfs.remotecli import remote_catalog, remote_options
    from lmzfs.store.catalog import Catalog, CatalogDamaged
    from lmzfs.store.catalog.check import examine
    options = remote_options(args)
    if options is not None:
        with remote_catalog(options) as (catalog, archive):
            snap = archive.current_snapshot
            return _ls(catalog, args, f"remote {archive.url} (generation {snap.pointer.generation})",
                       archive.totals().stored_bytes, "in its pack objects")
    store = _store(args)
    if not store.exists():
        if args.json:
            print("[]")
        else:
            print(f"no store at {store.root} yet (lmz add DIR creates it)")
        return 0
    store.check_format()
    catalog = Catalog(store.catalog, readonly=True)      # refuses a version it does not know
    try:
        # damage in a page no listing query reads would go unseen: ls judges the file as mount does
        check = examine(store.catalog)
        if not check.clean and not check.unreadable:
            raise CatalogDamaged(store.catalog, check.problem)
        return _ls(catalog, args, f"store {store.root}", None, "on disk")
    finally:
        catalog.close()


def _ls(catalog, args, where: str, stored: int | None, place: str) -> int:
    if args.model:
        return _ls_model(catalog, args)
    usage = catalog.usage()
    depends = catalog.model_dependencies()
    hf = _hf_origins(catalog)
    if args.json:
        print(json.dumps([{"model": u.name, "files": u.files, "logical_bytes": u.logical_bytes,
                           "stored_bytes": u.stored_bytes, "saved_pct": round(u.saved_pct, 3),
                           "depends_on": depends.get(u.name, []),
                           "hf": _hf_json(hf[u.name]) if u.name in hf else None} for u in usage],
                         indent=1))
        return 0
    rows = [(u.name, str(u.files), human_bytes(u.logical_bytes), human_bytes(u.stored_bytes), f"{u.saved_pct:.2f}%")
            for u in usage]
    _table(("MODEL", "FILES", "LOGICAL", "STORED", "SAVED"), rows)
    if depends:
        print("\nchains (a model's chunks are coded against chunks of the models it depends on; STORED "
              "counts its delta payloads):")
        for name, deps in sorted(depends.items()):
            shown = ", ".join(REMOVED_BASE if d is None else d for d in deps)
            print(printable(f"  {name} depends on {shown}"))
    if hf:
        print("\nHugging Face revisions (served by name under MOUNTPOINT/.hf/hub):")
        for name, row in sorted(hf.items()):
            print(printable(f"  {name} is {_hf_line(row)}"))
    on_disk = _store(args).disk_bytes() if stored is None else stored
    total = sum(u.logical_bytes for u in usage)
    print()
    print(printable(f"{where}: {human_bytes(total)} of model files in {human_bytes(on_disk)} {place} "
                    f"(packs and catalog, shared chunks counted once)"))
    return 0


REMOVED_BASE = "(removed model, chunks kept)"


def _hf_origins(catalog) -> dict:
    """The models' Hugging Face origins; {} with one warning line when the store's tables are of a
    version this lmzfs does not know (the models are listed all the same, as the mount serves them)."""
    try:
        return catalog.hf_revisions()
    except StoreError as exc:
        print(printable(f"lmz: warning: no Hugging Face revisions shown: {exc}"), file=sys.stderr)
        return {}


def _hf_json(row) -> dict:
    return {"repo_type": row.repo_type, "repo_id": row.repo_id, "commit": row.commit_hash, "refs": list(row.refs)}


def _hf_line(row) -> str:
    kind = "" if row.repo_type == "model" else f"{row.repo_type} "
    return f"{kind}{row.repo_id}@{row.commit_hash}" + (f" ({', '.join(row.refs)})" if row.refs else "")


def _ls_model(catalog, args) -> int:
    if catalog.model(args.model) is None:
        raise StoreError(f"no model named {args.model!r}")
    charges = catalog.file_charges(args.model)
    files = catalog.files(args.model)
    if args.json:
        print(json.dumps([{"path": f.path, "size": f.size, "stored_bytes": charges[f.path], "sha256": f.sha256,
                           "format": f.format} for f in files], indent=1))
        return 0
    _table(("FILE", "FORMAT", "SIZE", "STORED", "SAVED"),
           [(f.path, f.format, human_bytes(f.size), human_bytes(charges[f.path]),
             f"{100 * (1 - charges[f.path] / f.size):.2f}%" if f.size else "-") for f in files])
    print("\nSTORED counts each chunk once, against the first file (in this order) that uses it.")
    row = _hf_origins(catalog).get(args.model)
    if row is not None:
        print(printable(f"Hugging Face: {_hf_line(row)}, served by name under MOUNTPOINT/.hf/hub"))
    return 0


def _table(header, rows) -> None:
    rows = [tuple(printable(str(c)) for c in r) for r in rows]     # names may hold ESC, newlines, bidi overrides
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows)] if rows else [len(h) for h in header]
    for r in (header, *rows):
        print("  ".join(str(c).ljust(w) if i == 0 else str(c).rjust(w) for i, (c, w) in enumerate(zip(r, widths))))


def cmd_rm(args) -> int:
    from lmzfs.store.remove import remove_models
    n = remove_models(_store(args), args.models)
    print(printable(f"removed {', '.join(args.models)} ({n} file(s)); run `lmz gc` to reclaim their space"))
    return 0


def cmd_gc(args) -> int:
    from lmzfs.store.gc import collect_garbage
    r = collect_garbage(_store(args), forget_set_aside=args.forget_set_aside)
    print(f"gc: dropped {r.chunks_dropped} unreferenced chunk(s), rewrote into {r.packs_rewritten} pack(s), "
          f"truncated {r.packs_truncated}, deleted {r.packs_deleted}; reclaimed {human_bytes(r.reclaimed)}")
    if r.set_aside:
        print(f"gc: kept {r.packs_kept} pack(s) as they are: {', '.join(r.set_aside)} (set aside by "
              f"`lmz verify --repair`) still names records in them; once you no longer need it, "
              f"`lmz gc --forget-set-aside` removes it and reclaims them")
    return 0


def cmd_rewrite(args) -> int:
    from lmzfs.store.rewrite.anchor import anchor_store
    from lmzfs.store.rewrite.compact import compact_store
    from lmzfs.store.rewrite.delta import delta_store
    from lmzfs.store.rewrite.recode import recode_store
    store = _store(args)
    progress = ProgressLine(f"rewrite {args.rewrite}")
    try:
        if args.rewrite == "compact":
            r = compact_store(store, min_dead=args.min_dead / 100, everything=args.all, progress=progress)
        elif args.rewrite == "recode":
            r = recode_store(store, args.model, progress=progress)
        elif args.rewrite == "delta":
            from lmzfs.config import resolve
            depth = args.chain_depth if args.chain_depth is not None else resolve(store=args.store).chain_depth
            r = delta_store(store, args.model, args.base, chain_depth=depth, progress=progress)
        else:
            r = anchor_store(store, args.model, progress=progress)
    finally:
        progress.finish()
    if args.json:
        print(json.dumps({"pass": r.name, "chunks_examined": r.chunks_examined, "chunks_changed": r.chunks_changed,
                          "chunks_dropped": r.chunks_dropped, "packs_written": r.packs_written,
                          "packs_deleted": r.packs_deleted, "base": r.base, "notes": r.notes,
                          "payload_bytes_before": r.before.payload, "payload_bytes_after": r.after.payload,
                          "pack_bytes_before": r.before.packs, "pack_bytes_after": r.after.packs,
                          "seconds": round(r.seconds, 3)}, indent=1))
        return 0
    what = (f"moved {r.chunks_changed} chunk(s) into {r.packs_written} new pack(s), deleted {r.packs_deleted} "
            f"pack(s), dropped {r.chunks_dropped} unused chunk(s)" if r.name == "compact" else
            f"recoded {r.chunks_changed} of {r.chunks_examined} chunk(s)"
            + (f" against {printable(r.base)}" if r.base else ""))
    print(f"rewrite {r.name}: {what}; stored payload {_before_after(r.before.payload, r.after.payload)}, "
          f"packs on disk {_before_after(r.before.packs, r.after.packs)}, {r.seconds:.1f} s")
    for note in r.notes:
        print(printable(note))
    if r.name != "compact" and r.chunks_changed:
        print("the payloads replaced are dead pack space until `lmz rewrite compact` (or `lmz gc`)")
    return 0


def _before_after(before: int, after: int) -> str:
    change = f" ({100 * (after - before) / before:+.2f}%)" if before and after != before else ""
    return f"{human_bytes(before)} -> {human_bytes(after)}{change}"


def cmd_verify(args) -> int:
    from lmzfs.admin.verify import verify_remote, verify_store
    from lmzfs.remotecli import remote_options
    options = remote_options(args)
    if options is not None:
        if args.repair or args.record_checksums:
            raise StoreError("--repair and --record-checksums act on a local store; a remote is repaired by "
                             "pushing from its ingest host")
        progress = ProgressLine("verifying")
        try:
            report = verify_remote(options, args.model, progress)
        finally:
            progress.finish()
        return _verify_report(report, 0, False)
    damaged_chunks = 0
    lost = False
    if args.repair:
        lost = not _repair(_store(args))
    if args.record_checksums:
        from lmzfs.store.checksums import record_checksums
        progress = ProgressLine("recording checksums")
        try:
            rec = record_checksums(_store(args), progress)
        finally:
            progress.finish()
        for line in rec.damaged:
            print(printable(f"DAMAGED {line}"))
        damaged_chunks = len(rec.damaged)
        print(f"checksums: recorded for {rec.recorded} chunk(s) ({human_bytes(rec.bytes)}) stored without one"
              + (f"; {damaged_chunks} damaged chunk(s) left without" if damaged_chunks else ""))
    progress = ProgressLine("verifying")
    try:
        report = verify_store(_store(args), args.model, progress)
    finally:
        progress.finish()
    return _verify_report(report, damaged_chunks, lost)


def _verify_report(report, damaged_chunks: int, lost: bool) -> int:
    for d in report.damaged:
        print(printable(f"DAMAGED {d.model}/{d.path}: {d.reason}"))
    state = "ok" if report.ok else f"{len(report.damaged)} damaged file(s)"
    print(f"verify: {report.files} file(s), {human_bytes(report.bytes)} decoded and checked: {state}")
    return 0 if report.ok and not damaged_chunks and not lost else 1


def _repair(store: StorePaths) -> bool:
    """Print what `verify --repair` found and did; False if some model could not be recovered."""
    from lmzfs.store.catalog.repair import repair_catalog
    r = repair_catalog(store)
    if r.problem is None:
        print(f"catalog {store.catalog}: sound" + ("; wrote a copy of it beside it" if r.copy_written else ""))
        return True
    print(f"catalog {store.catalog} was damaged: {r.problem}")
    if r.damaged_kept is not None:
        print(f"  kept the damaged file as {r.damaged_kept}")
    print(f"  restored {r.restored_from.name}" +
          (f"; {r.relocated_chunks} chunk(s) found in payloads newer than the copy (moved by a gc, recoded or "
           f"rewritten since)" if r.relocated_chunks else ""))
    for name in r.recovered_models:
        print(f"  recovered {name} from the rows the damaged catalog still holds (every file checked against "
              f"its SHA-256)")
    for name in r.lost_models:
        print(f"LOST {name}: not in the restored copy, or its chunks are in no pack")
    if r.unnamed_losses:
        print("  the damaged catalog's model list is unreadable: a model added after the restored copy "
              "was written (if any) is lost, and cannot be named")
    return r.recovered


def cmd_cat(args) -> int:
    from lmzfs.reader.archive import Archive
    from lmzfs.remotecli import open_remote, remote_options
    options = remote_options(args)
    archive = open_remote(options) if options is not None else \
        Archive(_store(args).root, cache_bytes=64 << 20)     # room for read-ahead
    try:
        entry = _find_entry(archive, args.file)
        out = sys.stdout.buffer
        with archive.open(entry) as reader:
            for off in range(0, entry.size, 1 << 22):
                out.write(reader.pread(off, 1 << 22))
        out.flush()
    finally:
        archive.close()
    return 0


def _find_entry(archive, spec: str):
    spec = spec.strip("/")
    for e in archive.files():
        if f"{e.model}/{e.path}" == spec:
            return e
    raise StoreError(f"{spec}: no such file (give MODEL/PATH as `lmz ls MODEL` shows it)")


def _os_error(exc: OSError) -> str:
    return f"{exc.filename}: {exc.strerror}" if exc.filename and exc.strerror else str(exc)


def cmd_pack(args) -> int:
    from lmzfs.singlefile import pack_file
    progress = ProgressLine(f"packing {Path(args.file).name}")
    try:
        r = pack_file(args.file, args.out, overwrite=args.overwrite, report=args.report, progress=progress)
    finally:
        progress.finish()
    codecs = ", ".join(f"{name} {u.chunks}" for name, u in sorted(r.codecs.items(), key=lambda kv: -kv[1].chunks))
    print(f"packed {r.source} ({r.format}, {human_bytes(r.plain_bytes)}) into {r.dest}: "
          f"{human_bytes(r.archive_bytes)}, {r.saved_pct:.2f}% saved; {r.chunks} chunk(s) ({codecs or 'none'}); "
          f"{r.seconds:.1f} s, {r.mb_per_s:.1f} MB/s")
    return 0


def cmd_unpack(args) -> int:
    from lmzfs.singlefile import unpack_file
    progress = ProgressLine(f"unpacking {Path(args.archive).name}")
    try:
        r = unpack_file(args.archive, args.file, max_output_bytes=args.max_output_bytes, overwrite=args.overwrite,
                        report=args.report, progress=progress)
    finally:
        progress.finish()
    print(f"unpacked {r.source} into {r.dest}: {human_bytes(r.plain_bytes)}, {r.chunks} chunk(s), SHA-256 "
          f"{r.sha256} verified; {r.seconds:.1f} s, {r.mb_per_s:.1f} MB/s")
    return 0


def cmd_inspect(args) -> int:
    from lmzfs.inspect import inspect_file
    try:
        report = inspect_file(args.file, sha256=args.sha256)
    except OSError as exc:
        print(f"lmz: {printable(args.file)}: {printable(str(exc.strerror or exc))}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(report.to_json(), indent=1))     # ensure_ascii: controls come out as \u escapes
    else:
        print("\n".join(printable(line) for line in report.human_lines()))
    return 0 if report.ok else 1


def build_parser() -> argparse.ArgumentParser:
    store_opt = argparse.ArgumentParser(add_help=False)
    store_opt.add_argument("--store", default=argparse.SUPPRESS, metavar="DIR",
                           help="store directory (default: $LMZ_STORE, else the config's store, else ~/.local/share/lmzfs)")
    p = argparse.ArgumentParser(prog="lmz", parents=[store_opt],
                                description="Keep model files compressed and deduplicated; serve them as ordinary files.")
    p.add_argument("--version", action="version", version=f"lmzfs {__version__}")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def cmd(name, func, help_):
        sp = sub.add_parser(name, parents=[store_opt], help=help_, description=help_)
        sp.set_defaults(func=func)
        return sp

    sp = cmd("add", cmd_add, "pack a model directory (or one file, or a Hugging Face cache's model) into the "
                             "store, losslessly")
    sp.add_argument("path", nargs="?", help="a directory, a file, a Hugging Face cache snapshot directory, or "
                                            "hf://ORG/NAME[@REVISION] (taken from the local cache, offline)")
    sp.add_argument("--hf-cache", nargs="?", const="", default=None, metavar="DIR",
                    help="add every model revision of a Hugging Face hub cache (default: the one huggingface_hub "
                         "uses: $HF_HUB_CACHE, else $HF_HOME/hub, else ~/.cache/huggingface/hub); never changes it")
    sp.add_argument("--hf-repo", metavar="ORG/NAME",
                    help="serve the model in the mount's .hf/hub view as this Hugging Face repo")
    sp.add_argument("--name", help="model name (default: the directory's name); 'family/run' names allowed")
    codecs = sp.add_mutually_exclusive_group()
    codecs.add_argument("--smallest", dest="fast", action="store_false",
                        help="the default: every codec, entropy-coded ones included; the smallest store "
                             "(beats lmzip, ZipNN and zstd on every corpus file)")
    codecs.add_argument("--fast", dest="fast", action="store_true",
                        help="only zstd and byte grouping: a store a few points larger whose reads through "
                             "the mount decode faster (docs/results.md)")
    sp.set_defaults(fast=False)
    sp.add_argument("--chunk-size", type=parse_size, metavar="SIZE",
                    help="plain bytes per chunk of every tensor and header, 64K to 16M (default: the "
                         "sizes the store records; a new store cuts float tensors at 4M, the rest at 1M); "
                         "smaller chunks make random 4 KiB reads through the mount faster on a cache miss "
                         "and sequential reads slower; chunks cut at other sizes than the store's do not "
                         "deduplicate with its own (docs/results.md)")
    sp.add_argument("--segments", action=argparse.BooleanOptionalAction, default=True,
                    help="code float chunks over 256 KiB in 256 KiB segments that a lone small read "
                         "decodes alone (default); --no-segments codes them whole: random 4 KiB "
                         "reads miss slower, whole chunks decode a little faster (docs/results.md); "
                         "no effect with --fast")
    chains = sp.add_mutually_exclusive_group()
    chains.add_argument("--base", metavar="MODEL",
                        help="pair with this stored model: its chunks of the same tensors are recoded as deltas "
                             "against the new model's (default: the stored model of the same family, else the "
                             "most recent, whose tensors match; docs/chains.md)")
    chains.add_argument("--no-delta", dest="delta", action="store_false",
                        help="store the model standalone and change no other model")
    sp.set_defaults(delta=True)
    sp.add_argument("--chain-depth", type=_chain_depth, metavar="N",
                    help="the most references a read of any chunk follows, 1 to 15 (default: the config's "
                         "chain_depth, else 4); chunks that would sit deeper are re-anchored")
    sp = cmd("ls", cmd_ls, "list models (or one model's files) with logical and stored sizes")
    sp.add_argument("model", nargs="?")
    sp.add_argument("--json", action="store_true")
    add_remote_option(sp, what="list")
    sp = cmd("rm", cmd_rm, "remove models from the store (space returns with `lmz gc`)")
    sp.add_argument("models", nargs="+", metavar="MODEL")
    sp = cmd("gc", cmd_gc, "reclaim space of removed models and interrupted adds")
    sp.add_argument("--forget-set-aside", action="store_true",
                    help="first remove the damaged catalogs `verify --repair` set aside, letting go of what only "
                         "they name")
    sp = cmd("rewrite", cmd_rewrite, "rewrite how chunks are stored, offline and atomically; no served byte "
                                     "changes (docs/chains.md)")
    passes = sp.add_subparsers(dest="rewrite", required=True, metavar="PASS")

    def rewrite_pass(name, help_):
        pp = passes.add_parser(name, parents=[store_opt], help=help_, description=help_)
        pp.add_argument("--json", action="store_true", help="print one JSON object")
        return pp

    pp = rewrite_pass("compact", "repack live chunks into new packs and delete dead pack space")
    pp.add_argument("--all", action="store_true", help="rewrite every pack, not only those with dead bytes")
    pp.add_argument("--min-dead", type=float, default=10.0, metavar="PCT",
                    help="rewrite a pack once more than PCT%% of its bytes are dead (default 10)")
    pp = rewrite_pass("recode", "code chunks again with the best codecs; keep a payload only where smaller")
    pp.add_argument("model", nargs="?", metavar="MODEL", help="only this model's chunks (default: every model's)")
    pp = rewrite_pass("delta", "code a stored model as deltas against another, per chunk where smaller")
    pp.add_argument("model", metavar="MODEL")
    pp.add_argument("--base", metavar="MODEL", help="the model to code against (default: the stored model "
                                                    "whose tensors pair with most of MODEL's, same family first)")
    pp.add_argument("--chain-depth", type=_chain_depth, default=None, metavar="N",
                    help="no read follows more than N references (default: the config's chain_depth, 4)")
    pp = rewrite_pass("anchor", "store a model's delta chunks alone again, so it needs no other model")
    pp.add_argument("model", metavar="MODEL")
    sp = cmd("verify", cmd_verify, "decode and check every chunk and file; exit 1 if anything is damaged")
    sp.add_argument("model", nargs="?")
    sp.add_argument("--repair", action="store_true",
                    help="first check the catalog; if it is damaged or missing, keep it aside, restore the "
                         "newest copy that checks clean and re-derive chunk locations from the packs (takes "
                         "the writer lock; unmount first)")
    sp.add_argument("--record-checksums", action="store_true",
                    help="first give chunks stored before lmzfs kept read checksums theirs (whole store; "
                         "takes the writer lock), so that reads of them stop checking SHA-256")
    add_remote_option(sp, what="fetch and check every chunk of")
    sp = cmd("cat", cmd_cat, "write a stored file to stdout")
    sp.add_argument("file", metavar="MODEL/FILE")
    add_remote_option(sp, what="read from")
    sp = cmd("mount", cmd_mount, "serve every stored model as read-only files under MOUNTPOINT")
    add_mount_arguments(sp, parse_size)
    sp = cmd("umount", cmd_umount, "unmount a mount made by `lmz mount`")
    sp.add_argument("mountpoint", nargs="?", help="default: the config's mountpoint")
    add_service_commands(cmd)
    add_push_command(cmd)
    sp = cmd("pack", cmd_pack, "compress one file into a standalone single-file archive (no store needed)")
    sp.add_argument("file", metavar="FILE")
    sp.add_argument("out", metavar="OUT")
    sp.add_argument("--overwrite", action="store_true", help="replace OUT if it exists")
    sp.add_argument("--report", metavar="FILE.json", help="write sizes, codecs, speed and SHA-256 as JSON")
    sp = cmd("unpack", cmd_unpack, "restore the file in a single-file archive, checked before it appears")
    sp.add_argument("archive", metavar="IN")
    sp.add_argument("file", metavar="FILE")
    sp.add_argument("--max-output-bytes", type=parse_size, required=True, metavar="N",
                    help="refuse archives that would unpack to more than N bytes (e.g. 512M, 2G)")
    sp.add_argument("--overwrite", action="store_true", help="replace FILE if it exists")
    sp.add_argument("--report", metavar="FILE.json", help="write sizes, speed and SHA-256 as JSON")
    sp = cmd("inspect", cmd_inspect, "check a model file's container, list its tensors and pickle imports, "
                                     "predict the saving; exit 1 on a malformed header or a suspicious import")
    sp.add_argument("file", metavar="FILE")
    sp.add_argument("--json", action="store_true", help="print one JSON object")
    sp.add_argument("--sha256", action="store_true", help="also hash the whole file")
    return p


@functools.cache
def _parser() -> argparse.ArgumentParser:
    """One parser per process: building it costs more than most commands (make torture runs
    thousands in one process)."""
    return build_parser()


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if not hasattr(args, "store"):
        args.store = None
    tune_malloc()       # add, verify, cat, pack and unpack decode or encode chunk after chunk
    try:
        return args.func(args)
    except sqlite3.Error as exc:     # a catalog query outside the Catalog class's guarded seam
        from lmzfs.store.catalog import catalog_error
        print(f"lmz: {catalog_error(_store(args).catalog, exc)}", file=sys.stderr)
        return 2
    except (StoreError, CorruptChunk) as exc:
        print(f"lmz: {printable(str(exc.strerror if isinstance(exc, CorruptChunk) else exc))}", file=sys.stderr)
        return 1 if isinstance(exc, CorruptChunk) else 2
    except SingleFileError as exc:
        print(f"lmz: {printable(str(exc))}", file=sys.stderr)
        return exc.exit_status
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    except OSError as exc:     # unreadable source, unwritable destination, disk full
        print(f"lmz: {printable(_os_error(exc))}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("lmz: interrupted", file=sys.stderr)
        return 130
