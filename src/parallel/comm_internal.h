/* Shared between comm.c and the two backends (comm_mpi.c, comm_single.c);
 * nothing outside src/parallel/comm*.c includes this. */
#ifndef Q3_PARALLEL_COMM_INTERNAL_H
#define Q3_PARALLEL_COMM_INTERNAL_H

#include <stdint.h>

#include "parallel/comm.h"

/* Monotonic clock in nanoseconds. */
int64_t q3_comm__now_ns(void);

/* World rank / size for messages (set by the backend's init). */
void q3_comm__set_world(int rank, int size);
int q3_comm__world_rank(void);
int q3_comm__world_size(void);

/* Read Q3MOE_COMM_TIMEOUT into the setting q3_comm_timeout_s returns.
 * 0, or -1 with q3_err. */
int q3_comm__read_timeout(void);

/* Bracket one blocking call: begin stores the start time where the
 * watchdog sees it and returns it; end clears it and adds the call to the
 * counters of (kind, current phase). No allocation. */
int64_t q3_comm__begin(q3_coll kind, const char *group_name);
void q3_comm__end(q3_coll kind, int64_t t0, uint64_t sent, uint64_t recv);

/* alltoallv of bytes whose counts are in units of `unit` bytes (rows of
 * a wire format); counted as alltoallv with the bytes moved. */
void q3_comm__alltoallv_units(q3_group *g, const void *send, const size_t *send_counts, void *recv,
                              const size_t *recv_counts, size_t unit);

/* Watchdog thread (started by the MPI backend's init, stopped by its
 * finalize). 0, or -1 with q3_err. */
int q3_comm__watchdog_start(void);
void q3_comm__watchdog_stop(void);

#endif
