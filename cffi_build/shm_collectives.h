/* hpccomm's node-local shared-memory collectives engine: the interface cffi binds. */
#ifndef HPCCOMM_SHM_COLLECTIVES_H
#define HPCCOMM_SHM_COLLECTIVES_H
#include <stddef.h>
#include <stdint.h>

/* Element types hpccomm_shm_reduce_into reduces (16-bit floats come from
 * hpccomm._half_reduce through the reducer pointer instead; bool travels as
 * SHM_U8 with MAX for "or" and MIN for "and"). */
enum {
    SHM_F32 = 0, SHM_F64 = 1, SHM_I8 = 2, SHM_U8 = 3, SHM_I16 = 4, SHM_I32 = 5, SHM_I64 = 6,
    SHM_C64 = 7, SHM_C128 = 8
};
/* Reductions, numbered as torch's SUM, PRODUCT, MIN, MAX (and HALF_OP_*), then
 * the bitwise ones (integers only). */
enum { SHM_OP_SUM = 0, SHM_OP_PRODUCT = 1, SHM_OP_MIN = 2, SHM_OP_MAX = 3, SHM_OP_BAND = 4, SHM_OP_BOR = 5,
       SHM_OP_BXOR = 6 };
/* The collectives (see the .c file for what each phase does in each). */
enum { SHM_ALLREDUCE = 0, SHM_REDUCE = 1, SHM_BROADCAST = 2, SHM_ALLGATHER = 3, SHM_REDUCE_SCATTER = 4 };
/* The counters each rank owns, one 64-byte line apiece (see the .c file). */
enum { SHM_COUNTERS_PER_RANK = 3, SHM_COUNTER_STRIDE = 8 };

/* out[i] = acc[i] (op) in[i] for n elements; acc may be out. Returns 0, or -1
 * for a dtype/op/path it cannot do. hpccomm_half_reduce_into has this type. */
typedef int (*hpccomm_shm_reducer)(int dtype, int op, int path, const void *in, const void *acc, void *out,
                                   size_t n);

/* One collective in flight on a shared segment. The caller fills every field
 * above `copied_in` and zeroes the three cursors.
 *
 * all-reduce, reduce, broadcast: `data` is the tensor (`count` elements),
 * which the collective changes in place.
 * all-gather and reduce-scatter move `blocks` blocks per rank: block b of
 * rank k is block_addr[k * blocks + b] (block_count[...] elements), a block of
 * the output that rank k's data fills (all-gather) or of the input that rank k
 * reduces (reduce-scatter). `data` is this rank's contiguous run of its own
 * blocks: the source of an all-gather (0: the blocks are in the output
 * already), the output of a reduce-scatter. */
typedef struct {
    int64_t *counters;        /* SHM_COUNTERS_PER_RANK lines per rank, rank-major */
    char *slots;              /* rank k's slot starts at slots + k * slot_stride */
    size_t slot_stride;       /* bytes from one rank's slot to the next */
    size_t buffer_stride;     /* bytes from one chunk buffer to the next in a slot */
    int size;                 /* ranks on the segment */
    int rank;                 /* this one */
    int buffers;              /* chunks a slot holds: how far ranks may run ahead */
    size_t elem_size;         /* bytes per element */
    hpccomm_shm_reducer reduce;
    int dtype, op, path;      /* passed through to `reduce` */
    int kind;                 /* SHM_ALLREDUCE ... SHM_REDUCE_SCATTER */
    int root;                 /* reduce, broadcast: the rank that ends with the result / has the data */
    int stream;               /* write results into the caller's memory with non-temporal stores (x86-64) */
    uintptr_t data;           /* see above */
    size_t count;             /* all-reduce, reduce, broadcast: elements of `data` */
    const uintptr_t *block_addr; /* all-gather, reduce-scatter: size * blocks addresses */
    const size_t *block_count;   /* ... and their element counts */
    int blocks;               /* blocks per rank */
    size_t chunk_elems;       /* elements per chunk (of the tensor, or of every block) */
    int64_t base;             /* chunks the segment carried before this collective */
    int64_t chunks;           /* chunks this one takes */
    int64_t copied_in, reduced, copied_out; /* this rank's progress, in chunks */
} hpccomm_shm_op;

/* Advance `op` as far as the other ranks allow. When no step is possible it
 * polls again, up to `polls` times (yielding the CPU in between), then gives
 * up. Returns 1 once every chunk is done here, 0 while waiting for another
 * rank, -1 if `reduce` failed (the data is then undefined). */
int hpccomm_shm_progress(hpccomm_shm_op *op, int polls);

/* The reducer for the SHM_* element types; `path` is ignored. NaN propagates
 * through MIN and MAX (as torch.minimum/maximum); integers wrap. */
int hpccomm_shm_reduce_into(int dtype, int op, int path, const void *in, const void *acc, void *out, size_t n);

#endif
