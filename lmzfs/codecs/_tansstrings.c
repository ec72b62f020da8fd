/* The strings codec's two loops (lmzfs/codecs/strings.py has the numpy reference of both).
 *
 * string_lengths(data, out) -> (count, end): the lengths of the whole u64-length-prefixed strings
 * at the start of data into out (int64, at least len(data) / 8 + 1 of them), how many, and where
 * the last one ends. Each string's length depends on the one before, so numpy cannot do this in
 * whole-array steps; in Python it was the codec's slowest step after zstd.
 *
 * join_strings(lengths, text, out) -> bool: out = each length as eight little-endian bytes and
 * then its string's bytes from text, in turn, and after the last string the rest of text; False
 * (out untouched) unless 8 * count + len(text) == len(out) and the lengths fit in text. */
#include "_tansloop.h"
#include <string.h>

PyObject *tans_string_lengths(PyObject *self, PyObject *args)
{
    TANS_BUFFER data = {0}, out = {0};
    if (!PyArg_ParseTuple(args, "y*w*", &data, &out))
        return NULL;
    if (out.len / 8 < data.len / 8 + 1) {
        PyBuffer_Release(&data);
        PyBuffer_Release(&out);
        PyErr_SetString(PyExc_ValueError, "string_lengths: out too short");
        return NULL;
    }
    const uint8_t *d = data.buf;
    int64_t *o = out.buf;
    const Py_ssize_t size = data.len;
    Py_ssize_t pos = 0, count = 0;
    Py_BEGIN_ALLOW_THREADS
    while (size - pos >= 8) {
        uint64_t n;
        memcpy(&n, d + pos, 8);     /* little-endian hosts only; checked at import */
        if (n > (uint64_t)(size - pos - 8))
            break;
        o[count++] = (int64_t)n;
        pos += 8 + (Py_ssize_t)n;
    }
    Py_END_ALLOW_THREADS
    return Py_BuildValue("nn", count, pos);
}

PyObject *tans_join_strings(PyObject *self, PyObject *args)
{
    TANS_BUFFER lb = {0}, tb = {0}, ob = {0};
    if (!PyArg_ParseTuple(args, "y*y*w*", &lb, &tb, &ob))
        return NULL;
    const int64_t *len = lb.buf;
    const Py_ssize_t count = lb.len / 8;
    int ok = lb.len % 8 == 0 && count <= ob.len / 8 && ob.len - 8 * count == tb.len;
    if (ok) {
        Py_ssize_t used = 0;
        for (Py_ssize_t i = 0; i < count && ok; i++) {
            ok = len[i] >= 0 && len[i] <= tb.len - used;
            used += ok ? (Py_ssize_t)len[i] : 0;
        }
    }
    if (ok) {
        const uint8_t *t = tb.buf;
        uint8_t *o = ob.buf;
        Py_BEGIN_ALLOW_THREADS
        for (Py_ssize_t i = 0; i < count; i++) {
            const uint64_t n = (uint64_t)len[i];
            memcpy(o, &n, 8);
            memcpy(o + 8, t, (size_t)n);
            o += 8 + n;
            t += n;
        }
        memcpy(o, t, (size_t)(ob.len - (o - (uint8_t *)ob.buf)));
        Py_END_ALLOW_THREADS
    }
    return PyBool_FromLong(ok);
}
