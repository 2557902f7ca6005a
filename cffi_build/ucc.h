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

/* One poll of a posted request: progress the context once unless the request
 * has already ended, and return its status. A request that has ended (UCC_OK
 * or an error) is finalized by this call and must not be used again. */
ucc_status_t hpccomm_ucc_poll(ucc_context_h context, ucc_coll_req_h request);

#endif
