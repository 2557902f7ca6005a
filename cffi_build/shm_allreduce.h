/* hpccomm's shared-memory progress counters: the interface cffi binds. */
#ifndef HPCCOMM_SHM_SYNC_H
#define HPCCOMM_SHM_SYNC_H
#include <stdint.h>

/* Store `value` in *counter with release order: writes made before it are
 * visible to a process that sees the value. */
void hpccomm_shm_publish(int64_t *counter, int64_t value);

/* 1 if each of the n counters (every `stride` int64s from `counters`) is at
 * least `target`, read with acquire order; else 0. */
int hpccomm_shm_reached(const int64_t *counters, int n, int stride, int64_t target);

#endif
