"""Checkpoint chains (issue 25): what a chain of checkpoints costs to keep, and to read back.

Each chain's members are added one at a time, in order, as separate models of one fresh store
(`lmz add DIR --name CHAIN/MEMBER`: the store picks each member's reference itself), the way a
user adds checkpoints as a run produces them, then `lmz gc` (what the recoding of earlier members
left dead). The anchor is lmzip's best case: `lmz compress DIR`
of all the members in one directory, delta coding on (lmzip codes a tensor against the same tensor
of an earlier file of the same archive only). Reads: the newest and the oldest member, each read
whole through a fresh mount of the chain's store (store files in the page cache), beside the same
file read through a fresh mount of a store that holds it alone.

Chains: the quire release pair (int8, from the corpus), the BF16 and FP32 training chains that
bench/trainchain.py trains and caches, and the base / fine-tune pairs of bench/finetune.py (the
corpus's real all-MiniLM-L6-v2 and a fine-tune of it, FP32 and both rounded to BF16).
"""
from __future__ import annotations

import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import common
from common import (LMZIP_CLI, ToolError, describe, du_bytes, link_dir, log, mounted, read_sequential, run,
                    sha256_file, warm_page_cache)

HERE = Path(__file__).resolve().parent
CHAIN_CACHE = Path.home() / ".cache" / "lmzfs" / "chains"
FINETUNE_CACHE = Path.home() / ".cache" / "lmzfs" / "finetune"


@dataclass(frozen=True)
class Chain:
    name: str
    members: list[tuple[str, Path]]     # (member name, its one file), oldest first
    note: str


def training_chains(cache: Path = CHAIN_CACHE) -> list[Chain]:
    """The chains of bench/trainchain.py, trained (and cached) if not there yet: BF16 and FP32
    safetensors checkpoints, and the FP32 ones quantised to GGUF Q4_1 and Q8_0."""
    run([sys.executable, str(HERE / "trainchain.py"), "--out", str(cache)], timeout=3600)
    out = []
    for kind, filename in (("bf16", "model.safetensors"), ("fp32", "model.safetensors"),
                           ("q4_1", "model.gguf"), ("q8_0", "model.gguf")):
        steps = sorted(p for p in (cache / kind).glob("step-*") if (p / filename).is_file())
        if len(steps) >= 2:
            out.append(Chain(f"train {kind}", [(p.name, p / filename) for p in steps],
                             f"checkpoints of one training run (bench/trainchain.py), {kind.upper()}"))
    return out


def finetune_chains(minilm: Path, cache: Path = FINETUNE_CACHE) -> list[Chain]:
    """The base / fine-tune pairs of bench/finetune.py, fine-tuned (and cached) if not there yet."""
    run([sys.executable, str(HERE / "finetune.py"), "--base", str(minilm), "--out", str(cache)], timeout=3600)
    note = "a real base model and a fine-tune of it (bench/finetune.py)"
    return [Chain("minilm fine-tune fp32", [("base", minilm), ("tuned", cache / "fp32" / "model.safetensors")],
                  f"{note}, FP32"),
            Chain("minilm fine-tune bf16", [("base", cache / "bf16" / "base.safetensors"),
                                            ("tuned", cache / "bf16" / "model.safetensors")], f"{note}, both rounded to BF16")]


def quire_chain(paths: dict[str, Path]) -> Chain:
    return Chain("quire releases", [("v0.3.0", paths["quire"]), ("v0.3.1", paths["quire@0.3.1"])],
                 "two successive releases of an int8 model")


def _lmz(store: Path, *args) -> list:
    return [common.LMZFS_CLI, "--store", store, *args]


def _read_through_mount(store: Path, model: str, path: Path, work: Path, expect: str | None) -> float:
    """Seconds to read the file whole through a fresh mount of `store`; checks its SHA-256 if asked."""
    warm_page_cache([store])
    mnt = work / "mnt"
    with mounted(_lmz(store, "mount", mnt), _lmz(store, "umount", mnt), mnt, work / "mount.log") as m:
        served = m.path / model / path.name
        n, seconds = read_sequential(served)
        if n != path.stat().st_size:
            raise ToolError(f"mount served {n} bytes of {path.stat().st_size} for {model}/{path.name}")
        if expect is not None and sha256_file(served) != expect:
            raise ToolError(f"mount served different bytes for {model}/{path.name}")
    return seconds


def _lmzip_archive(chain: Chain, work: Path) -> dict:
    src = work / "lmzip-src"
    src.mkdir()
    for i, (member, path) in enumerate(chain.members):
        link_dir([path], src / f"{i:03d}-{member}")
    out = work / "chain.lmz"
    t0 = time.monotonic()
    run([LMZIP_CLI, "compress", "-q", "-f", src, out])
    return {"bytes": out.stat().st_size, "seconds": time.monotonic() - t0}


def _our_store(chain: Chain, work: Path) -> dict:
    store = work / "store"
    adds = []
    for member, path in chain.members:
        t0 = time.monotonic()
        said = run(_lmz(store, "add", link_dir([path], work / "src" / member), "--name", f"chain/{member}"))
        adds.append({"member": member, "seconds": time.monotonic() - t0, "said": said.strip()[-600:]})
    before_gc = du_bytes(store)
    # A member's arrival recodes its predecessor's chunks as deltas; their old payloads stay in the
    # packs (a mount may be reading them) until `lmz gc`, which a user runs as the docs say.
    t0 = time.monotonic()
    gc_said = run(_lmz(store, "gc")).strip()
    return {"store": store, "bytes": du_bytes(store), "pack_bytes": du_bytes(store / "packs"), "adds": adds,
            "bytes_before_gc": before_gc, "gc_seconds": time.monotonic() - t0, "gc_said": gc_said[-400:],
            "listing": run(_lmz(store, "ls")).strip()[-2000:]}


def _standalone(member: str, path: Path, work: Path) -> Path:
    store = work / f"alone-{member}"
    run(_lmz(store, "add", link_dir([path], work / "src-alone" / member), "--name", f"chain/{member}"))
    return store


def measure_chain(chain: Chain, runs: int, work: Path) -> dict:
    row: dict = {"name": chain.name, "note": chain.note, "members": [m for m, _ in chain.members],
                 "logical_bytes": sum(p.stat().st_size for _, p in chain.members)}
    try:
        row["lmzip"] = _lmzip_archive(chain, work)
    except Exception as exc:
        row["lmzip"] = {"error": describe(exc)}
    try:
        ours = _our_store(chain, work)
    except Exception as exc:
        row["ours"] = {"error": describe(exc)}
        return row
    row["ours"] = {k: v for k, v in ours.items() if k != "store"}
    reads: dict = {}
    for which, (member, path) in (("newest", chain.members[-1]), ("oldest", chain.members[0])):
        try:
            alone = _standalone(member, path, work)
            digest = sha256_file(path)
            chained_s, alone_s = [], []
            for i in range(runs):
                chained_s.append(_read_through_mount(ours["store"], f"chain/{member}", path, work,
                                                     digest if i == 0 else None))
                alone_s.append(_read_through_mount(alone, f"chain/{member}", path, work, digest if i == 0 else None))
            reads[which] = {"member": member, "bytes": path.stat().st_size, "chain_s": chained_s,
                            "alone_s": alone_s, "alone_store_bytes": du_bytes(alone)}
        except Exception as exc:
            reads[which] = {"member": member, "error": describe(exc)}
    row["reads"] = reads
    return row


def measure(chains: list[Chain], runs: int, work: Path) -> dict:
    out = []
    for chain in chains:
        log(f"chains: {chain.name} ({len(chain.members)} members)")
        sub = work / chain.name.replace(" ", "-")
        sub.mkdir(parents=True)
        out.append(measure_chain(chain, runs, sub))
    return {"chains": out}


def ratio_of(row: dict) -> float | None:
    """Our store's bytes over lmzip's archive's, or None where either is missing."""
    ours, theirs = row.get("ours", {}).get("bytes"), row.get("lmzip", {}).get("bytes")
    return ours / theirs if ours and theirs else None


def read_ratio(read: dict) -> float | None:
    """Median over runs of (standalone seconds / chained seconds): the chained read's speed as a
    fraction of the standalone copy's."""
    if "chain_s" not in read:
        return None
    return statistics.median(a / c for a, c in zip(read["alone_s"], read["chain_s"]))
