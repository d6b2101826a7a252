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

int main(int argc, char **argv)
{
	if (argc != 2) {
		fprintf(stderr, "usage: %s ABSENT_IPV4\n", argv[0]);
		return 2;
	}
	if (verbs_misuse() || cm_misuse(argv[1]))
		failures++;
	printf("%d failed\n", failures);
	return failures ? 1 : 0;
}
