/* floatsplit's stored mantissa planes merged into the decoded elements, compiled.
 *
 * Why C: numpy spends four whole-array passes per plane (unpack nibbles, widen, shift, or) and a
 * masked scatter for zero-block groups; this is one pass. The numpy path in floatsplit.py does
 * the same and stays the fallback; the tests run both.
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

PyObject *tans_or_plane(PyObject *self, PyObject *args)
{
    Py_buffer u = {0}, plane = {0}, mask = {0};
    Py_ssize_t isz, shift;
    int nib;
    PyObject *mask_obj, *result = NULL;
    if (!PyArg_ParseTuple(args, "w*ny*pnO", &u, &isz, &plane, &nib, &shift, &mask_obj))
        return NULL;
    if (mask_obj != Py_None && PyObject_GetBuffer(mask_obj, &mask, PyBUF_SIMPLE) < 0)
        goto done;
    if ((isz != 2 && isz != 4 && isz != 8) || u.len % isz || shift < 0 || shift + 8 > 8 * isz ||
        (mask.obj && mask.len != u.len / isz)) {
        PyErr_SetString(PyExc_ValueError, "or_plane: bad arguments");
        goto done;
    }
    const Py_ssize_t n = u.len / isz;
    Py_ssize_t count = n;
    const uint8_t *m = mask.obj ? mask.buf : NULL;
    if (m) {
        count = 0;
        for (Py_ssize_t i = 0; i < n; i++)
            count += m[i] != 0;
    }
    const uint8_t *p = plane.buf;
    if (plane.len != (nib ? (count + 1) / 2 : count)) {
        result = PyLong_FromLong(1);
        goto done;
    }
    if (nib && count % 2 && p[count / 2] >> 4) {
        result = PyLong_FromLong(2);
        goto done;
    }
    Py_BEGIN_ALLOW_THREADS
    switch (isz) {
    case 2: or_uint16_t(u.buf, n, p, nib, (unsigned)shift, m); break;
    case 4: or_uint32_t(u.buf, n, p, nib, (unsigned)shift, m); break;
    default: or_uint64_t(u.buf, n, p, nib, (unsigned)shift, m); break;
    }
    Py_END_ALLOW_THREADS
    result = PyLong_FromLong(0);
done:
    PyBuffer_Release(&u);
    PyBuffer_Release(&plane);
    if (mask.obj)
        PyBuffer_Release(&mask);
    return result;
}
