"""Synthetic BF16 checkpoints of one training run, for tests of chains: each step's weights are
the last step's plus a small drift, so `lmz add` of the next one recodes this one as deltas."""
from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np


def write_bf16_safetensors(path: Path, tensors: dict[str, np.ndarray]) -> None:
    """A safetensors file of BF16 tensors (given as float32 arrays, truncated to their high half)."""
    header, blobs, at = {}, [], 0
    for name, values in tensors.items():
        data = (np.ascontiguousarray(values, dtype=np.float32).view(np.uint32) >> 16).astype("<u2").tobytes()
        header[name] = {"dtype": "BF16", "shape": list(values.shape), "data_offsets": [at, at + len(data)]}
        blobs.append(data)
        at += len(data)
    text = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def bf16_checkpoints(root: Path, n: int, *, seed: int = 0, rows: int = 1024, cols: int = 1024) -> list[Path]:
    """n checkpoint directories step-0 ... step-(n-1) under root: model.safetensors (a BF16 weight
    of rows x cols that drifts a little per step, and a BF16 bias redrawn per step) and config.json."""
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((rows, cols)).astype(np.float32)
    out = []
    for k in range(n):
        w = w + (rng.standard_normal(w.shape) * 1e-2).astype(np.float32)
        d = root / f"step-{k}"
        d.mkdir(parents=True)
        write_bf16_safetensors(d / "model.safetensors",
                               {"w": w, "b": rng.standard_normal(cols).astype(np.float32)})
        (d / "config.json").write_text(json.dumps({"step": k}))
        out.append(d)
    return out
