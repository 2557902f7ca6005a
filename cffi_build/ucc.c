/* hpccomm's C helpers around UCC's collective calls (see ucc.h). */
#include "ucc.h"

#include <stddef.h>

ucc_status_t hpccomm_ucc_start(ucc_team_h team, ucc_coll_args_t *args, ucc_coll_req_h *request)
{
    ucc_coll_req_h req = NULL;
    ucc_status_t status = ucc_collective_init(args, &req, team);

    *request = NULL;
    if (status != UCC_OK) {
        return status;
    }
    /* ucc_collective_init_and_post would do both, but UCC 1.8 does not implement it. */
    status = ucc_collective_post(req);
    if (status != UCC_OK) {
        ucc_collective_finalize(req);
        return status;
    }
    *request = req;
    return UCC_OK;
}

ucc_status_t hpccomm_ucc_poll(ucc_context_h context, ucc_coll_req_h request)
{
    /* ucc_collective_test is this read (static inline in ucc.h). */
    ucc_status_t status = request->status;

    if (status == UCC_INPROGRESS) {
        ucc_context_progress(context);
        status = request->status;
    }
    if (status != UCC_INPROGRESS) {
        ucc_collective_finalize(request);
    }
    return status;
}
