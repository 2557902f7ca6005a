/* hpccomm's node-local shared-memory all-reduce engine: the interface cffi binds. */
#ifndef HPCCOMM_SHM_ALLREDUCE_H
#define HPCCOMM_SHM_ALLREDUCE_H
#include <stddef.h>
#include <stdint.h>

/* Element types hpccomm_shm_reduce_into reduces (16-bit floats come from
 * hpccomm._half_reduce through the reducer pointer instead). */
enum {
    SHM_F32 = 0, SHM_F64 = 1, SHM_I8 = 2, SHM_U8 = 3, SHM_I16 = 4, SHM_I32 = 5, SHM_I64 = 6,
    SHM_C64 = 7, SHM_C128 = 8
};
/* Reductions, numbered as torch's SUM, PRODUCT, MIN, MAX (and HALF_OP_*). */
enum { SHM_OP_SUM = 0, SHM_OP_PRODUCT = 1, SHM_OP_MIN = 2, SHM_OP_MAX = 3 };
/* The counters each rank owns, one 64-byte line apiece (see the .c file). */
enum { SHM_COUNTERS_PER_RANK = 3, SHM_COUNTER_STRIDE = 8 };

/* out[i] = acc[i] (op) in[i] for n elements; acc may be out. Returns 0, or -1
 * for a dtype/op/path it cannot do. hpccomm_half_reduce_into has this type. */
typedef int (*hpccomm_shm_reducer)(int dtype, int op, int path, const void *in, const void *acc, void *out,
                                   size_t n);

/* One all-reduce in flight on a shared segment. The caller fills every field
 * above `copied_in` and zeroes the three cursors. */
typedef struct {
    int64_t *counters;        /* SHM_COUNTERS_PER_RANK lines per rank, rank-major */
    char *slots;              /* rank k's slot starts at slots + k * slot_stride */
    size_t slot_stride;       /* bytes from one rank's slot to the next */
    size_t buffer_stride;     /* bytes from one chunk buffer to the next in a slot */
    int size;                 /* ranks on the segment */
    int rank;                 /* this one */
    uintptr_t data;           /* the tensor's address (contiguous), reduced in place */
    size_t count;             /* its elements */
    size_t elem_size;         /* bytes per element */
    size_t chunk_elems;       /* elements per pipeline chunk (at most buffer_stride bytes) */
    int buffers;              /* chunks a slot holds: how far ranks may run ahead */
    hpccomm_shm_reducer reduce;
    int dtype, op, path;      /* passed through to `reduce` */
    int64_t base;             /* chunks the segment carried before this all-reduce */
    int64_t chunks;           /* chunks this one takes: ceil(count / chunk_elems) */
    int64_t copied_in, reduced, copied_out; /* this rank's progress, in chunks */
} hpccomm_shm_allreduce;

/* Advance `ar` as far as the other ranks allow. When no step is possible it
 * polls again, up to `polls` times (yielding the CPU in between), then gives
 * up. Returns 1 once every chunk is done here, 0 while waiting for another
 * rank, -1 if `reduce` failed (the data is then undefined). */
int hpccomm_shm_allreduce_progress(hpccomm_shm_allreduce *ar, int polls);

/* The reducer for the SHM_* element types; `path` is ignored. NaN propagates
 * through MIN and MAX (as torch.minimum/maximum); integers wrap. */
int hpccomm_shm_reduce_into(int dtype, int op, int path, const void *in, const void *acc, void *out, size_t n);

#endif
