/* ggufblocks' helper, compiled: Q4_1 quant bytes rebuilt from their decoded 4-bit symbols,
 * straight into the blocks' quant field. The numpy path in ggufblocks.py computes the same and
 * stays the fallback; the tests run both.
 *
 * Why C: in numpy the merge took a shift, an OR and a strided store over the chunk, about a
 * fifth of a Q4_1 chunk's decode; here it is one pass.
 *
 * merge_nibbles(nib, out, nblk, bsize, foff, fsize) -> None
 *   nib:  uint8[2 * fsize * nblk], the symbols of every block's field in order, low nibble first
 *   out:  writable, at least nblk * bsize bytes: byte foff + i of block b becomes
 *         nib[2k] | nib[2k + 1] << 4 (k = b * fsize + i), as a byte
 */
#include "_tansloop.h"
#include <stdint.h>

PyObject *tans_merge_nibbles(PyObject *self, PyObject *args)
{
    Py_buffer nib = {0}, out = {0};
    Py_ssize_t nblk, bsize, foff, fsize;
    if (!PyArg_ParseTuple(args, "y*w*nnnn", &nib, &out, &nblk, &bsize, &foff, &fsize))
        return NULL;
    PyObject *result = NULL;
    if (nblk < 0 || fsize < 0 || foff < 0 || bsize < foff + fsize || nib.len != 2 * fsize * nblk ||
        out.len < nblk * bsize) {
        PyErr_SetString(PyExc_ValueError, "merge_nibbles: bad arguments");
        goto done;
    }
    const uint8_t *restrict p = nib.buf;
    uint8_t *restrict o = out.buf;
    Py_BEGIN_ALLOW_THREADS      /* only C buffers: other decodes run meanwhile */
    for (Py_ssize_t b = 0; b < nblk; b++) {
        const uint8_t *restrict q = p + 2 * fsize * b;
        uint8_t *restrict d = o + bsize * b + foff;
        for (Py_ssize_t i = 0; i < fsize; i++)
            d[i] = (uint8_t)(q[2 * i] | q[2 * i + 1] << 4);
    }
    Py_END_ALLOW_THREADS
    result = Py_NewRef(Py_None);
done:
    PyBuffer_Release(&nib);
    PyBuffer_Release(&out);
    return result;
}
