/* The communication layer: the only code in q3moe that calls MPI.
 *
 * One interface, two implementations chosen at build time:
 *   src/parallel/comm_mpi.c     with MPI (Q3_HAVE_MPI; the Makefile picks it
 *                               when `pkg-config --exists ompi-c`)
 *   src/parallel/comm_single.c  without (`make MPI=0`): world size 1, every
 *                               collective is a copy or a no-op.
 * src/parallel/comm.c holds what both share: the counters, the byte
 * formulas, the phase names and the timeout setting.
 *
 * Collectives are called from one thread per process (the thread that
 * called q3_comm_init), every rank of the group calling the same collective
 * in the same order with matching sizes. Misuse that can be detected
 * locally (a count past INT_MAX, a bad root, mismatched alltoallv counts in
 * the single build) is fatal: q3_comm_abort, which takes the whole job down
 * (a rank that returned an error while its peers wait would hang them).
 *
 * BYTE ACCOUNTING ("link bytes", per rank, per call). Every collective adds
 * to this rank's counters the bytes that must cross this rank's link in a
 * bandwidth-optimal algorithm; data that stays on the rank is never counted,
 * so with P = 1 everything is 0. These are the bus-bandwidth factors of
 * nccl-tests, fixed by the collective's definition and independent of the
 * algorithm MPI actually picks. With P ranks in the group and B bytes as
 * defined per line:
 *
 *   allreduce_sum      B = the buffer            sent = recv = floor(2 (P-1) B / P)
 *   allgather          B = this rank's block     sent = recv = (P-1) B
 *                      (the gathered output is P B)
 *   reduce_scatter_sum B = this rank's output    sent = recv = (P-1) B
 *                      (the input is P B)
 *   alltoall           B = the block per peer    sent = recv = (P-1) B
 *   alltoallv          sent = sum over peers j != rank of send_counts[j] * elem
 *                      recv = sum over peers j != rank of recv_counts[j] * elem
 *   broadcast          B = the buffer            root: sent = B, recv = 0
 *                                                others: sent = 0, recv = B
 *   barrier            0
 *
 * elem is 4 for the float collectives and 1 for the _bytes variants; the
 * _bytes variants count under the same kind as their float counterpart.
 * q3_comm_payload() computes exactly these numbers, and the performance
 * model of `q3moe plan` uses it, so prediction and measurement agree by
 * construction. Each call also adds its wall time (monotonic clock, from
 * just before the blocking MPI call to just after it) and one to `calls`.
 * Counters are kept per (kind, phase); the phase is whatever the caller set
 * last with q3_comm_set_phase ("other" until then).
 *
 * HANG PROTECTION. MPI_COMM_WORLD and every group use MPI_ERRORS_ARE_FATAL.
 * A watchdog thread started by q3_comm_init aborts the job, naming the
 * collective, phase and rank, when one collective has been blocked for
 * longer than Q3MOE_COMM_TIMEOUT seconds (default 300; a positive number).
 * The collective itself only stores a monotonic timestamp before and clears
 * it after the blocking call: no allocation, lock or syscall beyond
 * clock_gettime per call. */
#ifndef Q3_PARALLEL_COMM_H
#define Q3_PARALLEL_COMM_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

typedef enum {
    Q3_COLL_ALLREDUCE = 0,
    Q3_COLL_ALLGATHER,
    Q3_COLL_REDUCE_SCATTER,
    Q3_COLL_ALLTOALL,
    Q3_COLL_ALLTOALLV,
    Q3_COLL_BROADCAST,
    Q3_COLL_BARRIER,
    Q3_COLL_N
} q3_coll;

/* Exit status of a job taken down by q3_comm_abort / the watchdog. */
#define Q3_COMM_ABORT_CODE 3
#define Q3_COMM_DEFAULT_TIMEOUT_S 300.0
#define Q3_COMM_MAX_PHASES 8
#define Q3_COMM_PHASE_LEN 16

typedef struct q3_group q3_group;

/* ---------------------------------------------------------------- set-up */

/* Initialise MPI (MPI_Init_thread) or the single-rank stand-in, read
 * Q3MOE_COMM_TIMEOUT and start the watchdog. 0, or -1 with q3_err (bad
 * timeout; the single build launched by mpirun with more than one rank). */
int q3_comm_init(int *argc, char ***argv);
/* Stop the watchdog, free every group and finalize MPI. */
void q3_comm_finalize(void);
/* 1 when this build talks MPI. */
int q3_comm_have_mpi(void);
/* The world group (all ranks); valid between init and finalize. */
q3_group *q3_comm_world(void);
int q3_group_rank(const q3_group *g);
int q3_group_size(const q3_group *g);
const char *q3_group_name(const q3_group *g);
/* Collective over `parent`: ranks passing the same color form one new
 * group, ordered by key (then parent rank). `name` (e.g. "attn_tp") is for
 * messages. The group lives until q3_group_free or q3_comm_finalize. */
q3_group *q3_group_split(q3_group *parent, int color, int key, const char *name);
void q3_group_free(q3_group *g);

/* Print "q3moe: rank R/P: fatal: REASON" on stderr and take the whole job
 * down (MPI_Abort with Q3_COMM_ABORT_CODE; exit(Q3_COMM_ABORT_CODE) in the
 * single build or outside init/finalize). */
_Noreturn void q3_comm_abort(const char *reason);

/* ------------------------------------------------------- float collectives */

/* buf[0..n) = sum over the group's ranks, in place. */
void q3_comm_allreduce_sum(q3_group *g, float *buf, size_t n);
/* recv[r*n .. (r+1)*n) = rank r's send[0..n). send may be recv + rank*n. */
void q3_comm_allgather(q3_group *g, const float *send, size_t n, float *recv);
/* recv[0..n) = sum over ranks of their send[rank*n .. (rank+1)*n). */
void q3_comm_reduce_scatter_sum(q3_group *g, const float *send, float *recv, size_t n);
/* Block j of send (n elements) goes to rank j; block i of recv came from i. */
void q3_comm_alltoall(q3_group *g, const float *send, float *recv, size_t n);
/* Packed variable blocks: send_counts[j] elements to rank j, taken in rank
 * order from send; recv_counts[i] elements from rank i, stored in rank
 * order in recv. The counts must agree pairwise across ranks. */
void q3_comm_alltoallv(q3_group *g, const float *send, const size_t *send_counts, float *recv,
                       const size_t *recv_counts);
/* buf[0..n) of rank `root` to every rank of the group. */
void q3_comm_broadcast(q3_group *g, float *buf, size_t n, int root);
void q3_comm_barrier(q3_group *g);

/* --------------------------- byte collectives (quantized payloads: MXFP8
 * element bytes and their E8M0 scales); counts are in bytes. */
void q3_comm_allgather_bytes(q3_group *g, const void *send, size_t n, void *recv);
void q3_comm_alltoall_bytes(q3_group *g, const void *send, void *recv, size_t n);
void q3_comm_alltoallv_bytes(q3_group *g, const void *send, const size_t *send_counts, void *recv,
                             const size_t *recv_counts);
void q3_comm_broadcast_bytes(q3_group *g, void *buf, size_t n, int root);

/* ------------------------------ rows of floats, optionally MXFP8 on the wire
 * (comm_quant: mxfp8). Each row has n floats; its first nq (a multiple of
 * 32, nq <= n) travel as MXFP8 and the other n - nq as raw fp32 (e.g. the
 * routing ids and weights appended to a hidden row). A row on the wire is
 * nq E4M3 element bytes, nq/32 E8M0 scale bytes (the bit-exact codec of
 * src/quant/mx.h), then 4 (n - nq) bytes: q3_comm_wire_row_bytes. Every
 * rank's rows, its own included, go through quantize + dequantize, so all
 * ranks compute on identical values. nq == 0 is the plain fp32 collective
 * (`wire` unused, may be NULL). The counters count the bytes actually sent
 * (the formulas above with B in wire bytes), under the float kind. `wire`
 * is the caller's scratch, sized as stated per call (sized at load: these
 * calls allocate nothing). A NaN or infinite value in a quantized column
 * takes the job down (q3_comm_abort): it cannot be encoded. */
size_t q3_comm_wire_row_bytes(size_t n, size_t nq);
/* recv[r*rows*n ..] = rank r's rows; send may be recv + rank*rows*n.
 * wire: (P + 1) * rows * q3_comm_wire_row_bytes(n, nq) bytes. */
void q3_comm_allgather_rows(q3_group *g, const float *send, size_t rows, size_t n, size_t nq, float *recv,
                            uint8_t *wire);
/* Block j (rows rows of n) of send goes to rank j; block i of recv came
 * from rank i. wire: 2 * P * rows * q3_comm_wire_row_bytes(n, nq) bytes. */
void q3_comm_alltoall_rows(q3_group *g, const float *send, float *recv, size_t rows, size_t n, size_t nq,
                           uint8_t *wire);
/* alltoallv with counts in rows. wire: (sum of send_rows + sum of
 * recv_rows) * q3_comm_wire_row_bytes(n, nq) bytes. */
void q3_comm_alltoallv_rows(q3_group *g, const float *send, const size_t *send_rows, float *recv,
                            const size_t *recv_rows, size_t n, size_t nq, uint8_t *wire);

/* -------------------------------------------------------------- counting */

typedef struct {
    uint64_t calls;
    uint64_t bytes_sent, bytes_recv;
    double seconds;       /* total wall time inside the collective */
    double max_seconds;   /* longest single call */
} q3_comm_stat;

/* Phase that later collectives count under, e.g. "prefill" or "decode"
 * (at most Q3_COMM_PHASE_LEN-1 characters, Q3_COMM_MAX_PHASES distinct
 * names including "other"). 0, or -1 with q3_err. */
int q3_comm_set_phase(const char *phase);
const char *q3_comm_phase(void);
/* This rank's counters for (kind, phase); all zero when nothing was
 * recorded there. */
q3_comm_stat q3_comm_stats_get(q3_coll kind, const char *phase);
void q3_comm_stats_reset(void);
/* One line per (kind, phase) with calls: calls, bytes sent / received,
 * total and max ms; preceded by a header naming this rank. */
void q3_comm_stats_print(FILE *f);
/* "allreduce_sum", "allgather", ... */
const char *q3_coll_name(q3_coll kind);

/* The byte formula above for one call: `bytes` as defined per kind
 * (buffer, own block, own output block, block per peer); is_root matters
 * for broadcast only. Not for alltoallv (its counts are per peer). */
void q3_comm_payload(q3_coll kind, int nranks, uint64_t bytes, int is_root, uint64_t *sent, uint64_t *recv);

/* The watchdog limit in seconds (after q3_comm_init). */
double q3_comm_timeout_s(void);
/* Whether the watchdog watches the collectives started from now on (on
 * by default). Off around a wait that is meant to be long, such as the
 * other ranks waiting while rank 0 converts --quant's cache file: that can
 * take minutes on a real checkpoint. */
void q3_comm_watch(int on);

#endif
