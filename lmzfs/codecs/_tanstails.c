/* The bits-back tails of tANS symbol sections (entropy.decode_tans_section), compiled: the last
 * k symbols of every interleaved lane are coded under the marginal tables (contexts K..2K-1) and
 * their low g bits sit in the lane's end state. The numpy path in entropy.py computes the same
 * (results and errors) and stays the fallback; the tests run both.
 *
 * Why C: the tails are a few per lane, scattered one lane apart, and numpy's fancy indexing over
 * them (context offsets, end-state bits, range checks, the merge) cost as much as decoding a
 * 50 000-symbol section itself.
 *
 * Lane j of Wp (interleaved: step t of lane j is symbol t * Wp + j) has T symbols if
 * j < n - (T - 1) * Wp, else T - 1; its q-th tail (q < k) is its symbol at step len - k + q,
 * and does not exist when that is negative.
 *
 * tail_contexts(ctx, n, T, Wp, k, K) -> None: ctx (uint8[n] or int64[n], by length) += K at
 *   every tail.
 * tail_symbols(sym, fin, n, T, Wp, k, g, S) -> 0 ok; 1 an end state holds bits of no symbol;
 *   2 a symbol out of range. sym (uint8[n] or int64[n]) holds each tail's symbol >> g, which
 *   must be < ceil(S / 2**g); it becomes (symbol << g) | bits q * g.. of fin[j] (int64[Wp]), and
 *   must then be < S. Bits of fin[j] for tails that do not exist, or past k * g, must be zero.
 */
#include "_tansloop.h"
#include <stdint.h>

static int layout_ok(Py_ssize_t n, Py_ssize_t T, Py_ssize_t Wp, Py_ssize_t k)
{
    return n >= 1 && T >= 1 && Wp >= 1 && k >= 1 && k <= T && (T - 1) * Wp < n && T * Wp >= n;
}

/* The tails at step t are those of a range of lanes: lanes below ``last`` hold T symbols and
 * the others T - 1, so step t holds a tail of lane j when len(j) - k <= t < len(j). Walking
 * the steps and, in each, a run of adjacent lanes touches memory in order; lane by lane it
 * jumps Wp symbols at every tail, which cost as much as the decode itself on wide sections. */
static inline void tail_lanes(Py_ssize_t t, Py_ssize_t T, Py_ssize_t Wp, Py_ssize_t k, Py_ssize_t last,
                              Py_ssize_t *lo, Py_ssize_t *hi)
{
    const int full = T - k <= t && t < T, part = T - 1 - k <= t && t < T - 1;    /* lanes of T, of T - 1 */
    *lo = full ? 0 : last;
    *hi = part ? Wp : last;
    if (!full && !part)
        *lo = *hi = 0;
}

void tans_tail_contexts_into(void *ctx, int narrow, Py_ssize_t n, Py_ssize_t T, Py_ssize_t Wp, Py_ssize_t k,
                             Py_ssize_t K)
{
    const Py_ssize_t last = n - (T - 1) * Wp;   /* lanes with T symbols */
    for (Py_ssize_t t = T - 1 - k < 0 ? 0 : T - 1 - k; t < T; t++) {
        Py_ssize_t lo, hi;
        tail_lanes(t, T, Wp, k, last, &lo, &hi);
        if (narrow) {
            uint8_t *c = (uint8_t *)ctx + t * Wp;
            for (Py_ssize_t j = lo; j < hi; j++)
                c[j] += (uint8_t)K;
        } else {
            int64_t *c = (int64_t *)ctx + t * Wp;
            for (Py_ssize_t j = lo; j < hi; j++)
                c[j] += K;
        }
    }
}

long tans_tail_symbols_into(void *sym, int narrow, const int64_t *f, Py_ssize_t n, Py_ssize_t T, Py_ssize_t Wp,
                            Py_ssize_t k, Py_ssize_t g, Py_ssize_t S)
{
    const Py_ssize_t last = n - (T - 1) * Wp;
    const int64_t top = (S + ((int64_t)1 << g) - 1) >> g, mask = ((int64_t)1 << g) - 1;
    for (Py_ssize_t j = 0; j < Wp; j++) {     /* first every end state, as numpy does */
        const Py_ssize_t len = j < last ? T : T - 1, missing = len < k ? k - len : 0;
        if (f[j] < 0 || f[j] >> (k * g) || (f[j] & ((((int64_t)1 << (missing * g)) - 1))))
            return 1;
    }
    int bad = 0;
    for (Py_ssize_t t = T - 1 - k < 0 ? 0 : T - 1 - k; t < T; t++) {
        Py_ssize_t lo, hi;
        tail_lanes(t, T, Wp, k, last, &lo, &hi);
        for (Py_ssize_t j = lo; j < hi; j++) {
            const Py_ssize_t q = t - ((j < last ? T : T - 1) - k);      /* this tail's place in its lane */
            const Py_ssize_t i = t * Wp + j;
            const int64_t s = narrow ? ((uint8_t *)sym)[i] : ((int64_t *)sym)[i];
            const int64_t v = s << g | ((f[j] >> (q * g)) & mask);
            bad |= s < 0 || s >= top || v >= S;
            if (narrow)
                ((uint8_t *)sym)[i] = (uint8_t)v;
            else
                ((int64_t *)sym)[i] = v;
        }
    }
    return bad ? 2 : 0;
}

PyObject *tans_tail_contexts(PyObject *self, PyObject *args)
{
    TANS_BUFFER ctx = {0};
    Py_ssize_t n, T, Wp, k, K;
    if (!PyArg_ParseTuple(args, "w*nnnnn", &ctx, &n, &T, &Wp, &k, &K))
        return NULL;
    if (!layout_ok(n, T, Wp, k) || K < 1 || (ctx.len != n && ctx.len != 8 * n) || (ctx.len == n && 2 * K > 255))
        return tans_bad_arguments("tail_contexts");
    Py_BEGIN_ALLOW_THREADS
    tans_tail_contexts_into(ctx.buf, ctx.len == n, n, T, Wp, k, K);
    Py_END_ALLOW_THREADS
    return Py_NewRef(Py_None);
}

PyObject *tans_tail_symbols(PyObject *self, PyObject *args)
{
    TANS_BUFFER sym = {0}, fin = {0};
    Py_ssize_t n, T, Wp, k, g, S;
    if (!PyArg_ParseTuple(args, "w*y*nnnnnn", &sym, &fin, &n, &T, &Wp, &k, &g, &S))
        return NULL;
    if (!layout_ok(n, T, Wp, k) || g < 1 || g > 8 || k * g > 62 || S < 1 || (sym.len != n && sym.len != 8 * n) ||
        (sym.len == n && S > 256) || fin.len != 8 * Wp)
        return tans_bad_arguments("tail_symbols");
    long code;
    Py_BEGIN_ALLOW_THREADS
    code = tans_tail_symbols_into(sym.buf, sym.len == n, fin.buf, n, T, Wp, k, g, S);
    Py_END_ALLOW_THREADS
    return PyLong_FromLong(code);
}
