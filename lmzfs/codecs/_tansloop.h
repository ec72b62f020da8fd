/* Shared by the sources of the lmzfs.codecs._tansloop extension: the decode loop (_tansloop.c,
 * which defines the module), the table helpers (_tanstables.c), floatsplit's helpers
 * (_tansfloat.c), ggufblocks' (_tansgguf.c) and the symbol sections' tails (_tanstails.c). */
#ifndef LMZFS_TANSLOOP_H
#define LMZFS_TANSLOOP_H
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdint.h>

/* compiled helpers shared between the sources (no Python objects; safe without the GIL) */
struct remainder {
    int64_t rem, sym;
};
const char *tans_build_rows(const int64_t *f, int64_t K, int64_t S, int64_t R, int64_t L,
                            int16_t *spread, int64_t *next, int64_t *pk, uint32_t *pk32);
int tans_quantize_counts(const int64_t *counts, int64_t *freqs, int64_t K, int64_t S, int64_t L,
                         unsigned char *small, struct remainder *big);

PyObject *tans_build(PyObject *self, PyObject *args);
PyObject *tans_quantize_rows(PyObject *self, PyObject *args);
PyObject *tans_varints(PyObject *self, PyObject *args);
PyObject *tans_pack_fields(PyObject *self, PyObject *args);
PyObject *tans_unpack_fields(PyObject *self, PyObject *args);
PyObject *tans_or_plane(PyObject *self, PyObject *args);
PyObject *tans_float_tables(PyObject *self, PyObject *args);
PyObject *tans_merge_nibbles(PyObject *self, PyObject *args);
PyObject *tans_q4_1_contexts(PyObject *self, PyObject *args);
PyObject *tans_tail_contexts(PyObject *self, PyObject *args);
PyObject *tans_tail_symbols(PyObject *self, PyObject *args);

#endif
