"""The registered codecs: each by the stable id recorded in its payloads and by name, which of
them code against a reference chunk, and which decode fastest (ties go to those)."""
from __future__ import annotations

from .base import Codec, DeltaCodec
from .blockdelta import BlockDeltaCodec
from .bytegroup import BytegroupCodec
from .entropy import EntropyCodec
from .floatseg import FloatSegCodec
from .floatsplit import FloatSplitCodec
from .ggufblocks import GgufBlocksCodec
from .raw import RawCodec
from .strings import StringsCodec
from .ulpdelta import UlpDeltaCodec
from .xordelta import XorZstdCodec
from .zstd import ZstdCodec

REGISTRY: dict[int, Codec] = {c.id: c for c in (RawCodec(), ZstdCodec(), BytegroupCodec(), FloatSplitCodec(),
                                                 EntropyCodec(), GgufBlocksCodec(), FloatSegCodec(),
                                                 XorZstdCodec(), UlpDeltaCodec(), BlockDeltaCodec(),
                                                 StringsCodec())}
# The delta codecs (Codec.reference): encode_delta_chunk tries them, encode_chunk never does.
DELTA_CODECS: tuple[DeltaCodec, ...] = tuple(c for c in REGISTRY.values() if c.reference)
_BY_NAME: dict[str, Codec] = {c.name: c for c in REGISTRY.values()}
assert len(_BY_NAME) == len(REGISTRY) and all(0 <= i <= 255 for i in REGISTRY)

# Ties between equally small payloads go to the codec that decodes fastest.
DECODE_COST = {RawCodec.id: 0, ZstdCodec.id: 1, BytegroupCodec.id: 2, FloatSplitCodec.id: 3,
               FloatSegCodec.id: 3, GgufBlocksCodec.id: 3, EntropyCodec.id: 4, XorZstdCodec.id: 2,
               UlpDeltaCodec.id: 4, BlockDeltaCodec.id: 4, StringsCodec.id: 2}


def by_name(name: str) -> Codec:
    """The registered codec called ``name`` ("raw", "zstd", "bytegroup", "floatsplit", ...)."""
    try:
        return _BY_NAME[name]
    except KeyError:
        raise KeyError(f"unknown codec {name!r}; known: {', '.join(_BY_NAME)}") from None


def beats(length: int, codec_id: int, best_length: int, best_id: int) -> bool:
    """Whether a payload of ``length`` bytes under codec_id is kept over the best so far: it is
    smaller, or as small and decodes faster (DECODE_COST)."""
    return length < best_length or (length == best_length and DECODE_COST[codec_id] < DECODE_COST[best_id])
