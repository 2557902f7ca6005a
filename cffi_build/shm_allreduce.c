/*
 * Progress counters in a shared-memory window, for hpccomm's node-local
 * all-reduce (hpccomm/transports/shm.py). Each rank publishes how far it got
 * with a release store; the others poll with acquire loads, so the data a rank
 * wrote before publishing is visible to whoever sees the new count, on any
 * CPU's memory model (Python and torch give no such ordering).
 */
#include "shm_sync.h"

void hpccomm_shm_publish(int64_t *counter, int64_t value) {
    __atomic_store_n(counter, value, __ATOMIC_RELEASE);
}

int hpccomm_shm_reached(const int64_t *counters, int n, int stride, int64_t target) {
    for (int i = 0; i < n; i++)
        if (__atomic_load_n(counters + (int64_t)i * stride, __ATOMIC_ACQUIRE) < target)
            return 0;
    return 1;
}
