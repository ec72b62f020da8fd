/* The entropy codec's column-class search (entropy._column_classes), compiled: the numpy code in
 * entropy.py makes the same choices and stays the reference the tests compare against (and the
 * path where this extension is not built).
 *
 * Why C: the search is a few dozen small numpy steps per class count (quantiles, class sums as
 * matrix products, logarithms, a product of every column's histogram with every class's costs,
 * argmax), each holding Python's lock; here it is one call that releases it, and it visits only
 * the symbols a column has (int8 columns use a few dozen of the 256 values), where the matrix
 * products go over all 256.
 *
 * Why it gives the same answer as numpy: every quantity that decides something is computed
 * exactly or by the same sequence of IEEE operations.
 *   - Column histograms, class counts and the spreads' sums are integers.
 *   - A spread is its integer sum over the rows divided by rows (numpy's mean); the class edges
 *     are numpy's "linear" quantiles of the sorted spreads, interpolated as numpy's _lerp does.
 *   - Logarithms come from log2_fixed below, which the reference evaluates with the same
 *     operations in the same order (no libm or numpy log2: those differ in the last bit); this
 *     file is built with -ffp-contract=off so that no multiply and add fuse into one rounding.
 *   - Those logarithms are rounded to integers in units of 2**-F (column scores) or 2**-G (code
 *     lengths), F and G chosen by the caller (entropy._score_bits, _cost_bits) so that every
 *     product and partial sum stays an integer below 2**53 (scores, doubles) or 2**63 (code
 *     lengths, int64): the sums are then exact in any order, so numpy's BLAS and this loop agree.
 *
 * column_classes(a, n, C, F, G, series, rounds, table_bytes, cls) -> K
 *   a: n bytes, rows of C (the last row may be short); C >= 8 and n // C >= 32. series: the
 *   float64 coefficients of log2_fixed's series. rounds: the refinement rounds of each class
 *   count; table_bytes: the estimated bytes of a class's table (entropy._ROUNDS, _TABLE_BYTES,
 *   passed so that the two searches cannot drift apart). cls: int64[C], each column's class when
 *   K > 0.
 *   K: the number of classes (2, 4, 8 or 16) whose estimated size is the smallest and beats one
 *   table for all columns, or 0 when none does (cls then unspecified).
 */
#include "_tansloop.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define SQRT_HALF 0.70710678118654752440

/* rint(log2(x) * scale) for x > 0 and scale a power of two (so that the product is exact):
 * x = m * 2**e with m in [sqrt(1/2), sqrt(2)), and log2(m) = s * sum_k series[k] * z**k with
 * s = (m - 1) / (m + 1) = f / (2 + f), z = s * s (Horner, highest coefficient first).
 * entropy._log2_fixed is the same, operation for operation. */
static double log2_fixed(double x, double scale, const double *series, int64_t nseries)
{
    int e;
    double m = frexp(x, &e);
    if (m < SQRT_HALF) {
        m = m * 2.0;
        e -= 1;
    }
    const double f = m - 1.0;
    const double s = f / (2.0 + f);
    const double z = s * s;
    double p = series[nseries - 1];
    for (int64_t k = nseries - 2; k >= 0; k--)
        p = p * z + series[k];
    const double r = s * p;
    return rint(((double)e + r) * scale);
}

/* The columns' histograms as their nonzero entries: column j's symbols sym[start[j]..start[j + 1])
 * with counts h (doubles, as the scores take them). A column has a few dozen of the 256 values
 * where int8 weights have a narrow spread, and every pass below visits only those. */
struct columns {
    int64_t C;
    int64_t *start;
    uint8_t *sym;
    double *h;
};

/* sum over rows k < K with a nonzero total of -counts[k][s] * log2_fixed(counts[k][s] / total, G):
 * the order-0 code length of each row in units of 2**-G bits, Gscale = 2**G (entropy._code_length). */
static int64_t code_length(const int64_t *counts, int64_t K, double Gscale, const double *series, int64_t ns)
{
    int64_t sum = 0;
    for (int64_t k = 0; k < K; k++) {
        const int64_t *c = counts + k * 256;
        int64_t tot = 0;
        for (int s = 0; s < 256; s++)
            tot += c[s];
        for (int s = 0; s < 256; s++)
            if (c[s] > 0)
                sum += c[s] * (int64_t)log2_fixed((double)c[s] / (double)tot, Gscale, series, ns);
    }
    return -sum;
}

static void add_column(const struct columns *col, int64_t j, int64_t *row, int64_t sign)
{
    for (int64_t q = col->start[j]; q < col->start[j + 1]; q++)
        row[col->sym[q]] += sign * (int64_t)col->h[q];
}

/* two doubles, read from the aligned costs w (may_alias: w is written as doubles) */
typedef double vd2 __attribute__((vector_size(16), may_alias));

/* The class whose costs w (256 rows of K, each 16-byte aligned) give column j the largest score, the
 * first on a tie (numpy's argmax). The sums are exact (see the top), so their order and the
 * vector width do not matter. */
static inline __attribute__((always_inline)) int64_t best_class(const struct columns *col, int64_t j,
                                                                const double *restrict w, const int K)
{
    vd2 v[8] = {{0}};
    for (int64_t q = col->start[j]; q < col->start[j + 1]; q++) {
        const vd2 *ws = (const vd2 *)(w + (int64_t)col->sym[q] * K);
        const vd2 hq = {col->h[q], col->h[q]};
        for (int i = 0; i < K / 2; i++)
            v[i] += hq * ws[i];
    }
    double acc[16];
    memcpy(acc, v, (size_t)K * sizeof(double));
    int best = 0;
    for (int k = 1; k < K; k++)
        if (acc[k] > acc[best])
            best = k;
    return best;
}

/* Moves every column to its best class under w, keeping the class counts (K x 256) current;
 * returns whether any moved. Specialised per K so that the K sums stay in registers. */
static inline __attribute__((always_inline)) int assign_classes_any(const struct columns *col, const double *w,
                                                                    int64_t K, int64_t *cls, int64_t *counts)
{
    int moved = 0;
    for (int64_t j = 0; j < col->C; j++) {
        int64_t b;
        switch (K) {
        case 2: b = best_class(col, j, w, 2); break;
        case 4: b = best_class(col, j, w, 4); break;
        case 8: b = best_class(col, j, w, 8); break;
        default: b = best_class(col, j, w, 16); break;
        }
        if (b != cls[j]) {
            add_column(col, j, counts + cls[j] * 256, -1);
            add_column(col, j, counts + b * 256, 1);
            cls[j] = b;
            moved = 1;
        }
    }
    return moved;
}

static int assign_classes(const struct columns *col, const double *w, int64_t K, int64_t *cls, int64_t *counts)
{
    return assign_classes_any(col, w, K, cls, counts);
}

/* The same, built for AVX2 where the CPU has it (chosen by column_classes): the sums of K classes
 * take half the vector operations. They are the same integers, being exact. */
#if defined(__x86_64__) && defined(__GNUC__)
#define HAVE_AVX2_CLASSES 1
__attribute__((target("avx2"))) static int assign_classes_avx2(const struct columns *col, const double *w,
                                                               int64_t K, int64_t *cls, int64_t *counts)
{
    return assign_classes_any(col, w, K, cls, counts);
}
#endif

static int cmp_double(const void *x, const void *y)
{
    const double a = *(const double *)x, b = *(const double *)y;
    return (a > b) - (a < b);
}

/* numpy's quantile(sorted, i / K) ("linear"), for 0 < i < K and C > 1 values: the virtual index
 * (C - 1) * q is below C - 1, so both neighbours exist. */
static double quantile(const double *sorted, int64_t C, int64_t i, int64_t K)
{
    const double q = (double)i / (double)K;
    const double v = (double)(C - 1) * q;
    const double lo = floor(v);
    const double g = v - lo;
    const double a = sorted[(int64_t)lo], b = sorted[(int64_t)lo + 1];
    const double d = b - a;
    return g >= 0.5 ? b - d * (1.0 - g) : a + d * g;
}

/* Columns counted a block at a time: the block's histograms stay in the nearest cache while the
 * rows stream past, where a whole chunk's (C x 256) would not. */
#define BLOCK_COLUMNS 16

/* The nonzero entries of every column's histogram over all of a (the short last row included),
 * and the histogram of a's bytes; false when out of memory. */
static int count_columns(const uint8_t *a, int64_t n, int64_t C, struct columns *col, int64_t *total)
{
    const int64_t rows = n / C, body = rows * C, bound = (n < C * 256 ? n : C * 256) + 1;
    uint32_t *tab = calloc(BLOCK_COLUMNS * 256, sizeof(uint32_t));
    col->start = malloc((size_t)(C + 1) * sizeof(int64_t));
    col->sym = malloc((size_t)bound);
    col->h = malloc((size_t)bound * sizeof(double));
    if (!tab || !col->start || !col->sym || !col->h) {
        free(tab);
        return 0;
    }
    int64_t nnz = 0;
    for (int64_t j0 = 0; j0 < C; j0 += BLOCK_COLUMNS) {
        const int64_t B = C - j0 < BLOCK_COLUMNS ? C - j0 : BLOCK_COLUMNS;
        if (B == BLOCK_COLUMNS)
            for (int64_t i = j0; i < body; i += C) {
#pragma GCC unroll 16
                for (int j = 0; j < BLOCK_COLUMNS; j++)
                    tab[j * 256 + a[i + j]]++;
            }
        else
            for (int64_t i = j0; i < body; i += C)
                for (int64_t j = 0; j < B; j++)
                    tab[j * 256 + a[i + j]]++;
        for (int64_t j = j0; j < j0 + B && body + j < n; j++)
            tab[(j - j0) * 256 + a[body + j]]++;
        for (int64_t j = 0; j < B; j++) {
            uint32_t *h = tab + j * 256;
            col->start[j0 + j] = nnz;
            for (int s = 0; s < 256; s++) {     /* written always, kept where nonzero: no branch */
                const uint32_t v = h[s];
                total[s] += v;
                col->sym[nnz] = (uint8_t)s;
                col->h[nnz] = (double)v;
                nnz += v != 0;
                h[s] = 0;
            }
        }
    }
    col->start[C] = nnz;
    free(tab);
    return 1;
}

struct search {
    const uint8_t *a;
    int64_t n, C;
    int F, G;
    const double *series;
    int64_t ns, rounds, table_bytes;
    int64_t *out;
    int avx2;
};

/* Returns K, or 0 when no class count pays, or -1 when out of memory. */
static int64_t search_classes(const struct search *sp)
{
    const uint8_t *a = sp->a;
    const int64_t n = sp->n, C = sp->C, rows = n / C, body = rows * C;
    const double *series = sp->series;
    const int64_t ns = sp->ns;
    const double Fscale = ldexp(1.0, sp->F), Gscale = ldexp(1.0, sp->G);
    int64_t K_best = -1;
    int64_t total[256] = {0};
    struct columns col = {.C = C};
    double *spread = malloc((size_t)C * 2 * sizeof(double));
    int64_t *cls = malloc((size_t)C * sizeof(int64_t));
    int64_t *counts = malloc(16 * 256 * sizeof(int64_t));
    double *w = aligned_alloc(64, 16 * 256 * sizeof(double));
    if (!spread || !cls || !counts || !w || !count_columns(a, n, C, &col, total))
        goto done;
    double *sorted = spread + C;

    /* the mode over every byte (numpy's argmax: the first); each column's spread, the mean
     * distance, as int8, of its bytes from the mode over the whole rows (the short row's byte
     * taken out again) */
    int mode = 0;
    for (int s = 1; s < 256; s++)
        if (total[s] > total[mode])
            mode = s;
    int64_t dist[256];
    for (int s = 0; s < 256; s++)
        dist[s] = llabs((int64_t)(((s - mode + 128) & 255) - 128));
    for (int64_t j = 0; j < C; j++) {
        int64_t sum = body + j < n ? -dist[a[body + j]] : 0;
        for (int64_t q = col.start[j]; q < col.start[j + 1]; q++)
            sum += (int64_t)col.h[q] * dist[col.sym[q]];
        spread[j] = (double)sum / (double)rows;
    }

    memcpy(sorted, spread, (size_t)C * sizeof(double));
    qsort(sorted, (size_t)C, sizeof(double), cmp_double);
    const int64_t base = code_length(total, 1, Gscale, series, ns) + (sp->table_bytes * 8 << sp->G);
    int64_t best_cost = 0;
    K_best = 0;
    for (int64_t K = 2, logK = 1; K <= 16; K *= 2, logK++) {
        /* the first classes: how many of the K - 1 quantile edges are <= the spread (numpy's
         * searchsorted, side "right", on edges that interpolation keeps ascending) */
        double edges[15];
        for (int64_t i = 1; i < K; i++)
            edges[i - 1] = quantile(sorted, C, i, K);
        memset(counts, 0, (size_t)K * 256 * sizeof(int64_t));
        for (int64_t j = 0; j < C; j++) {
            int64_t c = 0;
            for (int64_t i = 0; i < K - 1; i++)
                c += edges[i] <= spread[j];
            cls[j] = c;
            add_column(&col, j, counts + c * 256, 1);
        }
        /* refine: move each column to the class that codes it shortest, until none moves */
        for (int64_t round = 0; round < sp->rounds; round++) {
            for (int64_t k = 0; k < K; k++) {
                const int64_t *c = counts + k * 256;
                double tot = 0;
                for (int s = 0; s < 256; s++)
                    tot += (double)c[s];
                tot += 128.0;       /* the 256 halves, exact: every partial sum is a multiple of 1/2 */
                for (int s = 0; s < 256; s++)
                    w[s * K + k] = log2_fixed(((double)c[s] + 0.5) / tot, Fscale, series, ns);
            }
#ifdef HAVE_AVX2_CLASSES
            if (!(sp->avx2 ? assign_classes_avx2 : assign_classes)(&col, w, K, cls, counts))
                break;
#else
            if (!assign_classes(&col, w, K, cls, counts))
                break;
#endif
        }
        const int64_t cost = code_length(counts, K, Gscale, series, ns) +
                             ((sp->table_bytes * 8 * K + C * logK) << sp->G);
        if (cost < base && (K_best == 0 || cost < best_cost)) {
            best_cost = cost;
            K_best = K;
            memcpy(sp->out, cls, (size_t)C * sizeof(int64_t));
        }
    }
done:
    FREE_ALL(spread, cls, counts, w, col.start, col.sym, col.h);
    return K_best;
}

PyObject *tans_column_classes(PyObject *self, PyObject *args)
{
    TANS_BUFFER ab = {0}, sb = {0}, cb = {0};
    Py_ssize_t n, C, F, G, rounds, table_bytes;
    if (!PyArg_ParseTuple(args, "y*nnnny*nnw*", &ab, &n, &C, &F, &G, &sb, &rounds, &table_bytes, &cb))
        return NULL;
    if (C < 8 || n < 0 || n / C < 32 || n / C >= UINT32_MAX || ab.len < n || F < 0 || F > 52 || G < 0 ||
        G > 62 || sb.len < 8 || sb.len % 8 || rounds < 0 || table_bytes < 0 || table_bytes > 4096 ||
        cb.len < C * 8)
        return tans_bad_arguments("column_classes");
    struct search sp = {.a = ab.buf, .n = n, .C = C, .F = (int)F, .G = (int)G, .series = sb.buf,
                        .ns = sb.len / 8, .rounds = rounds, .table_bytes = table_bytes, .out = cb.buf};
#ifdef HAVE_AVX2_CLASSES
    static int avx2 = -1;       /* asked once, with the lock held */
    if (avx2 < 0) {
        __builtin_cpu_init();
        avx2 = __builtin_cpu_supports("avx2") != 0;
    }
    sp.avx2 = avx2;
#endif
    int64_t K;
    Py_BEGIN_ALLOW_THREADS
    K = search_classes(&sp);
    Py_END_ALLOW_THREADS
    if (K < 0) {
        PyErr_NoMemory();
        return NULL;
    }
    return PyLong_FromLongLong(K);
}
