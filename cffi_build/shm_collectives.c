/*
 * hpccomm's node-local collectives through a shared segment
 * (hpccomm/transports/shm.py maps the segment and drives this engine).
 *
 * One state machine runs every collective. The data goes through in chunks;
 * each rank's slot holds `buffers` of them, so a rank may copy in the next
 * chunks while the others still reduce or copy out earlier ones, and a chunk
 * stays small enough to live in cache between one rank writing it and another
 * reading it. Per chunk, every rank runs three phases, each ending with a
 * counter it publishes:
 *
 *   copy in   (waits until every rank has copied out the chunk that last used
 *              this buffer, chunk g - buffers)                     -> IN
 *   reduce    (waits for every rank's IN of this chunk)            -> REDUCED
 *   copy out  (waits for what the collective needs, below)         -> OUT
 *
 * What each phase does depends on the collective:
 *
 *   all-reduce   in: its elements except its own part (1/n of the chunk) into
 *                its slot; reduce: its own part, from its tensor and every
 *                other rank's slot, into its slot and its tensor (each element
 *                has one owner, so all ranks get the same bits); out (after
 *                every REDUCED): every other rank's reduced part.
 *   reduce       as all-reduce, but only the root writes its tensor and
 *                copies out; the others' tensors stay as they were.
 *   broadcast    in: the root copies the chunk into its slot; no reduce; out
 *                (after the root's IN): the others copy it into their tensors.
 *   all-gather   in: its own blocks' share of the chunk into its slot (and into
 *                its own output blocks); no reduce; out (after every IN): every
 *                other rank's blocks from their slots into its output.
 *   reduce-      in: every other rank's blocks' share into its slot; reduce:
 *   scatter      its own blocks, from its input and every other rank's slot,
 *                into its output; nothing to copy out.
 *
 * Counters count chunks over the segment's life, published with release stores
 * and read with acquire loads, so whatever a rank wrote before publishing is
 * visible to a rank that sees the new count, on any CPU's memory model.
 *
 * Nothing here blocks for long: hpccomm_shm_progress() returns after a bounded
 * number of fruitless polls, so Python can check timeouts, departed peers and
 * aborts between calls.
 */
#include <sched.h>
#include <string.h>
#if defined(__x86_64__)
#include <emmintrin.h>
#endif

#include "shm_collectives.h"

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

static int64_t *counter(const hpccomm_shm_op *op, int rank, int which) {
    return op->counters + ((int64_t)rank * SHM_COUNTERS_PER_RANK + which) * SHM_COUNTER_STRIDE;
}

static void publish(const hpccomm_shm_op *op, int which, int64_t value) {
    __atomic_store_n(counter(op, op->rank, which), value, __ATOMIC_RELEASE);
}

static int reached(const hpccomm_shm_op *op, int rank, int which, int64_t target) {
    return __atomic_load_n(counter(op, rank, which), __ATOMIC_ACQUIRE) >= target;
}

/* Whether every rank's `which` counter has reached `target`. */
static int all_reached(const hpccomm_shm_op *op, int which, int64_t target) {
    for (int k = 0; k < op->size; k++)
        if (!reached(op, k, which, target))
            return 0;
    return 1;
}

/* Rank `rank`'s buffer for the segment's chunk number `global`. */
static char *buffer(const hpccomm_shm_op *op, int rank, int64_t global) {
    return op->slots + (size_t)rank * op->slot_stride + (size_t)(global % op->buffers) * op->buffer_stride;
}

/* How many of `total` elements chunk `c` covers. */
static size_t chunk_length(const hpccomm_shm_op *op, size_t total, int64_t c) {
    size_t start = (size_t)c * op->chunk_elems;
    if (start >= total)
        return 0;
    return total - start < op->chunk_elems ? total - start : op->chunk_elems;
}

/* Copy n bytes of a result into the caller's memory. With op->stream (a
 * result too large for the last-level cache) the destination is written with
 * non-temporal stores: a plain store first reads each line of the destination
 * into the cache (a read of every byte written), and the result would evict
 * the segment's buffers, which the other ranks read next. Non-temporal stores
 * are not ordered by the release store that publishes a counter, hence the
 * fence. x86-64 only (SSE2, which every x86-64 CPU has); plain copies elsewhere. */
static void copy_result(const hpccomm_shm_op *op, void *dst, const void *src, size_t n) {
#if defined(__x86_64__)
    if (op->stream) {
        char *d = dst;
        const char *s = src;
        size_t head = (size_t)(-(uintptr_t)d & 15); /* to the first 16-byte boundary */
        if (head > n)
            head = n;
        memcpy(d, s, head);
        d += head, s += head, n -= head;
        size_t i = 0;
        for (; i + 64 <= n; i += 64) {
            __m128i a = _mm_loadu_si128((const __m128i *)(s + i));
            __m128i b = _mm_loadu_si128((const __m128i *)(s + i + 16));
            __m128i c = _mm_loadu_si128((const __m128i *)(s + i + 32));
            __m128i e = _mm_loadu_si128((const __m128i *)(s + i + 48));
            _mm_stream_si128((__m128i *)(d + i), a);
            _mm_stream_si128((__m128i *)(d + i + 16), b);
            _mm_stream_si128((__m128i *)(d + i + 32), c);
            _mm_stream_si128((__m128i *)(d + i + 48), e);
        }
        memcpy(d + i, s + i, n - i);
        _mm_sfence();
        return;
    }
#endif
    memcpy(dst, src, n);
}

/* ---- all-reduce and reduce: the chunk split into one part per rank --------------- */

/* Rank k's part of a chunk of n elements, in bytes: [*lo, *hi). */
static void part(const hpccomm_shm_op *op, size_t n, int k, size_t *lo, size_t *hi) {
    *lo = n * (size_t)k / (size_t)op->size * op->elem_size;
    *hi = n * (size_t)(k + 1) / (size_t)op->size * op->elem_size;
}

static char *tensor_chunk(const hpccomm_shm_op *op, int64_t c) {
    return (char *)op->data + (size_t)c * op->chunk_elems * op->elem_size;
}

static void copy_in_parts(const hpccomm_shm_op *op, int64_t c, int64_t global) {
    size_t n = chunk_length(op, op->count, c), lo, hi;
    part(op, n, op->rank, &lo, &hi);
    const char *src = tensor_chunk(op, c);
    char *dst = buffer(op, op->rank, global);
    /* Its own part this rank reads from its tensor when it reduces. */
    memcpy(dst, src, lo);
    memcpy(dst + hi, src + hi, n * op->elem_size - hi);
}

static int reduce_own_part(const hpccomm_shm_op *op, int64_t c, int64_t global) {
    size_t n = chunk_length(op, op->count, c), lo, hi;
    part(op, n, op->rank, &lo, &hi);
    if (hi == lo)
        return 0;
    char *mine = buffer(op, op->rank, global) + lo;
    char *tensor = tensor_chunk(op, c) + lo;
    size_t elems = (hi - lo) / op->elem_size;
    const char *acc = tensor;
    for (int k = 0; k < op->size; k++) {
        if (k == op->rank)
            continue;
        if (op->reduce(op->dtype, op->op, op->path, buffer(op, k, global) + lo, acc, mine, elems) != 0)
            return -1;
        acc = mine;
    }
    if (op->kind == SHM_ALLREDUCE || op->rank == op->root)
        copy_result(op, tensor, mine, hi - lo);
    return 0;
}

static void copy_out_parts(const hpccomm_shm_op *op, int64_t c, int64_t global) {
    size_t n = chunk_length(op, op->count, c), lo, hi;
    char *tensor = tensor_chunk(op, c);
    for (int k = 0; k < op->size; k++) {
        part(op, n, k, &lo, &hi);
        if (k != op->rank && hi > lo)
            copy_result(op, tensor + lo, buffer(op, k, global) + lo, hi - lo);
    }
}

/* ---- broadcast: the root's chunk through its slot ---------------------------------- */

static void copy_in_root(const hpccomm_shm_op *op, int64_t c, int64_t global) {
    if (op->rank == op->root)
        memcpy(buffer(op, op->rank, global), tensor_chunk(op, c), chunk_length(op, op->count, c) * op->elem_size);
}

static void copy_out_root(const hpccomm_shm_op *op, int64_t c, int64_t global) {
    if (op->rank != op->root)
        copy_result(op, tensor_chunk(op, c), buffer(op, op->root, global), chunk_length(op, op->count, c) * op->elem_size);
}

/* ---- all-gather and reduce-scatter: blocks per rank -------------------------------- */

static size_t block_count(const hpccomm_shm_op *op, int k, int b) {
    return op->block_count[k * op->blocks + b];
}

/* Rank k's block b, at chunk c. */
static char *block_chunk(const hpccomm_shm_op *op, int k, int b, int64_t c) {
    return (char *)op->block_addr[k * op->blocks + b] + (size_t)c * op->chunk_elems * op->elem_size;
}

/* This rank's block b in `data` (its blocks back to back), at chunk c. */
static char *data_chunk(const hpccomm_shm_op *op, int b, int64_t c) {
    size_t offset = 0;
    for (int i = 0; i < b; i++)
        offset += block_count(op, op->rank, i);
    return (char *)op->data + (offset + (size_t)c * op->chunk_elems) * op->elem_size;
}

/* Where block b of rank k's blocks sits in a slot's buffer: `per_rank` is 0 when a
 * slot carries only its owner's blocks (all-gather), 1 when it carries every rank's. */
static char *slot_block(const hpccomm_shm_op *op, int owner, int k, int b, int per_rank, int64_t global) {
    size_t index = (size_t)(per_rank ? k * op->blocks + b : b);
    return buffer(op, owner, global) + index * op->chunk_elems * op->elem_size;
}

static void copy_in_own_blocks(const hpccomm_shm_op *op, int64_t c, int64_t global) {
    for (int b = 0; b < op->blocks; b++) {
        size_t bytes = chunk_length(op, block_count(op, op->rank, b), c) * op->elem_size;
        if (bytes == 0)
            continue;
        char *out = block_chunk(op, op->rank, b, c);
        const char *src = op->data ? data_chunk(op, b, c) : out;
        memcpy(slot_block(op, op->rank, op->rank, b, 0, global), src, bytes);
        if (src != out)
            copy_result(op, out, src, bytes);
    }
}

static void copy_out_blocks(const hpccomm_shm_op *op, int64_t c, int64_t global) {
    for (int k = 0; k < op->size; k++) {
        if (k == op->rank)
            continue;
        for (int b = 0; b < op->blocks; b++) {
            size_t bytes = chunk_length(op, block_count(op, k, b), c) * op->elem_size;
            if (bytes)
                copy_result(op, block_chunk(op, k, b, c), slot_block(op, k, k, b, 0, global), bytes);
        }
    }
}

static void copy_in_others_blocks(const hpccomm_shm_op *op, int64_t c, int64_t global) {
    for (int k = 0; k < op->size; k++) {
        if (k == op->rank)
            continue;
        for (int b = 0; b < op->blocks; b++) {
            size_t bytes = chunk_length(op, block_count(op, k, b), c) * op->elem_size;
            if (bytes)
                memcpy(slot_block(op, op->rank, k, b, 1, global), block_chunk(op, k, b, c), bytes);
        }
    }
}

static int reduce_own_blocks(const hpccomm_shm_op *op, int64_t c, int64_t global) {
    for (int b = 0; b < op->blocks; b++) {
        size_t elems = chunk_length(op, block_count(op, op->rank, b), c);
        if (elems == 0)
            continue;
        const char *acc = block_chunk(op, op->rank, b, c);
        char *out = data_chunk(op, b, c);
        for (int k = 0; k < op->size; k++) {
            if (k == op->rank)
                continue;
            const char *in = slot_block(op, k, op->rank, b, 1, global);
            if (op->reduce(op->dtype, op->op, op->path, in, acc, out, elems) != 0)
                return -1;
            acc = out;
        }
    }
    return 0;
}

/* ---- the state machine ------------------------------------------------------------- */

static int has_reduce_phase(const hpccomm_shm_op *op) {
    return op->kind == SHM_ALLREDUCE || op->kind == SHM_REDUCE || op->kind == SHM_REDUCE_SCATTER;
}

/* Whether this rank may copy out chunk number `global`: what it reads is ready. */
static int may_copy_out(const hpccomm_shm_op *op, int64_t global) {
    switch (op->kind) {
    case SHM_ALLREDUCE: return all_reached(op, REDUCED, global + 1);
    case SHM_REDUCE: return op->rank != op->root || all_reached(op, REDUCED, global + 1);
    case SHM_BROADCAST: return op->rank == op->root || reached(op, op->root, IN, global + 1);
    case SHM_ALLGATHER: return all_reached(op, IN, global + 1);
    default: return 1; /* reduce-scatter: nothing to copy out */
    }
}

static int try_copy_in(hpccomm_shm_op *op) {
    int64_t c = op->copied_in, global = op->base + c;
    if (c == op->chunks || !all_reached(op, OUT, global - op->buffers + 1))
        return 0;
    switch (op->kind) {
    case SHM_ALLREDUCE:
    case SHM_REDUCE: copy_in_parts(op, c, global); break;
    case SHM_BROADCAST: copy_in_root(op, c, global); break;
    case SHM_ALLGATHER: copy_in_own_blocks(op, c, global); break;
    case SHM_REDUCE_SCATTER: copy_in_others_blocks(op, c, global); break;
    }
    publish(op, IN, global + 1);
    op->copied_in++;
    return 1;
}

static int try_reduce(hpccomm_shm_op *op) {
    int64_t c = op->reduced, global = op->base + c;
    if (c == op->copied_in)
        return 0;
    if (!has_reduce_phase(op)) {
        op->reduced = op->copied_in;
        return 1;
    }
    if (!all_reached(op, IN, global + 1))
        return 0;
    int failed = op->kind == SHM_REDUCE_SCATTER ? reduce_own_blocks(op, c, global) : reduce_own_part(op, c, global);
    if (failed)
        return -1;
    publish(op, REDUCED, global + 1);
    op->reduced++;
    return 1;
}

static int try_copy_out(hpccomm_shm_op *op) {
    int64_t c = op->copied_out, global = op->base + c;
    if (c == op->reduced || !may_copy_out(op, global))
        return 0;
    switch (op->kind) {
    case SHM_ALLREDUCE: copy_out_parts(op, c, global); break;
    case SHM_REDUCE:
        if (op->rank == op->root)
            copy_out_parts(op, c, global);
        break;
    case SHM_BROADCAST: copy_out_root(op, c, global); break;
    case SHM_ALLGATHER: copy_out_blocks(op, c, global); break;
    }
    publish(op, OUT, global + 1);
    op->copied_out++;
    return 1;
}

int hpccomm_shm_progress(hpccomm_shm_op *op, int polls) {
    int idle = 0;
    while (op->copied_out < op->chunks) {
        /* Reduce first: the other ranks wait for it; copying out only this one does. */
        int reduced = try_reduce(op);
        if (reduced < 0)
            return -1;
        int moved = reduced + try_copy_in(op) + try_copy_out(op);
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

#define BAND(a, b) ((a) & (b))
#define BOR(a, b) ((a) | (b))
#define BXOR(a, b) ((a) ^ (b))

/* The cases every real type has; MIN and MAX name the type's own minimum and maximum. */
#define REDUCE_ORDERED(T, MIN, MAX)                                                                      \
    case SHM_OP_SUM: REDUCE_LOOP(T, ADD); return 0;                                                      \
    case SHM_OP_PRODUCT: REDUCE_LOOP(T, MUL); return 0;                                                  \
    case SHM_OP_MIN: REDUCE_LOOP(T, MIN); return 0;                                                      \
    case SHM_OP_MAX: REDUCE_LOOP(T, MAX); return 0;

#define REDUCE_FLOAT(T)                                                                                  \
    switch (op) {                                                                                        \
    REDUCE_ORDERED(T, FLOAT_MIN, FLOAT_MAX)                                                              \
    default: return -1;                                                                                  \
    }

/* Integer types wrap on overflow, as torch's do: built with -fwrapv. */
#define REDUCE_INT(T)                                                                                    \
    switch (op) {                                                                                        \
    REDUCE_ORDERED(T, INT_MIN_OF, INT_MAX_OF)                                                            \
    case SHM_OP_BAND: REDUCE_LOOP(T, BAND); return 0;                                                    \
    case SHM_OP_BOR: REDUCE_LOOP(T, BOR); return 0;                                                      \
    case SHM_OP_BXOR: REDUCE_LOOP(T, BXOR); return 0;                                                    \
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
    case SHM_F32: REDUCE_FLOAT(float)
    case SHM_F64: REDUCE_FLOAT(double)
    case SHM_I8: REDUCE_INT(int8_t)
    case SHM_U8: REDUCE_INT(uint8_t)
    case SHM_I16: REDUCE_INT(int16_t)
    case SHM_I32: REDUCE_INT(int32_t)
    case SHM_I64: REDUCE_INT(int64_t)
    case SHM_C64: REDUCE_COMPLEX(float)
    case SHM_C128: REDUCE_COMPLEX(double)
    default: return -1;
    }
}
