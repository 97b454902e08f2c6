/* The single-rank backend of src/parallel/comm.h (`make MPI=0`, or no
 * OpenMPI found): world size 1, every group has one rank, collectives are
 * copies or no-ops. Calls and time are still counted; bytes are 0 by the
 * formulas (nothing leaves the rank). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "parallel/comm_internal.h"
#include "util/error.h"

struct q3_group {
    int rank, size;
    char name[32];
    struct q3_group *next;
};

static q3_group g_world_group = {.rank = 0, .size = 1, .name = "world"};
static int g_inited = 0;
static q3_group *g_groups = NULL;

int q3_comm_have_mpi(void) { return 0; }

/* Launched by a process manager for more ranks than this build can talk to:
 * every copy would run alone, so refuse. */
static int launched_size(void) {
    static const char *vars[] = {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE", "MPI_LOCALNRANKS"};
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) {
        const char *s = getenv(vars[i]);
        if (s && atoi(s) > 1) return atoi(s);
    }
    return 1;
}

int q3_comm_init(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    if (g_inited) return q3_err("comm: q3_comm_init called twice");
    if (q3_comm__read_timeout()) return -1;
    int n = launched_size();
    if (n > 1)
        return q3_err("comm: this q3moe was built without MPI (make MPI=0, or no OpenMPI found) "
                      "but was launched as one of %d ranks; rebuild with OpenMPI (libopenmpi-dev)", n);
    q3_comm__set_world(0, 1);
    g_inited = 1;
    return 0;
}

void q3_comm_finalize(void) {
    while (g_groups) {
        q3_group *g = g_groups;
        g_groups = g->next;
        free(g);
    }
    g_inited = 0;
}

q3_group *q3_comm_world(void) { return g_inited ? &g_world_group : NULL; }
int q3_group_rank(const q3_group *g) { return g->rank; }
int q3_group_size(const q3_group *g) { return g->size; }
const char *q3_group_name(const q3_group *g) { return g->name; }

q3_group *q3_group_split(q3_group *parent, int color, int key, const char *name) {
    (void)parent;
    (void)color;
    (void)key;
    q3_group *g = q3_calloc(1, sizeof *g);
    g->size = 1;
    snprintf(g->name, sizeof g->name, "%s", name ? name : "?");
    g->next = g_groups;
    g_groups = g;
    return g;
}

void q3_group_free(q3_group *g) {
    if (!g || g == &g_world_group) return;
    for (q3_group **p = &g_groups; *p; p = &(*p)->next)
        if (*p == g) {
            *p = g->next;
            break;
        }
    free(g);
}

_Noreturn void q3_comm_abort(const char *reason) {
    fprintf(stderr, "q3moe: rank 0 of 1: fatal: %s\n", reason ? reason : "(no reason given)");
    fflush(stderr);
    fflush(stdout);
    _exit(Q3_COMM_ABORT_CODE);
}

static void copy(void *dst, const void *src, size_t bytes) {
    if (dst != src && bytes) memmove(dst, src, bytes);
}

void q3_comm_allreduce_sum(q3_group *g, float *buf, size_t n) {
    (void)buf;
    int64_t t0 = q3_comm__begin(Q3_COLL_ALLREDUCE, g->name);
    q3_comm__end(Q3_COLL_ALLREDUCE, t0, 0, 0);
    (void)n;
}

void q3_comm_allgather(q3_group *g, const float *send, size_t n, float *recv) {
    q3_comm_allgather_bytes(g, send, n * sizeof(float), recv);
}
void q3_comm_allgather_bytes(q3_group *g, const void *send, size_t n, void *recv) {
    int64_t t0 = q3_comm__begin(Q3_COLL_ALLGATHER, g->name);
    copy(recv, send, n);
    q3_comm__end(Q3_COLL_ALLGATHER, t0, 0, 0);
}

void q3_comm_reduce_scatter_sum(q3_group *g, const float *send, float *recv, size_t n) {
    int64_t t0 = q3_comm__begin(Q3_COLL_REDUCE_SCATTER, g->name);
    copy(recv, send, n * sizeof(float));
    q3_comm__end(Q3_COLL_REDUCE_SCATTER, t0, 0, 0);
}

void q3_comm_alltoall(q3_group *g, const float *send, float *recv, size_t n) {
    q3_comm_alltoall_bytes(g, send, recv, n * sizeof(float));
}
void q3_comm_alltoall_bytes(q3_group *g, const void *send, void *recv, size_t n) {
    int64_t t0 = q3_comm__begin(Q3_COLL_ALLTOALL, g->name);
    copy(recv, send, n);
    q3_comm__end(Q3_COLL_ALLTOALL, t0, 0, 0);
}

/* es: bytes per count unit. */
static void alltoallv(q3_group *g, const void *send, const size_t *send_counts, void *recv,
                      const size_t *recv_counts, size_t es) {
    if (send_counts[0] != recv_counts[0]) {
        char msg[160];
        snprintf(msg, sizeof msg, "alltoallv on group '%s': send count %zu != receive count %zu on one rank",
                 g->name, send_counts[0], recv_counts[0]);
        q3_comm_abort(msg);
    }
    int64_t t0 = q3_comm__begin(Q3_COLL_ALLTOALLV, g->name);
    copy(recv, send, send_counts[0] * es);
    q3_comm__end(Q3_COLL_ALLTOALLV, t0, 0, 0);
}

void q3_comm_alltoallv(q3_group *g, const float *send, const size_t *send_counts, float *recv,
                       const size_t *recv_counts) {
    alltoallv(g, send, send_counts, recv, recv_counts, sizeof(float));
}
void q3_comm_alltoallv_bytes(q3_group *g, const void *send, const size_t *send_counts, void *recv,
                             const size_t *recv_counts) {
    alltoallv(g, send, send_counts, recv, recv_counts, 1);
}
void q3_comm__alltoallv_units(q3_group *g, const void *send, const size_t *send_counts, void *recv,
                              const size_t *recv_counts, size_t unit) {
    alltoallv(g, send, send_counts, recv, recv_counts, unit);
}

void q3_comm_broadcast_bytes(q3_group *g, void *buf, size_t n, int root) {
    (void)buf;
    (void)n;
    if (root != 0) {
        char msg[160];
        snprintf(msg, sizeof msg, "broadcast on group '%s': root %d is not in [0, 1)", g->name, root);
        q3_comm_abort(msg);
    }
    int64_t t0 = q3_comm__begin(Q3_COLL_BROADCAST, g->name);
    q3_comm__end(Q3_COLL_BROADCAST, t0, 0, 0);
}
void q3_comm_broadcast(q3_group *g, float *buf, size_t n, int root) {
    q3_comm_broadcast_bytes(g, buf, n * sizeof(float), root);
}

void q3_comm_barrier(q3_group *g) {
    int64_t t0 = q3_comm__begin(Q3_COLL_BARRIER, g->name);
    q3_comm__end(Q3_COLL_BARRIER, t0, 0, 0);
}
