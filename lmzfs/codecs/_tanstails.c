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

void tans_tail_contexts_into(void *ctx, int narrow, Py_ssize_t n, Py_ssize_t T, Py_ssize_t Wp, Py_ssize_t k,
                             Py_ssize_t K)
{
    const Py_ssize_t last = n - (T - 1) * Wp;   /* lanes with T symbols */
    for (Py_ssize_t j = 0; j < Wp; j++) {
        const Py_ssize_t len = j < last ? T : T - 1;
        for (Py_ssize_t t = len - k < 0 ? 0 : len - k; t < len; t++) {
            if (narrow)
                ((uint8_t *)ctx)[t * Wp + j] += (uint8_t)K;
            else
                ((int64_t *)ctx)[t * Wp + j] += K;
        }
    }
}

long tans_tail_symbols_into(void *sym, int narrow, const int64_t *f, Py_ssize_t n, Py_ssize_t T, Py_ssize_t Wp,
                            Py_ssize_t k, Py_ssize_t g, Py_ssize_t S)
{
    const Py_ssize_t last = n - (T - 1) * Wp;
    const int64_t top = (S + ((int64_t)1 << g) - 1) >> g, mask = ((int64_t)1 << g) - 1;
    long code = 0;
    for (Py_ssize_t j = 0; j < Wp && !code; j++) {     /* first every end state, as numpy does */
        const Py_ssize_t len = j < last ? T : T - 1, missing = len < k ? k - len : 0;
        code = f[j] < 0 || f[j] >> (k * g) || (f[j] & ((((int64_t)1 << (missing * g)) - 1))) ? 1 : 0;
    }
    for (Py_ssize_t j = 0; j < Wp && !code; j++) {
        const Py_ssize_t len = j < last ? T : T - 1;
        for (Py_ssize_t q = len < k ? k - len : 0; q < k && !code; q++) {
            const Py_ssize_t i = (len - k + q) * Wp + j;
            const int64_t s = narrow ? ((uint8_t *)sym)[i] : ((int64_t *)sym)[i];
            const int64_t v = s << g | ((f[j] >> (q * g)) & mask);
            if (s < 0 || s >= top || v >= S) {
                code = 2;
            } else if (narrow) {
                ((uint8_t *)sym)[i] = (uint8_t)v;
            } else {
                ((int64_t *)sym)[i] = v;
            }
        }
    }
    return code;
}

PyObject *tans_tail_contexts(PyObject *self, PyObject *args)
{
    Py_buffer ctx = {0};
    Py_ssize_t n, T, Wp, k, K;
    if (!PyArg_ParseTuple(args, "w*nnnnn", &ctx, &n, &T, &Wp, &k, &K))
        return NULL;
    PyObject *result = NULL;
    if (!layout_ok(n, T, Wp, k) || K < 1 || (ctx.len != n && ctx.len != 8 * n) || (ctx.len == n && 2 * K > 255)) {
        PyErr_SetString(PyExc_ValueError, "tail_contexts: bad arguments");
        goto done;
    }
    tans_tail_contexts_into(ctx.buf, ctx.len == n, n, T, Wp, k, K);
    result = Py_NewRef(Py_None);
done:
    PyBuffer_Release(&ctx);
    return result;
}

PyObject *tans_tail_symbols(PyObject *self, PyObject *args)
{
    Py_buffer sym = {0}, fin = {0};
    Py_ssize_t n, T, Wp, k, g, S;
    if (!PyArg_ParseTuple(args, "w*y*nnnnnn", &sym, &fin, &n, &T, &Wp, &k, &g, &S))
        return NULL;
    PyObject *result = NULL;
    if (!layout_ok(n, T, Wp, k) || g < 1 || g > 8 || k * g > 62 || S < 1 || (sym.len != n && sym.len != 8 * n) ||
        (sym.len == n && S > 256) || fin.len != 8 * Wp) {
        PyErr_SetString(PyExc_ValueError, "tail_symbols: bad arguments");
        goto done;
    }
    const long code = tans_tail_symbols_into(sym.buf, sym.len == n, fin.buf, n, T, Wp, k, g, S);
    result = PyLong_FromLong(code);
done:
    PyBuffer_Release(&sym);
    PyBuffer_Release(&fin);
    return result;
}
