/* floatsplit's helpers, compiled: its decoder tables from the transmitted model, and its stored
 * mantissa planes merged into the decoded elements. The numpy paths in floatsplit.py compute the
 * same and stay the fallback; the tests run both.
 *
 * Why C: on a 256 KiB chunk the model tables took a dozen numpy calls and three compiled ones
 * (as long as the tANS loop itself); a plane merge took four whole-array numpy passes and a
 * masked scatter for zero-block groups, here one pass.
 *
 * or_plane(u, isz, plane, nibbles, shift, mask) -> 0 ok, 1 the plane's length does not match,
 * 2 a nonzero padding nibble
 *   u:       writable buffer of n elements of isz bytes (2, 4 or 8), little-endian
 *   plane:   the stored values, one byte each, or two per byte (the first in the low half) when
 *            nibbles
 *   shift:   where the values go: u[i] |= value << shift (shift + 8 <= 8 * isz)
 *   mask:    None (every element) or uint8[n] (only elements whose mask byte is nonzero, in order)
 */
#include "_tansloop.h"
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define OR_PLANE(TYPE)                                                                             \
    static void or_##TYPE(TYPE *restrict u, Py_ssize_t n, const uint8_t *restrict p, int nib,     \
                          unsigned shift, const uint8_t *restrict mask)                            \
    {                                                                                              \
        Py_ssize_t c = 0;                                                                          \
        if (!mask && nib) {     /* the common case, in pairs so that it vectorises */              \
            for (Py_ssize_t q = 0; q < n / 2; q++) {                                               \
                u[2 * q] |= (TYPE)((TYPE)(p[q] & 15) << shift);                                    \
                u[2 * q + 1] |= (TYPE)((TYPE)(p[q] >> 4) << shift);                                \
            }                                                                                      \
            if (n % 2)                                                                             \
                u[n - 1] |= (TYPE)((TYPE)(p[n / 2] & 15) << shift);                                \
            return;                                                                                \
        }                                                                                          \
        for (Py_ssize_t i = 0; i < n; i++) {                                                       \
            if (mask && !mask[i])                                                                  \
                continue;                                                                          \
            const unsigned v = nib ? (p[c >> 1] >> ((c & 1) * 4)) & 15 : p[c];                     \
            u[i] |= (TYPE)((TYPE)v << shift);                                                      \
            c++;                                                                                   \
        }                                                                                          \
    }
OR_PLANE(uint16_t)
OR_PLANE(uint32_t)
OR_PLANE(uint64_t)

void tans_or_plane_into(void *u, Py_ssize_t isz, Py_ssize_t n, const uint8_t *p, int nib, unsigned shift,
                        const uint8_t *mask)
{
    switch (isz) {
    case 2: or_uint16_t(u, n, p, nib, shift, mask); break;
    case 4: or_uint32_t(u, n, p, nib, shift, mask); break;
    default: or_uint64_t(u, n, p, nib, shift, mask); break;
    }
}

PyObject *tans_or_plane(PyObject *self, PyObject *args)
{
    TANS_BUFFER u = {0}, plane = {0}, mask = {0};
    Py_ssize_t isz, shift;
    int nib;
    PyObject *mask_obj;
    if (!PyArg_ParseTuple(args, "w*ny*pnO", &u, &isz, &plane, &nib, &shift, &mask_obj))
        return NULL;
    if (mask_obj != Py_None && PyObject_GetBuffer(mask_obj, &mask, PyBUF_SIMPLE) < 0)
        return NULL;
    if ((isz != 2 && isz != 4 && isz != 8) || u.len % isz || shift < 0 || shift + 8 > 8 * isz ||
        (mask.obj && mask.len != u.len / isz))
        return tans_bad_arguments("or_plane");
    const Py_ssize_t n = u.len / isz;
    Py_ssize_t count = n;
    const uint8_t *m = mask.obj ? mask.buf : NULL;
    if (m) {
        count = 0;
        for (Py_ssize_t i = 0; i < n; i++)
            count += m[i] != 0;
    }
    const uint8_t *p = plane.buf;
    if (plane.len != (nib ? (count + 1) / 2 : count))
        return PyLong_FromLong(1);
    if (nib && count % 2 && p[count / 2] >> 4)
        return PyLong_FromLong(2);
    Py_BEGIN_ALLOW_THREADS
    tans_or_plane_into(u.buf, isz, n, p, nib, (unsigned)shift, m);
    Py_END_ALLOW_THREADS
    return PyLong_FromLong(0);
}

/* float_tables(vals, nb, E, T2, R, a_max, m_max, packed) -> 0 ok, 1 a model value out of range,
 * 2 a table that cannot be quantised. floatsplit's _model_tables: vals holds A (nb x E), S (2)
 * and M (E x T2/2); A values must be <= a_max and S, M values <= m_max. Row b of the tables is
 * quantize(A[b, e] * S[sign] * M[e, m] over symbols e * T2 + sign * T2/2 + m, R), or every slot
 * on symbol 0 when that product is zero everywhere; packed (uint32[nb * 2**R]) gets the entries
 * for those rows in the decode loop's own 32-bit form (base | nb << 15 | sym << 19), so that
 * decode() only checks them (E * T2 <= 8192). */
PyObject *tans_float_tables(PyObject *self, PyObject *args)
{
    TANS_BUFFER vals = {0}, packed = {0};
    Py_ssize_t nb, E, T2, R, a_max, m_max;
    PyObject *result = NULL;
    int64_t *joint = NULL, *freqs = NULL, *next = NULL;
    int16_t *spread = NULL;
    unsigned char *small = NULL;
    struct remainder *big = NULL;
    if (!PyArg_ParseTuple(args, "y*nnnnnnw*", &vals, &nb, &E, &T2, &R, &a_max, &m_max, &packed))
        return NULL;
    const int64_t L = (int64_t)1 << (R < 4 || R > 15 ? 4 : R), S = E * T2, H = T2 / 2;
    if (R < 4 || R > 15 || nb < 1 || E < 1 || T2 < 2 || T2 % 2 || S > 8192 ||
        vals.len != (nb * E + 2 + E * H) * 8 || packed.len != nb * L * 4) {
        PyErr_SetString(PyExc_ValueError, "float_tables: bad arguments");
        goto done;
    }
    joint = PyMem_RawMalloc(nb * S * sizeof *joint);
    freqs = PyMem_RawMalloc(nb * S * sizeof *freqs);
    next = PyMem_RawMalloc(S * sizeof *next);
    spread = PyMem_RawMalloc(L * sizeof *spread);
    small = PyMem_RawMalloc(S);
    big = PyMem_RawMalloc(S * sizeof *big);
    if (!joint || !freqs || !next || !spread || !small || !big) {
        PyErr_NoMemory();
        goto done;
    }
    const int64_t *A = vals.buf, *Sg = A + nb * E, *M = Sg + 2;
    long code = 0;
    Py_BEGIN_ALLOW_THREADS      /* only C buffers from here on */
    for (int64_t i = 0; i < nb * E && !code; i++)
        code = A[i] < 0 || A[i] > a_max;
    for (int64_t i = 0; i < 2 + E * H && !code; i++)
        code = Sg[i] < 0 || Sg[i] > m_max;
    for (int64_t b = 0; b < nb && !code; b++) {
        int64_t *row = joint + b * S, any = 0;
        for (int64_t e = 0; e < E; e++)
            for (int64_t sign = 0; sign < 2; sign++)
                for (int64_t m = 0; m < H; m++) {
                    const int64_t v = A[b * E + e] * Sg[sign] * M[e * H + m];
                    row[e * T2 + sign * H + m] = v;
                    any |= v;
                }
        if (!any) {             /* an unused context: every slot on symbol 0 */
            memset(freqs + b * S, 0, S * sizeof *freqs);
            freqs[b * S] = L;
        } else if (!tans_quantize_counts(row, freqs + b * S, 1, S, L, small, big)) {
            code = 2;
        }
    }
    if (!code && tans_build_rows(freqs, nb, S, R, L, spread, next, NULL, packed.buf))
        code = 2;
    Py_END_ALLOW_THREADS
    result = PyLong_FromLong(code);
done:
    PyMem_RawFree(joint);
    PyMem_RawFree(freqs);
    PyMem_RawFree(next);
    PyMem_RawFree(spread);
    PyMem_RawFree(small);
    PyMem_RawFree(big);
    return result;
}
