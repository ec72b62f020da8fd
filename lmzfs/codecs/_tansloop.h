/* Shared by the sources of the lmzfs.codecs._tansloop extension: the decode loop (_tansloop.c,
 * which defines the module), the table helpers (_tanstables.c), floatsplit's helpers
 * (_tansfloat.c), ggufblocks' (_tansgguf.c), the symbol sections' tails (_tanstails.c) and
 * the copy of a decoded array into bytes (_tanscopy.c), the encoder's steps (_tansenc.c) and its passes over a chunk (_tansfit.c)
 * and over a symbol section (_tanssection.c), and the entropy codec's column-class search
 * (_tanscolumns.c). */
#ifndef LMZFS_TANSLOOP_H
#define LMZFS_TANSLOOP_H
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdint.h>
#include <stdlib.h>

/* One tANS decode (see _tansloop.c): the tables, the stream, the lane states and where the
 * symbols go. The step loops resume at step t0, lane j0 (both 0 at first): the vector loop
 * (_tansvec.c) leaves the last few lanes before the stream's end to the scalar one. */
struct job {
    uint32_t *tab;
    int64_t ntab;
    const int64_t *nxo;       /* per symbol: next context offset (dyn), or NULL */
    const int64_t *ctx;       /* per symbol index: its context (ctx mode, int64), or NULL */
    const uint8_t *ctx8;      /* the same as uint8, or NULL */
    const uint8_t *s;
    Py_ssize_t slen;
    uint32_t *st;
    uint16_t *sym;            /* step-major: sym[t * SW + j] = map[symbol] */
    const uint16_t *map;      /* per symbol: what the loop stores (the values themselves when they
                               * are 16-bit, else the symbol) */
    uint8_t *sym8;            /* 8-bit values, interleaved lanes: the loop stores them in place */
    const uint8_t *map8;
    int64_t SW;               /* the row stride of sym: Wp, padded for contiguous lanes (see ROW_PAD) */
    int64_t n, T, Wp, L, nsym;
    int interleaved;
    uint64_t pos;
    int64_t t0, j0;
};
#define SYM_SHIFT 19          /* the loop's 32-bit entries: base | nb << 15 | sym << SYM_SHIFT */

/* The lanes still holding a symbol at step t (always a prefix), shared by the scalar and the
 * vector steps; ``interleaved`` is passed so that each specialised loop folds it. */
static inline int64_t tans_active_lanes(const struct job *jb, const int interleaved, int64_t t)
{
    if (interleaved)
        return jb->n - t * jb->Wp < jb->Wp ? jb->n - t * jb->Wp : jb->Wp;
    return t < jb->n - (jb->Wp - 1) * jb->T ? jb->Wp : jb->Wp - 1;
}

/* A batched decode's outcome once the lock is taken back: None, or the error its loop reported
 * (nomem: an allocation failed there), raised. */
/* A buffer a Python-facing function parses: released however the function returns (GCC's and
 * Clang's cleanup attribute), and passed over if it was never filled (still {0}). */
#define TANS_BUFFER __attribute__((cleanup(PyBuffer_Release))) Py_buffer

/* What a function with a single exit does there: let go of buffers that are not TANS_BUFFERs and
 * free its scratch (free(NULL) does nothing). */
static inline void tans_release_buffers(Py_buffer *const *b, size_t n)
{
    for (size_t i = 0; i < n; i++)
        PyBuffer_Release(b[i]);
}
static inline void tans_free_all(void *const *p, size_t n)
{
    for (size_t i = 0; i < n; i++)
        free(p[i]);
}
#define TANS_COUNT(T, ...) (sizeof((T[]){__VA_ARGS__}) / sizeof(T))
#define RELEASE_BUFFERS(...) tans_release_buffers((Py_buffer *const[]){__VA_ARGS__}, TANS_COUNT(Py_buffer *, __VA_ARGS__))
#define FREE_ALL(...) tans_free_all((void *const[]){__VA_ARGS__}, TANS_COUNT(void *, __VA_ARGS__))

/* A Python-facing function's refusal of arguments that do not fit together: "FN: bad arguments". */
static inline PyObject *tans_bad_arguments(const char *fn)
{
    PyErr_Format(PyExc_ValueError, "%s: bad arguments", fn);
    return NULL;
}

static inline PyObject *tans_none_or_error(const char *err, int nomem)
{
    if (nomem)
        return PyErr_NoMemory();
    if (err) {
        PyErr_SetString(PyExc_ValueError, err);
        return NULL;
    }
    return Py_NewRef(Py_None);
}

/* Of the a active lanes at step t, those that decode another symbol at step t + 1 (and so take
 * its per-symbol context): a prefix too. */
static inline int64_t tans_continuing_lanes(const struct job *jb, const int interleaved, int64_t t, int64_t a)
{
    if (t + 1 >= jb->T)
        return 0;
    const int64_t left = interleaved ? jb->n - (t + 1) * jb->Wp : (jb->n - t - 1 + jb->T - 1) / jb->T;
    return left < a ? left : a;
}

/* The same steps as the scalar loop, 16 lanes at a time where the CPU has AVX-512: returns an
 * error or NULL, having decoded up to (jb->t0, jb->j0). Does nothing where it cannot help (no
 * such CPU, turned off, contiguous lanes with per-symbol contexts, streams under 128 bytes). */
const char *tans_steps_vector(struct job *jb);
PyObject *tans_vector_isa(PyObject *self, PyObject *args);

/* One decode (_tansloop.c), every input checked by the caller (as decode() checks its
 * arguments) but the tables, first states and contexts, which it checks itself. No Python
 * objects: call it without the GIL. Returns an error or NULL, with *nomem set when an
 * allocation failed; on success ``states`` holds each lane's last table index and ``pos`` the
 * bit where the stream ended. */
struct decode_in {
    const void *packed;         /* int64 entries, or the loop's own uint32 ones with compact */
    int compact, checked;
    int64_t ntab;
    const uint8_t *stream;
    Py_ssize_t slen;
    int64_t *states;            /* in: each lane's first table index */
    void *out;                  /* n items of isz bytes: values[symbol] */
    Py_ssize_t isz;
    const void *values;
    int64_t nsym;
    const int64_t *ctx;         /* per symbol contexts (int64 or uint8), or NULL */
    const uint8_t *ctx8;
    const int64_t *nxo;         /* previous-symbol context offsets, or NULL */
    int interleaved;
    int64_t n, T, Wp, L;
    uint64_t pos;               /* in: the first bit after the initial states */
};
const char *tans_decode_run(struct decode_in *d, int *nomem);
/* A whole stream's decode for the batched decoders: tans_first_states reads the lanes' first
 * states (the stream's first Wp R-bit fields; an error if it is shorter), before the caller adds
 * their contexts; tans_decode_section runs tans_decode_run from bit Wp * R, checks that the stream
 * ends at the last symbol's bits (zero padding after), and leaves each lane's end state in
 * [0, L). GIL-free. */
const char *tans_first_states(const uint8_t *stream, Py_ssize_t slen, int64_t R, int64_t Wp, int64_t *states);
const char *tans_decode_section(struct decode_in *d, int *nomem);
/* u[i] |= plane value i << shift for n elements of isz bytes (2, 4, 8), or only those whose
 * mask byte is set, the values in order; one byte each or two per byte (nib). GIL-free. */
void tans_or_plane_into(void *u, Py_ssize_t isz, Py_ssize_t n, const uint8_t *p, int nib, unsigned shift,
                        const uint8_t *mask);
/* the R-bit fields of count values as one little-endian bit string: its first m bytes into o;
 * returns nonzero when a bit at or past 8 * m is set. GIL-free. */
int tans_pack_fields_into(const int64_t *v, Py_ssize_t count, Py_ssize_t R, uint8_t *o, Py_ssize_t m);
/* out[i] = the R-bit little-endian field at bit i * R of b, for count fields. GIL-free. */
void tans_unpack_fields_into(const uint8_t *b, Py_ssize_t R, int64_t *out, Py_ssize_t count);
PyObject *tans_float_parts(PyObject *self, PyObject *args);
/* the tails of a symbol section (_tanstails.c): contexts (uint8 when narrow, else int64) += K at
 * every tail; the tails' symbols merged with their end-state bits (0 ok, 1 bits of no symbol, 2
 * a symbol out of range). GIL-free. */
void tans_tail_contexts_into(void *ctx, int narrow, Py_ssize_t n, Py_ssize_t T, Py_ssize_t Wp, Py_ssize_t k,
                             Py_ssize_t K);
long tans_tail_symbols_into(void *sym, int narrow, const int64_t *f, Py_ssize_t n, Py_ssize_t T, Py_ssize_t Wp,
                            Py_ssize_t k, Py_ssize_t g, Py_ssize_t S);
/* ggufblocks' helpers (_tansgguf.c), GIL-free: the Q4_1 zero points of nblk blocks (32 each), a
 * nibble stream merged into a quant field, a byte stream copied into a field */
void tans_q4_1_contexts_into(const uint8_t *restrict p, Py_ssize_t nblk, Py_ssize_t bsize, uint8_t *restrict o);
void tans_merge_nibbles_into(const uint8_t *restrict p, uint8_t *restrict o, Py_ssize_t nblk, Py_ssize_t bsize,
                             Py_ssize_t foff, Py_ssize_t fsize);
void tans_scatter_field_into(const uint8_t *restrict p, uint8_t *restrict out, Py_ssize_t nblk, Py_ssize_t bsize,
                             Py_ssize_t foff, Py_ssize_t fsize);
/* ggufblocks' fields of a chunk in one call (_tansblocks.c) */
PyObject *tans_decode_fields(PyObject *self, PyObject *args);

/* A buffer's bytes as a new bytes object, copied without the lock (_tanscopy.c). */
PyObject *tans_copy_bytes(PyObject *self, PyObject *arg);
PyObject *tans_string_lengths(PyObject *self, PyObject *args);
PyObject *tans_join_strings(PyObject *self, PyObject *args);

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
PyObject *tans_to_varints(PyObject *self, PyObject *arg);
PyObject *tans_section_model(PyObject *self, PyObject *args);
PyObject *tans_pack_fields(PyObject *self, PyObject *args);
PyObject *tans_unpack_fields(PyObject *self, PyObject *args);
PyObject *tans_or_plane(PyObject *self, PyObject *args);
PyObject *tans_float_tables(PyObject *self, PyObject *args);
PyObject *tans_merge_nibbles(PyObject *self, PyObject *args);
PyObject *tans_q4_1_contexts(PyObject *self, PyObject *args);
PyObject *tans_scatter_field(PyObject *self, PyObject *args);
PyObject *tans_tail_contexts(PyObject *self, PyObject *args);
PyObject *tans_tail_symbols(PyObject *self, PyObject *args);
PyObject *tans_encode(PyObject *self, PyObject *args);
PyObject *tans_encode_slots(PyObject *self, PyObject *args);
/* the encoders' passes over a chunk (_tansfit.c) */
PyObject *tans_float_range(PyObject *self, PyObject *args);
PyObject *tans_float_fields(PyObject *self, PyObject *args);
PyObject *tans_float_planes(PyObject *self, PyObject *args);
PyObject *tans_zero_blocks(PyObject *self, PyObject *args);
PyObject *tans_row_means(PyObject *self, PyObject *args);
PyObject *tans_row_classes(PyObject *self, PyObject *args);
PyObject *tans_row_order_stats(PyObject *self, PyObject *args);
PyObject *tans_row_contexts(PyObject *self, PyObject *args);
PyObject *tans_encode_rows(PyObject *self, PyObject *args);
/* the encoder's passes over a symbol section (_tanssection.c) */
PyObject *tans_section_counts(PyObject *self, PyObject *args);
PyObject *tans_section_rows(PyObject *self, PyObject *args);
/* the entropy codec's column-class search (_tanscolumns.c) */
PyObject *tans_column_classes(PyObject *self, PyObject *args);
/* ulpdelta's element loops (_tansulp.c) */
PyObject *tans_ulp_residuals(PyObject *self, PyObject *args);
PyObject *tans_ulp_contexts(PyObject *self, PyObject *args);
PyObject *tans_ulp_apply(PyObject *self, PyObject *args);

#endif
