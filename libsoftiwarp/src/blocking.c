/* The blocking entry points of libsoftiwarp: ibv_get_cq_event, ibv_get_async_event and
 * rdma_get_cm_event. The contract is written in src/blocking.rs; in short:
 *
 * - Each call loops: the Rust step (swi_*_try, non-blocking, inside the library's
 *   panic guard) either finishes the call (0, or -1 with errno) or hands back an fd of
 *   the caller's own (a dup of the channel's eventfd, or a new eventfd that nothing
 *   signals for a channel destroyed under the call) to wait on; this C frame then
 *   blocks in read(2) on it, with no Rust frame on the stack, and closes it.
 * - read(2) is what rdma-core's own calls block in, so a signal interrupts them alike:
 *   -1 with errno EINTR after a handler installed without SA_RESTART, restarted by the
 *   kernel after one with SA_RESTART.
 * - read(2) is a cancellation point: pthread_cancel of a thread blocked here unwinds
 *   through this frame (built with -fexceptions: its cleanup handler closes the fd)
 *   and the caller's, never through Rust code. The Rust step runs with cancellation
 *   disabled (as every entry point does: boundary::guard), so no cancellation acts
 *   inside it.
 */
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <unistd.h>

struct ibv_comp_channel;
struct ibv_cq;
struct ibv_context;
struct ibv_async_event;
struct rdma_event_channel;
struct rdma_cm_event;

/* The Rust steps (src/ibv.rs, src/events.rs, src/cm.rs): 0 done, -1 failed (errno set),
 * 1 wait on *fd (then the caller owns *fd). */
int swi_get_cq_event_try(struct ibv_comp_channel *channel, struct ibv_cq **cq,
			 void **cq_context, int *fd);
int swi_get_async_event_try(struct ibv_context *context, struct ibv_async_event *event,
			    int *fd);
int swi_get_cm_event_try(struct rdma_event_channel *channel, struct rdma_cm_event **event,
			 int retry, int *fd);

#define SW_WAIT 1

static void close_fd(void *fd)
{
	close(*(int *)fd);
}

/* Blocks in read(2) until fd (an eventfd of the caller's) is readable, then closes
 * it: 0, or -1 with read's errno (EINTR: a signal without SA_RESTART). */
static int wait_and_close(int fd)
{
	uint64_t counter;
	ssize_t n;
	int err = 0;

	pthread_cleanup_push(close_fd, &fd);
	n = read(fd, &counter, sizeof(counter));
	if (n < 0)
		err = errno;
	pthread_cleanup_pop(1);
	if (n < 0) {
		errno = err;
		return -1;
	}
	return 0;
}

int sw_ibv_get_cq_event(struct ibv_comp_channel *channel, struct ibv_cq **cq,
			void **cq_context)
{
	for (;;) {
		int fd = -1;
		int r = swi_get_cq_event_try(channel, cq, cq_context, &fd);

		if (r != SW_WAIT)
			return r;
		if (wait_and_close(fd))
			return -1;
	}
}
__asm__(".symver sw_ibv_get_cq_event, ibv_get_cq_event@@IBVERBS_1.1");

int sw_ibv_get_async_event(struct ibv_context *context, struct ibv_async_event *event)
{
	for (;;) {
		int fd = -1;
		int r = swi_get_async_event_try(context, event, &fd);

		if (r != SW_WAIT)
			return r;
		if (wait_and_close(fd))
			return -1;
	}
}
__asm__(".symver sw_ibv_get_async_event, ibv_get_async_event@@IBVERBS_1.1");

int sw_rdma_get_cm_event(struct rdma_event_channel *channel, struct rdma_cm_event **event)
{
	int retry;

	for (retry = 0;; retry = 1) {
		int fd = -1;
		int r = swi_get_cm_event_try(channel, event, retry, &fd);

		if (r != SW_WAIT)
			return r;
		if (wait_and_close(fd))
			return -1;
	}
}
__asm__(".symver sw_rdma_get_cm_event, rdma_get_cm_event@@RDMACM_1.0");
