/* tans.encode's step loop and bit packing, compiled: the same stream, byte for byte, as the numpy
 * code in tans.py, which stays the reference the tests compare against.
 *
 * Why C: encoding steps every lane backwards one symbol at a time; numpy does a handful of array
 * operations per step, and a chunk has tens of thousands of steps of few lanes, so its per-call
 * overhead, not the arithmetic, was most of `lmz add`'s time in the entropy coders.
 *
 * encode(si, n, T, Wp, interleaved, ks, thr, sf, enc, x0, R) -> bytes
 *   si   int64[n] or uint16[n]: each symbol's row index context * S + symbol (frequency > 0,
 *        checked here); the 16-bit rows of a section move a quarter of the bytes
 *   ks, thr, sf  int64[K * S]: per row, R + 1 - bit length of f, f << ks, and start - f
 *   enc  int64[K * L]: encoder slots (L + position)
 *   x0   int64[Wp]: each lane's initial state (L, plus any bits back)
 * Lane j's step t holds symbol t * Wp + j (interleaved) or j * T + t (contiguous), when that is
 * below n. The stream is the Wp final states (x - L, R bits each), then for every step t
 * ascending and lane j ascending the nb low bits of the state before that step's symbol, fields
 * packed least significant bit first.
 *
 * How: the tables are checked once, before the steps, for every state a lane can hold (L to
 * 2L - 1), so the step loop does no range check but the row index's. The steps run backwards,
 * while the stream wants them forwards: each step's fields are packed as they are made, into a
 * bit run of that step's own, and the runs are joined in step order at the end. */
#include "_tansloop.h"
#include <stdlib.h>
#include <string.h>

struct enc_row {            /* one (context, symbol) row, the fields a step reads side by side */
    uint32_t thr;           /* f << ks; states below it lose ks - 1 bits, the others ks */
    uint32_t ks;
    int32_t sf;             /* start - f: the slot of a state x is sf + (x >> nb) */
    uint32_t bad;           /* nonzero: frequency 0 or inconsistent fields (an error if used) */
};

static inline void store64(uint8_t *p, uint64_t v)
{
    memcpy(p, &v, 8);
}

/* Whether every state x in [L, 2L) gives row r a field of 0..16 bits and a slot in [0, nenc). */
static int row_ok(int64_t ks, int64_t thr, int64_t sf, int64_t L, int64_t nenc)
{
    if (ks < 0 || ks > 16 || thr < 1 || thr > 2 * L || (thr >> ks) << ks != thr)
        return 0;
    if (thr > L) {          /* states L .. thr - 1: nb = ks - 1 */
        if (ks < 1)
            return 0;
        const int64_t lo = sf + (L >> (ks - 1)), hi = sf + ((thr - 1) >> (ks - 1));
        if (lo < 0 || hi >= nenc)
            return 0;
    }
    if (thr < 2 * L) {      /* states max(thr, L) .. 2L - 1: nb = ks */
        const int64_t lo = sf + ((thr > L ? thr : L) >> ks), hi = sf + ((2 * L - 1) >> ks);
        if (lo < 0 || hi >= nenc)
            return 0;
    }
    return 1;
}

/* The steps, each step's fields packed into its own run of runs (bits[t] bits from runs + at[t]).
 * x holds the lanes' states, in [L, 2L) throughout (the tables were checked for that). */
static inline const char *encode_steps(const void *si, const int wide, int64_t n, int64_t T, int64_t Wp,
                                       int interleaved, const struct enc_row *restrict rows, int64_t nrows,
                                       const uint16_t *restrict enc, uint32_t *restrict x, uint8_t *restrict runs,
                                       int64_t *restrict at, int64_t *restrict bits)
{
    const int64_t *restrict si64 = si;
    const uint16_t *restrict si16 = si;
    int64_t pos = 0;
    uint32_t bad = 0;
    for (int64_t t = T - 1; t >= 0; t--) {
        int64_t a;
        if (interleaved)
            a = n - t * Wp < Wp ? n - t * Wp : Wp;
        else
            a = t < n - (Wp - 1) * T ? Wp : Wp - 1;
        at[t] = pos;
        uint64_t acc = 0;
        int64_t fill = 0, start = pos;
        for (int64_t j = 0; j < a; j++) {
            const int64_t i = interleaved ? t * Wp + j : j * T + t;
            const int64_t r = wide ? si64[i] : si16[i];
            if ((uint64_t)r >= (uint64_t)nrows)
                return "encode: a row index is out of range";
            const struct enc_row e = rows[r];
            const uint32_t xs = x[j];
            const uint32_t nb = e.ks - (xs < e.thr);
            bad |= e.bad;
            acc |= (uint64_t)(xs & ((1u << nb) - 1)) << fill;
            fill += nb;
            store64(runs + pos, acc);
            pos += fill >> 3;
            acc >>= fill & 56;
            fill &= 7;
            x[j] = enc[e.sf + (int32_t)(xs >> nb)];
        }
        /* the run's last byte holds only its own bits: the next run starts on a fresh byte */
        if (fill)
            runs[pos++] = (uint8_t)acc;
        bits[t] = (pos - start) * 8 - (fill ? 8 - fill : 0);
    }
    if (bad)
        return "encode: a symbol has zero frequency in its table";
    return NULL;
}

struct bitwriter {
    uint8_t *out;
    uint64_t acc;
    int64_t fill;
    int64_t pos;
};

/* Append nb <= 32 bits (v has no bits above them). out has 8 bytes of slack past the end. */
static inline void put_bits(struct bitwriter *w, uint64_t v, int64_t nb)
{
    w->acc |= v << w->fill;
    w->fill += nb;
    store64(w->out + w->pos, w->acc);
    w->pos += w->fill >> 3;
    w->acc >>= w->fill & 56;
    w->fill &= 7;
}

/* Append the first nbits bits of run (whose bytes past them are zero up to the next byte). */
static void put_run(struct bitwriter *w, const uint8_t *run, int64_t nbits)
{
    int64_t k = 0;
    for (; k + 32 <= nbits; k += 32) {
        uint32_t v;
        memcpy(&v, run + (k >> 3), 4);
        put_bits(w, v, 32);
    }
    for (; k < nbits; k += 8) {
        const int64_t nb = nbits - k < 8 ? nbits - k : 8;
        put_bits(w, run[k >> 3] & ((1u << nb) - 1), nb);
    }
}

PyObject *tans_encode(PyObject *self, PyObject *args)
{
    TANS_BUFFER si = {0}, ks = {0}, thr = {0}, sf = {0}, enc = {0}, x0 = {0};
    Py_ssize_t n, T, Wp, R;
    int interleaved;
    if (!PyArg_ParseTuple(args, "y*nnnpy*y*y*y*y*n", &si, &n, &T, &Wp, &interleaved, &ks, &thr, &sf, &enc,
                          &x0, &R))
        return NULL;
    PyObject *result = NULL;
    uint32_t *x = NULL;
    uint16_t *enc16 = NULL;
    struct enc_row *rows = NULL;
    uint8_t *runs = NULL, *out = NULL;
    int64_t *at = NULL, *bits = NULL;
    const int64_t nrows = ks.len / 8, nenc = enc.len / 8, L = (int64_t)1 << (R < 1 || R > 15 ? 1 : R);
    if (n < 1 || T < 1 || Wp < 1 || T * Wp < n || R < 1 || R > 15 || (si.len != 8 * n && si.len != 2 * n) ||
            x0.len != 8 * Wp || thr.len != ks.len || sf.len != ks.len || enc.len % 8 || nenc < 1 || nenc > INT32_MAX ||
            (interleaved ? (T - 1) * Wp >= n : (Wp - 1) * T >= n)) {
        PyErr_SetString(PyExc_ValueError, "encode: bad arguments");
        goto done;
    }
    x = malloc(4 * (size_t)Wp);
    enc16 = malloc(2 * (size_t)nenc);
    rows = malloc(sizeof *rows * (size_t)(nrows ? nrows : 1));
    runs = malloc(2 * (size_t)n + 8 * (size_t)T + 8);      /* fields are at most 16 bits */
    at = malloc(8 * (size_t)T);
    bits = malloc(8 * (size_t)T);
    if (!x || !enc16 || !rows || !runs || !at || !bits) {
        PyErr_NoMemory();
        goto done;
    }
    const int64_t *k64 = ks.buf, *t64 = thr.buf, *s64 = sf.buf, *e64 = enc.buf, *x64 = x0.buf;
    const char *err = NULL;
    for (int64_t j = 0; j < Wp && !err; j++) {
        if (x64[j] < L || x64[j] >= 2 * L)
            err = "encode: a state is out of range";
        x[j] = (uint32_t)x64[j];
    }
    for (int64_t p = 0; p < nenc && !err; p++) {
        if (e64[p] < L || e64[p] >= 2 * L)
            err = "encode: a slot is out of range";
        enc16[p] = (uint16_t)e64[p];
    }
    for (int64_t r = 0; r < nrows && !err; r++) {
        const int ok = row_ok(k64[r], t64[r], s64[r], L, nenc);
        /* a bad row keeps the steps in range (every state gives slot 0) until the error */
        rows[r] = ok ? (struct enc_row){(uint32_t)t64[r], (uint32_t)k64[r], (int32_t)s64[r], 0}
                     : (struct enc_row){0, (uint32_t)R + 1, 0, 1};
    }
    if (err) {
        PyErr_SetString(PyExc_ValueError, err);
        goto done;
    }
    Py_BEGIN_ALLOW_THREADS
    if (si.len == 8 * n)
        err = encode_steps(si.buf, 1, n, T, Wp, interleaved, rows, nrows, enc16, x, runs, at, bits);
    else
        err = encode_steps(si.buf, 0, n, T, Wp, interleaved, rows, nrows, enc16, x, runs, at, bits);
    Py_END_ALLOW_THREADS
    if (err) {
        PyErr_SetString(PyExc_ValueError, err);
        goto done;
    }
    int64_t total = R * Wp;
    for (int64_t t = 0; t < T; t++)
        total += bits[t];
    const int64_t nbytes = (total + 7) >> 3;
    out = malloc((size_t)nbytes + 16);
    if (!out) {
        PyErr_NoMemory();
        goto done;
    }
    Py_BEGIN_ALLOW_THREADS
    struct bitwriter w = {out, 0, 0, 0};
    for (int64_t j = 0; j < Wp; j++)
        put_bits(&w, (uint64_t)(x[j] - L), R);
    for (int64_t t = 0; t < T; t++)
        put_run(&w, runs + at[t], bits[t]);
    if (w.fill)
        out[w.pos++] = (uint8_t)w.acc;
    Py_END_ALLOW_THREADS
    result = PyBytes_FromStringAndSize((const char *)out, nbytes);
done:
    FREE_ALL(x, enc16, rows, runs, at, bits, out);
    return result;
}

/* encode_slots(packed, K, S, R, freqs, enc): the encoder slots from the decoder entries that
 * build (_tanstables.c) made: enc[k * L + start + rank] = L + the rank-th position (ascending)
 * holding symbol s in table k, start being the sum of k's frequencies below s. That is
 * tans.py's argsort of the spread, by counting instead of sorting, and without spreading again. */
PyObject *tans_encode_slots(PyObject *self, PyObject *args)
{
    TANS_BUFFER pb = {0}, fb = {0}, eb = {0};
    Py_ssize_t K, S, R;
    if (!PyArg_ParseTuple(args, "y*nnny*w*", &pb, &K, &S, &R, &fb, &eb))
        return NULL;
    PyObject *result = NULL;
    int64_t *cursor = NULL, *limit = NULL;
    const int64_t L = (int64_t)1 << (R < 1 || R > 15 ? 1 : R);
    if (R < 1 || R > 15 || K < 1 || S < 1 || pb.len < K * L * 8 || fb.len < K * S * 8 || eb.len < K * L * 8) {
        PyErr_SetString(PyExc_ValueError, "encode_slots: bad arguments");
        goto done;
    }
    cursor = malloc((size_t)S * sizeof *cursor);
    limit = malloc((size_t)S * sizeof *limit);
    if (!cursor || !limit) {
        PyErr_NoMemory();
        goto done;
    }
    const int64_t *restrict packed = pb.buf, *restrict f = fb.buf;
    int64_t *restrict enc = eb.buf;
    int bad = 0;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t k = 0; k < K && !bad; k++) {
        int64_t at = 0;
        for (Py_ssize_t s = 0; s < S; s++) {
            cursor[s] = at;
            at += f[k * S + s];
            limit[s] = at;
        }
        if (at != L) {
            bad = 1;
            break;
        }
        const int64_t *row = packed + k * L;
        int64_t *out = enc + k * L;
        for (int64_t p = 0; p < L; p++) {
            const int64_t s = row[p] >> 20;
            if (s < 0 || s >= S || cursor[s] >= limit[s]) {
                bad = 1;
                break;
            }
            out[cursor[s]++] = L + p;
        }
    }
    Py_END_ALLOW_THREADS
    if (bad) {
        PyErr_SetString(PyExc_ValueError, "encode_slots: the entries do not match the frequencies");
        goto done;
    }
    result = Py_NewRef(Py_None);
done:
    FREE_ALL(cursor, limit);
    return result;
}
