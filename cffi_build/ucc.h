/* hpccomm's C helpers around UCC's collective calls: the interface cffi binds
 * (after cffi_build/ucc_api.cdef, which declares UCC's own types). Each folds
 * two or three UCC calls into one, so a collective costs two crossings from
 * Python instead of five. */
#ifndef HPCCOMM_UCC_H
#define HPCCOMM_UCC_H
#include <ucc/api/ucc.h>

/* ucc_collective_init, then ucc_collective_post. On success *request holds the
 * posted request; on failure nothing is left to free (a request whose post
 * failed is finalized here) and *request is NULL. */
ucc_status_t hpccomm_ucc_start(ucc_team_h team, ucc_coll_args_t *args, ucc_coll_req_h *request);

/* The two halves of hpccomm_ucc_start, for a request posted later than it is
 * initialised (hpccomm's UCC transport on device memory posts once the
 * caller's stream has produced the inputs). Collectives must be initialised
 * in the same order on every rank; they may be posted later. A request whose
 * post fails is finalized by hpccomm_ucc_post. */
ucc_status_t hpccomm_ucc_init(ucc_team_h team, ucc_coll_args_t *args, ucc_coll_req_h *request);
ucc_status_t hpccomm_ucc_post(ucc_coll_req_h request);

/* An initialised request posted on an execution engine (a CUDA stream): UCC
 * starts it once the stream reaches this point and holds the stream until the
 * collective has completed. ucc_collective_triggered_post, then every
 * UCC_EVENT_COLLECTIVE_POST event the engine has queued so far acknowledged
 * (UCC's generic path queues it at a later progress, not in this call). If the
 * triggered post fails the request is finalized. */
ucc_status_t hpccomm_ucc_triggered_post(ucc_ee_h ee, ucc_coll_req_h request);

/* An execution engine on a CUDA stream (a cudaStream_t, passed as a pointer). */
ucc_status_t hpccomm_ucc_ee_create(ucc_team_h team, void *cuda_stream, ucc_ee_h *ee);

/* One poll of a request: progress the context once unless the request has
 * already ended, and return its status. A positive status (UCC_INPROGRESS, or
 * UCC_OPERATION_INITIALIZED while a triggered post waits for its stream) is not
 * an end. A request that has ended (UCC_OK or an error) is finalized by this
 * call and must not be used again. */
ucc_status_t hpccomm_ucc_poll(ucc_context_h context, ucc_coll_req_h request);

#endif
