/*
 * A C program that misuses libsoftiwarp the way buggy RDMA programs do, built with
 * -fsanitize=address and run by tests/misuse.rs. Every call's return value (and errno,
 * where the call reports through errno) is checked against what the man pages say;
 * one line per check, exit 1 on any mismatch. AddressSanitizer must report nothing:
 * a destroyed object's handle is EINVAL, never a use of freed memory.
 *
 * argv[1]: an IPv4 address on the device's link that nobody answers (ADDR_ERROR).
 * The device comes from SOFTIWARP_DEVICE (one end of a UDP link, no peer needed: the
 * WRs here complete by flushing).
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <poll.h>
#include <sys/resource.h>
#include <arpa/inet.h>
#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>

static int failures;

static void line(int ok, const char *what, long ret, int err, const char *want)
{
	printf("%s %s: ret=%ld errno=%d (want %s)\n", ok ? "ok  " : "FAIL", what, ret, err,
	       want);
	fflush(stdout);
	if (!ok)
		failures++;
}

/* A call that returns an errno value (ibv_dealloc_pd, ibv_destroy_qp, ...). */
#define EXPECT_RET(what, expr, want)                                                  \
	do {                                                                          \
		errno = 0;                                                            \
		long r_ = (long)(expr);                                               \
		int e_ = errno;                                                       \
		line(r_ == (long)(want), what, r_, e_, "ret " #want);                 \
	} while (0)

/* A call that returns -1 (or another failure value) and sets errno. */
#define EXPECT_ERR(what, expr, want_ret, want_errno)                                  \
	do {                                                                          \
		errno = 0;                                                            \
		long r_ = (long)(expr);                                               \
		int e_ = errno;                                                       \
		line(r_ == (long)(want_ret) && e_ == (want_errno), what, r_, e_,      \
		     "ret " #want_ret ", errno " #want_errno);                        \
	} while (0)

/* A call that returns a pointer: NULL with errno. */
#define EXPECT_NULL(what, expr, want_errno)                                           \
	do {                                                                          \
		errno = 0;                                                            \
		void *p_ = (void *)(expr);                                            \
		int e_ = errno;                                                       \
		line(p_ == NULL && e_ == (want_errno), what, (long)(uintptr_t)p_, e_, \
		     "NULL, errno " #want_errno);                                     \
	} while (0)

/* Something that must hold. */
#define EXPECT(what, cond)                                                            \
	do {                                                                          \
		int c_ = !!(cond);                                                    \
		line(c_, what, c_, errno, "true");                                    \
	} while (0)

/* A setup step that must succeed; nothing after it makes sense otherwise. */
#define MUST(what, cond)                                                              \
	do {                                                                          \
		if (!(cond)) {                                                        \
			printf("FAIL %s: setup failed (errno %d)\n", what, errno);    \
			return 1;                                                     \
		}                                                                     \
	} while (0)

static double now(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec + t.tv_nsec / 1e9;
}

static int set_qp_state(struct ibv_qp *qp, enum ibv_qp_state s)
{
	struct ibv_qp_attr a;
	memset(&a, 0, sizeof a);
	a.qp_state = s;
	return ibv_modify_qp(qp, &a, IBV_QP_STATE);
}

/* Polls until a negative return or `limit` seconds; counts the WCs taken and how many
 * of them were flushed. Returns the last poll's value. */
static int poll_until_error(struct ibv_cq *cq, double limit, int *taken, int *flushed)
{
	struct ibv_wc wc[16];
	double end = now() + limit;
	int n = 0;
	*taken = *flushed = 0;
	while (now() < end) {
		n = ibv_poll_cq(cq, 16, wc);
		if (n < 0)
			return n;
		for (int i = 0; i < n; i++)
			*flushed += wc[i].status == IBV_WC_WR_FLUSH_ERR;
		*taken += n;
		if (n == 0)
			usleep(1000);
	}
	return n;
}

/* The next CM event on `ch`, or NULL after 10 s. */
static struct rdma_cm_event *next_event(struct rdma_event_channel *ch)
{
	struct rdma_cm_event *ev = NULL;
	int fl = fcntl(ch->fd, F_GETFL);
	fcntl(ch->fd, F_SETFL, fl | O_NONBLOCK);
	double end = now() + 10;
	while (now() < end) {
		if (rdma_get_cm_event(ch, &ev) == 0)
			return ev;
		usleep(2000);
	}
	return NULL;
}

static int resolve(struct rdma_cm_id *id, const char *ip)
{
	struct sockaddr_in dst;
	memset(&dst, 0, sizeof dst);
	dst.sin_family = AF_INET;
	dst.sin_port = htons(7471);
	inet_pton(AF_INET, ip, &dst.sin_addr);
	return rdma_resolve_addr(id, NULL, (struct sockaddr *)&dst, 200);
}

struct late_ack {
	struct rdma_event_channel *ch;
	struct rdma_cm_event *ev;
	volatile int got, acked;
};

/* Takes the next event on its own thread, holds it 300 ms, acks it. */
static void *take_and_ack_later(void *arg)
{
	struct late_ack *l = arg;
	l->ev = next_event(l->ch);
	l->got = 1;
	if (!l->ev)
		return NULL;
	usleep(300 * 1000);
	l->acked = 1;
	rdma_ack_cm_event(l->ev);
	return NULL;
}

static int verbs_misuse(void)
{
	int n = 0;
	struct ibv_device **list = ibv_get_device_list(&n);
	MUST("ibv_get_device_list", list && n == 1);
	struct ibv_context *ctx = ibv_open_device(list[0]);
	struct ibv_context *ctx2 = ibv_open_device(list[0]);
	MUST("ibv_open_device", ctx && ctx2);

	/* Objects of a context outlive its close (ibv_close_device(3): the resources are
	 * not released); the closed context is EINVAL, twice closed too. */
	struct ibv_pd *pd2 = ibv_alloc_pd(ctx2);
	MUST("ibv_alloc_pd", pd2);
	EXPECT_RET("ibv_close_device with a PD on it", ibv_close_device(ctx2), 0);
	EXPECT_ERR("ibv_close_device twice", ibv_close_device(ctx2), -1, EINVAL);
	EXPECT_NULL("ibv_alloc_pd on a closed context", ibv_alloc_pd(ctx2), EINVAL);
	struct ibv_device_attr da;
	EXPECT_RET("ibv_query_device on a closed context", ibv_query_device(ctx2, &da), EINVAL);
	EXPECT_NULL("ibv_create_cq on a closed context", ibv_create_cq(ctx2, 4, NULL, NULL, 0),
		    EINVAL);
	EXPECT_RET("ibv_dealloc_pd of a closed context's PD", ibv_dealloc_pd(pd2), 0);

	struct ibv_comp_channel *chan = ibv_create_comp_channel(ctx);
	struct ibv_cq *cq = ibv_create_cq(ctx, 4, (void *)0x1234, chan, 0);
	struct ibv_cq *scq = ibv_create_cq(ctx, 256, NULL, NULL, 0);
	struct ibv_pd *pd = ibv_alloc_pd(ctx);
	MUST("channel, CQs, PD", chan && cq && scq && pd);
	EXPECT("a tiny CQ has at least the entries asked for", cq->cqe >= 4);
	static char buf[4096];
	struct ibv_mr *mr = ibv_reg_mr(pd, buf, sizeof buf, IBV_ACCESS_LOCAL_WRITE);
	MUST("ibv_reg_mr", mr);
	int depth = cq->cqe + 8; /* more WRs than the receive CQ holds */
	struct ibv_qp_init_attr ia;
	memset(&ia, 0, sizeof ia);
	ia.send_cq = scq;
	ia.recv_cq = cq;
	ia.cap.max_send_wr = 16;
	ia.cap.max_recv_wr = depth;
	ia.cap.max_send_sge = 1;
	ia.cap.max_recv_sge = 1;
	ia.qp_type = IBV_QPT_RC;
	struct ibv_qp *qp = ibv_create_qp(pd, &ia);
	MUST("ibv_create_qp", qp);

	/* Destroy in use. */
	EXPECT_RET("ibv_dealloc_pd with an MR and a QP on it", ibv_dealloc_pd(pd), EBUSY);
	EXPECT_RET("ibv_destroy_cq with a QP on it", ibv_destroy_cq(cq), EBUSY);
	EXPECT_RET("ibv_destroy_cq (send CQ) with a QP on it", ibv_destroy_cq(scq), EBUSY);
	EXPECT_RET("ibv_destroy_comp_channel with a CQ on it", ibv_destroy_comp_channel(chan),
		   EBUSY);

	/* A foreign handle (never ours) and a handle of another kind. */
	struct ibv_qp fake_qp;
	memset(&fake_qp, 0, sizeof fake_qp);
	fake_qp.context = ctx; /* the header inline reaches our post_send through it */
	struct ibv_cq fake_cq;
	memset(&fake_cq, 0, sizeof fake_cq);
	fake_cq.context = ctx;
	struct ibv_sge sge = { (uintptr_t)buf, 64, mr->lkey };
	struct ibv_send_wr swr, *sbad = NULL;
	memset(&swr, 0, sizeof swr);
	swr.wr_id = 1;
	swr.sg_list = &sge;
	swr.num_sge = 1;
	swr.opcode = IBV_WR_SEND;
	swr.send_flags = IBV_SEND_SIGNALED;
	struct ibv_wc wc[4];
	EXPECT_RET("ibv_post_send on a foreign QP", ibv_post_send(&fake_qp, &swr, &sbad), EINVAL);
	EXPECT_RET("ibv_destroy_qp of a foreign QP", ibv_destroy_qp(&fake_qp), EINVAL);
	EXPECT("ibv_poll_cq on a foreign CQ is negative", ibv_poll_cq(&fake_cq, 4, wc) < 0);
	EXPECT_RET("ibv_destroy_cq of a PD", ibv_destroy_cq((struct ibv_cq *)pd), EINVAL);
	EXPECT_RET("ibv_dealloc_pd of a QP", ibv_dealloc_pd((struct ibv_pd *)qp), EINVAL);
	EXPECT_RET("ibv_dereg_mr of a CQ", ibv_dereg_mr((struct ibv_mr *)cq), EINVAL);
	EXPECT_ERR("ibv_close_device of a PD", ibv_close_device((struct ibv_context *)pd), -1,
		   EINVAL);

	/* CQ overrun: more receives flush onto the CQ than it holds, nobody polling. */
	EXPECT_RET("ibv_modify_qp to INIT", set_qp_state(qp, IBV_QPS_INIT), 0);
	struct ibv_sge rsge = { (uintptr_t)buf, 64, mr->lkey };
	struct ibv_recv_wr *rwr = calloc(depth, sizeof *rwr), *rbad = NULL;
	for (int i = 0; i < depth; i++) {
		rwr[i].wr_id = 100 + i;
		rwr[i].sg_list = &rsge;
		rwr[i].num_sge = 1;
		rwr[i].next = i + 1 < depth ? &rwr[i + 1] : NULL;
	}
	EXPECT_RET("ibv_post_recv of cqe + 8 receives", ibv_post_recv(qp, rwr, &rbad), 0);
	free(rwr);
	EXPECT_RET("ibv_modify_qp to ERR (flushes them)", set_qp_state(qp, IBV_QPS_ERR), 0);
	int taken, flushed;
	int last = poll_until_error(cq, 5, &taken, &flushed);
	EXPECT("ibv_poll_cq is negative once the completions that fit are taken", last < 0);
	EXPECT("ibv_poll_cq returned exactly cqe completions before that", taken == cq->cqe);
	EXPECT("every completion taken was flushed", flushed == taken);
	EXPECT("ibv_poll_cq stays negative on the overrun CQ", ibv_poll_cq(cq, 4, wc) < 0);
	struct ibv_qp_attr qa;
	struct ibv_qp_init_attr qia;
	EXPECT_RET("ibv_query_qp after the overrun", ibv_query_qp(qp, &qa, IBV_QP_STATE, &qia), 0);
	EXPECT("the QP on the overrun CQ is in IBV_QPS_ERR", qa.qp_state == IBV_QPS_ERR);
	EXPECT_RET("ibv_post_send on the QP in ERR", ibv_post_send(qp, &swr, &sbad), 0);
	int got = 0;
	double end = now() + 5;
	while (got == 0 && now() < end)
		got = ibv_poll_cq(scq, 4, wc);
	EXPECT("the later send WR flushed onto the send CQ",
	       got == 1 && wc[0].wr_id == 1 && wc[0].status == IBV_WC_WR_FLUSH_ERR);

	/* The async event of the overrun (IBV_EVENT_CQ_ERR), taken without blocking. */
	int fl = fcntl(ctx->async_fd, F_GETFL);
	fcntl(ctx->async_fd, F_SETFL, fl | O_NONBLOCK);
	struct ibv_async_event ae;
	int cq_err = 0;
	end = now() + 5;
	while (now() < end) {
		if (ibv_get_async_event(ctx, &ae) == 0) {
			if (ae.event_type == IBV_EVENT_CQ_ERR && ae.element.cq == cq)
				cq_err++;
			ibv_ack_async_event(&ae);
			if (cq_err)
				break;
		} else {
			usleep(2000);
		}
	}
	EXPECT("ibv_get_async_event delivered IBV_EVENT_CQ_ERR for the CQ", cq_err == 1);

	/* Double destroy and use after destroy, QP first. */
	EXPECT_RET("ibv_destroy_qp", ibv_destroy_qp(qp), 0);
	EXPECT_RET("ibv_destroy_qp twice", ibv_destroy_qp(qp), EINVAL);
	EXPECT_RET("ibv_post_send after destroy", ibv_post_send(qp, &swr, &sbad), EINVAL);
	struct ibv_recv_wr one = { .wr_id = 9, .sg_list = &rsge, .num_sge = 1 };
	EXPECT_RET("ibv_post_recv after destroy", ibv_post_recv(qp, &one, &rbad), EINVAL);
	EXPECT_RET("ibv_query_qp after destroy", ibv_query_qp(qp, &qa, IBV_QP_STATE, &qia), EINVAL);
	EXPECT_RET("ibv_modify_qp after destroy", set_qp_state(qp, IBV_QPS_ERR), EINVAL);
	EXPECT_RET("ibv_destroy_cq", ibv_destroy_cq(cq), 0);
	EXPECT_RET("ibv_destroy_cq twice", ibv_destroy_cq(cq), EINVAL);
	EXPECT("ibv_poll_cq after destroy is negative", ibv_poll_cq(cq, 4, wc) < 0);
	EXPECT_RET("ibv_req_notify_cq after destroy", ibv_req_notify_cq(cq, 0), EINVAL);
	EXPECT_RET("ibv_destroy_cq (send CQ)", ibv_destroy_cq(scq), 0);
	EXPECT_RET("ibv_destroy_comp_channel", ibv_destroy_comp_channel(chan), 0);
	EXPECT_RET("ibv_destroy_comp_channel twice", ibv_destroy_comp_channel(chan), EINVAL);
	struct ibv_cq *ev_cq;
	void *ev_ctx;
	EXPECT_ERR("ibv_get_cq_event after destroy", ibv_get_cq_event(chan, &ev_cq, &ev_ctx), -1,
		   EINVAL);
	EXPECT_RET("ibv_dereg_mr", ibv_dereg_mr(mr), 0);
	EXPECT_RET("ibv_dereg_mr twice", ibv_dereg_mr(mr), EINVAL);
	EXPECT_RET("ibv_dealloc_pd", ibv_dealloc_pd(pd), 0);
	EXPECT_RET("ibv_dealloc_pd twice", ibv_dealloc_pd(pd), EINVAL);
	EXPECT_NULL("ibv_reg_mr on a deallocated PD",
		    ibv_reg_mr(pd, buf, sizeof buf, IBV_ACCESS_LOCAL_WRITE), EINVAL);
	EXPECT_NULL("ibv_create_qp on a deallocated PD", ibv_create_qp(pd, &ia), EINVAL);
	EXPECT_RET("ibv_close_device", ibv_close_device(ctx), 0);
	EXPECT_ERR("ibv_close_device twice", ibv_close_device(ctx), -1, EINVAL);
	ibv_free_device_list(list);
	return 0;
}

static struct ibv_context *open_device(void)
{
	int n = 0;
	struct ibv_device **list = ibv_get_device_list(&n);
	struct ibv_context *ctx = list && n == 1 ? ibv_open_device(list[0]) : NULL;
	ibv_free_device_list(list);
	return ctx;
}

static struct ibv_qp *make_qp(struct ibv_pd *pd, struct ibv_cq *cq, struct ibv_qp_init_attr *ia)
{
	memset(ia, 0, sizeof *ia);
	ia->send_cq = cq;
	ia->recv_cq = cq;
	ia->cap.max_send_wr = 16;
	ia->cap.max_recv_wr = 16;
	ia->cap.max_send_sge = 1;
	ia->cap.max_recv_sge = 1;
	ia->cap.max_inline_data = 64;
	ia->qp_type = IBV_QPT_RC;
	return ibv_create_qp(pd, ia);
}

/* Polls `cq` until `want` WCs were taken or 5 s passed; counts the flushed ones. */
static int poll_n(struct ibv_cq *cq, int want, int *flushed)
{
	struct ibv_wc wc[16];
	int taken = 0;
	double end = now() + 5;
	*flushed = 0;
	while (taken < want && now() < end) {
		int n = ibv_poll_cq(cq, 16, wc);
		if (n < 0)
			break;
		for (int i = 0; i < n; i++)
			*flushed += wc[i].status == IBV_WC_WR_FLUSH_ERR;
		taken += n;
		if (n == 0)
			usleep(1000);
	}
	return taken;
}

/* A context with a PD, an optional completion channel, a CQ, an MR over `buf` and an RC
 * QP in INIT: what a test posts on. */
struct rig {
	struct ibv_context *ctx;
	struct ibv_pd *pd;
	struct ibv_comp_channel *ch;
	struct ibv_cq *cq;
	struct ibv_mr *mr;
	struct ibv_qp *qp;
	struct ibv_qp_init_attr ia;
};

static int rig_up(struct rig *g, int channel, int cqe, char *buf, size_t len)
{
	memset(g, 0, sizeof *g);
	g->ctx = open_device();
	MUST("ibv_open_device", g->ctx);
	g->pd = ibv_alloc_pd(g->ctx);
	g->ch = channel ? ibv_create_comp_channel(g->ctx) : NULL;
	MUST("PD, channel", g->pd && (g->ch || !channel));
	g->cq = ibv_create_cq(g->ctx, cqe, NULL, g->ch, 0);
	g->mr = ibv_reg_mr(g->pd, buf, len, IBV_ACCESS_LOCAL_WRITE);
	MUST("CQ, MR", g->cq && g->mr);
	g->qp = make_qp(g->pd, g->cq, &g->ia);
	MUST("ibv_create_qp", g->qp);
	EXPECT_RET("ibv_modify_qp to INIT", set_qp_state(g->qp, IBV_QPS_INIT), 0);
	return 0;
}

static void rig_down(struct rig *g)
{
	EXPECT_RET("ibv_destroy_qp", ibv_destroy_qp(g->qp), 0);
	EXPECT_RET("ibv_destroy_cq", ibv_destroy_cq(g->cq), 0);
	if (g->ch)
		EXPECT_RET("ibv_destroy_comp_channel", ibv_destroy_comp_channel(g->ch), 0);
	EXPECT_RET("ibv_dereg_mr", ibv_dereg_mr(g->mr), 0);
	EXPECT_RET("ibv_dealloc_pd", ibv_dealloc_pd(g->pd), 0);
	EXPECT_RET("ibv_close_device", ibv_close_device(g->ctx), 0);
}

/* Counts and lists that do not fit: a negative or too large num_sge, inline data
 * beyond max_inline_data, misaligned pointers, a cyclic WR list. Each is an error with
 * *bad_wr naming the WR, never an abort, a read past the array, or a list followed
 * forever. */
static int post_misuse(void)
{
	static char buf[4096];
	struct rig g;
	if (rig_up(&g, 0, 256, buf, sizeof buf))
		return 1;
	struct ibv_qp *qp = g.qp;
	struct ibv_cq *cq = g.cq;
	struct ibv_mr *mr = g.mr;
	int sdepth = g.ia.cap.max_send_wr, rdepth = g.ia.cap.max_recv_wr;

	struct ibv_sge sge = { (uintptr_t)buf, 64, mr->lkey };
	struct ibv_recv_wr r, *rbad = NULL;
	memset(&r, 0, sizeof r);
	r.wr_id = 1;
	r.sg_list = &sge;
	r.num_sge = -1;
	EXPECT_RET("ibv_post_recv with num_sge -1", ibv_post_recv(qp, &r, &rbad), EINVAL);
	EXPECT("... names the WR in bad_wr", rbad == &r);
	r.num_sge = 2; /* above max_recv_sge, and the array has one */
	rbad = NULL;
	EXPECT_RET("ibv_post_recv with num_sge above max_recv_sge", ibv_post_recv(qp, &r, &rbad),
		   EINVAL);
	EXPECT("... names the WR in bad_wr", rbad == &r);
	r.num_sge = 1;
	r.sg_list = (struct ibv_sge *)(buf + 1);
	rbad = NULL;
	EXPECT_RET("ibv_post_recv with a misaligned sg_list", ibv_post_recv(qp, &r, &rbad), EINVAL);
	EXPECT("... names the WR in bad_wr", rbad == &r);

	struct ibv_send_wr sw, *sbad = NULL;
	memset(&sw, 0, sizeof sw);
	sw.wr_id = 2;
	sw.sg_list = &sge;
	sw.num_sge = -1;
	sw.opcode = IBV_WR_SEND;
	sw.send_flags = IBV_SEND_SIGNALED;
	EXPECT_RET("ibv_post_send with num_sge -1", ibv_post_send(qp, &sw, &sbad), EINVAL);
	EXPECT("... names the WR in bad_wr", sbad == &sw);
	sw.num_sge = 2;
	sbad = NULL;
	EXPECT_RET("ibv_post_send with num_sge above max_send_sge", ibv_post_send(qp, &sw, &sbad),
		   EINVAL);
	EXPECT("... names the WR in bad_wr", sbad == &sw);
	struct ibv_sge huge = { (uintptr_t)buf, 1u << 30, mr->lkey };
	sw.sg_list = &huge;
	sw.num_sge = 1;
	sw.send_flags = IBV_SEND_SIGNALED | IBV_SEND_INLINE;
	sbad = NULL;
	EXPECT_RET("ibv_post_send of 1 GiB inline (refused before it is read)",
		   ibv_post_send(qp, &sw, &sbad), EINVAL);
	EXPECT("... names the WR in bad_wr", sbad == &sw);
	sw.sg_list = &sge;
	sw.send_flags = IBV_SEND_SIGNALED;

	/* A list whose second WR is misaligned: the first is posted. */
	struct ibv_recv_wr good;
	memset(&good, 0, sizeof good);
	good.wr_id = 3;
	good.sg_list = &sge;
	good.num_sge = 1;
	good.next = (struct ibv_recv_wr *)(buf + 1);
	rbad = NULL;
	EXPECT_RET("ibv_post_recv of a list with a misaligned next", ibv_post_recv(qp, &good, &rbad),
		   EINVAL);
	EXPECT("... names the misaligned WR in bad_wr", (char *)rbad == buf + 1);

	/* A cyclic list: what fits in the queue is posted, then ENOMEM at the first WR
	 * that does not fit (one receive is outstanding already). */
	struct ibv_recv_wr cyc;
	memset(&cyc, 0, sizeof cyc);
	cyc.wr_id = 4;
	cyc.sg_list = &sge;
	cyc.num_sge = 1;
	cyc.next = &cyc;
	rbad = NULL;
	EXPECT_RET("ibv_post_recv of a cyclic list", ibv_post_recv(qp, &cyc, &rbad), ENOMEM);
	EXPECT("... names the WR in bad_wr", rbad == &cyc);
	EXPECT_RET("ibv_modify_qp to ERR (flushes them)", set_qp_state(qp, IBV_QPS_ERR), 0);
	int flushed, taken = poll_n(cq, rdepth + 1, &flushed);
	EXPECT("exactly max_recv_wr receives were posted and flushed",
	       taken == rdepth && flushed == rdepth);
	/* In ERR a send queue takes any number (each completes at once, flushed): the
	 * list is cut at the queue's depth. */
	struct ibv_send_wr scyc = sw;
	scyc.next = &scyc;
	sbad = NULL;
	EXPECT_RET("ibv_post_send of a cyclic list on a QP in ERR", ibv_post_send(qp, &scyc, &sbad),
		   ENOMEM);
	EXPECT("... names the WR in bad_wr", sbad == &scyc);
	taken = poll_n(cq, sdepth + 1, &flushed);
	EXPECT("exactly max_send_wr sends were posted and flushed",
	       taken == sdepth && flushed == sdepth);
	struct ibv_wc wc[2];
	EXPECT_ERR("ibv_poll_cq with num_entries -1", ibv_poll_cq(cq, -1, wc), -1, EINVAL);
	rig_down(&g);
	return 0;
}

enum race_kind { CQ_ON_CHANNEL, QP_ON_CQ, QP_ON_PD };

struct race {
	pthread_barrier_t bar;
	enum race_kind kind;
	struct ibv_context *ctx;
	struct ibv_comp_channel *ch;
	struct ibv_cq *cq;
	struct ibv_pd *pd;
	void *made;
};

static void *race_create(void *arg)
{
	struct race *r = arg;
	struct ibv_qp_init_attr ia;
	pthread_barrier_wait(&r->bar);
	if (r->kind == CQ_ON_CHANNEL)
		r->made = ibv_create_cq(r->ctx, 16, NULL, r->ch, 0);
	else
		r->made = make_qp(r->pd, r->cq, &ia);
	return NULL;
}

/* Destroys `what` until it is gone (EBUSY: a QP destroyed just before is still being
 * flushed). */
#define DESTROY_UNTIL_GONE(call)                                                      \
	do {                                                                          \
		double end_ = now() + 5;                                              \
		while ((call) == EBUSY && now() < end_)                               \
			usleep(1000);                                                 \
	} while (0)

/* The creation of a child (a CQ on a channel, a QP on a CQ or PD) racing the destroy
 * of its parent on another thread: one of them fails, never both succeed. Returns how
 * many rounds both succeeded. */
static int create_racing_destroy(struct ibv_context *ctx, enum race_kind kind, int rounds)
{
	struct race r;
	memset(&r, 0, sizeof r);
	r.ctx = ctx;
	r.kind = kind;
	pthread_barrier_init(&r.bar, NULL, 2);
	int both = 0;
	for (int i = 0; i < rounds; i++) {
		r.made = NULL;
		r.ch = kind == CQ_ON_CHANNEL ? ibv_create_comp_channel(ctx) : NULL;
		r.pd = kind == CQ_ON_CHANNEL ? NULL : ibv_alloc_pd(ctx);
		r.cq = kind == CQ_ON_CHANNEL ? NULL : ibv_create_cq(ctx, 16, NULL, NULL, 0);
		pthread_t t;
		pthread_create(&t, NULL, race_create, &r);
		pthread_barrier_wait(&r.bar);
		for (volatile int k = 0; k < (i % 50) * 40; k++)
			;
		int d = kind == CQ_ON_CHANNEL ? ibv_destroy_comp_channel(r.ch) :
			kind == QP_ON_CQ      ? ibv_destroy_cq(r.cq) :
						ibv_dealloc_pd(r.pd);
		pthread_join(t, NULL);
		both += d == 0 && r.made;
		if (kind == CQ_ON_CHANNEL) {
			if (r.made)
				ibv_destroy_cq(r.made);
			if (d)
				DESTROY_UNTIL_GONE(ibv_destroy_comp_channel(r.ch));
		} else {
			if (r.made)
				ibv_destroy_qp(r.made);
			if (d || kind == QP_ON_PD)
				DESTROY_UNTIL_GONE(ibv_destroy_cq(r.cq));
			if (d || kind == QP_ON_CQ)
				DESTROY_UNTIL_GONE(ibv_dealloc_pd(r.pd));
		}
	}
	pthread_barrier_destroy(&r.bar);
	return both;
}

struct worker {
	struct ibv_cq *volatile cq;
	struct ibv_pd *pd;
	char *buf;
	volatile int stop;
	int calls, negative, bad;
};

/* Calls on the current CQ (and PD) until told to stop. With a PD: polls, arms and
 * registers on objects whose destroys another thread has refused, and every call must
 * succeed. Without: polls a CQ another thread destroys, and a failed poll must be
 * EINVAL. `bad` counts the calls that broke the rule. */
static void *call_until_stopped(void *arg)
{
	struct worker *w = arg;
	struct ibv_wc wc[4];
	while (!w->stop) {
		struct ibv_cq *cq = w->cq;
		if (!cq)
			continue;
		w->calls++;
		errno = 0;
		int n = ibv_poll_cq(cq, 4, wc);
		if (!w->pd) {
			w->negative += n < 0;
			w->bad += n < 0 && errno != EINVAL;
			continue;
		}
		if (n < 0 || ibv_req_notify_cq(cq, 0) != 0)
			w->bad++;
		struct ibv_mr *m = ibv_reg_mr(w->pd, w->buf, 64, IBV_ACCESS_LOCAL_WRITE);
		if (!m || ibv_dereg_mr(m) != 0)
			w->bad++;
	}
	return NULL;
}

/* Races of calls against destroys on other threads. */
static int verbs_races(void)
{
	struct ibv_context *ctx = open_device();
	MUST("ibv_open_device", ctx);
	EXPECT("ibv_create_cq on a channel racing its destroy: never both succeed",
	       create_racing_destroy(ctx, CQ_ON_CHANNEL, 300) == 0);
	EXPECT("ibv_create_qp on a CQ racing its destroy: never both succeed",
	       create_racing_destroy(ctx, QP_ON_CQ, 300) == 0);
	EXPECT("ibv_create_qp on a PD racing its dealloc: never both succeed",
	       create_racing_destroy(ctx, QP_ON_PD, 300) == 0);

	/* Refused destroys leave no window in which the live object is EINVAL. */
	static char buf[4096];
	struct worker h;
	memset(&h, 0, sizeof h);
	h.buf = buf;
	h.pd = ibv_alloc_pd(ctx);
	h.cq = ibv_create_cq(ctx, 64, NULL, NULL, 0);
	MUST("PD, CQ", h.pd && h.cq);
	struct ibv_qp_init_attr ia;
	struct ibv_qp *qp = make_qp(h.pd, h.cq, &ia);
	MUST("ibv_create_qp", qp);
	pthread_t t;
	pthread_create(&t, NULL, call_until_stopped, &h);
	int tries = 0, refused = 0;
	double end = now() + 10;
	while ((tries < 300 || h.calls < 2000) && now() < end) {
		refused += (ibv_destroy_cq(h.cq) == EBUSY) + (ibv_dealloc_pd(h.pd) == EBUSY);
		tries++;
	}
	h.stop = 1;
	pthread_join(t, NULL);
	EXPECT("ibv_destroy_cq and ibv_dealloc_pd with a QP on them: EBUSY",
	       refused == 2 * tries);
	printf("     (%d calls on the objects while their destroys were refused)\n", h.calls);
	EXPECT("calls on a CQ and PD whose destroys are being refused all succeed", h.bad == 0);
	EXPECT_RET("ibv_destroy_qp", ibv_destroy_qp(qp), 0);
	EXPECT_RET("ibv_destroy_cq", ibv_destroy_cq(h.cq), 0);
	EXPECT_RET("ibv_dealloc_pd", ibv_dealloc_pd(h.pd), 0);

	/* ibv_poll_cq racing ibv_destroy_cq: -1 with EINVAL, silently (misuse.rs checks
	 * stderr). */
	struct worker p;
	memset(&p, 0, sizeof p);
	pthread_create(&t, NULL, call_until_stopped, &p);
	for (int i = 0; i < 500; i++) {
		struct ibv_cq *cq = ibv_create_cq(ctx, 64, NULL, NULL, 0);
		MUST("ibv_create_cq", cq);
		p.cq = cq;
		for (volatile int k = 0; k < (i % 20) * 200; k++)
			;
		ibv_destroy_cq(cq);
	}
	p.stop = 1;
	pthread_join(t, NULL);
	printf("     (%d polls of a destroyed CQ)\n", p.negative);
	EXPECT("ibv_poll_cq racing ibv_destroy_cq is EINVAL when it fails", p.bad == 0);
	EXPECT_RET("ibv_close_device", ibv_close_device(ctx), 0);
	return 0;
}

/* An application that reads its own completion channel's fd (it may poll(2) it and
 * read it): ibv_get_cq_event still returns the event, and never blocks on the fd. */
static int channel_fd_read_by_the_application(void)
{
	static char buf[64];
	struct rig g;
	if (rig_up(&g, 1, 16, buf, sizeof buf))
		return 1;
	struct ibv_sge sge = { (uintptr_t)buf, sizeof buf, g.mr->lkey };
	struct ibv_recv_wr w = { .wr_id = 1, .sg_list = &sge, .num_sge = 1 }, *bad;
	EXPECT_RET("ibv_post_recv", ibv_post_recv(g.qp, &w, &bad), 0);
	EXPECT_RET("ibv_req_notify_cq", ibv_req_notify_cq(g.cq, 0), 0);
	EXPECT_RET("ibv_modify_qp to ERR", set_qp_state(g.qp, IBV_QPS_ERR), 0);
	struct pollfd pfd = { .fd = g.ch->fd, .events = POLLIN };
	EXPECT("the channel's fd becomes readable", poll(&pfd, 1, 5000) == 1);
	uint64_t v = 0;
	EXPECT("the application reads the fd itself", read(g.ch->fd, &v, sizeof v) == sizeof v);
	struct ibv_cq *ev_cq = NULL;
	void *ev_ctx;
	EXPECT_RET("ibv_get_cq_event after the application read the fd",
		   ibv_get_cq_event(g.ch, &ev_cq, &ev_ctx), 0);
	EXPECT("... returns the CQ", ev_cq == g.cq);
	ibv_ack_cq_events(g.cq, 1);
	int flushed;
	EXPECT("the flushed receive polls out", poll_n(g.cq, 1, &flushed) == 1 && flushed == 1);
	rig_down(&g);
	return 0;
}

/* Out of fds: every call that makes one fails with EMFILE (a context without its
 * async_fd, a channel without its fd, would be unusable). */
static int out_of_fds(void)
{
	int n = 0;
	struct ibv_device **list = ibv_get_device_list(&n);
	MUST("ibv_get_device_list", list && n == 1);
	struct rlimit old, low;
	MUST("getrlimit", getrlimit(RLIMIT_NOFILE, &old) == 0);
	int top = dup(0); /* the lowest free fd: the limit is a few above it */
	MUST("dup", top >= 0);
	close(top);
	low = old;
	low.rlim_cur = top + 4;
	MUST("setrlimit", setrlimit(RLIMIT_NOFILE, &low) == 0);
	struct ibv_context *ctxs[16];
	int opened = 0, bad_fd = 0, err = 0;
	while (opened < 16) {
		errno = 0;
		struct ibv_context *c = ibv_open_device(list[0]);
		if (!c) {
			err = errno;
			break;
		}
		bad_fd += c->async_fd < 0;
		ctxs[opened++] = c;
	}
	EXPECT("ibv_open_device out of fds: NULL with EMFILE", opened < 16 && err == EMFILE);
	EXPECT("no context was made without its async_fd", bad_fd == 0);
	if (opened > 0) {
		EXPECT_NULL("ibv_create_comp_channel out of fds", ibv_create_comp_channel(ctxs[0]),
			    EMFILE);
	}
	EXPECT_NULL("rdma_create_event_channel out of fds", rdma_create_event_channel(), EMFILE);
	struct rdma_cm_id *id = NULL;
	EXPECT_ERR("rdma_create_id (its own channel) out of fds",
		   rdma_create_id(NULL, &id, NULL, RDMA_PS_TCP), -1, EMFILE);
	for (int i = 0; i < opened; i++)
		ibv_close_device(ctxs[i]);
	MUST("setrlimit back", setrlimit(RLIMIT_NOFILE, &old) == 0);
	ibv_free_device_list(list);
	return 0;
}

static int cm_misuse(const char *absent_ip)
{
	struct rdma_event_channel *ch = rdma_create_event_channel();
	MUST("rdma_create_event_channel", ch);
	struct rdma_cm_id *id = NULL, *id2 = NULL, *id3 = NULL, *own = NULL;
	MUST("rdma_create_id", rdma_create_id(ch, &id, NULL, RDMA_PS_TCP) == 0);

	/* Destroying an id while this thread holds an unacked event of it: librdmacm
	 * would wait for the ack forever; here EDEADLK, the id still alive. */
	EXPECT_RET("rdma_resolve_addr to an absent host", resolve(id, absent_ip), 0);
	struct rdma_cm_event *ev = next_event(ch);
	MUST("an ADDR_ERROR event", ev && ev->event == RDMA_CM_EVENT_ADDR_ERROR && ev->id == id);
	EXPECT_ERR("rdma_destroy_id with an unacked event held by this thread",
		   rdma_destroy_id(id), -1, EDEADLK);
	EXPECT("the id is still alive after the refusal", rdma_get_src_port(id) == 0 && id->channel == ch);
	EXPECT_RET("rdma_ack_cm_event", rdma_ack_cm_event(ev), 0);
	EXPECT_ERR("rdma_ack_cm_event twice", rdma_ack_cm_event(ev), -1, EINVAL);
	EXPECT_RET("rdma_destroy_id after the ack", rdma_destroy_id(id), 0);
	EXPECT_ERR("rdma_destroy_id twice", rdma_destroy_id(id), -1, EINVAL);
	EXPECT_ERR("rdma_resolve_addr on a destroyed id", resolve(id, absent_ip), -1, EINVAL);

	/* An unacked event taken by another thread: destroy waits for its ack. */
	MUST("rdma_create_id", rdma_create_id(ch, &id2, NULL, RDMA_PS_TCP) == 0);
	EXPECT_RET("rdma_resolve_addr to an absent host", resolve(id2, absent_ip), 0);
	struct late_ack l = { ch, NULL, 0, 0 };
	pthread_t t;
	pthread_create(&t, NULL, take_and_ack_later, &l);
	double end = now() + 10;
	while (!l.got && now() < end)
		usleep(1000);
	MUST("the other thread's ADDR_ERROR event", l.got && l.ev && l.ev->id == id2);
	double t0 = now();
	EXPECT_RET("rdma_destroy_id with an event held by another thread", rdma_destroy_id(id2), 0);
	double waited = now() - t0;
	EXPECT("rdma_destroy_id returned only after the other thread's ack",
	       l.acked && waited >= 0.2);
	pthread_join(t, NULL);

	/* The event channel destroyed under a live id (librdmacm frees it regardless):
	 * the channel is EINVAL from then on, the id still destroys. */
	MUST("rdma_create_id", rdma_create_id(ch, &id3, NULL, RDMA_PS_TCP) == 0);
	rdma_destroy_event_channel(ch);
	EXPECT("rdma_destroy_event_channel with an id on it returned", 1);
	struct rdma_cm_event *ev2 = NULL;
	EXPECT_ERR("rdma_get_cm_event on a destroyed channel", rdma_get_cm_event(ch, &ev2), -1,
		   EINVAL);
	struct rdma_cm_id *id4 = NULL;
	EXPECT_ERR("rdma_create_id on a destroyed channel",
		   rdma_create_id(ch, &id4, NULL, RDMA_PS_TCP), -1, EINVAL);
	EXPECT_RET("rdma_destroy_id of the channel's id", rdma_destroy_id(id3), 0);
	rdma_destroy_event_channel(ch);
	EXPECT("rdma_destroy_event_channel twice returned", 1);

	/* An id with a channel of its own, and foreign ids. */
	MUST("rdma_create_id (NULL channel)", rdma_create_id(NULL, &own, NULL, RDMA_PS_TCP) == 0);
	EXPECT_RET("rdma_destroy_id (own channel)", rdma_destroy_id(own), 0);
	EXPECT_ERR("rdma_destroy_id (own channel) twice", rdma_destroy_id(own), -1, EINVAL);
	struct rdma_cm_id fake_id;
	memset(&fake_id, 0, sizeof fake_id);
	EXPECT_ERR("rdma_destroy_id of a foreign id", rdma_destroy_id(&fake_id), -1, EINVAL);
	struct rdma_event_channel fake_ch = { .fd = -1 };
	EXPECT_ERR("rdma_get_cm_event on a foreign channel", rdma_get_cm_event(&fake_ch, &ev2),
		   -1, EINVAL);
	rdma_destroy_event_channel(&fake_ch);
	EXPECT("rdma_destroy_event_channel of a foreign channel returned", 1);
	return 0;
}

struct spinner {
	struct rdma_event_channel *ch;
	volatile int done;
	int other;
};

/* A non-blocking rdma_get_cm_event in a loop, until the channel is gone (EINVAL). */
static void *get_until_gone(void *arg)
{
	struct spinner *s = arg;
	struct rdma_cm_event *ev;
	for (;;) {
		errno = 0;
		int r = rdma_get_cm_event(s->ch, &ev);
		if (r == 0)
			rdma_ack_cm_event(ev);
		else if (errno == EINVAL)
			break;
		else if (errno != EAGAIN)
			s->other++;
	}
	s->done = 1;
	return NULL;
}

struct reader {
	struct rdma_event_channel *ch;
	volatile int stop;
	int events, dead;
};

/* Takes events (non-blocking) until told to stop; counts those whose id is not live
 * any more while the event is held (rdma_set_option checks the id). */
static void *read_events(void *arg)
{
	struct reader *r = arg;
	while (!r->stop) {
		struct rdma_cm_event *ev;
		if (rdma_get_cm_event(r->ch, &ev)) {
			usleep(100);
			continue;
		}
		r->events++;
		errno = 0;
		if (rdma_set_option(ev->id, 0, 0, NULL, 0) == -1 && errno == EINVAL)
			r->dead++;
		rdma_ack_cm_event(ev);
	}
	return NULL;
}

/* Races of CM calls against destroys on other threads. */
static int cm_races(const char *absent_ip)
{
	/* A non-blocking rdma_get_cm_event never blocks, also when another thread
	 * destroys the channel under it. */
	int hung = 0, other = 0;
	for (int i = 0; i < 50 && !hung; i++) {
		struct spinner sp = { rdma_create_event_channel(), 0, 0 };
		MUST("rdma_create_event_channel", sp.ch);
		int fl = fcntl(sp.ch->fd, F_GETFL);
		fcntl(sp.ch->fd, F_SETFL, fl | O_NONBLOCK);
		pthread_t t;
		pthread_create(&t, NULL, get_until_gone, &sp);
		usleep(200 + (i % 10) * 50);
		rdma_destroy_event_channel(sp.ch);
		double end = now() + 5;
		while (!sp.done && now() < end)
			usleep(100);
		if (sp.done)
			pthread_join(t, NULL);
		else
			hung = 1; /* left blocked: the check below fails */
		other += sp.other;
	}
	EXPECT("a non-blocking rdma_get_cm_event returns EINVAL once another thread destroyed the channel",
	       !hung && other == 0);

	/* An event of an id is never handed out after the id's rdma_destroy_id
	 * returned: destroy waits for the events other threads took (the id stays live
	 * meanwhile), and drops those not yet taken. */
	struct reader r;
	memset(&r, 0, sizeof r);
	r.ch = rdma_create_event_channel();
	MUST("rdma_create_event_channel", r.ch);
	int fl = fcntl(r.ch->fd, F_GETFL);
	fcntl(r.ch->fd, F_SETFL, fl | O_NONBLOCK);
	pthread_t t;
	pthread_create(&t, NULL, read_events, &r);
	struct sockaddr_in dst;
	memset(&dst, 0, sizeof dst);
	dst.sin_family = AF_INET;
	dst.sin_port = htons(7471);
	inet_pton(AF_INET, absent_ip, &dst.sin_addr);
	int failed = 0;
	for (int i = 0; i < 1000; i++) {
		struct rdma_cm_id *id;
		MUST("rdma_create_id", rdma_create_id(r.ch, &id, NULL, RDMA_PS_TCP) == 0);
		failed += rdma_resolve_addr(id, NULL, (struct sockaddr *)&dst, 1) != 0;
		double until = now() + (i % 40) * 0.0001;
		while (now() < until)
			;
		failed += rdma_destroy_id(id) != 0;
	}
	r.stop = 1;
	pthread_join(t, NULL);
	printf("     (%d events taken while their ids were being destroyed)\n", r.events);
	EXPECT("rdma_resolve_addr and rdma_destroy_id all succeeded", failed == 0);
	EXPECT("no event is held whose id is no longer live", r.dead == 0);
	rdma_destroy_event_channel(r.ch);
	return 0;
}

int main(int argc, char **argv)
{
	if (argc != 2) {
		fprintf(stderr, "usage: %s ABSENT_IPV4\n", argv[0]);
		return 2;
	}
	if (verbs_misuse() || post_misuse() || verbs_races() ||
	    channel_fd_read_by_the_application() || out_of_fds() || cm_misuse(argv[1]) ||
	    cm_races(argv[1]))
		failures++;
	printf("%d failed\n", failures);
	return failures ? 1 : 0;
}
