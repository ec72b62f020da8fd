"""`lmz add`: pack a model directory (or one file) into the store, atomically.

Order of durability: chunk payloads are appended to packs and fsync'd first; only then does one
catalog transaction make the model, its files, extents and new chunks visible. An add that fails
before that commit (a full disk, a file that changed under it) cuts what it appended; a process
killed before it leaves only dead bytes at the end of a pack, which `lmz gc` reclaims.

Checkpoint chains: unless told not to (`--no-delta`), an add picks a stored model to pair with
(`--base`, or store/chains/plan.py's choice), stores the new model's chunks coded alone and recodes
the base's paired chunks as deltas against them (store/chains/recode.py) in the same transaction:
the newest checkpoint reads at full speed, older ones through their chain. After the commit the
recoded chunks' old payloads are dropped from the packs that held them (gc.reclaim_packs).
"""
from __future__ import annotations

import os
import posixpath
import sqlite3
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from lmzfs.chunker import MAX_CHUNK_SIZE, MIN_CHUNK_SIZE, ChunkSizes
from lmzfs.formats import ExternalRef, FormatError, external_refs
from lmzfs.store.catalog import Catalog, failure_words
from lmzfs.store.catalog.modelrows import NewFile, insert_file, insert_model
from lmzfs.store.chains.plan import BaseChoice, NewTensor, choose_base
from lmzfs.store.chains.recode import ChainRecoder, RecodedBefore, RecodeTotals, record_recoded
from lmzfs.store.gc import GcResult, reclaim_packs
from lmzfs.store.layout import StoreError, StorePaths
from lmzfs.store.lock import WriterLock
from lmzfs.store.names import validate_model_name
from lmzfs.store.catalog.chunkrows import add_refs
from lmzfs.store.write.encodefile import (EncodeTotals, FileChain, FileContent, FileEncoder, FilePlan,
                                          file_tensors, insert_file_rows, insert_new_chunks)
from lmzfs.store.write.policy import EncodePolicy
from lmzfs.store.write.session import PackSession
from lmzfs.store.write.siblings import SiblingIndex, SiblingTotals
from lmzfs.store.write.sources import SourceFile, SourceTree

Progress = Callable[[int, int], None]     # (bytes done, bytes total)


@dataclass(kw_only=True)
class AddResult(EncodeTotals):
    name: str
    seconds: float = 0.0
    base: BaseChoice | None = None          # the model paired with, if any
    delta: bool = True                      # False: --no-delta
    recoded: RecodeTotals = field(default_factory=RecodeTotals)
    siblings: SiblingTotals = field(default_factory=SiblingTotals)  # deltas between this add's files
    reclaimed: GcResult | None = None      # the recode's dead payloads dropped after the commit
    stored_models: int = 0                  # models in the store before this add
    tensors: int = 0                        # tensors found in the added files


def default_model_name(source: Path) -> str:
    real = Path(os.path.realpath(source))     # never raises, even on a symlink loop
    return real.name if real.is_dir() else real.stem


def check_name_free(catalog: Catalog, name: str) -> None:
    for m in catalog.models():
        if m.name == name:
            raise StoreError(f"model {name!r} already exists (`lmz rm {name}` first, or choose --name)")
        if m.name.startswith(name + "/") or name.startswith(m.name + "/"):
            raise StoreError(f"model {name!r} would nest with existing model {m.name!r}; pick a sibling name")


# How many references a read of a chunk follows at most, unless the config's chain_depth says otherwise.
DEFAULT_CHAIN_DEPTH = 4         # lmzfs/config.py keeps the same default


def add_model(store: StorePaths, source: Path, name: str | None = None, *,
              progress: Progress | None = None, workers: int | None = None, fast: bool = False,
              chunk_size: int | None = None, segments: bool = True, base: str | None = None,
              delta: bool = True, chain_depth: int = DEFAULT_CHAIN_DEPTH, link_roots: tuple[Path, ...] = (),
              also_record: Callable[[sqlite3.Connection, int], None] | None = None) -> AddResult:
    """Add SOURCE as model NAME.

    By default every chunk gets the smallest of all codecs, the entropy-coded ones (floatsplit,
    ggufblocks, entropy) included: the smallest store, but for streams not worth coding
    (entropy.worth_coding), which are stored. ``fast`` keeps to zstd and byte grouping:
    a store a few points larger whose chunks decode faster (docs/results.md).

    ``chunk_size``: plain bytes per chunk of every segment, MIN_CHUNK_SIZE to MAX_CHUNK_SIZE;
    None (the default) cuts by the sizes the store records (catalog/chunksizes.py: a new store
    cuts float tensors at 4 MiB, everything else at 1 MiB). Smaller chunks make a cache miss
    cheaper (a 4 KiB random read decodes a whole chunk, or a float chunk's segment) and
    sequential reads slower; chunks cut at different sizes do not deduplicate.

    ``segments``: float chunks over 256 KiB are coded in segments (floatseg) that a lone small
    read decodes alone, so a random read's miss costs one segment's decode, not its chunk's; False codes
    them whole (floatsplit), which decodes a little faster front to back.

    ``base``: the stored model to pair with (else one is chosen, if any qualifies); ``delta``
    False stores the model without touching any other; ``chain_depth``: the most references a
    read of any chunk may follow.

    ``link_roots``: directories outside SOURCE that its symlinks may lead into (a Hugging Face
    cache snapshot's blobs/); ``also_record(tx, model_id)`` writes more rows about the model
    inside the add's one transaction (its Hugging Face origin)."""
    if chunk_size is not None and not MIN_CHUNK_SIZE <= chunk_size <= MAX_CHUNK_SIZE:
        raise StoreError(f"chunk size {chunk_size} is outside {MIN_CHUNK_SIZE}..{MAX_CHUNK_SIZE} bytes")
    sizes = ChunkSizes.uniform(chunk_size) if chunk_size is not None else None
    if base is not None and not delta:
        raise StoreError("--base and --no-delta contradict each other")
    name = validate_model_name(default_model_name(source) if name is None else name)
    with SourceTree(source, link_roots) as tree:
        return _add_tree(store, tree, name, progress, workers, EncodePolicy(fast, segments), sizes,
                         _Chains(base, delta, chain_depth), also_record)


@dataclass(frozen=True)
class _Chains:
    base: str | None
    delta: bool
    depth: int


def external_data(tree: SourceTree) -> dict[str, list[ExternalRef]]:
    """File (rel) -> the initializers that the tree's ONNX models keep in it: a model over 2 GB
    keeps its weights in files beside it, named relative to its own directory. A location that
    names no file of the tree (absolute, leading out of it, missing) is left out, as is a model
    whose header is malformed (it is stored as opaque bytes)."""
    present = {src.rel for src in tree.files}
    out: dict[str, list[ExternalRef]] = {}
    for src in tree.files:
        if not src.rel.lower().endswith(".onnx"):
            continue
        with open(tree.open(src), "rb") as f:
            try:
                refs = external_refs(src.shown, f, os.fstat(f.fileno()).st_size)
            except FormatError:
                continue
        for r in refs:
            if r.location.startswith("/") or "\\" in r.location:
                continue
            rel = posixpath.normpath(posixpath.join(posixpath.dirname(src.rel), r.location))
            if rel in present and rel != src.rel:
                out.setdefault(rel, []).append(r)
    return out


def _new_tensors(tree: SourceTree, named: dict[str, list[ExternalRef]]) -> list[NewTensor]:
    """The tensors of the files to add, from their headers alone (a first, cheap pass)."""
    out = []
    for src in tree.files:
        with open(tree.open(src), "rb") as f:
            out.extend(file_tensors(src.rel, src.shown, f, os.fstat(f.fileno()).st_size, named.get(src.rel)))
    return out


def _add_tree(store: StorePaths, tree: SourceTree, name: str, progress: Progress | None, workers: int | None,
              policy: EncodePolicy, sizes: ChunkSizes | None, chains: _Chains,
              also_record: Callable[[sqlite3.Connection, int], None] | None = None) -> AddResult:
    sources = tree.files
    store.create()
    store.check_format()
    started = time.monotonic()
    with WriterLock(store.lock):
        catalog = Catalog(store.catalog)
        try:
            check_name_free(catalog, name)
            result = AddResult(name=name, delta=chains.delta)
            named = external_data(tree)
            new_tensors = _new_tensors(tree, named)
            result.stored_models, result.tensors = len(catalog.models()), len(new_tensors)
            index = choose_base(catalog, name, new_tensors, chains.base) if chains.delta else None
            result.base = index.choice if index is not None else None
            total = sum(s.size for s in sources)
            with PackSession(store, catalog, policy=policy, workers=workers) as session:
                encoder = FileEncoder(session, sizes or catalog.chunk_sizes(), result)
                plans: list[FilePlan] = []
                done = 0
                siblings = SiblingIndex(chains.depth) if chains.delta else None
                recoder = ChainRecoder(session, chains.depth) if index else None
                try:
                    for src in sources:
                        chain = FileChain(index, recoder, src.rel) if index is not None else None
                        plan = _add_file(tree, src, encoder, lambda n: progress and progress(done + n, total),
                                         chain, siblings, named.get(src.rel))
                        done += plan.size
                        plans.append(plan)
                    if recoder is not None:
                        recoder.drain(0)
                        result.recoded = recoder.totals
                        result.warnings.extend(recoder.warnings)
                finally:
                    if recoder is not None:
                        recoder.close()
                    if siblings is not None:
                        result.siblings = siblings.totals
                        siblings.close()
                recoded = recoder.rows if recoder is not None else {}
                before = RecodedBefore.of(catalog, recoded)
                try:
                    session.commit(lambda tx: _record_model(tx, name, str(tree.resolved), plans, encoder, recoded,
                                                            before, also_record))
                except sqlite3.Error as exc:
                    # e.g. a full disk: the transaction rolled back, so nothing of this add is
                    # visible, and the session cuts its pack bytes
                    raise StoreError(f"could not record {name!r} in the catalog "
                                     f"({failure_words(catalog.path, exc)}); nothing was added") from exc
            if before.packs:
                _reclaim(store, catalog, before.packs, result)
        finally:
            catalog.close()
    result.seconds = time.monotonic() - started
    return result


def _add_file(tree: SourceTree, src: SourceFile, encoder: FileEncoder, progress: Callable[[int], None],
              chain: FileChain | None, siblings: SiblingIndex | None,
              named_by: list[ExternalRef] | None) -> FilePlan:
    # The one descriptor the walk's file is read through: parsing, hashing and chunking alike.
    with open(tree.open(src), "rb") as f:
        before = os.fstat(f.fileno())
        content = FileContent(f, lambda length, offset: os.pread(f.fileno(), length, offset), before.st_size)
        plan = encoder.encode(content, src.shown, progress=progress, chain=chain, siblings=siblings,
                              named_by=named_by)
        plan.rel, plan.mtime = src.rel, before.st_mtime
        after = os.fstat(f.fileno())
        if (after.st_size, after.st_mtime_ns) != (before.st_size, before.st_mtime_ns):
            raise StoreError(f"{src.shown} changed while being added; nothing was added, try again when it is stable")
    return plan


def _reclaim(store: StorePaths, catalog: Catalog, packs: set[int], result: AddResult) -> None:
    """After the commit: the old payloads of recoded chunks are dead, so the user would see the
    store grow by the whole new model; drop them now from the packs that held them."""
    try:
        result.reclaimed = reclaim_packs(store, catalog, packs)
    except (StoreError, OSError, sqlite3.Error) as exc:
        result.warnings.append(f"the model was added, but the space its recode freed was not reclaimed ({exc}); "
                               f"`lmz gc` reclaims it")


def _record_model(tx: sqlite3.Connection, name: str, source: str, plans: list[FilePlan], encoder: FileEncoder,
                  recoded: dict, before: RecodedBefore,
                  also_record: Callable[[sqlite3.Connection, int], None] | None = None) -> None:
    """Inside the add's one transaction: the model, its files, extents and new chunks, and the
    recoded chunks of its base."""
    insert_new_chunks(tx, plans, encoder.new)
    model_id = insert_model(tx, name, time.time(), source)
    refs: dict[bytes, int] = {}
    for p in plans:
        file_id = insert_file(tx, NewFile(model_id, p.rel, p.size, p.mtime, p.sha256, p.format))
        for cid, n in insert_file_rows(tx, file_id, p).items():
            refs[cid] = refs.get(cid, 0) + n
    record_recoded(tx, recoded, before, refs)
    add_refs(tx, refs)
    if also_record is not None:
        also_record(tx, model_id)

