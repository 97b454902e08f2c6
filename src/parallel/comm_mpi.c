/* The MPI backend of src/parallel/comm.h (built with Q3_HAVE_MPI). The only
 * file in q3moe that includes mpi.h. */
#include <limits.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "parallel/comm_internal.h"
#include "util/error.h"

struct q3_group {
    int rank, size;
    MPI_Comm comm;
    int *scratch;            /* 4 * size ints: alltoallv counts / displacements */
    char name[32];
    struct q3_group *next;   /* every live group, for finalize */
};

static q3_group *g_world = NULL;
static q3_group *g_groups = NULL;

int q3_comm_have_mpi(void) { return 1; }

static q3_group *group_new(MPI_Comm comm, const char *name) {
    q3_group *g = q3_calloc(1, sizeof *g);
    g->comm = comm;
    MPI_Comm_set_errhandler(comm, MPI_ERRORS_ARE_FATAL);
    MPI_Comm_rank(comm, &g->rank);
    MPI_Comm_size(comm, &g->size);
    g->scratch = q3_malloc(4 * (size_t)g->size * sizeof *g->scratch);
    snprintf(g->name, sizeof g->name, "%s", name ? name : "?");
    g->next = g_groups;
    g_groups = g;
    return g;
}

int q3_comm_init(int *argc, char ***argv) {
    if (g_world) return q3_err("comm: q3_comm_init called twice");
    if (q3_comm__read_timeout()) return -1;
    int inited = 0, provided = 0;
    MPI_Initialized(&inited);
    if (inited) return q3_err("comm: MPI was initialised outside the comm layer");
    /* THREAD_MULTIPLE so that the watchdog may call MPI_Abort while the
     * main thread is blocked in a collective. */
    MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided);
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_ARE_FATAL);
    MPI_Comm world;
    MPI_Comm_dup(MPI_COMM_WORLD, &world);
    g_world = group_new(world, "world");
    q3_comm__set_world(g_world->rank, g_world->size);
    if (q3_comm__watchdog_start()) return -1;
    return 0;
}

void q3_comm_finalize(void) {
    if (!g_world) return;
    q3_comm__watchdog_stop();
    while (g_groups) {
        q3_group *g = g_groups;
        g_groups = g->next;
        MPI_Comm_free(&g->comm);
        free(g->scratch);
        free(g);
    }
    g_world = NULL;
    MPI_Finalize();
}

q3_group *q3_comm_world(void) { return g_world; }
int q3_group_rank(const q3_group *g) { return g->rank; }
int q3_group_size(const q3_group *g) { return g->size; }
const char *q3_group_name(const q3_group *g) { return g->name; }

q3_group *q3_group_split(q3_group *parent, int color, int key, const char *name) {
    MPI_Comm c;
    MPI_Comm_split(parent->comm, color < 0 ? 0 : color, key, &c);
    return group_new(c, name);
}

void q3_group_free(q3_group *g) {
    if (!g || g == g_world) return;
    for (q3_group **p = &g_groups; *p; p = &(*p)->next)
        if (*p == g) {
            *p = g->next;
            break;
        }
    MPI_Comm_free(&g->comm);
    free(g->scratch);
    free(g);
}

_Noreturn void q3_comm_abort(const char *reason) {
    fprintf(stderr, "q3moe: rank %d of %d: fatal: %s\n", q3_comm__world_rank(), q3_comm__world_size(),
            reason ? reason : "(no reason given)");
    fflush(stderr);
    fflush(stdout);
    int inited = 0, finalized = 0;
    MPI_Initialized(&inited);
    MPI_Finalized(&finalized);
    if (inited && !finalized) MPI_Abort(MPI_COMM_WORLD, Q3_COMM_ABORT_CODE);
    _exit(Q3_COMM_ABORT_CODE);
}

/* ------------------------------------------------------------ helpers */

static int count_int(q3_group *g, q3_coll kind, size_t n) {
    if (n > INT_MAX) {
        char msg[160];
        snprintf(msg, sizeof msg, "%s on group '%s': count %zu exceeds INT_MAX", q3_coll_name(kind), g->name, n);
        q3_comm_abort(msg);
    }
    return (int)n;
}

static void check_root(q3_group *g, int root) {
    if (root < 0 || root >= g->size) {
        char msg[160];
        snprintf(msg, sizeof msg, "broadcast on group '%s': root %d is not in [0, %d)", g->name, root, g->size);
        q3_comm_abort(msg);
    }
}

static void record(q3_group *g, q3_coll kind, int64_t t0, uint64_t bytes, int is_root) {
    uint64_t s, r;
    q3_comm_payload(kind, g->size, bytes, is_root, &s, &r);
    q3_comm__end(kind, t0, s, r);
}

/* ------------------------------------------------------------ collectives */

void q3_comm_allreduce_sum(q3_group *g, float *buf, size_t n) {
    int c = count_int(g, Q3_COLL_ALLREDUCE, n);
    int64_t t0 = q3_comm__begin(Q3_COLL_ALLREDUCE, g->name);
    MPI_Allreduce(MPI_IN_PLACE, buf, c, MPI_FLOAT, MPI_SUM, g->comm);
    record(g, Q3_COLL_ALLREDUCE, t0, (uint64_t)n * sizeof(float), 0);
}

static void allgather(q3_group *g, const void *send, size_t n, void *recv, MPI_Datatype t, size_t es) {
    int c = count_int(g, Q3_COLL_ALLGATHER, n * (size_t)g->size);
    c /= g->size;
    const void *sb = (const char *)send == (const char *)recv + (size_t)g->rank * n * es ? MPI_IN_PLACE : send;
    int64_t t0 = q3_comm__begin(Q3_COLL_ALLGATHER, g->name);
    MPI_Allgather(sb, c, t, recv, c, t, g->comm);
    record(g, Q3_COLL_ALLGATHER, t0, (uint64_t)n * es, 0);
}

void q3_comm_allgather(q3_group *g, const float *send, size_t n, float *recv) {
    allgather(g, send, n, recv, MPI_FLOAT, sizeof(float));
}
void q3_comm_allgather_bytes(q3_group *g, const void *send, size_t n, void *recv) {
    allgather(g, send, n, recv, MPI_BYTE, 1);
}

void q3_comm_reduce_scatter_sum(q3_group *g, const float *send, float *recv, size_t n) {
    int c = count_int(g, Q3_COLL_REDUCE_SCATTER, n * (size_t)g->size) / g->size;
    int64_t t0 = q3_comm__begin(Q3_COLL_REDUCE_SCATTER, g->name);
    MPI_Reduce_scatter_block(send, recv, c, MPI_FLOAT, MPI_SUM, g->comm);
    record(g, Q3_COLL_REDUCE_SCATTER, t0, (uint64_t)n * sizeof(float), 0);
}

static void alltoall(q3_group *g, const void *send, void *recv, size_t n, MPI_Datatype t, size_t es) {
    int c = count_int(g, Q3_COLL_ALLTOALL, n * (size_t)g->size) / g->size;
    int64_t t0 = q3_comm__begin(Q3_COLL_ALLTOALL, g->name);
    MPI_Alltoall(send, c, t, recv, c, t, g->comm);
    record(g, Q3_COLL_ALLTOALL, t0, (uint64_t)n * es, 0);
}

void q3_comm_alltoall(q3_group *g, const float *send, float *recv, size_t n) {
    alltoall(g, send, recv, n, MPI_FLOAT, sizeof(float));
}
void q3_comm_alltoall_bytes(q3_group *g, const void *send, void *recv, size_t n) {
    alltoall(g, send, recv, n, MPI_BYTE, 1);
}

/* Counts are in units of `unit` elements of type t (es bytes each). */
static void alltoallv(q3_group *g, const void *send, const size_t *send_counts, void *recv,
                      const size_t *recv_counts, MPI_Datatype t, size_t es, size_t unit) {
    int p = g->size;
    int *sc = g->scratch, *sd = sc + p, *rc = sd + p, *rd = rc + p;
    size_t soff = 0, roff = 0;
    uint64_t sent = 0, got = 0;
    for (int j = 0; j < p; j++) {
        sc[j] = count_int(g, Q3_COLL_ALLTOALLV, send_counts[j] * unit);
        rc[j] = count_int(g, Q3_COLL_ALLTOALLV, recv_counts[j] * unit);
        sd[j] = count_int(g, Q3_COLL_ALLTOALLV, soff);
        rd[j] = count_int(g, Q3_COLL_ALLTOALLV, roff);
        soff += send_counts[j] * unit;
        roff += recv_counts[j] * unit;
        if (j != g->rank) {
            sent += (uint64_t)send_counts[j] * unit * es;
            got += (uint64_t)recv_counts[j] * unit * es;
        }
    }
    count_int(g, Q3_COLL_ALLTOALLV, soff);
    count_int(g, Q3_COLL_ALLTOALLV, roff);
    int64_t t0 = q3_comm__begin(Q3_COLL_ALLTOALLV, g->name);
    MPI_Alltoallv(send, sc, sd, t, recv, rc, rd, t, g->comm);
    q3_comm__end(Q3_COLL_ALLTOALLV, t0, p > 1 ? sent : 0, p > 1 ? got : 0);
}

void q3_comm_alltoallv(q3_group *g, const float *send, const size_t *send_counts, float *recv,
                       const size_t *recv_counts) {
    alltoallv(g, send, send_counts, recv, recv_counts, MPI_FLOAT, sizeof(float), 1);
}
void q3_comm_alltoallv_bytes(q3_group *g, const void *send, const size_t *send_counts, void *recv,
                             const size_t *recv_counts) {
    alltoallv(g, send, send_counts, recv, recv_counts, MPI_BYTE, 1, 1);
}
void q3_comm__alltoallv_units(q3_group *g, const void *send, const size_t *send_counts, void *recv,
                              const size_t *recv_counts, size_t unit) {
    alltoallv(g, send, send_counts, recv, recv_counts, MPI_BYTE, 1, unit);
}

static void broadcast(q3_group *g, void *buf, size_t n, int root, MPI_Datatype t, size_t es) {
    check_root(g, root);
    int c = count_int(g, Q3_COLL_BROADCAST, n);
    int64_t t0 = q3_comm__begin(Q3_COLL_BROADCAST, g->name);
    MPI_Bcast(buf, c, t, root, g->comm);
    record(g, Q3_COLL_BROADCAST, t0, (uint64_t)n * es, g->rank == root);
}

void q3_comm_broadcast(q3_group *g, float *buf, size_t n, int root) {
    broadcast(g, buf, n, root, MPI_FLOAT, sizeof(float));
}
void q3_comm_broadcast_bytes(q3_group *g, void *buf, size_t n, int root) { broadcast(g, buf, n, root, MPI_BYTE, 1); }

void q3_comm_barrier(q3_group *g) {
    int64_t t0 = q3_comm__begin(Q3_COLL_BARRIER, g->name);
    MPI_Barrier(g->comm);
    q3_comm__end(Q3_COLL_BARRIER, t0, 0, 0);
}
