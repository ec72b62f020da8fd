#!/usr/bin/env python3
"""Real loaders through our mount, lmzip's mount and the plain files (issue 49).

`make bench` runs it as its "loaders" section (bench/run.py, `--only loaders`); on its own, in the
bench venv, as root (the page cache is dropped before every timed run):

    bench/.venv/bin/python bench/loaders_table.py [--runs 3] [--against REV] [--json OUT] [--tmpdir DIR]

Subjects: the all-MiniLM-L6-v2 directory of the corpus (sentence-transformers layout, 91 MB), a
~440 MB FP32 BERT directory written by transformers' own `save_pretrained` (bert-base's shape,
random weights from a fixed seed, minilm's tokenizer; built once and cached under
~/.cache/lmzfs/loaders), astra (BF16 safetensors) and the two smollm2 GGUF files (Q4_1, and the
K-quant Q4_K_M). Each goes, as a model, into a store of ours (`lmz add`, default codecs) and one of
lmzip's; with --against REV also into a store made by lmzfs as it was at git revision REV (the
read path before a change, in the same run).

Each timed run: `sync; echo 3 > /proc/sys/vm/drop_caches` (the stores' packs come from disk too),
a fresh mount, then a fresh Python process (its imports not timed) that runs the loader and
reports its seconds and a SHA-256 of its output, which must be the same for every target:

  st        SentenceTransformer(DIR, device="cpu") + encode of three sentences (load, encode)
  safe_open safetensors.safe_open(framework="pt"), get_tensor + clone of every tensor of astra
  gguf      gguf.GGUFReader + a copy of every tensor's data
  llama     llama_cpp.Llama(model_path, n_ctx=64): the load, then the logits of 4 tokens
            (when llama-cpp-python is in this venv; else a note says why not)
  cold      the file read front to back in 1 MiB reads
  mmap      the file mmap'd, one byte of every 4 KiB page touched in file order

Beside them, the pyfuse3 floor: the model's files copied into bench/pyfuse_floor.py (an in-memory
file system on pyfuse3 + trio, as our daemon is, whose read handler only slices its bytes;
read_ahead_kb as ours), page cache dropped: the quickest any pyfuse3 + trio daemon serves that
loader here, with nothing to decode and no disk to read.

Each row is measured through every target back to back, their order rotating from row to row
and run to run; ratios are taken within a run (lmzip's
seconds over ours: above 1, ours is faster; ours over the plain file's) and their median reported.
"""
from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common  # noqa: E402
from common import describe, log, run, sha256_file, version_of  # noqa: E402
from tools import CliStore, lmzfs_store, lmzip_store  # noqa: E402

HERE = Path(__file__).resolve()
BERT_CACHE = Path(os.environ.get("LMZ_LOADERS_CACHE", Path.home() / ".cache" / "lmzfs" / "loaders"))
BERT_NAME = "bert-base-random-fp32"
BERT_SEED = 20261206
SENTENCES = ["A lossless store serves model files back byte for byte.",
             "Real loaders judge a model mount by how long they take."]
PLAIN, OURS, LMZIP, EARLIER = "plain files", "lmzfs mount", "lmzip mount", "lmzfs mount, earlier"
FLOOR = "pyfuse3 floor"
READ_AHEAD_KB = 1024        # what `lmz mount` sets its mounts' read_ahead_kb to (lmzfs/daemon/kernel_readahead.py)
PAGE = 4096


# ----------------------------------------------------------------------------- the children

def _digest(arrays) -> str:
    h = hashlib.sha256()
    for a in arrays:
        h.update(memoryview(a).cast("B") if not hasattr(a, "tobytes") else a.tobytes())
    return h.hexdigest()


def child(kind: str, path: str) -> dict:
    """Run one loader in this (fresh) process; imports first, untimed."""
    if kind == "st":
        import numpy as np
        import torch  # noqa: F401
        from sentence_transformers import SentenceTransformer
        t0 = time.perf_counter()
        model = SentenceTransformer(path, device="cpu")
        t1 = time.perf_counter()
        emb = model.encode(SENTENCES, convert_to_numpy=True)
        t2 = time.perf_counter()
        return {"seconds": t2 - t0, "load_s": t1 - t0, "encode_s": t2 - t1,
                "digest": _digest([np.ascontiguousarray(emb)])}
    if kind == "safe_open":
        import torch  # noqa: F401
        from safetensors import safe_open
        t0 = time.perf_counter()
        tensors = {}
        with safe_open(path, framework="pt") as f:
            for k in f.keys():
                tensors[k] = f.get_tensor(k).clone()
        seconds = time.perf_counter() - t0
        return {"seconds": seconds, "digest": _digest(
            [tensors[k].contiguous().view(-1).view(torch.uint8).numpy() for k in sorted(tensors)])}
    if kind == "gguf":
        import numpy as np
        from gguf import GGUFReader
        t0 = time.perf_counter()
        reader = GGUFReader(path)
        data = [np.array(t.data) for t in reader.tensors]
        seconds = time.perf_counter() - t0
        return {"seconds": seconds, "digest": _digest(data)}
    if kind == "llama":
        import numpy as np
        from llama_cpp import Llama
        t0 = time.perf_counter()
        llm = Llama(model_path=path, n_ctx=64, n_threads=1, verbose=False)
        t1 = time.perf_counter()
        tokens = llm.tokenize(SENTENCES[0].encode())[:4]
        llm.eval(tokens)
        logits = np.array(llm.scores[:len(tokens)], dtype=np.float32)
        return {"seconds": t1 - t0, "digest": _digest([np.array(tokens, dtype=np.int64), logits])}
    if kind == "cold":
        n, seconds = common.read_sequential(Path(path))
        return {"seconds": seconds, "bytes": n}
    if kind == "mmap":
        import mmap
        with open(path, "rb") as f:
            t0 = time.perf_counter()
            with mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ) as m:
                total = sum(m[i] for i in range(0, len(m), PAGE))
            return {"seconds": time.perf_counter() - t0, "page_sum": total}
    raise SystemExit(f"unknown loader {kind}")


def build_bert(dest: Path, minilm_dir: Path) -> None:
    """bert-base's shape with random FP32 weights (fixed seed), saved by transformers itself, in a
    sentence-transformers directory with minilm's tokenizer (the same 30522-token vocabulary)."""
    import torch
    from transformers import BertConfig, BertModel
    tmp = dest.with_name(dest.name + ".part")
    shutil.rmtree(tmp, ignore_errors=True)
    top = {"model.safetensors", "config.json", "README.md"}     # transformers writes the first two anew
    shutil.copytree(minilm_dir, tmp, ignore=lambda d, names: top & set(names) if Path(d) == minilm_dir else set())
    torch.manual_seed(BERT_SEED)
    BertModel(BertConfig()).eval().save_pretrained(tmp, safe_serialization=True)
    pooling = tmp / "1_Pooling" / "config.json"
    conf = json.loads(pooling.read_text())
    conf["word_embedding_dimension"] = 768
    pooling.write_text(json.dumps(conf, indent=2) + "\n")
    os.replace(tmp, dest)


# ----------------------------------------------------------------------------- the parent

def drop_page_cache() -> bool:
    os.sync()
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        return True
    except OSError:
        return False


def set_read_ahead(mnt: Path, kb: int) -> bool:
    """The read_ahead_kb of the FUSE mount at mnt (its bdi, from mountinfo), where root may."""
    target = str(mnt.resolve())
    devices = [f[2] for f in (line.split() for line in Path("/proc/self/mountinfo").read_text().splitlines())
               if len(f) > 4 and f[4] == target]
    if not devices:
        return False
    try:
        Path(f"/sys/class/bdi/{devices[-1]}/read_ahead_kb").write_text(f"{kb}\n")
        return True
    except OSError:
        return False


def minilm_directory() -> Path:
    code = "from lmzfs.testing.hfcache import minilm_directory; print(minilm_directory())"
    return Path(run([common.LMZFS_PY, "-c", code], timeout=1800).strip().splitlines()[-1])


def bert_directory(minilm_dir: Path) -> Path:
    dest = BERT_CACHE / BERT_NAME
    if not (dest / "model.safetensors").is_file():
        log(f"loaders: building {dest} with transformers' save_pretrained")
        dest.parent.mkdir(parents=True, exist_ok=True)
        run([sys.executable, str(HERE), "--build-bert", str(dest), "--minilm", str(minilm_dir)], timeout=1800)
    return dest


def has_llama() -> str | None:
    """None if llama_cpp imports in this venv, else why not."""
    done = subprocess.run([sys.executable, "-c", "import llama_cpp"], capture_output=True, text=True)
    return None if done.returncode == 0 else (done.stderr.strip().splitlines() or ["import failed"])[-1]


def run_child(kind: str, path: Path) -> dict:
    out = run([sys.executable, str(HERE), "--child", kind, str(path)], timeout=1800)
    return json.loads(out.strip().splitlines()[-1])


def earlier_store(rev: str, work: Path) -> tuple[CliStore, str]:
    import against
    cli, commit = against.checkout_cli(rev, work / "earlier-lmzfs")
    saved = common.LMZFS_CLI
    common.LMZFS_CLI = cli
    try:
        return lmzfs_store(), commit
    finally:
        common.LMZFS_CLI = saved


class LoadersBench:
    def __init__(self, runs: int, work: Path, against: str | None = None):
        self.runs, self.work = runs, work
        self.tools: dict[str, CliStore | None] = {PLAIN: None, OURS: lmzfs_store(), LMZIP: lmzip_store()}
        self.res: dict = {"runs": runs, "targets": [], "models": {}, "rows": [], "notes": [], "errors": [],
                          "dropped_page_cache": True}
        if against:
            try:
                tool, commit = earlier_store(against, work)
                self.tools[EARLIER] = tool
                self.res["earlier_commit"] = commit
            except Exception as exc:
                self.res["errors"].append(f"--against {against}: {describe(exc)}")
        self.labels = [*self.tools, FLOOR]     # the floor is served from memory: no store
        self.res["targets"] = self.labels
        self.models: dict[str, Path] = {}      # model name -> directory of its files
        self.stores: dict[str, Path] = {}
        self._n = 0

    def add_model(self, name: str, files_or_dir: Path | list[Path]) -> None:
        if isinstance(files_or_dir, Path):
            d = files_or_dir
        else:
            d = common.link_dir(files_or_dir, self.work / "src" / name)
        self.models[name] = d
        self.res["models"][name] = {"dir": str(d), "bytes": sum(p.stat().st_size for p in common.files_under(d))}

    def build_stores(self) -> None:
        for label, tool in self.tools.items():
            if tool is None:
                continue
            store = self.work / ("store-" + label.replace(" ", "-").replace(",", ""))
            start = time.perf_counter()
            for name, d in self.models.items():
                run(tool.add_argv(store, d, name))
            log(f"loaders: {label}: {len(self.models)} models added in {time.perf_counter() - start:.1f} s")
            self.stores[label] = store

    @contextlib.contextmanager
    def served(self, label: str, model: str):
        """The model's directory through a fresh mount of the target's store, the plain one, or a
        copy in a fresh mount of the pyfuse3 floor; the page cache dropped last."""
        if label == FLOOR:
            with self.floor(model) as d:
                yield d
            return
        tool = self.tools[label]
        if tool is None:
            yield self.models[model]
            return
        self._n += 1
        mnt = self.work / f"mnt-{self._n}"
        pid = None
        try:
            with tool.mount(self.stores[label], mnt, self.work / "mount.log") as m:
                if tool.ours:       # our server detaches from `lmz mount`: its pid is in the stats
                    pid = json.loads((m.path / ".lmzfs" / "stats.json").read_text())["pid"]
                yield m.path / model
        finally:
            with contextlib.suppress(OSError):
                mnt.rmdir()
            # the next run starts once this server has exited (freeing its cache is CPU time)
            deadline = time.monotonic() + 20
            while pid and os.path.exists(f"/proc/{pid}") and time.monotonic() < deadline:
                time.sleep(0.02)

    @contextlib.contextmanager
    def floor(self, model: str):
        """The model's files copied into a fresh mount of bench/pyfuse_floor.py (an in-memory file
        system on pyfuse3 + trio whose read handler only slices its bytes; read_ahead_kb as ours),
        then the page cache dropped: what any pyfuse3 + trio daemon costs a loader, with nothing
        to decode and no disk to read."""
        self._n += 1
        mnt = self.work / f"mnt-{self._n}"
        argv = [common.LMZFS_PY, HERE.with_name("pyfuse_floor.py"), mnt]
        try:
            with common.mounted(argv, ["fusermount3", "-u", mnt], mnt, self.work / "floor.log") as m:
                set_read_ahead(mnt, READ_AHEAD_KB)
                shutil.copytree(self.models[model], m.path / model)
                drop_page_cache()
                yield m.path / model
        finally:
            with contextlib.suppress(OSError):
                mnt.rmdir()

    def measure(self, rows: list[dict]) -> dict:
        labels = self.labels
        for row in rows:
            row.update(seconds={t: [None] * self.runs for t in labels}, digests={}, errors={})
            if row["kind"] in ("st",):
                row.update(load_s={t: [None] * self.runs for t in labels})
        # Every row is measured through each target back to back (the targets' order rotating
        # from row to row and run to run), so that the load of this shared host, which drifts
        # over minutes, weighs on the targets of a row alike.
        for i in range(self.runs):
            for j, row in enumerate(rows):
                k = (i + j) % len(labels)
                for label in labels[k:] + labels[:k]:
                    if row["errors"].get(label):
                        continue
                    self.res["dropped_page_cache"] &= drop_page_cache()
                    try:
                        with self.served(label, row["model"]) as d:
                            path = d / row["file"] if row["file"] else d
                            got = run_child(row["kind"], path)
                            if i == 0 and label != PLAIN and row["kind"] == "cold":
                                got["digest"] = sha256_file(path)
                    except Exception as exc:
                        row["errors"][label] = describe(exc)
                        log(f"loaders: {row['name']} {label}: {row['errors'][label]}")
                        continue
                    row["seconds"][label][i] = got["seconds"]
                    if "load_s" in row:
                        row["load_s"][label][i] = got["load_s"]
                    if "digest" in got:
                        row["digests"].setdefault(label, got["digest"])
                    if "page_sum" in got:
                        row["digests"].setdefault(label, str(got["page_sum"]))
                    log(f"loaders: run {i + 1}/{self.runs} {row['name']} {label}: {got['seconds']:.2f} s")
        for row in rows:
            if row["kind"] == "cold":
                row["digests"][PLAIN] = row.pop("plain_sha256")
            digests = set(row["digests"].values())
            row["identical"] = len(digests) == 1 and len(row["digests"]) == len(labels) - len(row["errors"])
            row["speedup_vs_lmzip"] = _median_ratio(row["seconds"], LMZIP, OURS)
            row["floor_vs_lmzip"] = _median_ratio(row["seconds"], LMZIP, FLOOR)
            row["times_plain"] = _median_ratio(row["seconds"], OURS, PLAIN)
            if EARLIER in labels:
                row["earlier_speedup_vs_lmzip"] = _median_ratio(row["seconds"], LMZIP, EARLIER)
                row["speedup_vs_earlier"] = _median_ratio(row["seconds"], EARLIER, OURS)
            self.res["rows"].append(row)
        return self.res


def _median_ratio(seconds: dict, num: str, den: str) -> float | None:
    pairs = [a / b for a, b in zip(seconds.get(num, []), seconds.get(den, [])) if a and b]
    return statistics.median(pairs) if pairs else None


def measure(corpus: dict[str, Path], runs: int, work: Path, against: str | None = None,
            kinds: set[str] | None = None) -> dict:
    """corpus: astra, smollm2, smollm2-q4km (files); minilm's directory is found by the project's venv.
    kinds: only the rows of these loaders (e.g. {"llama"}), and only the models they read."""
    work.mkdir(parents=True, exist_ok=True)
    bench = LoadersBench(runs, work, against)
    res = bench.res
    res["versions"] = {d: _version(d) for d in ("torch", "transformers", "sentence-transformers", "tokenizers",
                                                "safetensors", "gguf", "llama_cpp_python", "lmzip")}
    rows: list[dict] = []
    try:
        minilm = minilm_directory()
        bench.add_model("minilm", minilm)
        rows.append({"name": "minilm: sentence-transformers load + encode", "kind": "st", "model": "minilm",
                     "file": ""})
        bert = bert_directory(minilm)
        bench.add_model("bert", bert)
        rows.append({"name": "bert-base FP32 (save_pretrained): sentence-transformers load + encode", "kind": "st",
                     "model": "bert", "file": ""})
    except Exception as exc:
        res["errors"].append(f"sentence-transformers subjects: {describe(exc)}")
    files = {n: corpus[n] for n in ("astra", "smollm2", "smollm2-q4km") if n in corpus}
    for n, p in files.items():
        bench.add_model(n, [p])
    if "astra" in files:
        rows.append({"name": "astra: safe_open + every tensor cloned", "kind": "safe_open", "model": "astra",
                     "file": files["astra"].name})
    why_not_llama = has_llama()
    if why_not_llama:
        res["notes"].append(f"llama.cpp row left out: llama-cpp-python is not in the bench venv ({why_not_llama})")
    for n in ("smollm2", "smollm2-q4km"):
        if n in files:
            rows.append({"name": f"{n}: gguf.GGUFReader + every tensor copied", "kind": "gguf", "model": n,
                         "file": files[n].name})
            if not why_not_llama:
                rows.append({"name": f"{n}: llama.cpp load (n_ctx 64)", "kind": "llama", "model": n,
                             "file": files[n].name})
    every = [(m, p.relative_to(bench.models[m])) for m in bench.models
             for p in common.files_under(bench.models[m]) if p.suffix in (".safetensors", ".gguf")]
    for kind, what in (("cold", "cold sequential read"), ("mmap", "mmap, pages touched in order")):
        for m, rel in every:
            row = {"name": f"{m}/{rel}: {what}", "kind": kind, "model": m, "file": str(rel),
                   "bytes": (bench.models[m] / rel).stat().st_size}
            if kind == "cold":
                row["plain_sha256"] = sha256_file(bench.models[m] / rel)
            rows.append(row)
    if kinds:
        rows = [r for r in rows if r["kind"] in kinds]
        used = {r["model"] for r in rows}
        bench.models = {m: d for m, d in bench.models.items() if m in used}
        res["models"] = {m: v for m, v in res["models"].items() if m in used}
    bench.build_stores()
    return bench.measure(rows)


def _version(dist: str) -> str | None:
    try:
        return version_of(dist.replace("_", "-"))
    except Exception:
        return None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--against", metavar="REV", help="also a store made and served by lmzfs at git revision REV")
    ap.add_argument("--json", type=Path, help="write the results here (default: stdout)")
    ap.add_argument("--tmpdir", type=Path)
    ap.add_argument("--kinds", help="only these loaders, comma-separated: st, safe_open, gguf, llama, cold, mmap")
    ap.add_argument("--child", nargs=2, metavar=("KIND", "PATH"), help=argparse.SUPPRESS)
    ap.add_argument("--build-bert", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--minilm", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        print(json.dumps(child(*args.child)))
        return 0
    if args.build_bert:
        build_bert(args.build_bert, args.minilm)
        return 0
    corpus = {n: common.fetch_corpus(n) for n in ("astra", "smollm2", "smollm2-q4km")}
    with tempfile.TemporaryDirectory(prefix="lmz-loaders-", dir=args.tmpdir) as tmp:
        kinds = {k.strip() for k in args.kinds.split(",")} if args.kinds else None
        out = measure(corpus, args.runs, Path(tmp), args.against, kinds)
    text = json.dumps(out, indent=1)
    if args.json:
        args.json.write_text(text + "\n")
    else:
        print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
