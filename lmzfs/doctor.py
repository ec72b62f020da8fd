"""`lmz doctor`: is this host ready to serve models, and is the store whole?

Checks FUSE (/dev/fuse, fusermount3, the kernel, /etc/fuse.conf when allow_other is wanted), the
versions of everything the mount depends on, the store (format, catalog integrity, counts, every
pack the catalog references), the active lmzfs mounts and the effective settings. Each check that
fails adds a problem; the report is healthy when there is none. Nothing here writes anything.
"""
from __future__ import annotations

import importlib.metadata
import os
import platform
import shutil
import stat
import sqlite3
import subprocess
import sys
from typing import TYPE_CHECKING

from lmzfs import __version__
from lmzfs.config import Settings
from lmzfs.hostresources import memory_limit, physical_memory, usable_cpus
from lmzfs.mountstats import StatsUnavailable, lmzfs_mounts, read_stats
from lmzfs.progress import human_bytes
from lmzfs.store.layout import StoreError, StorePaths

if TYPE_CHECKING:
    from lmzfs.store.catalog import Catalog

FUSE_CONF = "/etc/fuse.conf"
PACKAGES = ("pyfuse3", "trio", "zstandard", "numpy", "xxhash")


def diagnose(settings: Settings, config_error: str | None = None, remote=None) -> dict:
    """Every check's findings as plain data, with ``problems`` (one line each) and ``ok``.
    remote (RemoteOptions): also check that remote store from this host."""
    problems: list[str] = []
    if config_error:
        problems.append(f"config: {config_error}")
    doc = {
        "fuse": check_fuse(settings, problems),
        "versions": check_versions(problems),
        "store": check_store(StorePaths(settings.store.absolute()), problems, needed=remote is None),
        "mounts": check_mounts(settings, problems),
        "host": {"memory_bytes": memory_limit(), "physical_memory_bytes": physical_memory(),
                 "usable_cpus": usable_cpus()},
        "settings": {"config_file": str(settings.config_file) if settings.config_file else None,
                     **settings.as_dict()},
    }
    doc["store"]["source"] = settings.sources.get("store", "default")
    if remote is not None:
        from lmzfs.remotecheck import check_remote
        doc["remote"] = check_remote(remote, problems)
    doc["problems"] = problems
    doc["ok"] = not problems
    return doc


# -- FUSE ---------------------------------------------------------------------------------------

def check_fuse(settings: Settings, problems: list[str]) -> dict:
    out: dict = {"kernel": platform.release()}
    try:
        with open("/proc/filesystems") as f:
            out["kernel_fuse"] = any(line.split()[-1:] == ["fuse"] for line in f)
    except OSError:
        out["kernel_fuse"] = None
    dev = {"path": "/dev/fuse", "present": os.path.exists("/dev/fuse"), "openable": False}
    if dev["present"]:
        try:
            os.close(os.open("/dev/fuse", os.O_RDWR | os.O_CLOEXEC))
            dev["openable"] = True
        except OSError as exc:
            dev["error"] = exc.strerror
            problems.append(f"/dev/fuse cannot be opened read-write: {exc.strerror}")
    else:
        problems.append("/dev/fuse is missing (load the fuse module: modprobe fuse; in a container, "
                        "pass the device through)")
    out["dev_fuse"] = dev
    binary = shutil.which("fusermount3")
    out["fusermount3"] = {"path": binary, "version": _fusermount_version(binary)}
    if binary is None:
        problems.append("fusermount3 is not on PATH (install the fuse3 package: apt install fuse3)")
    allow = _user_allow_other()
    needed = settings.allow_other and os.geteuid() != 0
    out["fuse_conf"] = {"path": FUSE_CONF, "user_allow_other": allow, "needed": needed}
    if needed and not allow:
        problems.append(f"allow_other is configured but {FUSE_CONF} lacks a user_allow_other line "
                        "(add it, or mount as root)")
    return out


def _fusermount_version(binary: str | None) -> str | None:
    if binary is None:
        return None
    try:
        r = subprocess.run([binary, "-V"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    text = (r.stdout + r.stderr).strip()
    return text.rpartition(":")[2].strip() or None


def _user_allow_other() -> bool | None:
    """Whether /etc/fuse.conf enables user_allow_other; None if the file is missing or unreadable."""
    try:
        with open(FUSE_CONF) as f:
            return any(line.split("#", 1)[0].strip() == "user_allow_other" for line in f)
    except OSError:
        return None


# -- versions -----------------------------------------------------------------------------------

def check_versions(problems: list[str]) -> dict:
    out = {"lmzfs": __version__, "python": platform.python_version()}
    for name in PACKAGES:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = None
            problems.append(f"python package {name} is not installed (pip install lmzfs pulls it in)")
    out["libfuse"] = _fusermount_version(shutil.which("fusermount3"))
    # Not a problem when missing (the numpy loop reads every store), but several times slower to decode.
    from lmzfs.codecs import kernels
    loop = kernels.compiled()
    out["tans_decoder"] = "compiled" if loop is not None else "numpy (slower; a C compiler at install builds the loop)"
    if loop is not None:            # the compiled loop's steps: AVX-512 where the CPU has it
        out["tans_steps"] = "AVX-512" if loop.vector_isa() == "avx512" else "scalar"
    return out


# -- the store ----------------------------------------------------------------------------------

def check_store(store: StorePaths, problems: list[str], *, needed: bool = True) -> dict:
    """needed False: a host that mounts a remote store, for which no local store is no problem."""
    out: dict = {"path": str(store.root), "exists": store.exists()}
    if not out["exists"] and not needed:
        return out
    if not out["exists"]:
        what = "empty directory" if store.root.is_dir() else "nothing"
        problems.append(f"no store at {store.root} ({what} there; `lmz add MODEL_DIR` creates it)")
        return out
    try:
        out["format"] = store.format_file.read_text(errors="replace").strip()
        store.check_format()
    except (StoreError, OSError) as exc:
        problems.append(f"store format: {exc}")
        return out
    _check_modes(store, out, problems)
    from lmzfs.store.catalog.check import diagnose
    try:
        verdict = diagnose(store)
    except StoreError as exc:           # cannot be read now (a full disk): not damage
        problems.append(str(exc))
        return out
    out["catalog_copies"] = {"clean": sum(1 for _, c in verdict.copies if c.clean), "found": len(verdict.copies),
                             "newest_generation": max((c.generation for _, c in verdict.copies if c.clean),
                                                      default=None),
                             "generation": verdict.live.generation}
    if not verdict.sound:
        problems.append(f"catalog {store.catalog} is damaged: run lmz verify --repair ({verdict.problem})")
        return out
    try:
        catalog = _open_catalog(store)
    except StoreError as exc:
        problems.append(str(exc))
        return out
    try:
        _check_catalog(catalog, store, out, problems)
    except sqlite3.Error as exc:
        from lmzfs.store.catalog import catalog_error
        problems.append(str(catalog_error(store.catalog, exc)))
    finally:
        catalog.close()
    return out


def _check_modes(store: StorePaths, out: dict, problems: list[str]) -> None:
    """Whether other users may enter the store and read its packs and catalog: a store made before
    lmzfs created it owner-only, or loosened by hand. Inside an owner-only root nothing is
    reachable, whatever the files' own modes (the mount's log, say), so only then are they listed."""
    root_mode = store.root.stat().st_mode
    out["mode"] = stat.filemode(root_mode)
    loose: list[str] = []
    if root_mode & 0o077:
        for d in (store.root, store.packs):
            for path in [d, *(sorted(d.iterdir()) if d.is_dir() else [])]:
                try:
                    mode = path.lstat().st_mode
                except OSError:
                    continue          # removed meanwhile (a gc, a checkpoint of the WAL)
                if mode & 0o077 and (path == d or not stat.S_ISDIR(mode)):
                    loose.append(f"{path} {stat.filemode(mode)}")
        problems.append(f"store {store.root} is open to other users ({stat.filemode(root_mode)}; {len(loose)} "
                        f"path(s) with group or other permissions): they can read packs and the catalog directly, "
                        f"though the mount refuses them; fix with: chmod -R go= {store.root}")
    out["loose_permissions"] = loose


def _open_catalog(store: StorePaths) -> Catalog:
    from lmzfs.store.catalog import Catalog
    return Catalog(store.catalog, readonly=True)


def _check_catalog(catalog: Catalog, store: StorePaths, out: dict, problems: list[str]) -> None:
    from lmzfs.store.catalog.chunkrows import pack_use
    from lmzfs.store.catalog.stats import counts, quick_check
    db = catalog.db
    rows = quick_check(db)
    out["quick_check"] = "ok" if rows == ["ok"] else rows[:10]
    if rows != ["ok"]:
        problems.append(f"catalog {store.catalog} fails PRAGMA quick_check: {'; '.join(rows[:3])}")
    n = counts(db)
    out["models"] = n.models
    out["files"], out["logical_bytes"] = n.files, n.logical_bytes
    out["chunks"] = n.chunks
    out["catalog_version"] = catalog.version
    try:
        sizes = catalog.chunk_sizes()
        out["chunk_sizes"] = {"floats": sizes.floats, "other": sizes.other}
    except StoreError as exc:
        out["chunk_sizes"] = None
        problems.append(str(exc))
    out["chunks_checked_by_sha256"] = catalog.chunks_checked_by_id()
    out["unreferenced_chunks"], out["unreferenced_bytes"] = n.unreferenced_chunks, n.unreferenced_bytes
    packs = pack_use(db)
    out["packs"] = {"referenced": len(packs), "missing": [], "damaged": []}
    for u in packs.values():
        _check_pack(store, u.pack, u.chunks, u.end, out["packs"], problems)
    on_disk = store.disk_bytes()
    out["on_disk_bytes"] = on_disk


def _check_pack(store: StorePaths, pack_id: int, chunks: int, end: int, out: dict, problems: list[str]) -> None:
    from lmzfs.store.packs import PackDamaged, check_pack_header
    path = store.pack(pack_id)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        out["missing"].append(pack_id)
        problems.append(f"pack {path} is missing ({chunks} chunk(s) in the catalog are stored in it)")
        return
    except OSError as exc:
        out["damaged"].append(pack_id)
        problems.append(f"pack {path} cannot be opened: {exc.strerror}")
        return
    try:
        check_pack_header(fd, path)
        size = os.fstat(fd).st_size
        if size < end:
            raise PackDamaged(f"{path} is truncated: {size} bytes, but its chunks reach byte {end}")
    except PackDamaged as exc:
        out["damaged"].append(pack_id)
        problems.append(f"pack {exc}")
    finally:
        os.close(fd)


# -- mounts -------------------------------------------------------------------------------------

def check_mounts(settings: Settings, problems: list[str]) -> list[dict]:
    out = []
    for m in lmzfs_mounts():
        entry: dict = {"mountpoint": str(m.mountpoint), "source": m.source}
        try:
            entry["stats"] = read_stats(m.mountpoint, timeout=3.0)[1]
            corrupt = (entry["stats"].get("reader") or {}).get("corrupt_chunks", 0)
            if corrupt:
                problems.append(f"mount {m.mountpoint} met {corrupt} corrupt chunk(s) (reads of them got EIO); "
                                f"run: lmz verify")
        except StatsUnavailable as exc:
            entry["stats_error"] = str(exc)
            if exc.broken:
                problems.append(f"mount {m.mountpoint} is not being served ({exc}); clear it with: "
                                f"lmz umount {m.mountpoint} (if busy: fusermount3 -uz {m.mountpoint})")
        out.append(entry)
    mp = settings.mountpoint
    if mp is not None and not mp.is_dir() and not any(e["mountpoint"] == str(mp) for e in out):
        problems.append(f"the configured mountpoint {mp} is not a directory (create it: mkdir -p {mp})")
    return out


# -- the report ---------------------------------------------------------------------------------

def render(doc: dict) -> list[str]:
    lines = ["FUSE"]
    fuse = doc["fuse"]
    dev = fuse["dev_fuse"]
    lines.append(f"  /dev/fuse      {'missing' if not dev['present'] else 'opens read-write' if dev['openable'] else 'present but ' + dev.get('error', 'not openable')}")
    fm = fuse["fusermount3"]
    lines.append(f"  fusermount3    {fm['path'] or 'not found'}" + (f" (version {fm['version']})" if fm["version"] else ""))
    lines.append(f"  kernel         {fuse['kernel']}" + ("" if fuse["kernel_fuse"] is None else
                                                         ", fuse registered" if fuse["kernel_fuse"] else ", no fuse"))
    conf = fuse["fuse_conf"]
    state = {True: "set", False: "not set", None: "no file"}[conf["user_allow_other"]]
    lines.append(f"  {conf['path']} user_allow_other: {state}" + ("" if conf["needed"] else " (not needed here)"))
    lines.append("versions")
    lines.append("  " + ", ".join(f"{k} {v or 'MISSING'}" for k, v in doc["versions"].items()))
    store = doc["store"]
    lines.append(f"store {store['path']} (from {store['source']})" + ("" if store["exists"] else ": none"))
    if "chunks" in store:
        lines.append(f"  format         {store['format']}, catalog version {store['catalog_version']}; quick_check: "
                     f"{store['quick_check'] if store['quick_check'] == 'ok' else 'FAILED'}")
        lines.append(f"  contents       {store['models']} model(s), {store['files']} file(s), {store['chunks']} chunk(s)"
                     + (f"; {store['unreferenced_chunks']} unreferenced ({human_bytes(store['unreferenced_bytes'])}, "
                        "`lmz gc` reclaims them)" if store["unreferenced_chunks"] else ""))
        if store["chunk_sizes"]:
            cut = store["chunk_sizes"]
            lines.append("  chunk sizes    " + (f"every segment at {human_bytes(cut['other'])}"
                                                 if cut["floats"] == cut["other"] else
                                                 f"float tensors at {human_bytes(cut['floats'])}, the rest at "
                                                 f"{human_bytes(cut['other'])}") + " (what adds cut new files by)")
        copies = store["catalog_copies"]
        lines.append(f"  catalog copies {copies['clean']} clean of {copies['found']} beside it; newest of generation "
                     f"{copies['newest_generation']}, the catalog's is {copies['generation']}")
        old = store["chunks_checked_by_sha256"]
        lines.append("  checksums      " + ("every chunk read is checked by its XXH3-128" if not old else
                     f"{old} of {store['chunks']} chunk(s) were stored before lmzfs kept read checksums: reads "
                     "check their SHA-256 instead (more CPU per chunk read); `lmz verify "
                     "--record-checksums` records them"))
        packs = store["packs"]
        bad = len(packs["missing"]) + len(packs["damaged"])
        lines.append(f"  packs          {packs['referenced']} referenced, "
                     + ("all present with valid headers" if not bad else f"{bad} missing or damaged"))
        loose = store.get("loose_permissions", [])
        lines.append("  permissions    " + ("owner only" if not loose else f"{len(loose)} path(s) open to other users"))
        logical, disk = store["logical_bytes"], store["on_disk_bytes"]
        saved = f" ({100 * (1 - disk / logical):.1f}% saved)" if logical else ""
        lines.append(f"  size           {human_bytes(logical)} of model files in {human_bytes(disk)} on disk{saved}")
    if "remote" in doc:
        from lmzfs.remotecheck import render_remote
        lines += render_remote(doc["remote"])
    lines.append("mounts" + ("" if doc["mounts"] else "         none active"))
    for m in doc["mounts"]:
        s = m.get("stats")
        if s is None:
            lines.append(f"  {m['mountpoint']}: {m['stats_error']}")
            continue
        reader, cache = s.get("reader", {}), s.get("cache", {})
        rate = cache.get("hit_rate")
        lines.append(f"  {m['mountpoint']}: pid {s.get('pid', '?')}, served {human_bytes(reader.get('bytes_served', 0))}, "
                     f"cache hit rate {'-' if rate is None else f'{100 * rate:.1f}%'}, open files {s.get('open_files', 0)}")
    host = doc["host"]
    mem, ram = host["memory_bytes"], host["physical_memory_bytes"]
    limit = "" if mem is None or mem == ram else f", limited by a cgroup to {human_bytes(mem)}"
    lines.append(f"host           {human_bytes(ram) if ram else 'unknown'} of RAM{limit}; {host['usable_cpus']} usable CPU(s)")
    settings = doc["settings"]
    lines.append(f"settings (config file: {settings['config_file'] or 'none'})")
    for key, item in settings.items():
        if key != "config_file":
            value = item["value"]
            if key == "cache_size":
                value = f"{human_bytes(value)} ({value} bytes)"
            elif key == "workers" and value is None:
                value = f"usable CPUs ({host['usable_cpus']})"
            elif isinstance(value, bool):
                value = "yes" if value else "no"
            lines.append(f"  {key:<12} {value if value is not None else '-':<30} ({item['source']})")
    lines += [f"problem: {p}" for p in doc["problems"]]
    lines.append("healthy: no problems found" if doc["ok"] else f"{len(doc['problems'])} problem(s) found")
    return lines


def main_report(settings: Settings, config_error: str | None, as_json: bool, remote=None) -> int:
    import json
    doc = diagnose(settings, config_error, remote)
    if as_json:
        print(json.dumps(doc, indent=1, sort_keys=False))
    else:
        print("\n".join(render(doc)))
    sys.stdout.flush()
    return 0 if doc["ok"] else 1
