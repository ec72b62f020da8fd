/* ggufblocks' field streams decoded in one call: ggufblocks' compiled decode path (and the
 * entropy codec's one section, as a field of one-byte blocks).
 *
 * Why C: a GGUF block chunk is four to eight field streams, and each tANS-coded one took a
 * dozen calls from Python (first states, the loop, its tails, the scatter into the blocks),
 * each letting go of Python's lock and taking it back; in a mount, where the decode threads
 * share the lock with the FUSE loop and each other, the taking-back is where they waited. Here
 * Python checks every stream's header and builds its tables, and the streams are then decoded
 * and put in place with the lock let go once. Entropy.decode_tans_section and ggufblocks'
 * numpy path stay the reference; the tests compare them on every flipped byte.
 *
 * decode_fields(out, nblk, bsize, items) -> None
 *   out:   writable, at least nblk * bsize bytes: the blocks
 *   items: a tuple, one per stream in the order of the fields, each
 *          (foff, fsize, nib, symbols) for a stream stored or zstd-coded (its n symbols), or
 *          (foff, fsize, nib, stream, freqs, R, g, lanes, K, S) for a tANS section: its stream
 *          after the header, its K x S frequency rows (int64), table log, tail width, lanes,
 *          contexts and alphabet (S <= 256); the decoder tables (the rows, then with g their
 *          marginals over 2**g symbols) are built here, as tans.Tables builds them
 *          and, optionally, an 11th element: column classes (uint8, each < K), symbol i's
 *          context being classes[i % len] (the entropy codec's, with blocks of one byte)
 *          nib 0: n = nblk * fsize byte symbols, copied into bytes foff.. of each block;
 *          nib 1: n = 2 * nblk * fsize 4-bit symbols (Q4_1 quants), merged in pairs into the
 *          field, coded (tANS) under the K = 16 contexts of each block's zero point, read from
 *          the blocks' fp16 d and m (fields earlier in the items)
 * Raises ValueError with the message the Python path gives for the same damage.
 */
#include "_tansloop.h"
#include <stdint.h>
#include <stdio.h>
#include <string.h>

struct field {
    Py_ssize_t foff, fsize;
    int nib, tans;
    Py_buffer src;              /* the symbols, or the tANS stream */
    Py_buffer freqs;
    Py_buffer cls;              /* column classes: symbol i's context is cls[i % len], or none */
    Py_ssize_t R, g, lanes, K, S;
    char message[80];           /* an error that names a number */
};

/* tans.Tables(rows, R) of a section (entropy.TansSection.tables): the K rows, then with g their
 * marginals (row k's frequencies summed over each 2**g symbols, zero past S / 2**g), checked to
 * sum to 2**R, built into int64 decoder entries. */
static const char *section_tables(struct field *f, int64_t **packed, int64_t *ntab, int *nomem)
{
    const int64_t K = f->K, S = f->S, R = f->R, L = (int64_t)1 << R, Kt = f->g ? 2 * K : K;
    const int64_t *fr = f->freqs.buf;
    if (R < 4 || R > 15)
        return "tans: bad table shape or table log";
    for (int64_t k = 0; k < K; k++) {
        int64_t sum = 0;
        for (int64_t s = 0; s < S; s++)
            sum += fr[k * S + s];
        if (sum != L) {
            snprintf(f->message, sizeof f->message, "tans: a frequency table does not sum to %lld", (long long)L);
            return f->message;
        }
    }
    int64_t *rows = PyMem_RawCalloc(Kt * S, sizeof *rows);
    int64_t *pk = PyMem_RawMalloc(Kt * L * sizeof *pk);
    int16_t *spread = PyMem_RawMalloc(L * sizeof *spread);
    int64_t *next = PyMem_RawMalloc(S * sizeof *next);
    const char *err = NULL;
    if (!rows || !pk || !spread || !next) {
        *nomem = 1;
        err = "out of memory";
        goto done;
    }
    memcpy(rows, fr, (size_t)(K * S) * sizeof *rows);
    for (int64_t k = 0; f->g && k < K; k++)
        for (int64_t s = 0; s < S; s++)
            rows[(K + k) * S + (s >> f->g)] += fr[k * S + s];
    err = tans_build_rows(rows, Kt, S, R, L, spread, next, pk, NULL);
done:
    PyMem_RawFree(rows);
    PyMem_RawFree(spread);
    PyMem_RawFree(next);
    if (err) {
        PyMem_RawFree(pk);
        pk = NULL;
    }
    *packed = pk;
    *ntab = Kt * L;
    return err;
}

static const char *symbols_of(struct field *f, uint8_t *out, Py_ssize_t nblk, Py_ssize_t bsize, uint8_t *sym,
                              Py_ssize_t n, int *nomem)
{
    const Py_ssize_t R = f->R, L = (Py_ssize_t)1 << R, g = f->g, K = f->K, S = f->S;
    const Py_ssize_t Wp = f->lanes < n ? f->lanes : n, T = (n + Wp - 1) / Wp;
    const int ctxs = f->nib || g || K > 1 || f->cls.obj;
    int64_t *packed = NULL, ntab = 0;
    const char *err = NULL;
    if (g && R / g > T)         /* checked before the tables, as decode_tans_section does */
        return "tans section: lanes too short for their tails";
    err = section_tables(f, &packed, &ntab, nomem);
    if (err)
        return err;
    uint8_t *ctx = ctxs ? PyMem_RawCalloc(n, 1) : NULL;
    int64_t *states = PyMem_RawMalloc(Wp * sizeof *states);
    uint8_t *ident = PyMem_RawMalloc(S);
    if ((ctxs && !ctx) || !states || !ident) {
        *nomem = 1;
        err = "out of memory";
        goto done;
    }
    for (Py_ssize_t q = 0; q < S; q++)
        ident[q] = (uint8_t)q;
    if (f->nib)
        tans_q4_1_contexts_into(out, nblk, bsize, ctx);     /* n == 32 * nblk */
    if (f->cls.obj) {           /* the classes repeated: one copy, then copies of what is written */
        const Py_ssize_t period = f->cls.len;
        Py_ssize_t have = period < n ? period : n;
        memcpy(ctx, f->cls.buf, (size_t)have);
        while (have < n) {      /* have is a whole number of periods until the last copy */
            const Py_ssize_t run = have < n - have ? have : n - have;
            memcpy(ctx + have, ctx, (size_t)run);
            have += run;
        }
    }
    Py_ssize_t k = 0;
    if (g) {
        k = R / g;
        tans_tail_contexts_into(ctx, 1, n, T, Wp, k, K);
    }
    err = tans_first_states(f->src.buf, f->src.len, R, Wp, states);
    if (err)
        goto done;
    if (ctxs) {
        for (Py_ssize_t j = 0; j < Wp; j++) {
            if ((int64_t)ctx[j] * L >= ntab) {
                err = "tans: context out of range";
                goto done;
            }
            states[j] += (int64_t)ctx[j] * L;
        }
    }
    struct decode_in d = {.packed = packed, .compact = 0, .checked = 0, .ntab = ntab, .stream = f->src.buf,
                          .slen = f->src.len, .states = states, .out = sym, .isz = 1, .values = ident, .nsym = S,
                          .ctx = NULL, .ctx8 = ctxs ? ctx : NULL, .nxo = NULL, .interleaved = 1, .n = n,
                          .T = T, .Wp = Wp, .L = L, .pos = (uint64_t)(Wp * R)};
    err = tans_decode_section(&d, nomem);
    if (err)
        goto done;
    if (g) {
        const long code = tans_tail_symbols_into(sym, 1, states, n, T, Wp, k, g, S);
        if (code == 1)
            err = "tans section: end state holds bits of no symbol";
        else if (code)
            err = "tans section: symbol out of range";
    } else {
        for (Py_ssize_t j = 0; j < Wp && !err; j++)
            if (states[j])
                err = "tans section: lanes end in the wrong state";
    }
done:
    PyMem_RawFree(packed);
    PyMem_RawFree(ctx);
    PyMem_RawFree(states);
    PyMem_RawFree(ident);
    return err;
}

static const char *one_field(struct field *f, uint8_t *out, Py_ssize_t nblk, Py_ssize_t bsize, int *nomem)
{
    const Py_ssize_t n = (f->nib ? 2 : 1) * nblk * f->fsize;
    if (!n)
        return NULL;
    const char *err = NULL;
    uint8_t *sym = NULL;
    const uint8_t *src = f->src.buf;
    if (f->tans) {
        sym = PyMem_RawMalloc(n);
        if (!sym) {
            *nomem = 1;
            return "out of memory";
        }
        err = symbols_of(f, out, nblk, bsize, sym, n, nomem);
        src = sym;
    } else if (f->nib) {
        uint8_t top = 0;
        for (Py_ssize_t i = 0; i < n; i++)
            top |= src[i];
        if (top >= 16)
            err = "stream: symbol out of range";
    }
    if (!err) {
        if (f->nib)
            tans_merge_nibbles_into(src, out, nblk, bsize, f->foff, f->fsize);
        else
            tans_scatter_field_into(src, out, nblk, bsize, f->foff, f->fsize);
    }
    PyMem_RawFree(sym);
    return err;
}

PyObject *tans_decode_fields(PyObject *self, PyObject *args)
{
    TANS_BUFFER out = {0};
    Py_ssize_t nblk, bsize, count = 0, got = 0;
    PyObject *items, *result = NULL;
    struct field *fields = NULL;
    if (!PyArg_ParseTuple(args, "w*nnO!", &out, &nblk, &bsize, &PyTuple_Type, &items))
        return NULL;
    count = PyTuple_GET_SIZE(items);
    fields = PyMem_Calloc(count + 1, sizeof *fields);
    if (!fields) {
        PyErr_NoMemory();
        goto done;
    }
    if (nblk < 0 || bsize < 1 || out.len < nblk * bsize)
        goto bad;
    for (; got < count; got++) {
        PyObject *it = PyTuple_GET_ITEM(items, got);
        struct field *f = &fields[got];
        if (!PyTuple_Check(it))
            goto bad;
        f->tans = PyTuple_GET_SIZE(it) >= 10;
        PyObject *src;
        int ok = f->tans ? PyArg_ParseTuple(it, "nnpOy*nnnnn|y*", &f->foff, &f->fsize, &f->nib, &src, &f->freqs, &f->R,
                                            &f->g, &f->lanes, &f->K, &f->S, &f->cls)
                         : PyArg_ParseTuple(it, "nnpO", &f->foff, &f->fsize, &f->nib, &src);
        if (!ok)
            goto done;
        if (PyObject_GetBuffer(src, &f->src, PyBUF_SIMPLE) < 0) {
            if (f->tans)
                PyBuffer_Release(&f->freqs);
            if (f->cls.obj)
                PyBuffer_Release(&f->cls);
            goto done;
        }
        const Py_ssize_t n = (f->nib ? 2 : 1) * nblk * f->fsize;
        if (f->foff < 0 || f->fsize < 1 || f->foff + f->fsize > bsize || (f->nib && (bsize < 4 || f->fsize != 16)) ||
            (!f->tans && f->src.len != n) ||
            (f->tans && (f->R < 1 || f->R > 15 || f->g < 0 || f->g > 8 || (f->g && (1 << f->g) > f->S) ||
                         f->lanes < 1 || f->K < 1 || 2 * f->K > 255 || f->S < 1 || f->S > 256 ||
                         (f->nib && f->K != 16) || f->freqs.len != 8 * f->K * f->S ||
                         (f->cls.obj && (f->nib || f->cls.len < 1))))) {
            got++;
            goto bad;
        }
    }
    const char *err = NULL;
    int nomem = 0;
    Py_BEGIN_ALLOW_THREADS      /* only C buffers from here on: the chunk's fields, the lock let go once */
    for (Py_ssize_t q = 0; q < count && !err; q++)
        err = one_field(&fields[q], out.buf, nblk, bsize, &nomem);
    Py_END_ALLOW_THREADS
    result = tans_none_or_error(err, nomem);
    goto done;
bad:
    PyErr_SetString(PyExc_ValueError, "ggufblocks: bad field arguments");
done:
    for (Py_ssize_t q = 0; q < got; q++) {
        PyBuffer_Release(&fields[q].src);
        if (fields[q].tans)
            PyBuffer_Release(&fields[q].freqs);
        if (fields[q].cls.obj)
            PyBuffer_Release(&fields[q].cls);
    }
    PyMem_Free(fields);
    return result;
}
