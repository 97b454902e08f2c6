#include "kernels/scratch.h"

#include <pthread.h>
#include <stdlib.h>

#include "util/error.h"

static pthread_key_t g_key;
static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static int g_key_ok;
/* A thread's buffers and their sizes, one allocation the key's destructor frees. */
typedef struct {
    void *buf[Q3_SCR_COUNT];
    size_t size[Q3_SCR_COUNT];
} slots;
static _Thread_local slots *t_slots;

static void free_slots(void *v) {
    slots *s = v;
    for (int i = 0; i < Q3_SCR_COUNT; i++) q3_free_aligned(s->buf[i]);
    free(s);
}

static void make_key(void) { g_key_ok = pthread_key_create(&g_key, free_slots) == 0; }

void *q3_scratch(q3_scratch_slot slot, size_t bytes) {
    if (!t_slots) {
        pthread_once(&g_once, make_key);
        t_slots = q3_calloc(1, sizeof *t_slots);
        if (!g_key_ok || pthread_setspecific(g_key, t_slots) != 0) {
            /* No key for this thread: its buffers stay until the process
             * ends (nothing else goes wrong; g_key_ok is only read here,
             * after pthread_once, so no thread writes it twice). */
        }
    }
    if (bytes > t_slots->size[slot]) {
        q3_free_aligned(t_slots->buf[slot]);
        t_slots->buf[slot] = q3_calloc_aligned(bytes, 1);
        t_slots->size[slot] = bytes;
    }
    return t_slots->buf[slot];
}

void q3_scratch_reserve(q3_scratch_slot slot, size_t bytes) {
#pragma omp parallel
    q3_scratch(slot, bytes);
}
