#include "kernels/scratch.h"

#include <pthread.h>
#include <stdlib.h>

#include "util/error.h"

static pthread_key_t g_key;
static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static int g_key_ok;
static _Thread_local void **t_slots;
static _Thread_local size_t *t_sizes;

static void free_slots(void *v) {
    void **slots = v;
    for (int i = 0; i < Q3_SCR_COUNT; i++) free(slots[i]);
    free(slots[Q3_SCR_COUNT]); /* the sizes */
    free(slots);
}

static void make_key(void) { g_key_ok = pthread_key_create(&g_key, free_slots) == 0; }

void *q3_scratch(q3_scratch_slot slot, size_t bytes) {
    if (!t_slots) {
        pthread_once(&g_once, make_key);
        t_slots = q3_calloc(Q3_SCR_COUNT + 1, sizeof *t_slots);
        t_slots[Q3_SCR_COUNT] = t_sizes = q3_calloc(Q3_SCR_COUNT, sizeof *t_sizes);
        if (!g_key_ok || pthread_setspecific(g_key, t_slots) != 0) {
            /* No key for this thread: its buffers stay until the process
             * ends (nothing else goes wrong; g_key_ok is only read here,
             * after pthread_once, so no thread writes it twice). */
        }
    }
    if (bytes > t_sizes[slot]) {
        free(t_slots[slot]);
        t_slots[slot] = q3_malloc(bytes);
        t_sizes[slot] = bytes;
    }
    return t_slots[slot];
}
