/*
 * hpccomm's node-local all-reduce through a shared segment
 * (hpccomm/transports/shm.py maps the segment and drives this engine).
 *
 * The tensor goes through in chunks; each rank's slot holds `buffers` of them,
 * so a rank may copy in the next chunks while the others still reduce or copy
 * out earlier ones, and a chunk stays small enough to live in cache between
 * one rank writing it and another reading it. Per chunk, every rank:
 *
 *   1. copies in: its elements, except its own part (1/n of the chunk), into
 *      its slot;                                               -> counter IN
 *   2. reduces its own part: its tensor's elements and every other rank's
 *      slot, into its slot and its tensor (each element has one owner, so all
 *      ranks get the same bits);                              -> counter REDUCED
 *   3. copies out every other rank's reduced part into its tensor. -> OUT
 *
 * Each step waits for every rank's counter of the step before (reduce waits for
 * IN, copy-out for REDUCED), and copying chunk g into a buffer waits until every
 * rank has copied out chunk g - buffers, which last used it. Counters count
 * chunks over the segment's life, published with release stores and read with
 * acquire loads, so whatever a rank wrote before publishing is visible to a
 * rank that sees the new count, on any CPU's memory model.
 *
 * Nothing here blocks for long: hpccomm_shm_allreduce_progress() returns after
 * a bounded number of fruitless polls, so Python can check timeouts, departed
 * peers and aborts between calls.
 */
#include <sched.h>
#include <string.h>

#include "shm_allreduce.h"

enum { IN = 0, REDUCED = 1, OUT = 2 };
/* Fruitless polls spent spinning before yielding the CPU: a peer on another
 * core answers within a few hundred ns, a peer sharing this core never will
 * until this rank lets it run. */
enum { SPINS_BEFORE_YIELD = 64 };

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ volatile("yield");
#endif
}

static int64_t *counter(const hpccomm_shm_allreduce *ar, int rank, int which) {
    return ar->counters + ((int64_t)rank * SHM_COUNTERS_PER_RANK + which) * SHM_COUNTER_STRIDE;
}

static void publish(const hpccomm_shm_allreduce *ar, int which, int64_t value) {
    __atomic_store_n(counter(ar, ar->rank, which), value, __ATOMIC_RELEASE);
}

/* Whether every rank's `which` counter has reached `target`. */
static int all_reached(const hpccomm_shm_allreduce *ar, int which, int64_t target) {
    for (int k = 0; k < ar->size; k++)
        if (__atomic_load_n(counter(ar, k, which), __ATOMIC_ACQUIRE) < target)
            return 0;
    return 1;
}

/* Rank `rank`'s buffer for the segment's chunk number `global`. */
static char *buffer(const hpccomm_shm_allreduce *ar, int rank, int64_t global) {
    return ar->slots + (size_t)rank * ar->slot_stride + (size_t)(global % ar->buffers) * ar->buffer_stride;
}

/* The elements of this all-reduce's chunk `c`: [*first, *first + *n). */
static void chunk_span(const hpccomm_shm_allreduce *ar, int64_t c, size_t *first, size_t *n) {
    size_t start = (size_t)c * ar->chunk_elems, end = start + ar->chunk_elems;
    *first = start;
    *n = (end < ar->count ? end : ar->count) - start;
}

/* Rank k's part of a chunk of n elements, in bytes: [*lo, *hi). */
static void part(const hpccomm_shm_allreduce *ar, size_t n, int k, size_t *lo, size_t *hi) {
    *lo = n * (size_t)k / (size_t)ar->size * ar->elem_size;
    *hi = n * (size_t)(k + 1) / (size_t)ar->size * ar->elem_size;
}

static int try_copy_in(hpccomm_shm_allreduce *ar) {
    int64_t c = ar->copied_in, global = ar->base + c;
    if (c == ar->chunks || !all_reached(ar, OUT, global - ar->buffers + 1))
        return 0;
    size_t first, n, lo, hi;
    chunk_span(ar, c, &first, &n);
    part(ar, n, ar->rank, &lo, &hi);
    const char *src = (char *)ar->data + first * ar->elem_size;
    char *dst = buffer(ar, ar->rank, global);
    /* Its own part this rank reads from its tensor when it reduces. */
    memcpy(dst, src, lo);
    memcpy(dst + hi, src + hi, n * ar->elem_size - hi);
    publish(ar, IN, global + 1);
    ar->copied_in++;
    return 1;
}

static int try_reduce(hpccomm_shm_allreduce *ar) {
    int64_t c = ar->reduced, global = ar->base + c;
    if (c == ar->copied_in || !all_reached(ar, IN, global + 1))
        return 0;
    size_t first, n, lo, hi;
    chunk_span(ar, c, &first, &n);
    part(ar, n, ar->rank, &lo, &hi);
    if (hi > lo) {
        char *mine = buffer(ar, ar->rank, global) + lo;
        char *tensor = (char *)ar->data + first * ar->elem_size + lo;
        size_t elems = (hi - lo) / ar->elem_size;
        const char *acc = tensor;
        for (int k = 0; k < ar->size; k++) {
            if (k == ar->rank)
                continue;
            if (ar->reduce(ar->dtype, ar->op, ar->path, buffer(ar, k, global) + lo, acc, mine, elems) != 0)
                return -1;
            acc = mine;
        }
        memcpy(tensor, mine, hi - lo);
    }
    publish(ar, REDUCED, global + 1);
    ar->reduced++;
    return 1;
}

static int try_copy_out(hpccomm_shm_allreduce *ar) {
    int64_t c = ar->copied_out, global = ar->base + c;
    if (c == ar->reduced || !all_reached(ar, REDUCED, global + 1))
        return 0;
    size_t first, n, lo, hi;
    chunk_span(ar, c, &first, &n);
    char *tensor = (char *)ar->data + first * ar->elem_size;
    for (int k = 0; k < ar->size; k++) {
        part(ar, n, k, &lo, &hi);
        if (k != ar->rank && hi > lo)
            memcpy(tensor + lo, buffer(ar, k, global) + lo, hi - lo);
    }
    publish(ar, OUT, global + 1);
    ar->copied_out++;
    return 1;
}

int hpccomm_shm_allreduce_progress(hpccomm_shm_allreduce *ar, int polls) {
    int idle = 0;
    while (ar->copied_out < ar->chunks) {
        /* Reduce first: the other ranks wait for it; copying out only this one does. */
        int reduced = try_reduce(ar);
        if (reduced < 0)
            return -1;
        int moved = reduced + try_copy_in(ar) + try_copy_out(ar);
        if (moved) {
            idle = 0;
            continue;
        }
        if (idle >= polls)
            return 0;
        if (idle++ < SPINS_BEFORE_YIELD)
            cpu_relax();
        else
            sched_yield();
    }
    return 1;
}

/* ---- reductions for the element types above -------------------------------------- */

/* NaN wins MIN/MAX (x + y is a NaN where either is); on a tie the accumulator
 * wins, as std::min/max(acc, in) in torch's kernels. */
#define FLOAT_MIN(a, b) (((a) != (a) || (b) != (b)) ? (a) + (b) : ((b) < (a) ? (b) : (a)))
#define FLOAT_MAX(a, b) (((a) != (a) || (b) != (b)) ? (a) + (b) : ((b) > (a) ? (b) : (a)))
#define INT_MIN_OF(a, b) ((b) < (a) ? (b) : (a))
#define INT_MAX_OF(a, b) ((b) > (a) ? (b) : (a))

#define REDUCE_LOOP(T, EXPR)                                                                             \
    do {                                                                                                 \
        const T *x = (const T *)acc, *y = (const T *)in;                                                 \
        T *z = (T *)out;                                                                                 \
        for (size_t i = 0; i < n; i++)                                                                   \
            z[i] = EXPR(x[i], y[i]);                                                                     \
    } while (0)

#define ADD(a, b) ((a) + (b))
#define MUL(a, b) ((a) * (b))

/* Integer types wrap on overflow, as torch's do: built with -fwrapv. */
#define REDUCE_ANY(T, MINF, MAXF)                                                                        \
    switch (op) {                                                                                        \
    case SHM_OP_SUM: REDUCE_LOOP(T, ADD); return 0;                                                      \
    case SHM_OP_PRODUCT: REDUCE_LOOP(T, MUL); return 0;                                                  \
    case SHM_OP_MIN: REDUCE_LOOP(T, MINF); return 0;                                                     \
    case SHM_OP_MAX: REDUCE_LOOP(T, MAXF); return 0;                                                     \
    default: return -1;                                                                                  \
    }

/* Complex numbers are summed component-wise; hpccomm takes no other op on them. */
#define REDUCE_COMPLEX(PART)                                                                             \
    if (op != SHM_OP_SUM)                                                                                \
        return -1;                                                                                       \
    n *= 2;                                                                                              \
    REDUCE_LOOP(PART, ADD);                                                                              \
    return 0;

int hpccomm_shm_reduce_into(int dtype, int op, int path, const void *in, const void *acc, void *out, size_t n) {
    (void)path;
    switch (dtype) {
    case SHM_F32: REDUCE_ANY(float, FLOAT_MIN, FLOAT_MAX)
    case SHM_F64: REDUCE_ANY(double, FLOAT_MIN, FLOAT_MAX)
    case SHM_I8: REDUCE_ANY(int8_t, INT_MIN_OF, INT_MAX_OF)
    case SHM_U8: REDUCE_ANY(uint8_t, INT_MIN_OF, INT_MAX_OF)
    case SHM_I16: REDUCE_ANY(int16_t, INT_MIN_OF, INT_MAX_OF)
    case SHM_I32: REDUCE_ANY(int32_t, INT_MIN_OF, INT_MAX_OF)
    case SHM_I64: REDUCE_ANY(int64_t, INT_MIN_OF, INT_MAX_OF)
    case SHM_C64: REDUCE_COMPLEX(float)
    case SHM_C128: REDUCE_COMPLEX(double)
    default: return -1;
    }
}
