/* ulpdelta's element loops, compiled: the residuals of a chunk against its reference (encode),
 * the reference's contexts, and the elements rebuilt from decoded symbols, stored bits and the
 * reference (decode). The numpy paths in ulpdelta.py compute the same and stay the reference;
 * the tests run both and compare payloads and bytes.
 *
 * Why C: in numpy each is a dozen whole-array passes over uint64 copies of the elements; here
 * each is one pass with a running bit position.
 *
 * Keys (floating): non-negative x -> x | sign, negative x -> ~x (w bits); integers: the value.
 * z = zigzag(key(x) - key(ref) mod 2**w); b = bit length of z; the symbol is z itself when
 * b <= r + 1, else 2**(r+1) + (b - r - 2) * 2**r + the r bits below z's leading one, and the
 * b - 1 - r bits under those are the element's stored bits, appended to a little-endian bit string.
 *
 * ulp_residuals(u, v, bits, floating, fshift, fbits, fkey, r, sym, field, raw) -> stored bit count
 *   u, v:  n elements each (uint8, uint16 or uint32 little-endian by bits)
 *   sym:   writable int64[n]; field: writable uint8[n], the reference's context field
 *          ((key(v) if fkey else v) >> fshift) & (2**fbits - 1)
 *   raw:   writable, at least n * bits / 8 + 8 bytes: the stored bits (the bytes past them are
 *          left as they were)
 * ulp_contexts(v, bits, floating, fshift, fbits, fkey, cmap, out) -> None
 *   cmap:  uint8[2**fbits], each field value's context; out: writable uint8[n]
 * ulp_apply(sym, v, raw, rlen, bits, floating, r, out) -> 0, or 1 when the stored bits are not
 *   exactly the ones the symbols need (too few, too many bytes, or nonzero padding), 2 for a
 *   symbol out of the alphabet
 *   sym:   uint8[n]; raw: the rlen bytes of stored bits and at least 8 more (read, never used);
 *   out:   writable, n elements of v's type
 */
#include "_tansloop.h"
#include <stdint.h>
#include <string.h>

struct ulp_format {
    int bits, floating, fshift, fkey;
    uint32_t mask, sign, fmask;
};

static inline __attribute__((always_inline)) uint32_t load(const uint8_t *p, Py_ssize_t i, int bits)
{
    if (bits == 8)
        return p[i];
    if (bits == 16) {
        uint16_t x;
        memcpy(&x, p + 2 * i, 2);
        return x;
    }
    uint32_t x;
    memcpy(&x, p + 4 * i, 4);
    return x;
}

static inline __attribute__((always_inline)) void store(uint8_t *p, Py_ssize_t i, int bits, uint32_t x)
{
    if (bits == 8) {
        p[i] = (uint8_t)x;
    } else if (bits == 16) {
        const uint16_t y = (uint16_t)x;
        memcpy(p + 2 * i, &y, 2);
    } else {
        memcpy(p + 4 * i, &x, 4);
    }
}

/* without a branch: x XOR (all w bits when the sign is set, else the sign bit) */
static inline uint32_t key_of(const struct ulp_format *f, uint32_t x)
{
    if (!f->floating)
        return x;
    return x ^ (((0u - (x >> (f->bits - 1))) & f->mask) | f->sign);
}

static inline uint32_t unkey(const struct ulp_format *f, uint32_t k)
{
    if (!f->floating)
        return k;
    return (k & f->sign) ? (k ^ f->sign) : (~k & f->mask);
}

static inline uint32_t field_of(const struct ulp_format *f, uint32_t y)
{
    return ((f->fkey ? key_of(f, y) : y) >> f->fshift) & f->fmask;
}

static int format_of(struct ulp_format *f, int bits, int floating, int fshift, int fbits, int fkey)
{
    if ((bits != 8 && bits != 16 && bits != 32) || fshift < 0 || fbits < 1 || fbits > 8 || fshift + fbits > bits)
        return -1;
    f->bits = bits;
    f->floating = floating;
    f->fshift = fshift;
    f->fkey = fkey;
    f->mask = bits == 32 ? 0xFFFFFFFFu : (1u << bits) - 1;
    f->sign = 1u << (bits - 1);
    f->fmask = (1u << fbits) - 1;
    return 0;
}

static inline int bit_length(uint32_t z)
{
    return z ? 32 - __builtin_clz(z) : 0;
}

/* specialised by element width, as apply_loop below; returns the stored bit count */
static inline __attribute__((always_inline)) uint64_t
residuals_loop(const uint8_t *restrict pu, const uint8_t *restrict pv, int64_t *restrict ps, uint8_t *restrict pf,
               uint8_t *restrict pr, Py_ssize_t n, const struct ulp_format *f, const int r, const int bits)
{
    /* a local copy: the byte stores below may alias *f for all the compiler knows */
    const struct ulp_format fl = *f;
    f = &fl;
    uint64_t acc = 0, total = 0, out = 0;
    int nacc = 0;
    const int small_bits = r + 1;
    const uint32_t small = 1u << small_bits, rmask = (1u << r) - 1;
    for (Py_ssize_t i = 0; i < n; i++) {
        const uint32_t x = load(pu, i, bits), y = load(pv, i, bits);
        const uint32_t d = (key_of(f, x) - key_of(f, y)) & f->mask;
        const uint32_t z = ((d << 1) & f->mask) ^ ((0u - (d >> (bits - 1))) & f->mask);
        pf[i] = (uint8_t)field_of(f, y);
        const int b = bit_length(z), big = b > small_bits;
        const int extra = big ? b - 1 - r : 0;
        ps[i] = big ? small + ((int64_t)(b - r - 2) << r) + ((z >> extra) & rmask) : z;
        acc |= (uint64_t)(z & ((1u << extra) - 1)) << nacc;
        nacc += extra;
        total += extra;
        memcpy(pr + out, &acc, 8);   /* the buffer has 8 bytes to spare; later stores overwrite the excess */
        out += nacc >> 3;
        acc >>= nacc & ~7;
        nacc &= 7;
    }
    if (nacc)
        pr[out++] = (uint8_t)acc;
    return total;
}

PyObject *tans_ulp_residuals(PyObject *self, PyObject *args)
{
    TANS_BUFFER u = {0}, v = {0}, sym = {0}, field = {0}, raw = {0};
    int bits, floating, fshift, fbits, fkey, r;
    if (!PyArg_ParseTuple(args, "y*y*iiiiiiw*w*w*", &u, &v, &bits, &floating, &fshift, &fbits, &fkey, &r, &sym,
                          &field, &raw))
        return NULL;
    struct ulp_format f;
    const Py_ssize_t n = bits > 0 ? u.len / (bits / 8) : 0;
    if (format_of(&f, bits, floating, fshift, fbits, fkey) || r < 0 || r + 1 >= bits || u.len != v.len ||
        u.len % (bits / 8) || sym.len != 8 * n || field.len != n || raw.len < n * (bits / 8) + 8)
        return tans_bad_arguments("ulp_residuals");
    const uint8_t *restrict pu = u.buf, *restrict pv = v.buf;
    int64_t *restrict ps = sym.buf;
    uint8_t *restrict pf = field.buf, *restrict pr = raw.buf;
    uint64_t total = 0;
    Py_BEGIN_ALLOW_THREADS
    if (bits == 16)
        total = residuals_loop(pu, pv, ps, pf, pr, n, &f, r, 16);
    else if (bits == 32)
        total = residuals_loop(pu, pv, ps, pf, pr, n, &f, r, 32);
    else
        total = residuals_loop(pu, pv, ps, pf, pr, n, &f, r, 8);
    Py_END_ALLOW_THREADS
    return PyLong_FromUnsignedLongLong(total);
}

/* specialised by element width, as apply_loop below */
static inline __attribute__((always_inline)) void
contexts_loop(const uint8_t *restrict pv, const uint8_t *restrict cm, uint8_t *restrict po, Py_ssize_t n,
              const struct ulp_format *f, const int bits)
{
    const struct ulp_format fl = *f;     /* as in residuals_loop */
    for (Py_ssize_t i = 0; i < n; i++)
        po[i] = cm[field_of(&fl, load(pv, i, bits))];
}

PyObject *tans_ulp_contexts(PyObject *self, PyObject *args)
{
    TANS_BUFFER v = {0}, cmap = {0}, out = {0};
    int bits, floating, fshift, fbits, fkey;
    if (!PyArg_ParseTuple(args, "y*iiiiiy*w*", &v, &bits, &floating, &fshift, &fbits, &fkey, &cmap, &out))
        return NULL;
    struct ulp_format f;
    const Py_ssize_t n = bits > 0 ? v.len / (bits / 8) : 0;
    if (format_of(&f, bits, floating, fshift, fbits, fkey) || v.len % (bits / 8) || out.len != n ||
        cmap.len != (Py_ssize_t)1 << fbits)
        return tans_bad_arguments("ulp_contexts");
    const uint8_t *restrict pv = v.buf, *restrict cm = cmap.buf;
    uint8_t *restrict po = out.buf;
    Py_BEGIN_ALLOW_THREADS
    if (bits == 16)
        contexts_loop(pv, cm, po, n, &f, 16);
    else if (bits == 32)
        contexts_loop(pv, cm, po, n, &f, 32);
    else
        contexts_loop(pv, cm, po, n, &f, 8);
    Py_END_ALLOW_THREADS
    return Py_NewRef(Py_None);
}

/* The rebuild, specialised by element width and keying so that the loops carry no mode tests
 * and no branch per symbol: each symbol's stored-bit count and the bits of z above them come
 * from two small tables. It runs in blocks: first each element's z (the one serial part, a
 * running bit position), then the ZigZag, key and sum over the block, which the compiler
 * vectorises. */
#define APPLY_BLOCK 1024
/* element loads and stores that may be unaligned (a reference can start at any byte) */
typedef uint16_t __attribute__((aligned(1))) u16u;
typedef uint32_t __attribute__((aligned(1))) u32u;
#define APPLY_KEYS(T, W)                                                                        \
    do {                                                                                        \
        const T *restrict vv = (const T *)(pv + (W / 8) * i0);                                  \
        T *restrict oo = (T *)(po + (W / 8) * i0);                                              \
        for (Py_ssize_t j = 0; j < m; j++) {                                                    \
            const uint32_t z = zb[j], y = vv[j];                                                \
            const uint32_t d = (z >> 1) ^ ((0u - (z & 1)) & mask);                              \
            uint32_t k = floating ? y ^ (((0u - (y >> (W - 1))) & mask) | sign) : y;            \
            k = (k + d) & mask;                                                                 \
            oo[j] = (T)(floating ? k ^ (sign | (((k >> (W - 1)) - 1u) & mask)) : k);            \
        }                                                                                       \
    } while (0)
static inline __attribute__((always_inline)) void
apply_loop(const uint8_t *restrict ps, const uint8_t *restrict pv, const uint8_t *restrict pr, Py_ssize_t rlen,
           uint8_t *restrict po, Py_ssize_t n, const uint8_t *restrict ex, const uint32_t *restrict top,
           const int bits, const int floating, uint64_t *endpos)
{
    const uint32_t mask = bits == 32 ? 0xFFFFFFFFu : (1u << bits) - 1, sign = 1u << (bits - 1);
    uint32_t zb[APPLY_BLOCK];
    uint64_t pos = 0;
    for (Py_ssize_t i0 = 0; i0 < n; i0 += APPLY_BLOCK) {
        const Py_ssize_t m = n - i0 < APPLY_BLOCK ? n - i0 : APPLY_BLOCK;
        for (Py_ssize_t j = 0; j < m; j++) {
            const uint32_t s = ps[i0 + j];
            const uint64_t byte = pos >> 3;
            if (__builtin_expect(byte > (uint64_t)rlen, 0)) {     /* past the stored bits */
                *endpos = UINT64_MAX;
                return;
            }
            uint64_t w;
            memcpy(&w, pr + byte, 8);        /* the buffer holds 8 bytes past rlen */
            const int e = ex[s];
            zb[j] = top[s] | (uint32_t)((w >> (pos & 7)) & ((1ull << e) - 1));
            pos += e;
        }

        if (bits == 16)
            APPLY_KEYS(u16u, 16);
        else if (bits == 32)
            APPLY_KEYS(u32u, 32);
        else
            APPLY_KEYS(uint8_t, 8);
    }
    *endpos = pos;
}

PyObject *tans_ulp_apply(PyObject *self, PyObject *args)
{
    TANS_BUFFER sym = {0}, v = {0}, raw = {0}, out = {0};
    int bits, floating, r;
    Py_ssize_t rlen;
    if (!PyArg_ParseTuple(args, "y*y*y*niiiw*", &sym, &v, &raw, &rlen, &bits, &floating, &r, &out))
        return NULL;
    struct ulp_format f;
    const Py_ssize_t n = sym.len;
    if (format_of(&f, bits, floating, 0, 1, 0) || r < 0 || r + 1 >= bits || v.len != n * (bits / 8) ||
        out.len != v.len || rlen < 0 || raw.len < rlen + 8)
        return tans_bad_arguments("ulp_apply");
    const uint8_t *restrict ps = sym.buf, *restrict pv = v.buf, *restrict pr = raw.buf;
    uint8_t *restrict po = out.buf;
    const uint32_t small = 1u << (r + 1), rmask = (1u << r) - 1;
    const uint32_t nsym = small + (uint32_t)(bits - r - 1) * (1u << r);
    uint8_t ex[256];
    uint32_t top[256];
    for (uint32_t s = 0; s < 256; s++) {
        if (s < small) {
            ex[s] = 0;
            top[s] = s;
        } else if (s < nsym) {
            const uint32_t q = s - small;
            ex[s] = (uint8_t)((q >> r) + 1);        /* b - 1 - r, b = r + 2 + (q >> r) */
            top[s] = ((1u << r) | (q & rmask)) << ex[s];
        } else {
            ex[s] = 0;
            top[s] = 0;
        }
    }
    uint64_t pos = 0;
    int err = 0;
    Py_BEGIN_ALLOW_THREADS
    uint8_t most = 0;      /* a symbol outside the alphabet is refused before any work (a max vectorises) */
    for (Py_ssize_t i = 0; i < n; i++)
        most = ps[i] > most ? ps[i] : most;
    if (n && most >= nsym)
        err = 2;
    if (!err) {
        if (bits == 16 && floating)
            apply_loop(ps, pv, pr, rlen, po, n, ex, top, 16, 1, &pos);
        else if (bits == 32 && floating)
            apply_loop(ps, pv, pr, rlen, po, n, ex, top, 32, 1, &pos);
        else if (bits == 8 && floating)
            apply_loop(ps, pv, pr, rlen, po, n, ex, top, 8, 1, &pos);
        else if (bits == 16)
            apply_loop(ps, pv, pr, rlen, po, n, ex, top, 16, 0, &pos);
        else if (bits == 32)
            apply_loop(ps, pv, pr, rlen, po, n, ex, top, 32, 0, &pos);
        else
            apply_loop(ps, pv, pr, rlen, po, n, ex, top, 8, 0, &pos);
        if (pos == UINT64_MAX || ((pos + 7) >> 3) != (uint64_t)rlen || ((pos & 7) && (pr[rlen - 1] >> (pos & 7))))
            err = 1;
    }
    Py_END_ALLOW_THREADS
    return PyLong_FromLong(err);
}
