/* The extended verbs over libsoftiwarp (LD_PRELOAD, one host-TCP device on lo), in one
 * process: the context is a verbs_context; ibv_query_device_ex, ibv_query_port through
 * it, ibv_query_gid_table (negative errnos); ibv_create_cq_ex and the ibv_start_poll
 * API; ibv_create_qp_ex / rdma_create_qp_ex with send_ops_flags and the ibv_wr_* API
 * (Send with inline data, RDMA Write, Write with Immediate, RDMA Read in one batch, a
 * batch built wrong, an aborted batch); invalid arguments; and mlx5's direct verbs
 * finding "not this provider" instead of crashing.
 *
 * usage: extended_verbs PORT. One line per check; exit 1 at the first mismatch, 0
 * after "ok". */
#include <arpa/inet.h>
#include <poll.h>
#include <infiniband/verbs.h>
#include <infiniband/mlx5dv.h>
#include <rdma/rdma_cma.h>

#include "check.h"

#define LEN 64

static struct rdma_cm_event *next_event(struct rdma_event_channel *ch,
					enum rdma_cm_event_type want)
{
	struct pollfd p = { .fd = ch->fd, .events = POLLIN };
	struct rdma_cm_event *ev;

	if (poll(&p, 1, 10000) != 1 || rdma_get_cm_event(ch, &ev))
		failed("a CM event within 10 s", -1, want);
	if (ev->event != want)
		failed(rdma_event_str(ev->event), ev->event, want);
	return ev;
}

/* Polls `n` completions of `cq` with the extended API (up to 10 s) into the arrays. */
static void poll_ex(struct ibv_cq_ex *cq, int n, uint64_t *wr_id, int *opcode,
		    uint32_t *byte_len, uint32_t *flags, uint32_t *imm, uint32_t *qpn)
{
	struct ibv_poll_cq_attr pa = {};
	int got = 0, tries = 0;

	while (got < n && tries++ < 10000) {
		int r = ibv_start_poll(cq, &pa);

		if (r == ENOENT) {
			poll(NULL, 0, 1);
			continue;
		}
		if (r)
			failed("ibv_start_poll", r, 0);
		do {
			if (cq->status != IBV_WC_SUCCESS)
				failed("a completion's status", cq->status, IBV_WC_SUCCESS);
			wr_id[got] = cq->wr_id;
			opcode[got] = ibv_wc_read_opcode(cq);
			byte_len[got] = ibv_wc_read_byte_len(cq);
			flags[got] = ibv_wc_read_wc_flags(cq);
			imm[got] = flags[got] & IBV_WC_WITH_IMM ? ibv_wc_read_imm_data(cq) : 0;
			qpn[got] = ibv_wc_read_qp_num(cq);
			if (ibv_wc_read_slid(cq) || ibv_wc_read_sl(cq) || ibv_wc_read_src_qp(cq))
				failed("slid, sl and src_qp read 0", 1, 0);
			got++;
		} while (got < n && ibv_next_poll(cq) == 0);
		ibv_end_poll(cq);
	}
	CHECK("completions polled with ibv_start_poll", got, n);
}

int main(int argc, char **argv)
{
	static char cbuf[4 * LEN] __attribute__((aligned(8))), sbuf[4 * LEN] __attribute__((aligned(8)));
	struct rdma_event_channel *ch = rdma_create_event_channel();
	struct rdma_cm_id *lid, *cid, *sid;
	struct sockaddr_in a = { .sin_family = AF_INET };
	struct rdma_cm_event *ev;
	int i;

	if (argc != 2 || !ch)
		failed("usage: extended_verbs PORT, and an event channel", 0, 1);
	a.sin_port = htons(atoi(argv[1]));
	a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	if (rdma_create_id(ch, &lid, NULL, RDMA_PS_TCP) || rdma_bind_addr(lid, (struct sockaddr *)&a) ||
	    rdma_listen(lid, 4) || rdma_create_id(ch, &cid, NULL, RDMA_PS_TCP) ||
	    rdma_resolve_addr(cid, NULL, (struct sockaddr *)&a, 2000))
		failed("listen and resolve", -1, 0);
	rdma_ack_cm_event(next_event(ch, RDMA_CM_EVENT_ADDR_RESOLVED));
	if (rdma_resolve_route(cid, 2000))
		failed("rdma_resolve_route", -1, 0);
	rdma_ack_cm_event(next_event(ch, RDMA_CM_EVENT_ROUTE_RESOLVED));
	struct ibv_context *ctx = cid->verbs;

	/* The context is a verbs_context. */
	struct verbs_context *vctx = verbs_get_ctx(ctx);
	CHECK("verbs_get_ctx finds the verbs_context", vctx != NULL, 1);
	CHECK("  its sz", vctx->sz, sizeof(struct verbs_context));
	struct ibv_device_attr_ex dx;
	CHECK("ibv_query_device_ex", ibv_query_device_ex(ctx, NULL, &dx), 0);
	CHECK("  phys_port_cnt_ex", dx.phys_port_cnt_ex, 1);
	CHECK("  orig_attr.phys_port_cnt", dx.orig_attr.phys_port_cnt, 1);
	CHECK("  orig_attr.max_srq > 0", dx.orig_attr.max_srq > 0, 1);
	struct ibv_port_attr pa;
	memset(&pa, 0xff, sizeof(pa));
	CHECK("ibv_query_port (the verbs_context's query_port)", ibv_query_port(ctx, 1, &pa), 0);
	CHECK("  state", pa.state, IBV_PORT_ACTIVE);
	CHECK("  gid_tbl_len", pa.gid_tbl_len, 1);
	CHECK("  link_layer", pa.link_layer, IBV_LINK_LAYER_ETHERNET);
	CHECK("  port_cap_flags2 (written, 0)", pa.port_cap_flags2, 0);
	CHECK("ibv_query_port(port 2)", ibv_query_port(ctx, 2, &pa), EINVAL);
	struct ibv_gid_entry ge[4];
	CHECK("ibv_query_gid_table(4 entries)", ibv_query_gid_table(ctx, ge, 4, 0), 1);
	CHECK("  entry 0: port", ge[0].port_num, 1);
	CHECK("ibv_query_gid_table(0 entries)", ibv_query_gid_table(ctx, ge, 0, 0), -EINVAL);

	/* Another provider's direct verbs: "not this provider", no crash. */
	struct mlx5dv_context mdv = {};
	CHECK("mlx5dv_is_supported", mlx5dv_is_supported(ctx->device), 0);
	CHECK("mlx5dv_query_device", mlx5dv_query_device(ctx, &mdv), EOPNOTSUPP);

	/* Invalid arguments of the extended creations. */
	struct ibv_cq_init_attr_ex cx = { .cqe = 16, .wc_flags = IBV_WC_EX_WITH_COMPLETION_TIMESTAMP };
	errno = 0;
	CHECK("ibv_create_cq_ex with completion timestamps", ibv_create_cq_ex(ctx, &cx) == NULL, 1);
	CHECK("  errno EOPNOTSUPP", errno, EOPNOTSUPP);
	cx.wc_flags = IBV_WC_STANDARD_FLAGS;
	cx.comp_vector = ctx->num_comp_vectors;
	CHECK("ibv_create_cq_ex with comp_vector = num_comp_vectors", ibv_create_cq_ex(ctx, &cx) == NULL, 1);
	CHECK("  errno EINVAL", errno, EINVAL);
	CHECK("ibv_create_cq with comp_vector = num_comp_vectors",
	      ibv_create_cq(ctx, 16, NULL, NULL, ctx->num_comp_vectors) == NULL, 1);
	CHECK("  errno EINVAL", errno, EINVAL);
	cx.comp_vector = 0;
	struct ibv_cq_ex *ccq = ibv_create_cq_ex(ctx, &cx);
	struct ibv_pd *cpd = ibv_alloc_pd(ctx);
	if (!ccq || !cpd)
		failed("client CQ ex and PD", 0, 1);
	struct ibv_qp_init_attr_ex qx = {
		.send_cq = ibv_cq_ex_to_cq(ccq), .recv_cq = ibv_cq_ex_to_cq(ccq), .qp_type = IBV_QPT_RC,
		.cap = { .max_send_wr = 8, .max_recv_wr = 8, .max_send_sge = 2, .max_recv_sge = 1,
			 .max_inline_data = 32 },
		.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS, .pd = cpd,
		.send_ops_flags = IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD,
	};
	struct ibv_qp *fa = ibv_create_qp_ex(ctx, &qx);
	CHECK("ibv_create_qp_ex asking for Fetch-and-Add only", fa != NULL, 1);
	CHECK("  wr_atomic_fetch_add set", ((struct ibv_qp_ex *)fa)->wr_atomic_fetch_add != NULL, 1);
	CHECK("  wr_atomic_cmp_swp left NULL", ((struct ibv_qp_ex *)fa)->wr_atomic_cmp_swp == NULL, 1);
	CHECK("ibv_destroy_qp", ibv_destroy_qp(fa), 0);
	qx.send_ops_flags = IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_RDMA_WRITE |
			    IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM | IBV_QP_EX_WITH_RDMA_READ;
	struct ibv_qp *plain = ibv_create_qp_ex(ctx, &qx);
	CHECK("ibv_create_qp_ex outside the CM", plain != NULL, 1);
	CHECK("  its ibv_qp_ex", ibv_qp_to_qp_ex(plain) == (struct ibv_qp_ex *)plain, 1);
	CHECK("  wr_atomic_fetch_add left NULL", ((struct ibv_qp_ex *)plain)->wr_atomic_fetch_add == NULL, 1);
	CHECK("ibv_destroy_qp", ibv_destroy_qp(plain), 0);
	qx.send_ops_flags |= IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD | IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP;

	/* The client's QP through the CM, with the post API. */
	CHECK("rdma_create_qp_ex with send_ops_flags", rdma_create_qp_ex(cid, &qx), 0);
	struct ibv_qp_ex *qpx = ibv_qp_to_qp_ex(cid->qp);
	CHECK("ibv_qp_to_qp_ex", qpx != NULL, 1);
	struct ibv_mr *cmr = ibv_reg_mr(cpd, cbuf, sizeof(cbuf), IBV_ACCESS_LOCAL_WRITE);
	struct rdma_conn_param cp = { .initiator_depth = 1, .responder_resources = 1 };
	if (!cmr || rdma_connect(cid, &cp))
		failed("client MR and rdma_connect", -1, 0);

	/* The server: a legacy QP whose receive CQ is extended. */
	ev = next_event(ch, RDMA_CM_EVENT_CONNECT_REQUEST);
	sid = ev->id;
	rdma_ack_cm_event(ev);
	struct ibv_pd *spd = ibv_alloc_pd(sid->verbs);
	struct ibv_cq_ex *scq = ibv_create_cq_ex(sid->verbs, &cx);
	struct ibv_mr *smr = ibv_reg_mr(spd, sbuf, sizeof(sbuf),
					IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
					IBV_ACCESS_REMOTE_ATOMIC);
	struct ibv_qp_init_attr sqa = {
		.send_cq = ibv_cq_ex_to_cq(scq), .recv_cq = ibv_cq_ex_to_cq(scq), .qp_type = IBV_QPT_RC,
		.cap = { .max_send_wr = 8, .max_recv_wr = 8, .max_send_sge = 1, .max_recv_sge = 1 },
	};
	if (!spd || !scq || !smr || rdma_create_qp(sid, spd, &sqa))
		failed("server PD, CQ ex, MR and QP", -1, 0);
	errno = 0;
	CHECK("ibv_qp_to_qp_ex of a QP without send_ops_flags", ibv_qp_to_qp_ex(sid->qp) == NULL, 1);
	for (i = 0; i < 2; i++) {
		struct ibv_sge sge = { (uintptr_t)(sbuf + i * LEN), LEN, smr->lkey };
		struct ibv_recv_wr wr = { .wr_id = 10 + i, .sg_list = &sge, .num_sge = 1 }, *bad;
		if (ibv_post_recv(sid->qp, &wr, &bad))
			failed("ibv_post_recv", -1, 0);
	}
	memset(sbuf + 3 * LEN, 'r', LEN);
	struct rdma_conn_param sp = { .initiator_depth = 1, .responder_resources = 1 };
	CHECK("rdma_accept", rdma_accept(sid, &sp), 0);
	rdma_ack_cm_event(next_event(ch, RDMA_CM_EVENT_ESTABLISHED));
	rdma_ack_cm_event(next_event(ch, RDMA_CM_EVENT_ESTABLISHED));

	/* A batch built wrong (3 SGEs on a 2-SGE QP): nothing posted. An aborted batch:
	 * nothing posted. */
	struct ibv_sge three[3] = { { (uintptr_t)cbuf, 1, cmr->lkey }, { (uintptr_t)cbuf, 1, cmr->lkey },
				    { (uintptr_t)cbuf, 1, cmr->lkey } };
	ibv_wr_start(qpx);
	qpx->wr_id = 99;
	qpx->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_send(qpx);
	ibv_wr_set_sge_list(qpx, 3, three);
	CHECK("ibv_wr_complete of a WR with too many SGEs", ibv_wr_complete(qpx), EINVAL);
	ibv_wr_start(qpx);
	ibv_wr_send(qpx);
	ibv_wr_set_sge(qpx, cmr->lkey, (uintptr_t)cbuf, 1);
	ibv_wr_abort(qpx);

	/* One batch: Send (inline), RDMA Write, Write with Immediate, RDMA Read. */
	memset(cbuf + LEN, 'w', LEN);
	ibv_wr_start(qpx);
	qpx->wr_id = 1;
	qpx->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_send(qpx);
	ibv_wr_set_inline_data(qpx, "inline", 6);
	qpx->wr_id = 2;
	ibv_wr_rdma_write(qpx, smr->rkey, (uintptr_t)(sbuf + 2 * LEN));
	ibv_wr_set_sge(qpx, cmr->lkey, (uintptr_t)(cbuf + LEN), LEN);
	qpx->wr_id = 3;
	ibv_wr_rdma_write_imm(qpx, smr->rkey, (uintptr_t)(sbuf + 2 * LEN), htonl(0x1234));
	ibv_wr_set_sge(qpx, cmr->lkey, (uintptr_t)(cbuf + LEN), 8);
	qpx->wr_id = 4;
	ibv_wr_rdma_read(qpx, smr->rkey, (uintptr_t)(sbuf + 3 * LEN));
	ibv_wr_set_sge(qpx, cmr->lkey, (uintptr_t)(cbuf + 2 * LEN), LEN);
	CHECK("ibv_wr_complete", ibv_wr_complete(qpx), 0);

	uint64_t ids[4];
	int ops[4];
	uint32_t lens[4], fl[4], imm[4], qpn[4];
	poll_ex(ccq, 4, ids, ops, lens, fl, imm, qpn);
	for (i = 0; i < 4; i++) {
		static const int want_op[4] = { IBV_WC_SEND, IBV_WC_RDMA_WRITE, IBV_WC_RDMA_WRITE,
						IBV_WC_RDMA_READ };
		if (ids[i] != (uint64_t)(i + 1) || ops[i] != want_op[i] || qpn[i] != cid->qp->qp_num)
			failed("a client completion (wr_id, opcode, qp_num) in order", i, -1);
	}
	printf("client completions: wr_id 1..4, SEND, RDMA_WRITE, RDMA_WRITE, RDMA_READ\n");
	CHECK("  the read's byte_len", lens[3], LEN);
	CHECK("  the read's data", memcmp(cbuf + 2 * LEN, sbuf + 3 * LEN, LEN), 0);
	poll_ex(scq, 2, ids, ops, lens, fl, imm, qpn);
	CHECK("server completion 1: wr_id", ids[0], 10);
	CHECK("  opcode IBV_WC_RECV", ops[0], IBV_WC_RECV);
	CHECK("  byte_len", lens[0], 6);
	CHECK("  data", memcmp(sbuf, "inline", 6), 0);
	CHECK("  qp_num", qpn[0], sid->qp->qp_num);
	CHECK("server completion 2: wr_id", ids[1], 11);
	CHECK("  opcode IBV_WC_RECV_RDMA_WITH_IMM", ops[1], IBV_WC_RECV_RDMA_WITH_IMM);
	CHECK("  wc_flags IBV_WC_WITH_IMM", fl[1] & IBV_WC_WITH_IMM, IBV_WC_WITH_IMM);
	CHECK("  imm_data", ntohl(imm[1]), 0x1234);
	CHECK("the written bytes", sbuf[2 * LEN + 8] == 'w' && sbuf[2 * LEN + LEN - 1] == 'w', 1);

	/* A batch of the RFC 7306 atomics: Fetch-and-Add, then Compare-and-Swap on the
	 * new value; the original values land in the client's buffer. */
	uint64_t *target = (uint64_t *)(sbuf + 3 * LEN), *orig = (uint64_t *)(cbuf + 3 * LEN);
	*target = 40;
	ibv_wr_start(qpx);
	qpx->wr_id = 5;
	qpx->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_atomic_fetch_add(qpx, smr->rkey, (uintptr_t)target, 2);
	ibv_wr_set_sge(qpx, cmr->lkey, (uintptr_t)orig, 8);
	qpx->wr_id = 6;
	ibv_wr_atomic_cmp_swp(qpx, smr->rkey, (uintptr_t)target, 42, 7);
	ibv_wr_set_sge(qpx, cmr->lkey, (uintptr_t)(orig + 1), 8);
	CHECK("ibv_wr_complete of the atomics", ibv_wr_complete(qpx), 0);
	poll_ex(ccq, 2, ids, ops, lens, fl, imm, qpn);
	CHECK("atomic completion 1: wr_id", ids[0], 5);
	CHECK("  opcode IBV_WC_FETCH_ADD", ops[0], IBV_WC_FETCH_ADD);
	CHECK("  byte_len", lens[0], 8);
	CHECK("  the original value", orig[0], 40);
	CHECK("atomic completion 2: wr_id", ids[1], 6);
	CHECK("  opcode IBV_WC_COMP_SWAP", ops[1], IBV_WC_COMP_SWAP);
	CHECK("  the original value", orig[1], 42);
	CHECK("the target after both", *target, 7);

	struct ibv_poll_cq_attr pca = {};
	CHECK("ibv_start_poll on an empty CQ", ibv_start_poll(ccq, &pca), ENOENT);
	printf("ok\n");
	return 0;
}
