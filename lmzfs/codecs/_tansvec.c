/* The tANS step loop of _tansloop.c, 16 lanes at a time with AVX-512.
 *
 * Why: floatsplit's chunks are decoded by up to 16384 lanes over 32 steps, so a step is thousands
 * of independent lanes. Only the stream position is shared: lanes read their bits in lane order,
 * so a vector of lanes takes its bit offsets from a prefix sum of the lanes' bit counts, finds
 * its bits in one 64-byte load from the position's byte (at most 15 bits a lane and 16 lanes:
 * two permuted dwords a lane), and moves the position on by the sum. The rest is per lane, as in
 * the scalar loop: the table entry (gathered), the next state, the next context and the symbol's
 * value (one gather from a per-symbol table holding both), or the per-symbol contexts of
 * interleaved lanes (loaded). Measured on Zen 4 (1 MiB bfloat16 chunks of astra): the steps take
 * 0.84 ms instead of 1.1 ms; an AVX2 version of the same loop was no faster than the scalar one
 * there, gathers being no cheaper than the loads they replace, so there is none.
 *
 * It computes exactly what the scalar loop computes, in the same order of lanes, and stops where
 * the 64-byte window could pass the stream's end (the last few hundred bits), leaving the rest
 * to the scalar loop, which reads zeros past the end and reports a stream that runs past it.
 * The indices it gathers with are those the scalar loop uses, checked by prepare() before any step.
 *
 * Chosen once at import by the CPU (LMZFS_TANS_VECTOR=off turns it off); vector_isa(name)
 * changes it, so that the tests run both loops on the same streams.
 */
#include "_tansloop.h"
#include <stdlib.h>
#include <string.h>
#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define HAVE_X86_VECTOR 1
#endif

enum { ISA_OFF, ISA_AVX512 };
static const char *const ISA_NAMES[] = {"off", "avx512"};
static int isa_chosen = -1;         /* -1: not chosen yet */

/* What one vector step needs beyond the job: widened per-symbol tables and the mode. */
struct vec {
    /* per symbol: the value stored (16 bits) | its next context (dyn mode) << 16; NULL where
     * that is the symbol itself. One gather serves both. */
    const uint32_t *sv;
    int mode;                 /* as run_steps: 0 none, 1 ctx int64, 2 dyn, 3 ctx uint8 */
    int out8;
    unsigned lshift;          /* log2 L */
    int64_t vsafe;            /* while pos <= vsafe, the 64-byte window stays in the stream */
};

#ifdef HAVE_X86_VECTOR
__attribute__((target("avx512f,avx512bw,avx512vl,avx512dq")))
static const char *steps_avx512(struct job *jb, const struct vec *vc)
{
    const uint32_t *restrict tab = jb->tab;
    uint32_t *restrict st = jb->st;
    const uint8_t *s = jb->s;
    const int mode = vc->mode;
    const uint64_t nbits = (uint64_t)jb->slen * 8;
    const __m512i zero = _mm512_setzero_si512(), c15 = _mm512_set1_epi32(15), c31 = _mm512_set1_epi32(31),
                  c32 = _mm512_set1_epi32(32), low16 = _mm512_set1_epi32(0xFFFF),
                  low = _mm512_set1_epi32(0x7FFF), one = _mm512_set1_epi32(1);
    const __m128i lsh = _mm_cvtsi32_si128((int)vc->lshift);
    uint64_t pos = jb->pos;
    for (int64_t t = jb->t0; t < jb->T; t++) {
        const int64_t a = tans_active_lanes(jb, jb->interleaved, t);
        /* per-symbol contexts only reach here with interleaved lanes */
        const int64_t jn = mode == 1 || mode == 3 ? tans_continuing_lanes(jb, 1, t, a) : 0;
        uint16_t *o16 = vc->out8 ? NULL : jb->sym + t * jb->SW;
        uint8_t *o8 = vc->out8 ? jb->sym8 + t * jb->SW : NULL;
        for (int64_t j = 0; j < a; j += 16) {
            if ((int64_t)pos > vc->vsafe) {
                jb->t0 = t, jb->j0 = j, jb->pos = pos;
                return NULL;
            }
            const __mmask16 m = a - j >= 16 ? 0xFFFF : (__mmask16)((1u << (a - j)) - 1);
            const __m512i e = m == 0xFFFF ? _mm512_i32gather_epi32(_mm512_loadu_si512(st + j), tab, 4)
                                          : _mm512_mask_i32gather_epi32(zero, m, _mm512_maskz_loadu_epi32(m, st + j), tab, 4);
            const __m512i nb = _mm512_and_si512(_mm512_srli_epi32(e, 15), c15);
            __m512i p = _mm512_add_epi32(nb, _mm512_alignr_epi32(nb, zero, 15));    /* inclusive prefix sum */
            p = _mm512_add_epi32(p, _mm512_alignr_epi32(p, zero, 14));
            p = _mm512_add_epi32(p, _mm512_alignr_epi32(p, zero, 12));
            p = _mm512_add_epi32(p, _mm512_alignr_epi32(p, zero, 8));
            /* the lanes' bits lie within 64 bytes from pos's byte: each lane's two dwords, shifted */
            const __m512i win = _mm512_loadu_si512(s + (pos >> 3));
            const __m512i off = _mm512_add_epi32(_mm512_set1_epi32((int)(pos & 7)), _mm512_sub_epi32(p, nb));
            const __m512i dw = _mm512_srli_epi32(off, 5), sh = _mm512_and_si512(off, c31);
            const __m512i w = _mm512_or_si512(
                _mm512_srlv_epi32(_mm512_permutexvar_epi32(dw, win), sh),
                _mm512_sllv_epi32(_mm512_permutexvar_epi32(_mm512_add_epi32(dw, one), win), _mm512_sub_epi32(c32, sh)));
            const __m512i bits = _mm512_and_si512(w, _mm512_sub_epi32(_mm512_sllv_epi32(one, nb), one));
            __m512i v = _mm512_add_epi32(bits, _mm512_and_si512(e, low));
            const __m512i sym = _mm512_srli_epi32(e, SYM_SHIFT);
            __m512i val = vc->sv ? _mm512_mask_i32gather_epi32(zero, m, sym, vc->sv, 4) : sym;
            if (mode == 2) {
                v = _mm512_add_epi32(v, _mm512_sll_epi32(_mm512_srli_epi32(val, 16), lsh));
                val = _mm512_and_si512(val, low16);
            } else if ((mode == 1 || mode == 3) && j < jn) {
                const __mmask16 mc = m & (jn - j >= 16 ? 0xFFFF : (__mmask16)((1u << (jn - j)) - 1));
                __m512i c;
                if (mode == 3) {
                    c = _mm512_cvtepu8_epi32(_mm_maskz_loadu_epi8(mc, jb->ctx8 + (t + 1) * jb->Wp + j));
                } else {
                    const int64_t *cn = jb->ctx + (t + 1) * jb->Wp + j;
                    const __m256i lo = _mm512_cvtepi64_epi32(_mm512_maskz_loadu_epi64((__mmask8)mc, cn)),
                                  hi = _mm512_cvtepi64_epi32(_mm512_maskz_loadu_epi64((__mmask8)(mc >> 8), cn + 8));
                    c = _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
                }
                v = _mm512_add_epi32(v, _mm512_sll_epi32(c, lsh));
            }
            _mm512_mask_storeu_epi32(st + j, m, v);
            /* narrowed in registers: vpmovdw/vpmovdb with a memory operand are microcoded on Zen 4 */
            if (vc->out8)
                _mm_mask_storeu_epi8(o8 + j, m, _mm512_cvtepi32_epi8(val));
            else
                _mm256_mask_storeu_epi16(o16 + j, m, _mm512_cvtepi32_epi16(val));
            pos += (uint32_t)_mm_extract_epi32(_mm512_extracti32x4_epi32(p, 3), 3);
        }
        if (pos > nbits)
            return "tans: stream runs past its end";
    }
    jb->t0 = jb->T, jb->j0 = 0, jb->pos = pos;
    return NULL;
}

#endif

static int supported(int isa)
{
#ifdef HAVE_X86_VECTOR
    __builtin_cpu_init();
    if (isa == ISA_AVX512)
        return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
               __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
#endif
    return isa == ISA_OFF;
}

static int best(void)
{
    return supported(ISA_AVX512) ? ISA_AVX512 : ISA_OFF;
}

static int choose(void)
{
    const char *want = getenv("LMZFS_TANS_VECTOR");
    return want && !strcmp(want, "off") ? ISA_OFF : best();
}

const char *tans_steps_vector(struct job *jb)
{
    if (isa_chosen < 0)
        isa_chosen = choose();
    const int mode = jb->ctx ? 1 : jb->nxo ? 2 : jb->ctx8 ? 3 : 0;
    const uint64_t L = (uint64_t)jb->L;
    /* contiguous lanes take per-symbol contexts strided: left to the scalar loop */
    if (isa_chosen == ISA_OFF || (L & (L - 1)) || ((mode == 1 || mode == 3) && !jb->interleaved) ||
        jb->slen < 128)
        return NULL;
    struct vec vc = {.mode = mode, .out8 = jb->sym8 != NULL, .lshift = (unsigned)__builtin_ctzll(L),
                     .vsafe = ((int64_t)jb->slen - 64) * 8};
    uint32_t *sv = PyMem_RawMalloc((size_t)jb->nsym * sizeof *sv);
    if (!sv)
        return NULL;        /* the scalar loop needs no memory */
    int identity = mode != 2;
    for (int64_t q = 0; q < jb->nsym; q++) {
        sv[q] = vc.out8 ? jb->map8[q] : jb->map[q];
        identity &= sv[q] == (uint32_t)q;
        if (mode == 2) {
            /* prepare() checked nxo[q] + L <= ntab <= 2**24; tans.py makes them multiples of L */
            const uint64_t c = (uint64_t)jb->nxo[q] >> vc.lshift;
            if (c << vc.lshift != (uint64_t)jb->nxo[q] || c > 0xFFFF) {
                PyMem_RawFree(sv);
                return NULL;
            }
            sv[q] |= (uint32_t)c << 16;
        }
    }
    vc.sv = identity ? NULL : sv;
    const char *err = NULL;
#ifdef HAVE_X86_VECTOR
    err = steps_avx512(jb, &vc);
#endif
    PyMem_RawFree(sv);
    return err;
}

/* vector_isa() -> the name of the loop in use ("avx512" or "off"); vector_isa(name) switches to
 * "off", "avx512" or "auto" (the best this CPU has) and returns the name; ValueError if the CPU
 * lacks it. Not for use while another thread decodes. */
PyObject *tans_vector_isa(PyObject *self, PyObject *args)
{
    const char *want = NULL;
    if (!PyArg_ParseTuple(args, "|s", &want))
        return NULL;
    if (isa_chosen < 0)
        isa_chosen = choose();
    if (want) {
        int isa = !strcmp(want, "auto") ? best() : -1;
        for (int k = ISA_OFF; k <= ISA_AVX512; k++)
            if (!strcmp(want, ISA_NAMES[k]))
                isa = k;
        if (isa < 0 || !supported(isa)) {
            PyErr_Format(PyExc_ValueError, "vector_isa: %s is not available on this CPU", want);
            return NULL;
        }
        isa_chosen = isa;
    }
    return PyUnicode_FromString(ISA_NAMES[isa_chosen]);
}
