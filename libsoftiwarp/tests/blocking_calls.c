/* The blocking calls of libsoftiwarp under signals and pthread_cancel, as rdma-core's
 * (which block in read(2)) behave (issue 30):
 *
 * - a SIGALRM whose handler has no SA_RESTART ends ibv_get_cq_event,
 *   ibv_get_async_event and rdma_get_cm_event with -1 / EINTR;
 * - with SA_RESTART, ibv_get_cq_event goes on waiting and returns the event that
 *   comes after the signal;
 * - a thread blocked in ibv_get_cq_event or rdma_get_cm_event and cancelled with
 *   pthread_cancel ends (its cleanup handler runs, pthread_join gives
 *   PTHREAD_CANCELED), leaks no fd, and the process goes on (exit 0), an event queued
 *   afterwards still delivered.
 *
 * Run over the library with LD_PRELOAD (SOFTIWARP_DEVICE=netdev=lo). One line per
 * check; exit 1 at the first mismatch, 0 after "ok". */
#include <dirent.h>
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <unistd.h>
#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>

#include "check.h"

static volatile sig_atomic_t alarms;

static void on_alarm(int sig)
{
	(void)sig;
	alarms++;
}

/* SIGALRM's handler, with or without SA_RESTART, and the timer `ms` from now. */
static void alarm_in(int ms, int restart)
{
	struct sigaction sa;
	struct itimerval t = { .it_value = { .tv_sec = ms / 1000, .tv_usec = (ms % 1000) * 1000 } };

	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = on_alarm;
	sa.sa_flags = restart ? SA_RESTART : 0;
	sigemptyset(&sa.sa_mask);
	if (sigaction(SIGALRM, &sa, NULL) || setitimer(ITIMER_REAL, &t, NULL))
		failed("sigaction and setitimer", -1, 0);
}

static int open_fds(void)
{
	DIR *d = opendir("/proc/self/fd");
	int n = 0;

	while (d && readdir(d))
		n++;
	if (d)
		closedir(d);
	return n;
}

struct waiter {
	struct ibv_comp_channel *cc;
	struct rdma_event_channel *ec;
	volatile int cleaned;
	volatile int started;
};

static void cleanup(void *w)
{
	((struct waiter *)w)->cleaned = 1;
}

static void *wait_cq_event(void *arg)
{
	struct waiter *w = arg;
	struct ibv_cq *cq;
	void *ctx;
	void *r = NULL;

	pthread_cleanup_push(cleanup, w);
	w->started = 1;
	if (ibv_get_cq_event(w->cc, &cq, &ctx) == 0)
		r = (void *)1;
	pthread_cleanup_pop(0);
	return r;
}

static void *wait_cm_event(void *arg)
{
	struct waiter *w = arg;
	struct rdma_cm_event *ev;
	void *r = NULL;

	pthread_cleanup_push(cleanup, w);
	w->started = 1;
	if (rdma_get_cm_event(w->ec, &ev) == 0)
		r = (void *)1;
	pthread_cleanup_pop(0);
	return r;
}

static int to_error(struct ibv_qp *qp)
{
	struct ibv_qp_attr a = { .qp_state = IBV_QPS_ERR };

	return ibv_modify_qp(qp, &a, IBV_QP_STATE);
}

/* Moves the QP `arg` to Error (its receive completes flushed) once both signals of
 * (a2) were handled, and 100 ms more. */
static void *flush_after_signals(void *arg)
{
	for (int i = 0; i < 500 && alarms < 5; i++)
		usleep(10000);
	usleep(100000);
	to_error(arg);
	return NULL;
}

/* Starts `fn` on `w`, lets it block, cancels it and joins it. */
static void cancel_blocked(const char *what, void *(*fn)(void *), struct waiter *w)
{
	pthread_t t;
	void *ret = NULL;
	char line[128];
	int before = open_fds();

	if (pthread_create(&t, NULL, fn, w))
		failed("pthread_create", -1, 0);
	while (!w->started)
		usleep(1000);
	usleep(200000);
	CHECK("pthread_cancel", pthread_cancel(t), 0);
	CHECK("pthread_join", pthread_join(t, &ret), 0);
	snprintf(line, sizeof(line), "%s: cancelled (PTHREAD_CANCELED)", what);
	CHECK(line, ret == PTHREAD_CANCELED, 1);
	snprintf(line, sizeof(line), "%s: its cleanup handler ran", what);
	CHECK(line, w->cleaned, 1);
	snprintf(line, sizeof(line), "%s: fds open after as before", what);
	CHECK(line, open_fds(), before);
}

int main(void)
{
	int n;
	struct ibv_device **list = ibv_get_device_list(&n);
	struct ibv_context *ctx;
	struct rdma_event_channel *ec = rdma_create_event_channel();
	struct rdma_cm_event *cev;
	struct ibv_async_event aev;
	struct ibv_cq *cq, *got;
	void *got_ctx;

	if (!list || n < 1 || !ec)
		failed("a device and an event channel", n, 1);
	ctx = ibv_open_device(list[0]);
	if (!ctx)
		failed("ibv_open_device", 0, 1);
	struct ibv_comp_channel *cc = ibv_create_comp_channel(ctx);
	struct ibv_pd *pd = ibv_alloc_pd(ctx);
	cq = ibv_create_cq(ctx, 16, &n, cc, 0);
	if (!cc || !pd || !cq)
		failed("channel, PD and CQ", 0, 1);

	/* (a) Without SA_RESTART: -1 / EINTR from each blocking call. */
	CHECK("ibv_req_notify_cq", ibv_req_notify_cq(cq, 0), 0);
	alarm_in(200, 0);
	CHECK("ibv_get_cq_event interrupted", ibv_get_cq_event(cc, &got, &got_ctx), -1);
	CHECK("  errno EINTR", errno, EINTR);
	alarm_in(200, 0);
	CHECK("ibv_get_async_event interrupted", ibv_get_async_event(ctx, &aev), -1);
	CHECK("  errno EINTR", errno, EINTR);
	alarm_in(200, 0);
	CHECK("rdma_get_cm_event interrupted", rdma_get_cm_event(ec, &cev), -1);
	CHECK("  errno EINTR", errno, EINTR);
	CHECK("alarms so far", alarms, 3);

	/* (a2) With SA_RESTART: the wait goes on, and the event after the signals comes.
	 * The event: a receive flushed when a QP outside the CM goes to Error, from a
	 * thread, once both signals (200 ms, 400 ms) were handled. */
	struct ibv_qp_init_attr qa = {
		.send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_RC,
		.cap = { .max_send_wr = 4, .max_recv_wr = 4, .max_send_sge = 1, .max_recv_sge = 1 },
	};
	struct ibv_qp *qp = ibv_create_qp(pd, &qa);
	if (!qp)
		failed("ibv_create_qp", 0, 1);
	pid_t pid = fork();
	if (pid < 0)
		failed("fork", -1, 0);
	if (pid == 0) {
		/* The child signals the parent a second time at 400 ms, to be sure that a
		 * restarted wait is restarted again. */
		usleep(400000);
		kill(getppid(), SIGALRM);
		_exit(0);
	}
	struct ibv_recv_wr rwr = { .wr_id = 7 }, *bad;
	struct ibv_qp_attr to_init = { .qp_state = IBV_QPS_INIT };
	ibv_modify_qp(qp, &to_init, IBV_QP_STATE);
	CHECK("ibv_post_recv", ibv_post_recv(qp, &rwr, &bad), 0);
	alarm_in(200, 1);
	pthread_t flusher;
	if (pthread_create(&flusher, NULL, flush_after_signals, qp))
		failed("pthread_create", -1, 0);
	CHECK("ibv_get_cq_event across two SA_RESTART signals", ibv_get_cq_event(cc, &got, &got_ctx), 0);
	CHECK("  the CQ", got == cq, 1);
	CHECK("  alarms", alarms, 5);
	ibv_ack_cq_events(cq, 1);
	pthread_join(flusher, NULL);
	struct ibv_wc wc;
	CHECK("ibv_poll_cq: the flushed receive", ibv_poll_cq(cq, 1, &wc), 1);
	CHECK("  status IBV_WC_WR_FLUSH_ERR", wc.status, IBV_WC_WR_FLUSH_ERR);

	/* (b) pthread_cancel of a thread blocked in each. */
	struct waiter w1 = { .cc = cc };
	CHECK("ibv_req_notify_cq", ibv_req_notify_cq(cq, 0), 0);
	cancel_blocked("ibv_get_cq_event", wait_cq_event, &w1);
	struct waiter w2 = { .ec = ec };
	cancel_blocked("rdma_get_cm_event", wait_cm_event, &w2);

	/* Nothing was taken by the cancelled waits: an event queued now is delivered. */
	struct ibv_qp *qp2 = ibv_create_qp(pd, &qa);
	if (!qp2)
		failed("ibv_create_qp", 0, 1);
	ibv_modify_qp(qp2, &to_init, IBV_QP_STATE);
	CHECK("ibv_post_recv", ibv_post_recv(qp2, &rwr, &bad), 0);
	CHECK("ibv_modify_qp(ERR)", to_error(qp2), 0);
	CHECK("ibv_get_cq_event after the cancellations", ibv_get_cq_event(cc, &got, &got_ctx), 0);
	ibv_ack_cq_events(cq, 1);
	CHECK("ibv_poll_cq", ibv_poll_cq(cq, 1, &wc), 1);

	CHECK("ibv_destroy_qp", ibv_destroy_qp(qp), 0);
	CHECK("ibv_destroy_qp", ibv_destroy_qp(qp2), 0);
	CHECK("ibv_destroy_cq", ibv_destroy_cq(cq), 0);
	CHECK("ibv_destroy_comp_channel", ibv_destroy_comp_channel(cc), 0);
	rdma_destroy_event_channel(ec);
	printf("ok\n");
	return 0;
}
