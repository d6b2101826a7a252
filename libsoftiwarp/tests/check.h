/* The checks of the C test programs (srq_events.c, blocking_calls.c): CHECK prints
 * "what: value" and goes on if the value is the one wanted; otherwise it prints a FAIL
 * line with errno and exits 1. */
#ifndef SOFTIWARP_TEST_CHECK_H
#define SOFTIWARP_TEST_CHECK_H

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static inline void failed(const char *what, long got, long want)
{
	printf("FAIL %s: got %ld, want %ld (errno %d %s)\n", what, got, want, errno,
	       strerror(errno));
	exit(1);
}

#define CHECK(what, got, want)                                              \
	do {                                                                \
		long g_ = (long)(got), w_ = (long)(want);                   \
		if (g_ != w_)                                               \
			failed(what, g_, w_);                               \
		printf("%s: %ld\n", what, g_);                              \
	} while (0)

#endif
