/* copy_bytes(buffer) -> bytes: the buffer's bytes in a new bytes object, copied with Python's
 * lock released when they are many.
 *
 * Why: a reader that answers a small read from a chunk's decoded array before caching the chunk
 * (lmzfs/reader/filereader.py) leaves the copy into the cache to another thread. On a fresh mount
 * that copy takes a page fault for every 4 KiB of memory the process has never used (about
 * 0.55 ms per MiB on the benchmark host); made as bytes(), it would hold the lock all that time,
 * and the FUSE loop could not send the answer meanwhile. Releasing it is safe: the new object is
 * seen by no other thread until it is returned, and the source stays exported (so it cannot be
 * resized, freed or closed) until the copy is done. */
#include "_tansloop.h"
#include <string.h>

/* below this, giving the lock up and taking it back costs more than the copy */
#define UNLOCKED_MIN (64 << 10)

PyObject *tans_copy_bytes(PyObject *self, PyObject *arg)
{
    TANS_BUFFER b = {0};
    if (PyObject_GetBuffer(arg, &b, PyBUF_C_CONTIGUOUS) < 0)
        return NULL;
    PyObject *out = PyBytes_FromStringAndSize(NULL, b.len);
    if (out != NULL) {
        char *dst = PyBytes_AS_STRING(out);
        if (b.len >= UNLOCKED_MIN) {
            Py_BEGIN_ALLOW_THREADS
            memcpy(dst, b.buf, (size_t)b.len);
            Py_END_ALLOW_THREADS
        } else if (b.len) {
            memcpy(dst, b.buf, (size_t)b.len);
        }
    }
    return out;
}
