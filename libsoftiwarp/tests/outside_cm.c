/*
 * QPs made outside the RDMA CM, the CM's defaults for a QP, and synchronous ids, as
 * librdmacm's own programs use them (rping -q, cmtime, rdma_server). Built by
 * tests/endpoint.rs and run over libsoftiwarp's host-TCP device on lo, as two
 * processes:
 *
 *   outside_cm server PORT
 *   outside_cm client 127.0.0.1 PORT
 *
 * Both sides use synchronous ids (rdma_create_id with a NULL channel: each call waits
 * for its event and leaves it in id->event). Two connections:
 *
 * 1. A QP from ibv_create_qp (in INIT, as kernel siw's), which rdma_connect and
 *    rdma_accept name by conn_param.qp_num; rdma_init_qp_attr before and after the
 *    connect, as rping -q moves its QP. The client Sends 16 bytes, the server answers
 *    with 16; the client then posts 8 receives and moves its QP to ERR: each is flushed
 *    (IBV_WC_WR_FLUSH_ERR, in order), and so is a Send posted in ERR. The server's
 *    3 receives still posted are flushed by the disconnect.
 * 2. rdma_create_qp with a NULL PD and no CQs: the id's default PD, CQs and completion
 *    channels made by the CM (context: the id), the <rdma/rdma_verbs.h> helpers
 *    (rdma_reg_msgs / rdma_reg_write / rdma_reg_read on id->pd, rdma_post_send / recv /
 *    write / read, rdma_get_send/recv_comp): the client sends its buffers' keys, the
 *    server Writes one, Reads the other and echoes the message; rdma_destroy_qp
 *    destroys the CM's CQs. The client's id is made on a channel and moved by
 *    rdma_migrate_id: to NULL (synchronous), and back to the channel before its
 *    disconnect, whose event then comes there.
 *
 * The client also checks the refusals of what iWARP has no (a UD QP, a UDP port space).
 * Each check prints "ok: ..." or "FAILED: ..." (then exits 1); "done" last.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>
#include <rdma/rdma_verbs.h>

#define MSG 16

/* A check: on failure, why, and exit 1. */
#define MUST(cond, what)                                                        \
	do {                                                                        \
		if (!(cond)) {                                                          \
			printf("FAILED: %s (errno %d: %s)\n", what, errno, strerror(errno)); \
			fflush(stdout);                                                     \
			exit(1);                                                            \
		}                                                                       \
	} while (0)

/* MUST, and "ok: what" when it holds. */
#define CHECK(cond, what)                                                       \
	do {                                                                        \
		MUST(cond, what);                                                       \
		printf("ok: %s\n", what);                                               \
	} while (0)

/* The second connection's message: 16 bytes of text and the client's buffers for the
 * server's RDMA Write (rdma_reg_write) and RDMA Read (rdma_reg_read). */
struct keys {
	char text[MSG];
	uint64_t waddr;
	uint64_t raddr;
	uint32_t wkey;
	uint32_t rkey;
};

static double now(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec + t.tv_nsec / 1e9;
}

/* Polls `cq` for `n` completions within 10 s, and with `exact` checks that no more
 * come in the next 20 ms (only where the peer can cause none). */
static void poll_n(struct ibv_cq *cq, struct ibv_wc *wc, int n, int exact, const char *what)
{
	int got = 0;
	double end = now() + 10;
	while (got < n && now() < end) {
		int r = ibv_poll_cq(cq, n - got, wc + got);
		MUST(r >= 0, "ibv_poll_cq");
		got += r;
		if (got < n)
			usleep(1000);
	}
	if (got != n) {
		printf("FAILED: %s: %d of %d completions\n", what, got, n);
		exit(1);
	}
	struct ibv_wc extra;
	usleep(20000);
	int more = exact ? ibv_poll_cq(cq, 1, &extra) : 0;
	if (more != 0) {
		printf("FAILED: %s: poll for more: %d (wr_id %llu, %s)\n", what, more,
		       (unsigned long long)extra.wr_id, ibv_wc_status_str(extra.status));
		exit(1);
	}
	printf("ok: %s\n", what);
}

static int qp_state(struct ibv_qp *qp)
{
	struct ibv_qp_attr a;
	struct ibv_qp_init_attr i;
	if (ibv_query_qp(qp, &a, IBV_QP_STATE, &i))
		return -1;
	return a.qp_state;
}

static void post_recv(struct ibv_qp *qp, struct ibv_mr *mr, char *buf, uint64_t wr_id)
{
	struct ibv_sge sge = { (uintptr_t)buf, MSG, mr->lkey };
	struct ibv_recv_wr wr = { .wr_id = wr_id, .sg_list = &sge, .num_sge = 1 }, *bad;
	MUST(ibv_post_recv(qp, &wr, &bad) == 0, "ibv_post_recv");
}

static void post_send(struct ibv_qp *qp, struct ibv_mr *mr, char *buf, uint64_t wr_id)
{
	struct ibv_sge sge = { (uintptr_t)buf, MSG, mr->lkey };
	struct ibv_send_wr wr = { .wr_id = wr_id, .sg_list = &sge, .num_sge = 1,
				  .opcode = IBV_WR_SEND, .send_flags = IBV_SEND_SIGNALED },
			   *bad;
	MUST(ibv_post_send(qp, &wr, &bad) == 0, "ibv_post_send");
}

/* rping -q's moves: rdma_init_qp_attr for INIT, RTR, RTS, each applied. */
static void self_modify(struct rdma_cm_id *id, struct ibv_qp *qp, int connected)
{
	struct ibv_qp_attr a;
	int mask;
	a.qp_state = IBV_QPS_INIT;
	CHECK(rdma_init_qp_attr(id, &a, &mask) == 0, "rdma_init_qp_attr(INIT)");
	CHECK(mask == (IBV_QP_STATE | IBV_QP_ACCESS_FLAGS | IBV_QP_PORT) && a.qp_state == IBV_QPS_INIT &&
		      a.port_num == id->port_num && a.port_num == 1,
	      "INIT: state, access flags and port");
	CHECK(a.qp_access_flags == (connected ? (IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ) : 0),
	      "INIT access: remote write and read once the id has an iWARP CM id, else 0");
	CHECK(ibv_modify_qp(qp, &a, mask) == 0, "ibv_modify_qp(INIT)");
	a.qp_state = IBV_QPS_RTR;
	CHECK(rdma_init_qp_attr(id, &a, &mask) == 0, "rdma_init_qp_attr(RTR)");
	CHECK(ibv_modify_qp(qp, &a, mask) == 0, "ibv_modify_qp(RTR): a no-op, as kernel siw");
	a.qp_state = IBV_QPS_RTS;
	CHECK(rdma_init_qp_attr(id, &a, &mask) == 0, "rdma_init_qp_attr(RTS)");
	if (connected) {
		CHECK(mask == IBV_QP_PORT, "RTS of an id with an iWARP CM id: IBV_QP_PORT only");
		CHECK(ibv_modify_qp(qp, &a, mask) == 0, "ibv_modify_qp(RTS attributes)");
	} else {
		CHECK(mask == (IBV_QP_STATE | IBV_QP_ACCESS_FLAGS | IBV_QP_PORT),
		      "RTS before the connect: the state asked");
		CHECK(ibv_modify_qp(qp, &a, mask) == EINVAL && qp_state(qp) == IBV_QPS_INIT,
		      "to RTS with no connection: EINVAL (siw: no socket), still INIT");
	}
}

static struct sockaddr_in addr_of(const char *ip, const char *port)
{
	struct sockaddr_in a;
	memset(&a, 0, sizeof a);
	a.sin_family = AF_INET;
	a.sin_port = htons((uint16_t)atoi(port));
	inet_pton(AF_INET, ip, &a.sin_addr);
	return a;
}

static struct ibv_qp *own_qp(struct rdma_cm_id *id, struct ibv_pd **pd, struct ibv_cq **cq)
{
	*pd = ibv_alloc_pd(id->verbs);
	CHECK(*pd, "ibv_alloc_pd(id->verbs)");
	*cq = ibv_create_cq(id->verbs, 64, NULL, NULL, 0);
	CHECK(*cq, "ibv_create_cq");
	struct ibv_qp_init_attr qa = { .send_cq = *cq, .recv_cq = *cq, .qp_type = IBV_QPT_RC,
				       .cap = { .max_send_wr = 16, .max_recv_wr = 16,
						.max_send_sge = 1, .max_recv_sge = 1 } };
	struct ibv_qp *qp = ibv_create_qp(*pd, &qa);
	CHECK(qp, "ibv_create_qp");
	CHECK(qp_state(qp) == IBV_QPS_INIT, "a QP from ibv_create_qp starts in INIT");
	return qp;
}

static void cm_qp_checks(struct rdma_cm_id *id, struct ibv_qp_init_attr *qa)
{
	CHECK(id->qp && id->pd && id->qp->pd == id->pd, "id->pd: the default PD, the QP's");
	CHECK(id->send_cq && id->recv_cq && id->send_cq_channel && id->recv_cq_channel,
	      "the CM made both CQs and their completion channels");
	CHECK(qa->send_cq == id->send_cq && qa->recv_cq == id->recv_cq &&
		      id->qp->send_cq == id->send_cq && id->qp->recv_cq == id->recv_cq,
	      "the attr and the QP name the CM's CQs");
	CHECK(id->send_cq->cq_context == id && id->recv_cq->channel == id->recv_cq_channel,
	      "CQ context: the id; each CQ on its channel");
	CHECK(qa->cap.max_send_wr >= 4 && qa->cap.max_recv_wr >= 4, "capabilities written back");
}

static void cm_qp_destroyed(struct rdma_cm_id *id)
{
	struct ibv_cq *cq = id->send_cq;
	rdma_destroy_qp(id);
	CHECK(!id->qp && !id->send_cq && !id->recv_cq && !id->send_cq_channel &&
		      !id->recv_cq_channel,
	      "rdma_destroy_qp clears the QP, CQs and channels");
	errno = 0;
	CHECK(ibv_destroy_cq(cq) == EINVAL, "the CM's CQ was destroyed with the QP");
}

static int server(const char *port)
{
	struct rdma_cm_id *listen, *id;
	CHECK(rdma_create_id(NULL, &listen, NULL, RDMA_PS_TCP) == 0, "rdma_create_id(NULL channel)");
	struct sockaddr_in a = addr_of("0.0.0.0", port);
	CHECK(rdma_bind_addr(listen, (struct sockaddr *)&a) == 0, "rdma_bind_addr");
	CHECK(rdma_listen(listen, 4) == 0, "rdma_listen");
	printf("listening\n");
	fflush(stdout);

	/* 1. A QP from ibv_create_qp, named by qp_num at accept. */
	CHECK(rdma_get_request(listen, &id) == 0, "rdma_get_request");
	CHECK(id->event && id->event->event == RDMA_CM_EVENT_CONNECT_REQUEST &&
		      id->event->listen_id == listen && !id->qp,
	      "the new id holds its request, and has no QP");
	struct ibv_pd *pd;
	struct ibv_cq *cq;
	struct ibv_qp *qp = own_qp(id, &pd, &cq);
	self_modify(id, qp, 1);
	CHECK(qp_state(qp) == IBV_QPS_INIT, "still INIT before the accept (siw: idle)");
	static char buf[5][MSG];
	struct ibv_mr *mr = ibv_reg_mr(pd, buf, sizeof buf, IBV_ACCESS_LOCAL_WRITE);
	CHECK(mr, "ibv_reg_mr");
	for (int i = 0; i < 4; i++)
		post_recv(qp, mr, buf[i], 100 + i);
	struct rdma_conn_param p = { .responder_resources = 1, .initiator_depth = 1,
				     .qp_num = qp->qp_num };
	struct rdma_conn_param nop = { .qp_num = 0xabcdef };
	CHECK(rdma_accept(id, &nop) == -1 && errno == EINVAL, "rdma_accept naming no QP: EINVAL");
	CHECK(rdma_accept(id, &p) == 0, "rdma_accept(conn_param.qp_num)");
	CHECK(id->event && id->event->event == RDMA_CM_EVENT_ESTABLISHED && !id->qp,
	      "synchronous accept: ESTABLISHED in id->event; id->qp stays NULL");
	CHECK(qp_state(qp) == IBV_QPS_RTS, "the named QP is in RTS");
	struct ibv_wc wc[8];
	poll_n(cq, wc, 1, 1, "the client's Send");
	CHECK(wc[0].status == IBV_WC_SUCCESS && wc[0].wr_id == 100 && wc[0].byte_len == MSG &&
		      !memcmp(buf[0], "client says hi.", MSG),
	      "received the client's 16 bytes");
	memcpy(buf[4], "server answers.", MSG);
	post_send(qp, mr, buf[4], 200);
	poll_n(cq, wc, 1, 0, "the answer's Send");
	CHECK(wc[0].status == IBV_WC_SUCCESS && wc[0].wr_id == 200, "answer sent");
	/* The client moves its QP to ERR and disconnects: DISCONNECTED, and the 3
	 * receives still posted here are flushed. */
	struct rdma_cm_event *ev;
	CHECK(rdma_get_cm_event(id->channel, &ev) == 0 && ev->event == RDMA_CM_EVENT_DISCONNECTED,
	      "DISCONNECTED on the id's own channel");
	rdma_ack_cm_event(ev);
	poll_n(cq, wc, 3, 1, "the receives flushed by the disconnect");
	for (int i = 0; i < 3; i++)
		CHECK(wc[i].status == IBV_WC_WR_FLUSH_ERR && wc[i].wr_id == (uint64_t)(101 + i),
		      "a posted receive flushed, in order");
	CHECK(qp_state(qp) == IBV_QPS_ERR, "the QP is in ERR after the disconnect");
	CHECK(rdma_disconnect(id) == 0, "rdma_disconnect after the peer's");
	CHECK(ibv_destroy_qp(qp) == 0, "ibv_destroy_qp");
	CHECK(rdma_destroy_id(id) == 0, "rdma_destroy_id (acks id->event)");
	ibv_dereg_mr(mr);
	ibv_destroy_cq(cq);
	ibv_dealloc_pd(pd);

	/* 2. rdma_create_qp(NULL PD, no CQs) and the rdma_verbs.h helpers. */
	CHECK(rdma_get_request(listen, &id) == 0, "rdma_get_request (2)");
	struct ibv_qp_init_attr qa = { .qp_type = IBV_QPT_RC,
				       .cap = { .max_send_wr = 4, .max_recv_wr = 4,
						.max_send_sge = 1, .max_recv_sge = 1 } };
	CHECK(rdma_create_qp(id, NULL, &qa) == 0, "rdma_create_qp(id, NULL, no CQs)");
	cm_qp_checks(id, &qa);
	static struct keys msg;
	static char local[2][MSG];
	struct ibv_mr *m2 = rdma_reg_msgs(id, &msg, sizeof msg), *ml = rdma_reg_msgs(id, local, sizeof local);
	CHECK(m2 && ml && m2->pd == id->pd, "rdma_reg_msgs on id->pd");
	CHECK(rdma_post_recv(id, (void *)7, &msg, sizeof msg, m2) == 0, "rdma_post_recv");
	CHECK(rdma_accept(id, NULL) == 0, "rdma_accept(NULL)");
	CHECK(rdma_get_recv_comp(id, wc) == 1 && wc[0].status == IBV_WC_SUCCESS && wc[0].wr_id == 7 &&
		      wc[0].byte_len == sizeof msg && !memcmp(msg.text, "second connect.", MSG),
	      "rdma_get_recv_comp: the client's message and keys");
	memcpy(local[0], "written by srv.", MSG);
	CHECK(rdma_post_write(id, NULL, local[0], MSG, ml, IBV_SEND_SIGNALED, msg.waddr, msg.wkey) == 0,
	      "rdma_post_write to the client's rdma_reg_write buffer");
	CHECK(rdma_get_send_comp(id, wc) == 1 && wc[0].status == IBV_WC_SUCCESS &&
		      wc[0].opcode == IBV_WC_RDMA_WRITE,
	      "rdma_get_send_comp: the Write");
	CHECK(rdma_post_read(id, NULL, local[1], MSG, ml, IBV_SEND_SIGNALED, msg.raddr, msg.rkey) == 0,
	      "rdma_post_read from the client's rdma_reg_read buffer");
	CHECK(rdma_get_send_comp(id, wc) == 1 && wc[0].status == IBV_WC_SUCCESS &&
		      wc[0].opcode == IBV_WC_RDMA_READ && !memcmp(local[1], "read by server.", MSG),
	      "rdma_get_send_comp: the Read, and its bytes");
	CHECK(rdma_post_send(id, NULL, &msg, sizeof msg, m2, IBV_SEND_SIGNALED) == 0, "rdma_post_send");
	CHECK(rdma_get_send_comp(id, wc) == 1 && wc[0].status == IBV_WC_SUCCESS,
	      "rdma_get_send_comp");
	CHECK(rdma_disconnect(id) == 0, "synchronous rdma_disconnect");
	CHECK(id->event && id->event->event == RDMA_CM_EVENT_DISCONNECTED, "DISCONNECTED in id->event");
	rdma_dereg_mr(m2);
	rdma_dereg_mr(ml);
	cm_qp_destroyed(id);
	CHECK(rdma_destroy_id(id) == 0, "rdma_destroy_id (2)");
	CHECK(rdma_destroy_id(listen) == 0, "rdma_destroy_id(listener)");
	printf("done\n");
	return 0;
}

static int client(const char *ip, const char *port)
{
	struct rdma_cm_id *id;
	struct sockaddr_in a = addr_of(ip, port);

	/* What iWARP has no: one warning line each kind, and the errno. */
	CHECK(rdma_create_id(NULL, &id, NULL, RDMA_PS_UDP) == -1 && errno == EPROTONOSUPPORT,
	      "rdma_create_id(RDMA_PS_UDP): EPROTONOSUPPORT");

	/* 1. A QP from ibv_create_qp, named by qp_num at connect. */
	CHECK(rdma_create_id(NULL, &id, NULL, RDMA_PS_TCP) == 0, "rdma_create_id(NULL channel)");
	CHECK(rdma_resolve_addr(id, NULL, (struct sockaddr *)&a, 2000) == 0, "rdma_resolve_addr");
	CHECK(id->event && id->event->event == RDMA_CM_EVENT_ADDR_RESOLVED,
	      "synchronous: ADDR_RESOLVED in id->event");
	CHECK(rdma_resolve_route(id, 2000) == 0 && id->event->event == RDMA_CM_EVENT_ROUTE_RESOLVED,
	      "rdma_resolve_route");
	CHECK(id->pd != NULL, "the resolved id has its device's default PD");
	struct ibv_pd *pd;
	struct ibv_cq *cq;
	struct ibv_qp *qp = own_qp(id, &pd, &cq);
	struct ibv_qp_init_attr ud = { .send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_UD,
				       .cap = { .max_send_wr = 1, .max_recv_wr = 1,
						.max_send_sge = 1, .max_recv_sge = 1 } };
	errno = 0;
	CHECK(!ibv_create_qp(pd, &ud) && errno == EOPNOTSUPP, "ibv_create_qp(UD): EOPNOTSUPP");
	self_modify(id, qp, 0);
	static char buf[11][MSG];
	struct ibv_mr *mr = ibv_reg_mr(pd, buf, sizeof buf, IBV_ACCESS_LOCAL_WRITE);
	CHECK(mr, "ibv_reg_mr");
	post_recv(qp, mr, buf[0], 1);
	struct rdma_conn_param p = { .responder_resources = 1, .initiator_depth = 1,
				     .qp_num = qp->qp_num };
	CHECK(rdma_connect(id, NULL) == -1 && errno == EINVAL,
	      "rdma_connect(NULL) on an id without a QP: EINVAL");
	CHECK(rdma_connect(id, &p) == 0, "rdma_connect(conn_param.qp_num)");
	CHECK(id->event && id->event->event == RDMA_CM_EVENT_ESTABLISHED && !id->qp,
	      "synchronous connect: ESTABLISHED in id->event; id->qp stays NULL");
	CHECK(qp_state(qp) == IBV_QPS_RTS, "the named QP is in RTS");
	self_modify(id, qp, 1);
	CHECK(qp_state(qp) == IBV_QPS_RTS, "INIT/RTR/RTS attributes leave a connected QP in RTS");
	CHECK(rdma_establish(id) == 0, "rdma_establish: nothing left to do on iWARP");
	memcpy(buf[1], "client says hi.", MSG);
	post_send(qp, mr, buf[1], 2);
	struct ibv_wc wc[9];
	poll_n(cq, wc, 2, 1, "the Send and the answer");
	for (int i = 0; i < 2; i++)
		CHECK(wc[i].status == IBV_WC_SUCCESS && (wc[i].wr_id == 1 || wc[i].wr_id == 2),
		      "a completion of the exchange");
	CHECK(!memcmp(buf[0], "server answers.", MSG), "the server's answer");
	for (int i = 0; i < 8; i++)
		post_recv(qp, mr, buf[2 + i], 10 + i);
	struct ibv_qp_attr err = { .qp_state = IBV_QPS_ERR };
	CHECK(ibv_modify_qp(qp, &err, IBV_QP_STATE) == 0, "ibv_modify_qp(ERR)");
	CHECK(qp_state(qp) == IBV_QPS_ERR, "the QP is in ERR");
	poll_n(cq, wc, 8, 1, "the receives flushed by modify(ERR)");
	for (int i = 0; i < 8; i++)
		CHECK(wc[i].status == IBV_WC_WR_FLUSH_ERR && wc[i].wr_id == (uint64_t)(10 + i),
		      "a posted receive flushed, in order");
	post_send(qp, mr, buf[1], 20);
	poll_n(cq, wc, 1, 1, "a Send posted in ERR");
	CHECK(wc[0].status == IBV_WC_WR_FLUSH_ERR && wc[0].wr_id == 20, "a Send posted in ERR is flushed");
	CHECK(rdma_disconnect(id) == 0, "rdma_disconnect");
	CHECK(ibv_destroy_qp(qp) == 0, "ibv_destroy_qp");
	CHECK(rdma_destroy_id(id) == 0, "rdma_destroy_id");
	ibv_dereg_mr(mr);
	ibv_destroy_cq(cq);
	ibv_dealloc_pd(pd);

	/* 2. rdma_create_qp(NULL PD, no CQs) and the rdma_verbs.h helpers, on an id made on
	 * a channel and made synchronous by rdma_migrate_id(NULL). */
	struct rdma_event_channel *ch = rdma_create_event_channel();
	CHECK(ch, "rdma_create_event_channel");
	CHECK(rdma_create_id(ch, &id, NULL, RDMA_PS_TCP) == 0, "rdma_create_id (2)");
	CHECK(rdma_migrate_id(id, NULL) == 0 && id->channel && id->channel != ch,
	      "rdma_migrate_id(NULL): a channel of its own");
	CHECK(rdma_migrate_id(id, NULL) == -1 && errno == EINVAL,
	      "rdma_migrate_id(NULL) of a synchronous id: EINVAL");
	CHECK(rdma_resolve_addr(id, NULL, (struct sockaddr *)&a, 2000) == 0, "rdma_resolve_addr (2)");
	CHECK(rdma_resolve_route(id, 2000) == 0, "rdma_resolve_route (2)");
	struct ibv_qp_init_attr qa = { .qp_type = IBV_QPT_RC,
				       .cap = { .max_send_wr = 4, .max_recv_wr = 4,
						.max_send_sge = 1, .max_recv_sge = 1 } };
	CHECK(rdma_create_qp(id, NULL, &qa) == 0, "rdma_create_qp(id, NULL, no CQs)");
	cm_qp_checks(id, &qa);
	static struct keys msg, ans;
	static char wbuf[MSG], rbuf[MSG] = "read by server.";
	struct ibv_mr *m2 = rdma_reg_msgs(id, &msg, sizeof msg), *m3 = rdma_reg_msgs(id, &ans, sizeof ans);
	struct ibv_mr *mw = rdma_reg_write(id, wbuf, MSG), *mrd = rdma_reg_read(id, rbuf, MSG);
	CHECK(m2 && m3 && mw && mrd, "rdma_reg_msgs, rdma_reg_write, rdma_reg_read");
	CHECK(rdma_post_recv(id, NULL, &ans, sizeof ans, m3) == 0, "rdma_post_recv");
	CHECK(rdma_connect(id, NULL) == 0, "rdma_connect(NULL) with the CM's QP");
	memcpy(msg.text, "second connect.", MSG);
	msg.waddr = (uintptr_t)wbuf;
	msg.wkey = mw->rkey;
	msg.raddr = (uintptr_t)rbuf;
	msg.rkey = mrd->rkey;
	CHECK(rdma_post_send(id, (void *)9, &msg, sizeof msg, m2, IBV_SEND_SIGNALED) == 0, "rdma_post_send");
	CHECK(rdma_get_send_comp(id, wc) == 1 && wc[0].status == IBV_WC_SUCCESS && wc[0].wr_id == 9,
	      "rdma_get_send_comp");
	CHECK(rdma_get_recv_comp(id, wc) == 1 && wc[0].status == IBV_WC_SUCCESS &&
		      !memcmp(&ans, &msg, sizeof msg),
	      "rdma_get_recv_comp: the echo");
	CHECK(!memcmp(wbuf, "written by srv.", MSG), "the server's RDMA Write, placed before its echo");
	/* Back to a channel of the program's: the disconnect returns at once, and its
	 * event comes on that channel. */
	CHECK(rdma_migrate_id(id, ch) == 0 && id->channel == ch, "rdma_migrate_id(ch)");
	CHECK(rdma_disconnect(id) == 0, "rdma_disconnect (asynchronous again)");
	struct rdma_cm_event *ev;
	CHECK(rdma_get_cm_event(ch, &ev) == 0 && ev->event == RDMA_CM_EVENT_DISCONNECTED &&
		      ev->id == id,
	      "DISCONNECTED on the channel it moved to");
	rdma_ack_cm_event(ev);
	rdma_dereg_mr(m2);
	rdma_dereg_mr(m3);
	rdma_dereg_mr(mw);
	rdma_dereg_mr(mrd);
	cm_qp_destroyed(id);
	CHECK(rdma_destroy_id(id) == 0, "rdma_destroy_id (2)");
	rdma_destroy_event_channel(ch);
	printf("done\n");
	return 0;
}

int main(int argc, char **argv)
{
	setvbuf(stdout, NULL, _IOLBF, 0);
	if (argc == 3 && !strcmp(argv[1], "server"))
		return server(argv[2]);
	if (argc == 4 && !strcmp(argv[1], "client"))
		return client(argv[2], argv[3]);
	fprintf(stderr, "usage: outside_cm server PORT | client ADDR PORT\n");
	return 2;
}
