/* SRQ through the C ABI, in one process over libsoftiwarp (LD_PRELOAD, one host-TCP
 * device on lo): a server QP made by rdma_create_qp with init_attr.srq, the limit
 * armed by ibv_modify_srq firing IBV_EVENT_SRQ_LIMIT_REACHED once (then reading 0),
 * ibv_destroy_srq refused with EBUSY while the QP uses it, and
 * IBV_EVENT_QP_LAST_WQE_REACHED for the server QP once it is moved to Error.
 *
 * usage: srq_events PORT. Prints one line per check; exits 1 at the first mismatch,
 * 0 after "ok". */
#include <arpa/inet.h>
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>

#include "check.h"

#define MSGS 4
#define SRQ_WRS 8
#define LIMIT 6
#define LEN 8

static struct rdma_cm_event *next_event(struct rdma_event_channel *ch,
					enum rdma_cm_event_type want)
{
	struct pollfd p = { .fd = ch->fd, .events = POLLIN };
	struct rdma_cm_event *ev;

	for (;;) {
		if (poll(&p, 1, 10000) != 1)
			failed("a CM event within 10 s", 0, want);
		if (rdma_get_cm_event(ch, &ev))
			failed("rdma_get_cm_event", -1, 0);
		if (ev->event == want)
			return ev;
		printf("CM event %s (waiting for %s)\n", rdma_event_str(ev->event),
		       rdma_event_str(want));
		failed("an unexpected CM event", ev->event, want);
		rdma_ack_cm_event(ev);
	}
}

/* The next async event of ctx within 10 s; others than `want` for `element` are
 * printed and skipped. */
static void wait_async(struct ibv_context *ctx, enum ibv_event_type want, void *element)
{
	struct pollfd p = { .fd = ctx->async_fd, .events = POLLIN };
	struct ibv_async_event ev;

	for (;;) {
		if (poll(&p, 1, 10000) != 1)
			failed("an async event within 10 s", 0, want);
		if (ibv_get_async_event(ctx, &ev))
			failed("ibv_get_async_event", -1, 0);
		int match = ev.event_type == want && ev.element.srq == element;
		printf("async event %s%s\n", ibv_event_type_str(ev.event_type),
		       match ? " (the one awaited)" : "");
		ibv_ack_async_event(&ev);
		if (match)
			return;
	}
}

int main(int argc, char **argv)
{
	static char sbuf[MSGS * LEN], rbuf[SRQ_WRS * LEN];
	struct rdma_event_channel *ch = rdma_create_event_channel();
	struct rdma_cm_id *lid, *cid, *sid;
	struct sockaddr_in a = { .sin_family = AF_INET };
	struct rdma_cm_event *ev;
	struct ibv_wc wc[MSGS];
	int i, n;

	if (argc != 2 || !ch)
		failed("usage: srq_events PORT, and an event channel", 0, 1);
	a.sin_port = htons(atoi(argv[1]));
	a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	CHECK("rdma_create_id (listener)", rdma_create_id(ch, &lid, NULL, RDMA_PS_TCP), 0);
	CHECK("rdma_bind_addr", rdma_bind_addr(lid, (struct sockaddr *)&a), 0);
	CHECK("rdma_listen", rdma_listen(lid, 4), 0);

	/* The client: resolve, QP, connect. */
	CHECK("rdma_create_id (client)", rdma_create_id(ch, &cid, NULL, RDMA_PS_TCP), 0);
	CHECK("rdma_resolve_addr", rdma_resolve_addr(cid, NULL, (struct sockaddr *)&a, 2000), 0);
	rdma_ack_cm_event(next_event(ch, RDMA_CM_EVENT_ADDR_RESOLVED));
	CHECK("rdma_resolve_route", rdma_resolve_route(cid, 2000), 0);
	rdma_ack_cm_event(next_event(ch, RDMA_CM_EVENT_ROUTE_RESOLVED));
	struct ibv_pd *cpd = ibv_alloc_pd(cid->verbs);
	struct ibv_cq *ccq = ibv_create_cq(cid->verbs, 16, NULL, NULL, 0);
	struct ibv_qp_init_attr cqa = {
		.send_cq = ccq, .recv_cq = ccq, .qp_type = IBV_QPT_RC,
		.cap = { .max_send_wr = 8, .max_recv_wr = 8, .max_send_sge = 1, .max_recv_sge = 1 },
	};
	CHECK("rdma_create_qp (client)", rdma_create_qp(cid, cpd, &cqa), 0);
	struct ibv_mr *smr = ibv_reg_mr(cpd, sbuf, sizeof(sbuf), 0);
	if (!cpd || !ccq || !smr)
		failed("client PD, CQ and MR", 0, 1);
	struct rdma_conn_param cp = { .initiator_depth = 1, .responder_resources = 1 };
	CHECK("rdma_connect", rdma_connect(cid, &cp), 0);

	/* The server: a QP on an SRQ, receives posted to the SRQ, the limit armed. */
	ev = next_event(ch, RDMA_CM_EVENT_CONNECT_REQUEST);
	sid = ev->id;
	rdma_ack_cm_event(ev);
	struct ibv_context *sctx = sid->verbs;
	struct ibv_pd *spd = ibv_alloc_pd(sctx);
	struct ibv_cq *scq = ibv_create_cq(sctx, 16, NULL, NULL, 0);
	struct ibv_mr *rmr = ibv_reg_mr(spd, rbuf, sizeof(rbuf), IBV_ACCESS_LOCAL_WRITE);
	if (!spd || !scq || !rmr)
		failed("server PD, CQ and MR", 0, 1);
	struct ibv_srq_init_attr sia = {
		.srq_context = &sia, .attr = { .max_wr = SRQ_WRS, .max_sge = 1 },
	};
	struct ibv_srq *srq = ibv_create_srq(spd, &sia);
	if (!srq)
		failed("ibv_create_srq", 0, 1);
	CHECK("srq->srq_context is ours", srq->srq_context == &sia, 1);
	CHECK("srq->pd", srq->pd == spd, 1);
	CHECK("granted max_wr >= asked", sia.attr.max_wr >= SRQ_WRS, 1);
	CHECK("granted max_sge", sia.attr.max_sge, 1);
	struct ibv_qp_init_attr sqa = {
		.send_cq = scq, .recv_cq = scq, .srq = srq, .qp_type = IBV_QPT_RC,
		.cap = { .max_send_wr = 8, .max_send_sge = 1 },
	};
	CHECK("rdma_create_qp (server, on the SRQ)", rdma_create_qp(sid, spd, &sqa), 0);
	struct ibv_qp *sqp = sid->qp;
	CHECK("qp->srq", sqp->srq == srq, 1);
	for (i = 0; i < SRQ_WRS; i++) {
		struct ibv_sge sge = { (uintptr_t)(rbuf + i * LEN), LEN, rmr->lkey };
		struct ibv_recv_wr wr = { .wr_id = 100 + i, .sg_list = &sge, .num_sge = 1 }, *bad;
		if (ibv_post_srq_recv(srq, &wr, &bad))
			failed("ibv_post_srq_recv", -1, 0);
	}
	{
		struct ibv_sge sge = { (uintptr_t)rbuf, LEN, rmr->lkey };
		struct ibv_sge two[2] = { sge, sge };
		struct ibv_recv_wr wr = { .wr_id = 1, .sg_list = two, .num_sge = 2 }, *bad = NULL;
		CHECK("ibv_post_srq_recv with 2 SGEs on a max_sge 1 SRQ",
		      ibv_post_srq_recv(srq, &wr, &bad), EINVAL);
		CHECK("  bad_wr names it", bad == &wr, 1);
		wr.num_sge = 1;
		wr.sg_list = &sge;
		CHECK("ibv_post_recv on an SRQ QP", ibv_post_recv(sqp, &wr, &bad), EINVAL);
	}
	struct ibv_srq_attr sa = { .max_wr = 1024 };
	CHECK("ibv_modify_srq(IBV_SRQ_MAX_WR): no resize", ibv_modify_srq(srq, &sa, IBV_SRQ_MAX_WR),
	      EOPNOTSUPP);
	sa.srq_limit = LIMIT;
	CHECK("ibv_modify_srq(IBV_SRQ_LIMIT)", ibv_modify_srq(srq, &sa, IBV_SRQ_LIMIT), 0);
	memset(&sa, 0, sizeof(sa));
	CHECK("ibv_query_srq", ibv_query_srq(srq, &sa), 0);
	CHECK("  srq_limit armed", sa.srq_limit, LIMIT);
	CHECK("  max_wr", sa.max_wr, sia.attr.max_wr);
	struct rdma_conn_param sp = { .initiator_depth = 1, .responder_resources = 1 };
	CHECK("rdma_accept", rdma_accept(sid, &sp), 0);
	/* Both ends' ESTABLISHED (client and server id, in either order). */
	rdma_ack_cm_event(next_event(ch, RDMA_CM_EVENT_ESTABLISHED));
	rdma_ack_cm_event(next_event(ch, RDMA_CM_EVENT_ESTABLISHED));

	/* MSGS Sends: each takes the SRQ's oldest WR; the third leaves 5 < LIMIT. */
	for (i = 0; i < MSGS; i++) {
		memset(sbuf + i * LEN, 'a' + i, LEN);
		struct ibv_sge sge = { (uintptr_t)(sbuf + i * LEN), LEN, smr->lkey };
		struct ibv_send_wr wr = { .wr_id = i, .sg_list = &sge, .num_sge = 1,
					  .opcode = IBV_WR_SEND, .send_flags = IBV_SEND_SIGNALED }, *bad;
		if (ibv_post_send(cid->qp, &wr, &bad))
			failed("ibv_post_send", -1, 0);
	}
	for (n = 0, i = 0; n < MSGS && i < 10000; i++) {
		int got = ibv_poll_cq(scq, MSGS - n, wc + n);
		if (got < 0)
			failed("ibv_poll_cq", got, 0);
		n += got;
		if (n < MSGS)
			poll(NULL, 0, 1);
	}
	CHECK("receive completions", n, MSGS);
	for (i = 0; i < MSGS; i++) {
		char want[LEN];
		memset(want, 'a' + i, LEN);
		if (wc[i].status != IBV_WC_SUCCESS || wc[i].opcode != IBV_WC_RECV ||
		    wc[i].byte_len != LEN || wc[i].qp_num != sqp->qp_num ||
		    wc[i].wr_id != (uint64_t)(100 + i) || memcmp(rbuf + i * LEN, want, LEN))
			failed("a receive completion in SRQ order", i, -1);
	}
	printf("completions: the SRQ's WRs in posting order, on the server QP, data placed\n");
	wait_async(sctx, IBV_EVENT_SRQ_LIMIT_REACHED, srq);
	CHECK("ibv_query_srq", ibv_query_srq(srq, &sa), 0);
	CHECK("  srq_limit after the event (disarmed)", sa.srq_limit, 0);
	CHECK("ibv_destroy_srq while the QP uses it", ibv_destroy_srq(srq), EBUSY);

	/* The server QP to Error: LAST_WQE_REACHED for it. */
	struct ibv_qp_attr qa = { .qp_state = IBV_QPS_ERR };
	CHECK("ibv_modify_qp(ERR)", ibv_modify_qp(sqp, &qa, IBV_QP_STATE), 0);
	wait_async(sctx, IBV_EVENT_QP_LAST_WQE_REACHED, sqp);

	rdma_destroy_qp(sid);
	CHECK("ibv_destroy_srq once its QP is gone", ibv_destroy_srq(srq), 0);
	CHECK("ibv_destroy_srq again", ibv_destroy_srq(srq), EINVAL);
	printf("ok\n");
	return 0;
}
