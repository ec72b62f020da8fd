/* ggufblocks' helpers, compiled: the Q4_1 quant contexts (each block's zero point), the
 * quant bytes rebuilt from their decoded 4-bit symbols, straight into the blocks' quant field,
 * and every other decoded field stream copied into its place in the blocks.
 * The numpy paths in ggufblocks.py compute the same and stay the fallback; the tests run both.
 *
 * Why C: in numpy the merge took a shift, an OR and a strided store over the chunk, about a
 * fifth of a Q4_1 chunk's decode, and the zero points another tenth (float16 conversion of
 * strided fields, seven passes, a repeat); here each is one pass.
 *
 * q4_1_contexts(blocks, nblk, bsize, out) -> None
 *   blocks: at least nblk * bsize bytes of Q4_1 blocks (fp16 d at byte 0, fp16 m at byte 2)
 *   out:    writable uint8[32 * nblk]: the 32 quants of block b get its zero point
 *           clamp(rint(-m / d), 0, 15) (float32 arithmetic), 0 where -m / d is not finite
 *
 * merge_nibbles(nib, out, nblk, bsize, foff, fsize) -> None
 *   nib:  uint8[2 * fsize * nblk], the symbols (< 16) of every block's field in order, low
 *         nibble first
 *   out:  writable, at least nblk * bsize bytes: byte foff + i of block b becomes
 *         nib[2k] | nib[2k + 1] << 4 (k = b * fsize + i), as a byte
 *
 * scatter_field(src, out, nblk, bsize, foff, fsize) -> None
 *   src:  fsize * nblk bytes, one decoded field stream (block after block)
 *   out:  writable, at least nblk * bsize bytes: bytes foff .. foff + fsize - 1 of block b
 *         become src[b * fsize .. b * fsize + fsize - 1]
 *   Why C: numpy's strided assignment of a narrow field (an fp16 byte, a 12-byte scale field)
 *   steps through a generic loop per block; here each block is one fixed-size copy.
 */
#include "_tansloop.h"
#include <math.h>
#include <stdint.h>
#include <string.h>

/* IEEE half to float, exactly (every half is a float) */
static float half_to_float(uint16_t h)
{
    const uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exp = (h >> 10) & 31, man = h & 0x3FFu;
    uint32_t bits;
    if (exp == 31) {
        bits = sign | 0x7F800000u | man << 13;
    } else if (exp) {
        bits = sign | (exp + 112) << 23 | man << 13;
    } else {                    /* zero or subnormal: man * 2**-24, exact in float */
        const float f = (float)man * 5.9604644775390625e-8f;
        return sign ? -f : f;
    }
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

void tans_q4_1_contexts_into(const uint8_t *restrict p, Py_ssize_t nblk, Py_ssize_t bsize, uint8_t *restrict o)
{
    for (Py_ssize_t b = 0; b < nblk; b++) {
        const uint8_t *q = p + b * bsize;
        const float d = half_to_float((uint16_t)(q[0] | q[1] << 8)), m = half_to_float((uint16_t)(q[2] | q[3] << 8));
        const float z = -m / d;
        uint8_t c = 0;
        if (isfinite(z)) {
            const float r = rintf(z);
            c = r <= 0.0f ? 0 : r >= 15.0f ? 15 : (uint8_t)r;
        }
        memset(o + 32 * b, c, 32);
    }
}

PyObject *tans_q4_1_contexts(PyObject *self, PyObject *args)
{
    TANS_BUFFER blocks = {0}, out = {0};
    Py_ssize_t nblk, bsize;
    if (!PyArg_ParseTuple(args, "y*nnw*", &blocks, &nblk, &bsize, &out))
        return NULL;
    if (nblk < 0 || bsize < 4 || blocks.len < nblk * bsize || out.len != 32 * nblk)
        return tans_bad_arguments("q4_1_contexts");
    Py_BEGIN_ALLOW_THREADS
    tans_q4_1_contexts_into(blocks.buf, nblk, bsize, out.buf);
    Py_END_ALLOW_THREADS
    return Py_NewRef(Py_None);
}

/* d[i] = q[2i] | q[2i + 1] << 4 (as a byte), read as little-endian pairs */
static inline __attribute__((always_inline)) void merge_pairs(uint8_t *restrict d, const uint8_t *restrict q,
                                                              Py_ssize_t m)
{
    for (Py_ssize_t i = 0; i < m; i++) {
        uint16_t v;
        memcpy(&v, q + 2 * i, 2);
        d[i] = (uint8_t)(v | v >> 4);
    }
}

void tans_merge_nibbles_into(const uint8_t *restrict p, uint8_t *restrict o, Py_ssize_t nblk, Py_ssize_t bsize,
                             Py_ssize_t foff, Py_ssize_t fsize)
{
    if (fsize == 16)            /* Q4_0 and Q4_1: a constant width, so that the block vectorises */
        for (Py_ssize_t b = 0; b < nblk; b++)
            merge_pairs(o + bsize * b + foff, p + 32 * b, 16);
    else
        for (Py_ssize_t b = 0; b < nblk; b++)
            merge_pairs(o + bsize * b + foff, p + 2 * fsize * b, fsize);
}

PyObject *tans_merge_nibbles(PyObject *self, PyObject *args)
{
    TANS_BUFFER nib = {0}, out = {0};
    Py_ssize_t nblk, bsize, foff, fsize;
    if (!PyArg_ParseTuple(args, "y*w*nnnn", &nib, &out, &nblk, &bsize, &foff, &fsize))
        return NULL;
    if (nblk < 0 || fsize < 0 || foff < 0 || bsize < foff + fsize || nib.len != 2 * fsize * nblk ||
        out.len < nblk * bsize)
        return tans_bad_arguments("merge_nibbles");
    Py_BEGIN_ALLOW_THREADS      /* only C buffers: other decodes run meanwhile */
    tans_merge_nibbles_into(nib.buf, out.buf, nblk, bsize, foff, fsize);
    Py_END_ALLOW_THREADS
    return Py_NewRef(Py_None);
}

/* dst[b * bsize] .. += w bytes from src[b * w], for every block; w a constant where inlined */
static inline __attribute__((always_inline)) void scatter_blocks(uint8_t *restrict o, const uint8_t *restrict p,
                                                                 Py_ssize_t nblk, Py_ssize_t bsize, Py_ssize_t w)
{
    for (Py_ssize_t b = 0; b < nblk; b++)
        memcpy(o + b * bsize, p + b * w, (size_t)w);
}

void tans_scatter_field_into(const uint8_t *restrict p, uint8_t *restrict out, Py_ssize_t nblk, Py_ssize_t bsize,
                             Py_ssize_t foff, Py_ssize_t fsize)
{
    uint8_t *restrict o = out + foff;
    if (fsize == bsize) {       /* the field is the whole block: one copy */
        memcpy(o, p, (size_t)(nblk * bsize));
        return;
    }
    switch (fsize) {            /* the widths of ggml's block fields, each copy of a constant size */
    case 1: scatter_blocks(o, p, nblk, bsize, 1); break;
    case 4: scatter_blocks(o, p, nblk, bsize, 4); break;
    case 12: scatter_blocks(o, p, nblk, bsize, 12); break;
    case 16: scatter_blocks(o, p, nblk, bsize, 16); break;
    case 32: scatter_blocks(o, p, nblk, bsize, 32); break;
    case 64: scatter_blocks(o, p, nblk, bsize, 64); break;
    case 128: scatter_blocks(o, p, nblk, bsize, 128); break;
    default: scatter_blocks(o, p, nblk, bsize, fsize); break;
    }
}

PyObject *tans_scatter_field(PyObject *self, PyObject *args)
{
    TANS_BUFFER src = {0}, out = {0};
    Py_ssize_t nblk, bsize, foff, fsize;
    if (!PyArg_ParseTuple(args, "y*w*nnnn", &src, &out, &nblk, &bsize, &foff, &fsize))
        return NULL;
    if (nblk < 0 || fsize < 1 || foff < 0 || bsize < foff + fsize || src.len != fsize * nblk ||
        out.len < nblk * bsize)
        return tans_bad_arguments("scatter_field");
    Py_BEGIN_ALLOW_THREADS
    tans_scatter_field_into(src.buf, out.buf, nblk, bsize, foff, fsize);
    Py_END_ALLOW_THREADS
    return Py_NewRef(Py_None);
}
