/* hpccomm's bfloat16/float16 reduction kernels: the interface cffi binds. */
#ifndef HPCCOMM_HALF_REDUCE_H
#define HPCCOMM_HALF_REDUCE_H
#include <stddef.h>

/* dtypes */
enum { HALF_BF16 = 0, HALF_F16 = 1 };
/* reductions, as torch's SUM, PRODUCT, MIN, MAX */
enum { HALF_OP_SUM = 0, HALF_OP_PRODUCT = 1, HALF_OP_MIN = 2, HALF_OP_MAX = 3 };
/* vector paths, slowest first; AVX512-BF16 rounds bfloat16 in hardware (float16
 * runs its AVX-512 kernel there) */
enum { HALF_PATH_NONE = 0, HALF_PATH_AVX2 = 1, HALF_PATH_AVX512 = 2, HALF_PATH_AVX512_BF16 = 3 };

/* The fastest path this CPU runs for the dtype (HALF_PATH_NONE: reduce with torch). */
int hpccomm_half_path(int dtype);

/* inout[i] = inout[i] (op) in[i] for n elements of the dtype, on `path` (at most
 * hpccomm_half_path(dtype)). Returns 0, or -1 for an unknown op or unavailable path. */
int hpccomm_half_reduce(int dtype, int op, int path, const void *in, void *inout, size_t n);

/* out[i] = acc[i] (op) in[i]: as hpccomm_half_reduce, with the result written
 * elsewhere (acc may equal out). */
int hpccomm_half_reduce_into(int dtype, int op, int path, const void *in, const void *acc, void *out, size_t n);

/* Fix the path the MPI user functions below run for the dtype (at most
 * hpccomm_half_path). Returns 0, or -1 for a path this CPU or build lacks. */
int hpccomm_half_use_path(int dtype, int path);

/* An MPI_User_function (void (*)(void *in, void *inout, int *len, MPI_Datatype *))
 * reducing MPI_UINT16_T words as the dtype, for MPI_Op_create; NULL for an
 * unknown op or before hpccomm_half_use_path. */
void *hpccomm_half_mpi_function(int dtype, int op);

#endif
