/* hpccomm's C helpers around UCC's collective calls (see ucc.h). */
#include "ucc.h"

#include <stddef.h>

ucc_status_t hpccomm_ucc_init(ucc_team_h team, ucc_coll_args_t *args, ucc_coll_req_h *request)
{
    *request = NULL;
    return ucc_collective_init(args, request, team);
}

ucc_status_t hpccomm_ucc_post(ucc_coll_req_h request)
{
    ucc_status_t status = ucc_collective_post(request);

    if (status != UCC_OK) {
        ucc_collective_finalize(request);
    }
    return status;
}

ucc_status_t hpccomm_ucc_start(ucc_team_h team, ucc_coll_args_t *args, ucc_coll_req_h *request)
{
    ucc_coll_req_h req = NULL;
    /* ucc_collective_init_and_post would do both, but UCC 1.8 does not implement it. */
    ucc_status_t status = hpccomm_ucc_init(team, args, &req);

    *request = NULL;
    if (status == UCC_OK) {
        status = hpccomm_ucc_post(req);
    }
    if (status == UCC_OK) {
        *request = req;
    }
    return status;
}

static void drain_posted_events(ucc_ee_h ee)
{
    ucc_ev_t *posted = NULL;

    while (ucc_ee_get_event(ee, &posted) == UCC_OK && posted != NULL) {
        ucc_ee_ack_event(ee, posted);
        posted = NULL;
    }
}

ucc_status_t hpccomm_ucc_triggered_post(ucc_ee_h ee, ucc_coll_req_h request)
{
    ucc_ev_t compute_done = {0};
    ucc_status_t status;

    compute_done.ev_type = UCC_EVENT_COMPUTE_COMPLETE;
    compute_done.req = request;
    status = ucc_collective_triggered_post(ee, &compute_done);
    if (status != UCC_OK) {
        ucc_collective_finalize(request);
        return status;
    }
    /* UCC queues a COLLECTIVE_POST event on the engine once the collective is
     * on the stream: within this call where the team layer posts triggered
     * itself (tl/nccl), at a later ucc_context_progress on UCC's generic path
     * (ucc_trigger_test, src/core/ucc_coll.c). hpccomm waits for the request,
     * not the event, and acknowledges (frees) every one queued so far at each
     * triggered post: only those queued since the last post are left.
     * The request is posted whatever this finds: its poll will end it. */
    drain_posted_events(ee);
    return UCC_OK;
}

ucc_status_t hpccomm_ucc_ee_create(ucc_team_h team, void *cuda_stream, ucc_ee_h *ee)
{
    ucc_ee_params_t params = {0};

    params.ee_type = UCC_EE_CUDA_STREAM;
    params.ee_context = cuda_stream;
    params.ee_context_size = sizeof(void *);
    *ee = NULL;
    return ucc_ee_create(team, &params, ee);
}

ucc_status_t hpccomm_ucc_poll(ucc_context_h context, ucc_coll_req_h request)
{
    /* ucc_collective_test is this read (static inline in ucc.h). A positive
     * status means "not done yet": UCC_INPROGRESS, or UCC_OPERATION_INITIALIZED,
     * which a request keeps after a triggered post until its stream has reached
     * it (and before any post). Only UCC_OK or an error ends it. */
    ucc_status_t status = request->status;

    if (status > 0) {
        ucc_context_progress(context);
        status = request->status;
    }
    if (status <= 0) {
        ucc_collective_finalize(request);
    }
    return status;
}
