/* floatsplit's parts decoded in one call: floatsplit.decode_parts_together, compiled.
 *
 * Why C: a part (a floatseg segment, or a whole floatsplit chunk) took a dozen calls from
 * Python: the first states, the tANS loop, the bits back, the stored planes merged one group at
 * a time. Each call let go of Python's lock and took it back, and in a mount, where the decode
 * threads share the lock with the FUSE loop and each other, every taking-back could wait: the
 * decode threads spent about as long waiting as decoding. Here every part of a chunk is decoded
 * with the lock let go once, and the numpy-side work per part shrinks to building the records.
 * The result is the same as floatsplit.decode_part's for each part (the tests compare them on
 * every fixture and on adversarial chunks); groups coded as zstd or tANS streams are left to
 * Python, which decodes them afterwards (stored groups, the common case, are merged here).
 *
 * float_parts(packed32, checked, values, isz, nxo, cls, C, shift, c0, body, recs, groups,
 *              masks, raws, out, R, L, nib_plane) -> None
 *   packed32: the model's tables in the loop's compact form (uint32[K * L]); checked: an earlier
 *             decode checked them against this many values
 *   values:   isz-byte element bits per symbol (isz 2, 4 or 8)
 *   nxo:      int64[S], previous-symbol context offsets (contiguous lanes), or None
 *   cls:      uint8 row classes (interleaved lanes; element i's context is cls[(i + shift) / C]),
 *             or None; exactly one of nxo and cls is given
 *   c0:       the first context of the previous-symbol mode
 *   body:     the parts' bytes
 *   recs:     int64[9 * k]: per part its first element in the chunk, where it goes in out, its
 *             element count, lanes, tANS stream length, offset in body, stored bytes (raw_len),
 *             first group and group count
 *   groups:   int64[3 * G]: per group its plane j, byte length and mask (an index into masks,
 *             or -1: every element)
 *   raws:     k writable buffers of raw_len bytes: the part's stored bytes (bits back, then the
 *             rest from body), for Python's groups
 *   out:      writable, the elements (isz bytes each)
 * Raises ValueError with the message the Python path gives for the same damage.
 */
#include "_tansloop.h"
#include <stdint.h>
#include <string.h>

enum { REC = 9, GRP = 3, RAW_MODE = 0 };

struct parts_in {
    const uint32_t *tab;
    int checked;
    int64_t ntab, nsym, L, R, C, shift, c0, nib_plane, k, ng, nmask;
    const void *values;
    Py_ssize_t isz;
    const int64_t *nxo;
    const uint8_t *cls;
    Py_ssize_t ncls;
    const uint8_t *body;
    Py_ssize_t blen;
    const int64_t *recs, *groups;
    Py_buffer *masks, *raws;
    uint8_t *out;
    Py_ssize_t nout;
};

static const char *one_part(const struct parts_in *p, int64_t q, int *nomem)
{
    const int64_t *rec = p->recs + REC * q;
    const int64_t first = rec[0], at = rec[1], n = rec[2], lanes = rec[3], slen = rec[4], boff = rec[5],
                  raw_len = rec[6], g0 = rec[7], ng = rec[8];
    const int interleaved = p->cls != NULL;
    const int64_t L = p->L, R = p->R;
    if (n < 1 || lanes < 1 || at < 0 || at + n > p->nout || slen < 0 || boff < 0 || boff + slen > p->blen ||
        raw_len < 0 || g0 < 0 || ng < 0 || g0 + ng > p->ng || first < 0 ||
        (interleaved && (first + n - 1 + p->shift) / p->C >= p->ncls))
        return "floatsplit: bad part records";
    int64_t T, Wp;
    if (interleaved) {
        Wp = lanes < n ? lanes : n;
        T = (n + Wp - 1) / Wp;
    } else {
        T = (n + lanes - 1) / lanes;
        Wp = (n + T - 1) / T;
    }
    const uint8_t *stream = p->body + boff;
    const char *err = NULL;
    int64_t *states = PyMem_RawMalloc(Wp * sizeof *states);
    uint8_t *ctx8 = interleaved ? PyMem_RawMalloc(n) : NULL;
    if (!states || (interleaved && !ctx8)) {
        *nomem = 1;
        err = "out of memory";
        goto done;
    }
    err = tans_first_states(stream, slen, R, Wp, states);
    if (err)
        goto done;
    if (interleaved) {
        const int64_t K = p->ntab / L;
        for (int64_t i = 0; i < n; i++)
            ctx8[i] = p->cls[(first + i + p->shift) / p->C];
        for (int64_t j = 0; j < Wp; j++) {
            if (ctx8[j] >= K) {
                err = "tans: context out of range";
                goto done;
            }
            states[j] += (int64_t)ctx8[j] * L;
        }
    } else {
        for (int64_t j = 0; j < Wp; j++)
            states[j] += p->c0 * L;
    }
    struct decode_in d = {.packed = p->tab, .compact = 1, .checked = p->checked, .ntab = p->ntab,
                          .stream = stream, .slen = slen, .states = states, .out = p->out + at * p->isz,
                          .isz = p->isz, .values = p->values, .nsym = p->nsym, .ctx = NULL, .ctx8 = ctx8,
                          .nxo = interleaved ? NULL : p->nxo, .interleaved = interleaved, .n = n, .T = T,
                          .Wp = Wp, .L = L, .pos = (uint64_t)(Wp * R)};
    err = tans_decode_section(&d, nomem);
    if (err)
        goto done;
    /* the stored bytes: the lanes' end states (bits back), then the rest from the body */
    const int64_t back = Wp * R / 8, m = raw_len < back ? raw_len : back;
    uint8_t *raw = p->raws[q].buf;
    if (boff + slen + raw_len - m > p->blen) {
        err = "floatsplit: bad part records";
        goto done;
    }
    if (tans_pack_fields_into(states, Wp, R, raw, m)) {
        err = "floatsplit: lane end states hold bits past the stored bytes";
        goto done;
    }
    memcpy(raw + m, stream + slen, (size_t)(raw_len - m));
    /* stored groups merged here; zstd and tANS ones are Python's */
    int64_t off = 0;
    for (int64_t g = g0; g < g0 + ng; g++) {
        const int64_t j = p->groups[GRP * g], ln = p->groups[GRP * g + 1], mi = p->groups[GRP * g + 2];
        if (ln < 0 || off + ln > raw_len || mi < -1 || mi >= p->nmask || j < 0 || 8 * j + 8 > 8 * p->isz ||
            (mi >= 0 && p->masks[mi].len != n)) {
            err = "floatsplit: bad part records";
            goto done;
        }
        const uint8_t *grp = raw + off;
        off += ln;
        if (ln < 1 || grp[0] != RAW_MODE)
            continue;
        const uint8_t *mask = mi >= 0 ? p->masks[mi].buf : NULL;
        int64_t c = n;
        if (mask) {
            c = 0;
            for (int64_t i = 0; i < n; i++)
                c += mask[i] != 0;
        }
        const int nib = j == p->nib_plane;
        if (ln - 1 != (nib ? (c + 1) / 2 : c)) {
            err = "stream: stored length mismatch";
            goto done;
        }
        if (nib && c % 2 && grp[1 + c / 2] >> 4) {
            err = "floatsplit: nonzero padding nibble";
            goto done;
        }
        tans_or_plane_into(p->out + at * p->isz, p->isz, n, grp + 1, nib, (unsigned)(8 * j), mask);
    }
done:
    PyMem_RawFree(states);
    PyMem_RawFree(ctx8);
    return err;
}

PyObject *tans_float_parts(PyObject *self, PyObject *args)
{
    TANS_BUFFER packed = {0}, values = {0}, nxo = {0}, cls = {0}, body = {0}, recs = {0}, groups = {0}, out = {0};
    PyObject *nxo_obj, *cls_obj, *masks_obj, *raws_obj, *result = NULL;
    int checked;
    Py_ssize_t isz, C, shift, c0, R, L, nib_plane;
    Py_buffer *masks = NULL, *raws = NULL;
    Py_ssize_t nmask = 0, nraw = 0, got_masks = 0, got_raws = 0;
    if (!PyArg_ParseTuple(args, "y*py*nOOnnny*y*y*O!O!w*nnn", &packed, &checked, &values, &isz, &nxo_obj, &cls_obj,
                          &C, &shift, &c0, &body, &recs, &groups, &PyTuple_Type, &masks_obj, &PyTuple_Type,
                          &raws_obj, &out, &R, &L, &nib_plane))
        return NULL;
    if (nxo_obj != Py_None && PyObject_GetBuffer(nxo_obj, &nxo, PyBUF_SIMPLE) < 0)
        goto done;
    if (cls_obj != Py_None && PyObject_GetBuffer(cls_obj, &cls, PyBUF_SIMPLE) < 0)
        goto done;
    nmask = PyTuple_GET_SIZE(masks_obj);
    nraw = PyTuple_GET_SIZE(raws_obj);
    masks = PyMem_Calloc(nmask + 1, sizeof *masks);
    raws = PyMem_Calloc(nraw + 1, sizeof *raws);
    if (!masks || !raws) {
        PyErr_NoMemory();
        goto done;
    }
    for (; got_masks < nmask; got_masks++)
        if (PyObject_GetBuffer(PyTuple_GET_ITEM(masks_obj, got_masks), &masks[got_masks], PyBUF_SIMPLE) < 0)
            goto done;
    for (; got_raws < nraw; got_raws++)
        if (PyObject_GetBuffer(PyTuple_GET_ITEM(raws_obj, got_raws), &raws[got_raws], PyBUF_WRITABLE) < 0)
            goto done;
    const int64_t ntab = packed.len / 4, nsym = isz > 0 ? values.len / isz : 0, k = recs.len / (8 * REC);
    if ((isz != 2 && isz != 4 && isz != 8) || L < 2 || L > 1 << 15 || (1 << R) != L || R < 1 || R > 15 ||
        ntab < L || ntab % L || ntab > 1 << 24 || nsym < 1 || (cls.obj == NULL) == (nxo.obj == NULL) ||
        (cls.obj && C < 1) || shift < 0 || c0 < 0 || recs.len % (8 * REC) || groups.len % (8 * GRP) ||
        nraw != k || out.len % isz || (nxo.obj && nxo.len / 8 < nsym)) {
        PyErr_SetString(PyExc_ValueError, "floatsplit: bad part arguments");
        goto done;
    }
    for (int64_t q = 0; q < k; q++)
        if (raws[q].len != ((const int64_t *)recs.buf)[REC * q + 6]) {
            PyErr_SetString(PyExc_ValueError, "floatsplit: bad part records");
            goto done;
        }
    struct parts_in p = {.tab = packed.buf, .checked = checked, .ntab = ntab, .nsym = nsym, .L = L, .R = R, .C = C,
                         .shift = shift, .c0 = c0, .nib_plane = nib_plane, .k = k, .ng = groups.len / (8 * GRP),
                         .nmask = nmask, .values = values.buf, .isz = isz, .nxo = nxo.obj ? nxo.buf : NULL,
                         .cls = cls.obj ? cls.buf : NULL, .ncls = cls.len, .body = body.buf, .blen = body.len,
                         .recs = recs.buf, .groups = groups.buf, .masks = masks, .raws = raws, .out = out.buf,
                         .nout = out.len / isz};
    const char *err = NULL;
    int nomem = 0;
    Py_BEGIN_ALLOW_THREADS      /* only C buffers from here on: the chunk's parts, the lock let go once */
    for (int64_t q = 0; q < k && !err; q++) {
        err = one_part(&p, q, &nomem);
        p.checked = 1;          /* the tables were checked by the first part's decode */
    }
    Py_END_ALLOW_THREADS
    result = tans_none_or_error(err, nomem);
done:
    for (Py_ssize_t q = 0; q < got_masks; q++)
        PyBuffer_Release(&masks[q]);
    for (Py_ssize_t q = 0; q < got_raws; q++)
        PyBuffer_Release(&raws[q]);
    PyMem_Free(masks);
    PyMem_Free(raws);
    return result;
}
