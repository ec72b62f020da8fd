/* Shared by the two sources of the lmzfs.codecs._tansloop extension: the decode loop
 * (_tansloop.c, which defines the module), the table helpers (_tanstables.c) and floatsplit's
 * plane merge (_tansplanes.c). */
#ifndef LMZFS_TANSLOOP_H
#define LMZFS_TANSLOOP_H
#define PY_SSIZE_T_CLEAN
#include <Python.h>

PyObject *tans_build(PyObject *self, PyObject *args);
PyObject *tans_quantize_rows(PyObject *self, PyObject *args);
PyObject *tans_varints(PyObject *self, PyObject *args);
PyObject *tans_pack_fields(PyObject *self, PyObject *args);
PyObject *tans_unpack_fields(PyObject *self, PyObject *args);
PyObject *tans_or_plane(PyObject *self, PyObject *args);

#endif
