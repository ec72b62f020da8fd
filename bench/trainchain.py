#!/usr/bin/env python3
"""A real training chain: checkpoints of one small byte-level transformer, in BF16 and in FP32.

Runs under bench/.venv's python (it needs torch; it never imports lmzfs):

    bench/.venv/bin/python bench/trainchain.py --out ~/.cache/lmzfs/chains [--steps 500] [--every 100]

Trains a causal byte-level transformer (vocabulary 256, learned positions, pre-norm blocks) with
AdamW on the running interpreter's standard-library .py sources, read in sorted path order, and
saves a checkpoint every `--every` steps as OUT/bf16/step-NNNN/model.safetensors and
OUT/fp32/step-NNNN/model.safetensors (the same weights, rounded to BF16 in the first). Checkpoints
of one run are what delta coding across `lmz add`s is for: no tensor is byte-identical between two
of them, yet every tensor is close to its predecessor. From each FP32 checkpoint it also writes
GGUF files quantised with gguf-py, OUT/q4_1/step-NNNN/model.gguf and OUT/q8_0/... (matrices in
the block type, other tensors F32).

Deterministic: fixed seeds, two threads, deterministic algorithms; the batches are drawn from a
seeded generator. Cached: OUT/settings.json records the settings and the training text's digest,
and a run whose settings match and whose checkpoints all exist does nothing.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import sys
import sysconfig
import time
from dataclasses import asdict, dataclass
from pathlib import Path


@dataclass(frozen=True)
class Settings:
    steps: int = 500
    every: int = 100
    d_model: int = 256
    layers: int = 4
    heads: int = 4
    context: int = 128
    batch: int = 16
    lr: float = 1e-3
    weight_decay: float = 0.1
    seed: int = 1234
    text_bytes: int = 8 << 20
    text_sha256: str = ""


def training_text(limit: int) -> bytes:
    """The standard library's .py sources, concatenated in sorted path order, cut at `limit` bytes."""
    root = Path(sysconfig.get_paths()["stdlib"])
    out = bytearray()
    for path in sorted(root.rglob("*.py")):
        if "site-packages" in path.parts:
            continue
        try:
            out += path.read_bytes()
        except OSError:
            continue
        if len(out) >= limit:
            break
    return bytes(out[:limit])


def build_model(s: Settings):
    import torch
    from torch import nn

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.ln1 = nn.LayerNorm(s.d_model)
            self.attn = nn.Linear(s.d_model, 3 * s.d_model)
            self.proj = nn.Linear(s.d_model, s.d_model)
            self.ln2 = nn.LayerNorm(s.d_model)
            self.up = nn.Linear(s.d_model, 4 * s.d_model)
            self.down = nn.Linear(4 * s.d_model, s.d_model)

        def forward(self, x):
            b, t, c = x.shape
            q, k, v = self.attn(self.ln1(x)).split(c, dim=2)
            shape = (b, t, s.heads, c // s.heads)
            q, k, v = (z.view(shape).transpose(1, 2) for z in (q, k, v))
            y = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.proj(y.transpose(1, 2).reshape(b, t, c))
            return x + self.down(nn.functional.gelu(self.up(self.ln2(x))))

    class ByteTransformer(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.tok = nn.Embedding(256, s.d_model)
            self.pos = nn.Embedding(s.context, s.d_model)
            self.blocks = nn.ModuleList(Block() for _ in range(s.layers))
            self.ln = nn.LayerNorm(s.d_model)
            self.head = nn.Linear(s.d_model, 256, bias=False)

        def forward(self, idx):
            x = self.tok(idx) + self.pos(torch.arange(idx.shape[1]))
            for block in self.blocks:
                x = block(x)
            return self.head(self.ln(x))

    return ByteTransformer()


def checkpoint_dirs(out: Path, s: Settings) -> list[tuple[int, Path, Path]]:
    return [(step, out / "bf16" / f"step-{step:04d}", out / "fp32" / f"step-{step:04d}")
            for step in range(s.every, s.steps + 1, s.every)]


def save(state: dict, path: Path) -> None:
    from safetensors.torch import save_file
    path.mkdir(parents=True, exist_ok=True)
    tmp = path / "model.safetensors.tmp"
    save_file(state, str(tmp), metadata={"format": "pt"})
    os.replace(tmp, path / "model.safetensors")


def train(out: Path, s: Settings, text: bytes) -> None:
    import numpy as np
    import torch

    torch.manual_seed(s.seed)
    torch.set_num_threads(2)
    torch.use_deterministic_algorithms(True)
    data = torch.from_numpy(np.frombuffer(text, dtype=np.uint8).astype(np.int64))
    model = build_model(s)
    params = sum(p.numel() for p in model.parameters())
    print(f"trainchain: {params} parameters, {len(text)} bytes of text", file=sys.stderr)
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": s.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}], lr=s.lr, betas=(0.9, 0.95))
    warmup = max(1, s.steps // 20)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda i: min(1.0, (i + 1) / warmup) * 0.5 * (1 + math.cos(math.pi * min(i, s.steps) / s.steps)))
    gen = torch.Generator().manual_seed(s.seed + 1)
    saves = {step: (bf, fp) for step, bf, fp in checkpoint_dirs(out, s)}
    start = time.monotonic()
    for step in range(1, s.steps + 1):
        starts = torch.randint(0, len(data) - s.context - 1, (s.batch,), generator=gen)
        x = torch.stack([data[i:i + s.context] for i in starts])
        y = torch.stack([data[i + 1:i + 1 + s.context] for i in starts])
        logits = model(x)
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, 256), y.reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        if step % 25 == 0:
            print(f"trainchain: step {step} loss {loss.item():.3f} ({time.monotonic() - start:.0f} s)",
                  file=sys.stderr)
        if step in saves:
            bf, fp = saves[step]
            state = {n: t.detach().contiguous().clone() for n, t in model.state_dict().items()}
            save(state, fp)
            save({n: t.to(torch.bfloat16) for n, t in state.items()}, bf)


GGUF_TYPES = ("Q4_1", "Q8_0")     # the block types gguf-py quantises, of the two kinds GGUF models ship


def write_gguf_chains(out: Path, s: Settings) -> None:
    """OUT/q4_1/step-NNNN/model.gguf and OUT/q8_0/...: each FP32 checkpoint quantised by gguf-py
    (matrices whose rows are whole blocks; the other tensors stay F32), so that block-quantised
    deltas are measured on real checkpoints too. Derived, so cached by their own marker."""
    import gguf
    import importlib.metadata
    from safetensors.numpy import load_file

    version = importlib.metadata.version("gguf")
    marker = out / "gguf-settings.json"
    want = {"gguf": version, "types": list(GGUF_TYPES), "chain": asdict(s)}
    dirs = checkpoint_dirs(out, s)
    paths = [out / t.lower() / fp.name / "model.gguf" for t in GGUF_TYPES for _, _, fp in dirs]
    if marker.exists() and json.loads(marker.read_text()) == want and all(p.exists() for p in paths):
        return
    marker.unlink(missing_ok=True)
    for qt in GGUF_TYPES:
        kind = getattr(gguf.GGMLQuantizationType, qt)
        block = gguf.GGML_QUANT_SIZES[kind][0]
        for _, _, fp in dirs:
            tensors = load_file(str(fp / "model.safetensors"))
            path = out / qt.lower() / fp.name / "model.gguf"
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(".gguf.tmp")
            w = gguf.GGUFWriter(str(tmp), "bytetransformer")
            w.add_name(f"trainchain {fp.name} {qt}")
            for name, t in sorted(tensors.items()):
                if t.ndim == 2 and t.shape[-1] % block == 0:
                    w.add_tensor(name, gguf.quants.quantize(t, kind), raw_dtype=kind)
                else:
                    w.add_tensor(name, t)
            w.write_header_to_file()
            w.write_kv_data_to_file()
            w.write_tensors_to_file()
            w.close()
            os.replace(tmp, path)
    marker.write_text(json.dumps(want, indent=1) + "\n")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=Path.home() / ".cache" / "lmzfs" / "chains")
    ap.add_argument("--steps", type=int, default=Settings.steps)
    ap.add_argument("--every", type=int, default=Settings.every)
    args = ap.parse_args(argv)
    if args.every <= 0 or args.steps < 4 * args.every:
        print("trainchain: --steps must be at least 4 x --every (a chain of four or more)", file=sys.stderr)
        return 2
    base = Settings(steps=args.steps, every=args.every)
    text = training_text(base.text_bytes)
    s = Settings(**{**asdict(base), "text_sha256": hashlib.sha256(text).hexdigest()})
    out = args.out.expanduser()
    marker = out / "settings.json"
    dirs = checkpoint_dirs(out, s)
    done = (marker.exists() and json.loads(marker.read_text()) == asdict(s)
            and all((d / "model.safetensors").exists() for _, bf, fp in dirs for d in (bf, fp)))
    if done:
        print(f"trainchain: {out} already holds this chain", file=sys.stderr)
    else:
        marker.unlink(missing_ok=True)
        train(out, s, text)
        out.mkdir(parents=True, exist_ok=True)
        marker.write_text(json.dumps(asdict(s), indent=1) + "\n")
    write_gguf_chains(out, s)
    for step, bf, fp in dirs:
        print(f"{bf / 'model.safetensors'}\n{fp / 'model.safetensors'}")
        for qt in GGUF_TYPES:
            print(out / qt.lower() / fp.name / "model.gguf")
    return 0


if __name__ == "__main__":
    sys.exit(main())
