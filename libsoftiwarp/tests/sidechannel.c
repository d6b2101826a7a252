/*
 * An RDMA program with a TCP side channel to the address it resolves, as many
 * applications have (they trade buffer addresses and keys, or wait for each other,
 * over a plain socket beside the RDMA connection). Built by tests/host_tcp.rs and run
 * over libsoftiwarp's host-TCP devices with no SOFTIWARP_DEVICE and no shim: the
 * side channel is the kernel's TCP to the same address, so it works only when the
 * RDMA device's addresses are the host's.
 *
 *   sidechannel server ADDR RDMA_PORT TCP_PORT
 *   sidechannel client ADDR RDMA_PORT TCP_PORT
 *
 * The server listens on ADDR for both (the side channel last); the client connects
 * the side channel first, then resolves ADDR:RDMA_PORT and connects. The server sends
 * its buffer's address and rkey over the side channel; the client RDMA Writes a
 * pattern there and then Sends "DONE" on the same connection (a Write's completion
 * says nothing of its placement; the Send behind it is placed after it); the server,
 * on receiving it, checks every byte and answers "V" over the side channel; both
 * disconnect. Each side prints the device its CM id is on and its GID ("device: NAME
 * gid xx:xx:xx:xx:xx:xx", the MAC part) and "ok"
 * last; any failure prints why and exits 1.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>

#define SIZE 65536
/* The Send's bytes, behind the Write's in the same buffer. */
#define MSG 4

#define CHECK(cond, what)                                                       \
	do {                                                                        \
		if (!(cond)) {                                                          \
			fprintf(stdout, "FAILED: %s (errno %d: %s)\n", what, errno,         \
				strerror(errno));                                               \
			exit(1);                                                            \
		}                                                                       \
	} while (0)

struct key {
	uint64_t addr;
	uint32_t rkey;
} __attribute__((packed));

static struct sockaddr_in addr_of(const char *ip, const char *port)
{
	struct sockaddr_in a;
	memset(&a, 0, sizeof a);
	a.sin_family = AF_INET;
	a.sin_port = htons((uint16_t)atoi(port));
	CHECK(inet_pton(AF_INET, ip, &a.sin_addr) == 1, "an IPv4 address");
	return a;
}

static struct rdma_cm_id *expect(struct rdma_event_channel *ch,
				 enum rdma_cm_event_type type)
{
	struct rdma_cm_event *ev;
	CHECK(rdma_get_cm_event(ch, &ev) == 0, "rdma_get_cm_event");
	if (ev->event != type) {
		printf("FAILED: got %s (status %d), wanted %s\n",
		       rdma_event_str(ev->event), ev->status, rdma_event_str(type));
		exit(1);
	}
	struct rdma_cm_id *id = ev->id;
	rdma_ack_cm_event(ev);
	return id;
}

static void full_io(int fd, void *buf, size_t n, int out)
{
	char *p = buf;
	while (n > 0) {
		ssize_t r = out ? write(fd, p, n) : read(fd, p, n);
		if (r == 0) {
			printf("FAILED: the side channel closed early\n");
			exit(1);
		}
		CHECK(r > 0, out ? "side channel write" : "side channel read");
		p += r;
		n -= (size_t)r;
	}
}

struct res {
	struct ibv_pd *pd;
	struct ibv_cq *cq;
	struct ibv_mr *mr;
	char *buf;
};

/* PD, CQ, MR and QP on the id's device (id->verbs), and says which device it is. */
static struct res setup(struct rdma_cm_id *id)
{
	struct res r;
	CHECK(id->verbs != NULL, "id->verbs set");
	union ibv_gid gid;
	CHECK(ibv_query_gid(id->verbs, 1, 0, &gid) == 0, "ibv_query_gid");
	printf("device: %s gid %02x:%02x:%02x:%02x:%02x:%02x\n",
	       ibv_get_device_name(id->verbs->device), gid.raw[0], gid.raw[1],
	       gid.raw[2], gid.raw[3], gid.raw[4], gid.raw[5]);
	r.pd = ibv_alloc_pd(id->verbs);
	CHECK(r.pd, "ibv_alloc_pd");
	r.cq = ibv_create_cq(id->verbs, 16, NULL, NULL, 0);
	CHECK(r.cq, "ibv_create_cq");
	r.buf = calloc(1, SIZE + MSG);
	CHECK(r.buf, "calloc");
	r.mr = ibv_reg_mr(r.pd, r.buf, SIZE + MSG,
			  IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
	CHECK(r.mr, "ibv_reg_mr");
	struct ibv_qp_init_attr qa;
	memset(&qa, 0, sizeof qa);
	qa.send_cq = r.cq;
	qa.recv_cq = r.cq;
	qa.qp_type = IBV_QPT_RC;
	qa.cap.max_send_wr = 4;
	qa.cap.max_recv_wr = 4;
	qa.cap.max_send_sge = 1;
	qa.cap.max_recv_sge = 1;
	CHECK(rdma_create_qp(id, r.pd, &qa) == 0, "rdma_create_qp");
	return r;
}

static void teardown(struct rdma_cm_id *id, struct res *r)
{
	rdma_destroy_qp(id);
	CHECK(ibv_dereg_mr(r->mr) == 0, "ibv_dereg_mr");
	CHECK(ibv_destroy_cq(r->cq) == 0, "ibv_destroy_cq");
	CHECK(ibv_dealloc_pd(r->pd) == 0, "ibv_dealloc_pd");
	CHECK(rdma_destroy_id(id) == 0, "rdma_destroy_id");
	free(r->buf);
}

static int server(struct sockaddr_in rdma, struct sockaddr_in tcp)
{
	int one = 1, l = socket(AF_INET, SOCK_STREAM, 0);
	CHECK(l >= 0, "socket");
	setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
	CHECK(bind(l, (struct sockaddr *)&tcp, sizeof tcp) == 0, "side channel bind");

	struct rdma_event_channel *ch = rdma_create_event_channel();
	CHECK(ch, "rdma_create_event_channel");
	struct rdma_cm_id *listener;
	CHECK(rdma_create_id(ch, &listener, NULL, RDMA_PS_TCP) == 0, "rdma_create_id");
	CHECK(rdma_bind_addr(listener, (struct sockaddr *)&rdma) == 0, "rdma_bind_addr");
	CHECK(rdma_listen(listener, 1) == 0, "rdma_listen");
	/* The side channel listens last: a client it lets in finds the RDMA listener. */
	CHECK(listen(l, 1) == 0, "side channel listen");
	printf("listening\n");
	fflush(stdout);

	int s = accept(l, NULL, NULL);
	CHECK(s >= 0, "side channel accept");
	struct rdma_cm_id *id = expect(ch, RDMA_CM_EVENT_CONNECT_REQUEST);
	struct res r = setup(id);
	struct ibv_sge sge = { (uint64_t)(uintptr_t)(r.buf + SIZE), MSG, r.mr->lkey };
	struct ibv_recv_wr rwr, *rbad;
	memset(&rwr, 0, sizeof rwr);
	rwr.wr_id = 2;
	rwr.sg_list = &sge;
	rwr.num_sge = 1;
	CHECK(ibv_post_recv(id->qp, &rwr, &rbad) == 0, "ibv_post_recv");
	CHECK(rdma_accept(id, NULL) == 0, "rdma_accept");
	expect(ch, RDMA_CM_EVENT_ESTABLISHED);

	struct key k = { (uint64_t)(uintptr_t)r.buf, r.mr->rkey };
	full_io(s, &k, sizeof k, 1);
	struct ibv_wc wc;
	int n;
	while ((n = ibv_poll_cq(r.cq, 1, &wc)) == 0)
		;
	CHECK(n == 1 && wc.status == IBV_WC_SUCCESS && wc.opcode == IBV_WC_RECV &&
		      wc.byte_len == MSG && !memcmp(r.buf + SIZE, "DONE", MSG),
	      "the client's DONE");
	for (int i = 0; i < SIZE; i++) {
		if (r.buf[i] != (char)(i * 7 + 3)) {
			printf("FAILED: byte %d is %d\n", i, r.buf[i]);
			return 1;
		}
	}
	printf("verified %d bytes\n", SIZE);
	full_io(s, "V", 1, 1);
	expect(ch, RDMA_CM_EVENT_DISCONNECTED);
	teardown(id, &r);
	CHECK(rdma_destroy_id(listener) == 0, "rdma_destroy_id (listener)");
	rdma_destroy_event_channel(ch);
	close(s);
	close(l);
	printf("ok\n");
	return 0;
}

static int client(struct sockaddr_in rdma, struct sockaddr_in tcp)
{
	/* The side channel first: retried for 20 s while the server starts. */
	int s = -1;
	for (int tries = 0; tries < 200; tries++) {
		s = socket(AF_INET, SOCK_STREAM, 0);
		CHECK(s >= 0, "socket");
		if (connect(s, (struct sockaddr *)&tcp, sizeof tcp) == 0)
			break;
		CHECK(errno == ECONNREFUSED, "side channel connect");
		close(s);
		s = -1;
		struct timespec t = { 0, 100 * 1000 * 1000 };
		nanosleep(&t, NULL);
	}
	CHECK(s >= 0, "side channel connect (refused for 20 s)");

	struct rdma_event_channel *ch = rdma_create_event_channel();
	CHECK(ch, "rdma_create_event_channel");
	struct rdma_cm_id *id;
	CHECK(rdma_create_id(ch, &id, NULL, RDMA_PS_TCP) == 0, "rdma_create_id");
	CHECK(rdma_resolve_addr(id, NULL, (struct sockaddr *)&rdma, 2000) == 0,
	      "rdma_resolve_addr");
	expect(ch, RDMA_CM_EVENT_ADDR_RESOLVED);
	CHECK(rdma_resolve_route(id, 2000) == 0, "rdma_resolve_route");
	expect(ch, RDMA_CM_EVENT_ROUTE_RESOLVED);
	struct res r = setup(id);
	for (int i = 0; i < SIZE; i++)
		r.buf[i] = (char)(i * 7 + 3);
	memcpy(r.buf + SIZE, "DONE", MSG);
	CHECK(rdma_connect(id, NULL) == 0, "rdma_connect");
	expect(ch, RDMA_CM_EVENT_ESTABLISHED);

	struct key k;
	full_io(s, &k, sizeof k, 0);
	/* The Write, then the Send that tells the server it is placed. */
	struct ibv_sge sge[2] = {
		{ (uint64_t)(uintptr_t)r.buf, SIZE, r.mr->lkey },
		{ (uint64_t)(uintptr_t)(r.buf + SIZE), MSG, r.mr->lkey },
	};
	struct ibv_send_wr wr[2], *bad;
	memset(wr, 0, sizeof wr);
	wr[0].wr_id = 1;
	wr[0].sg_list = &sge[0];
	wr[0].num_sge = 1;
	wr[0].opcode = IBV_WR_RDMA_WRITE;
	wr[0].send_flags = IBV_SEND_SIGNALED;
	wr[0].wr.rdma.remote_addr = k.addr;
	wr[0].wr.rdma.rkey = k.rkey;
	wr[0].next = &wr[1];
	wr[1].wr_id = 2;
	wr[1].sg_list = &sge[1];
	wr[1].num_sge = 1;
	wr[1].opcode = IBV_WR_SEND;
	wr[1].send_flags = IBV_SEND_SIGNALED;
	CHECK(ibv_post_send(id->qp, wr, &bad) == 0, "ibv_post_send");
	for (int done = 0; done < 2;) {
		struct ibv_wc wc;
		int n = ibv_poll_cq(r.cq, 1, &wc);
		CHECK(n >= 0 && (n == 0 || wc.status == IBV_WC_SUCCESS),
		      "the Write's and the Send's completions");
		done += n;
	}
	char c;
	full_io(s, &c, 1, 0);
	CHECK(c == 'V', "the server's 'V'");
	CHECK(rdma_disconnect(id) == 0, "rdma_disconnect");
	expect(ch, RDMA_CM_EVENT_DISCONNECTED);
	teardown(id, &r);
	rdma_destroy_event_channel(ch);
	close(s);
	printf("ok\n");
	return 0;
}

int main(int argc, char **argv)
{
	setvbuf(stdout, NULL, _IOLBF, 0);
	if (argc != 5) {
		fprintf(stderr, "usage: %s server|client ADDR RDMA_PORT TCP_PORT\n", argv[0]);
		return 2;
	}
	struct sockaddr_in rdma = addr_of(argv[2], argv[3]);
	struct sockaddr_in tcp = addr_of(argv[2], argv[4]);
	if (!strcmp(argv[1], "server"))
		return server(rdma, tcp);
	return client(rdma, tcp);
}
