#!/usr/bin/env python3
"""A real base / fine-tune pair: all-MiniLM-L6-v2 (the corpus's FP32 sentence encoder) fine-tuned.

Runs under bench/.venv's python (it needs torch; it never imports lmzfs):

    bench/.venv/bin/python bench/finetune.py --base MINILM.safetensors --out ~/.cache/lmzfs/finetune

The base is the real trained model; the fine-tune is what a user makes of it: the same BERT encoder
(6 post-norm layers, mean pooling), every weight trained by AdamW at a fine-tuning learning rate
with the in-batch-negatives ranking loss sentence encoders are trained with, on pairs of (a
function's docstring, its `def` line) from the running interpreter's standard library. The
vocabulary of the real tokenizer is not in the weights file, so words are mapped to token ids by a
fixed hash: the gradients are real, their text is not the model's original one.

Writes OUT/fp32/model.safetensors (the fine-tune, FP32: its base is the --base file itself) and
OUT/bf16/base.safetensors, OUT/bf16/model.safetensors (base and fine-tune rounded to BF16, as a
BF16 release of both would be). Every tensor keeps its name, dtype and shape. Deterministic (fixed
seeds, two threads, deterministic algorithms) and cached: OUT/settings.json records the settings and
the digests of the base and the text; a run whose settings match does nothing.
"""
from __future__ import annotations

import argparse
import ast
import hashlib
import json
import math
import os
import re
import sys
import sysconfig
import time
import zlib
from dataclasses import asdict, dataclass
from pathlib import Path


@dataclass(frozen=True)
class Settings:
    steps: int = 300
    batch: int = 16
    max_len: int = 48
    lr: float = 2e-5
    weight_decay: float = 0.01
    seed: int = 4321
    pairs: int = 20000
    base_sha256: str = ""
    text_sha256: str = ""


LAYERS, HEADS, HIDDEN, EPS = 6, 12, 384, 1e-12
CLS, SEP, PAD, FIRST_WORD = 101, 102, 0, 1000


def docstring_pairs(limit: int) -> list[tuple[str, str]]:
    """(first paragraph of a docstring, the function's `def` line), in sorted path order."""
    root = Path(sysconfig.get_paths()["stdlib"])
    out: list[tuple[str, str]] = []
    for path in sorted(root.rglob("*.py")):
        if "site-packages" in path.parts or "test" in path.parts:
            continue
        try:
            source = path.read_text(encoding="utf-8")
            tree = ast.parse(source)
        except (OSError, UnicodeDecodeError, SyntaxError, ValueError):
            continue
        lines = source.splitlines()
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                doc = ast.get_docstring(node)
                if doc and node.lineno <= len(lines):
                    out.append((doc.split("\n\n")[0], lines[node.lineno - 1].strip()))
                    if len(out) >= limit:
                        return out
    return out


def token_ids(text: str, max_len: int, vocab: int) -> list[int]:
    words = re.findall(r"\w+|[^\w\s]", text.lower())[:max_len - 2]
    return [CLS] + [FIRST_WORD + zlib.crc32(w.encode()) % (vocab - FIRST_WORD) for w in words] + [SEP]


def encoder(params: dict, ids, mask):
    import torch
    from torch.nn import functional as F

    def ln(x, name):
        return F.layer_norm(x, (HIDDEN,), params[f"{name}.weight"], params[f"{name}.bias"], EPS)

    def dense(x, name):
        return F.linear(x, params[f"{name}.weight"], params[f"{name}.bias"])

    b, t = ids.shape
    x = (params["embeddings.word_embeddings.weight"][ids] + params["embeddings.position_embeddings.weight"][:t]
         + params["embeddings.token_type_embeddings.weight"][0])
    x = ln(x, "embeddings.LayerNorm")
    keep = mask[:, None, None, :].to(torch.bool)
    for i in range(LAYERS):
        p = f"encoder.layer.{i}"
        q, k, v = (dense(x, f"{p}.attention.self.{w}").view(b, t, HEADS, -1).transpose(1, 2)
                   for w in ("query", "key", "value"))
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=keep).transpose(1, 2).reshape(b, t, HIDDEN)
        x = ln(x + dense(y, f"{p}.attention.output.dense"), f"{p}.attention.output.LayerNorm")
        h = F.gelu(dense(x, f"{p}.intermediate.dense"))
        x = ln(x + dense(h, f"{p}.output.dense"), f"{p}.output.LayerNorm")
    m = mask[:, :, None].to(x.dtype)
    return (x * m).sum(1) / m.sum(1)


def batch_of(texts: list[str], s: Settings, vocab: int):
    import torch
    rows = [token_ids(t, s.max_len, vocab) for t in texts]
    width = max(len(r) for r in rows)
    ids = torch.tensor([r + [PAD] * (width - len(r)) for r in rows])
    mask = torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in rows])
    return ids, mask


def fine_tune(base: Path, s: Settings, pairs: list[tuple[str, str]]) -> dict:
    import torch
    from safetensors.torch import load_file

    torch.manual_seed(s.seed)
    torch.set_num_threads(2)
    torch.use_deterministic_algorithms(True)
    state = load_file(str(base))
    params = {n: torch.nn.Parameter(t.clone()) for n, t in state.items() if t.is_floating_point()}
    vocab = params["embeddings.word_embeddings.weight"].shape[0]
    decay = [p for n, p in params.items() if p.dim() >= 2]
    no_decay = [p for n, p in params.items() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": s.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}], lr=s.lr)
    warmup = max(1, s.steps // 10)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda i: min(1.0, (i + 1) / warmup) * 0.5 * (1 + math.cos(math.pi * min(i, s.steps) / s.steps)))
    gen = torch.Generator().manual_seed(s.seed + 1)
    start = time.monotonic()
    for step in range(1, s.steps + 1):
        picks = torch.randint(0, len(pairs), (s.batch,), generator=gen).tolist()
        a = encoder(params, *batch_of([pairs[i][0] for i in picks], s, vocab))
        p = encoder(params, *batch_of([pairs[i][1] for i in picks], s, vocab))
        sim = torch.nn.functional.normalize(a, dim=1) @ torch.nn.functional.normalize(p, dim=1).T * 20.0
        loss = torch.nn.functional.cross_entropy(sim, torch.arange(s.batch))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(list(params.values()), 1.0)
        opt.step()
        sched.step()
        if step % 50 == 0:
            print(f"finetune: step {step} loss {loss.item():.3f} ({time.monotonic() - start:.0f} s)", file=sys.stderr)
    return {n: (params[n].detach().contiguous().clone() if n in params else t) for n, t in state.items()}


def save(state: dict, path: Path) -> None:
    from safetensors.torch import save_file
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".safetensors.tmp")
    save_file(state, str(tmp), metadata={"format": "pt"})
    os.replace(tmp, path)


def outputs(out: Path) -> list[Path]:
    return [out / "fp32" / "model.safetensors", out / "bf16" / "base.safetensors", out / "bf16" / "model.safetensors"]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--base", type=Path, required=True, help="all-MiniLM-L6-v2's FP32 safetensors file")
    ap.add_argument("--out", type=Path, default=Path.home() / ".cache" / "lmzfs" / "finetune")
    ap.add_argument("--steps", type=int, default=Settings.steps)
    args = ap.parse_args(argv)
    pairs = docstring_pairs(Settings.pairs)
    text = "\n".join(f"{a}\t{b}" for a, b in pairs).encode()
    s = Settings(steps=args.steps, base_sha256=hashlib.sha256(args.base.read_bytes()).hexdigest(),
                 text_sha256=hashlib.sha256(text).hexdigest())
    out = args.out.expanduser()
    marker = out / "settings.json"
    if marker.exists() and json.loads(marker.read_text()) == asdict(s) and all(p.exists() for p in outputs(out)):
        print(f"finetune: {out} already holds this pair", file=sys.stderr)
    else:
        import torch
        from safetensors.torch import load_file
        marker.unlink(missing_ok=True)
        print(f"finetune: {len(pairs)} docstring pairs, {s.steps} steps", file=sys.stderr)
        tuned = fine_tune(args.base, s, pairs)
        fp32, bf16_base, bf16_tuned = outputs(out)
        save(tuned, fp32)

        def bf16(state: dict) -> dict:
            return {n: t.to(torch.bfloat16) if t.is_floating_point() else t for n, t in state.items()}
        save(bf16(load_file(str(args.base))), bf16_base)
        save(bf16(tuned), bf16_tuned)
        marker.write_text(json.dumps(asdict(s), indent=1) + "\n")
    for p in outputs(out):
        print(p)
    return 0


if __name__ == "__main__":
    sys.exit(main())
