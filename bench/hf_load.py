"""Load a model by name with transformers and sentence-transformers from two hub caches (the
original and a mount's .hf/hub view), each in a fresh process with only HF_HUB_CACHE and
HF_HUB_OFFLINE=1 set (no code change), with the page cache dropped first where we may; print the
load times and whether the outputs are identical.

    python bench/hf_load.py --original ~/.cache/huggingface/hub --view ~/models/.hf/hub \\
        --repo sentence-transformers/all-MiniLM-L6-v2 [--json OUT]

--json writes the same as one object (bench/hf_cache.py reads it): the seconds of each load, whether
the page cache was dropped, whether the outputs are identical, and the loaders' versions.

Needs torch, transformers and sentence-transformers (not test dependencies)."""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

SENTENCES = ["A lossless store serves model files back byte for byte.",
             "Hugging Face loaders find models by name in the hub cache.",
             "The quick brown fox jumps over the lazy dog."]

CHILD = r"""
import json, sys, time
import numpy as np
out, repo = sys.argv[1], sys.argv[2]
started = time.perf_counter()
import torch
from transformers import AutoModel, AutoTokenizer
t0 = time.perf_counter()
model = AutoModel.from_pretrained(repo)
tok = AutoTokenizer.from_pretrained(repo)
t_auto = time.perf_counter() - t0
with torch.no_grad():
    hidden = model(**tok(SENTENCES, padding=True, return_tensors="pt")).last_hidden_state.numpy()
from sentence_transformers import SentenceTransformer
t0 = time.perf_counter()
st = SentenceTransformer(repo, device="cpu")
t_st = time.perf_counter() - t0
emb = st.encode(SENTENCES, convert_to_numpy=True)
np.save(out + ".hidden.npy", hidden)
np.save(out + ".emb.npy", emb)
json.dump({"automodel_s": t_auto, "sentence_transformer_s": t_st}, open(out + ".json", "w"))
"""


def drop_page_cache() -> bool:
    try:
        os.sync()
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        return True
    except OSError:
        return False


def load(cache: str, repo: str, out: str) -> dict:
    env = {**os.environ, "HF_HUB_CACHE": cache, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    env.pop("HF_HOME", None)
    code = f"SENTENCES = {SENTENCES!r}\n" + CHILD
    subprocess.run([sys.executable, "-c", code, out, repo], env=env, check=True)
    with open(out + ".json") as f:
        return json.load(f)


def main(argv: list[str] | None = None) -> int:
    import numpy as np
    p = argparse.ArgumentParser()
    p.add_argument("--original", required=True)
    p.add_argument("--view", required=True)
    p.add_argument("--repo", required=True)
    p.add_argument("--json", type=Path, help="also write the times and the comparison here")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        times, all_dropped = {}, True
        for what, cache in (("original", args.original), ("view", args.view)):
            dropped = drop_page_cache()
            all_dropped &= dropped
            times[what] = load(cache, args.repo, str(Path(tmp) / what))
            print(f"{what}: {cache}: AutoModel.from_pretrained {times[what]['automodel_s']:.2f} s, "
                  f"SentenceTransformer {times[what]['sentence_transformer_s']:.2f} s"
                  + ("" if dropped else " (page cache not dropped: not root)"))
        same = {k: np.array_equal(np.load(str(Path(tmp) / f"original.{k}.npy")),
                                  np.load(str(Path(tmp) / f"view.{k}.npy"))) for k in ("hidden", "emb")}
    print(f"identical: AutoModel {'yes' if same['hidden'] else 'NO'}, "
          f"SentenceTransformer {'yes' if same['emb'] else 'NO'}")
    if args.json:
        from importlib.metadata import version
        args.json.write_text(json.dumps({
            "times": times, "dropped_page_cache": all_dropped, "identical": {k: bool(v) for k, v in same.items()},
            "versions": {d: version(d) for d in ("torch", "transformers", "sentence-transformers")}}) + "\n")
    return 0 if all(same.values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
