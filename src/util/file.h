/* Read-only file mappings and whole-file reads. */
#ifndef Q3_FILE_H
#define Q3_FILE_H

#include <stddef.h>

typedef struct {
    char *path;          /* owned copy, for error messages */
    const unsigned char *data;
    size_t size;
    size_t anon_len; /* nonzero: data is an anonymous copy of this many bytes (q3_hugepages_set) */
    unsigned long long dev, ino; /* the file mapped (path may name another one later) */
} q3_mapped_file;

/* mmap a whole file read-only. On failure returns -1 with q3_err set. */
int q3_map_file(q3_mapped_file *f, const char *path);
/* Lock every file mapped from now on in RAM (mlock, which also reads it in),
 * so the kernel never pages model weights out under memory pressure; a file
 * that cannot be locked is then an error of q3_map_file. */
void q3_mlock_set(int on);
/* Read every file mapped from now on into anonymous memory backed by
 * transparent huge pages (madvise) instead of mapping it: fewer TLB misses
 * over experts scattered across the file, and pages the kernel cannot drop.
 * Costs a copy at start-up and the file's size in RAM; a file larger than
 * the available memory is an error. */
void q3_hugepages_set(int on);
int q3_hugepages_get(void);
/* Bytes of this process's memory in transparent huge pages (AnonHugePages
 * of /proc/self/smaps_rollup), or 0. */
size_t q3_anon_huge_bytes(void);
/* Bytes of this process's file mappings mapped with 2 MiB page entries
 * (FilePmdMapped of /proc/self/smaps_rollup), or 0. A mapped model decodes
 * slower when much of it is not: the page cache can hold a file in small
 * folios, depending on how it was written and read (BENCHMARKS.md). */
size_t q3_file_pmd_bytes(void);
void q3_unmap_file(q3_mapped_file *f);
/* Map every page of the file now (from the page cache, reading what is
 * missing) so that later accesses take no page faults. Best effort. */
void q3_prefault(const q3_mapped_file *f);
/* Make q3_prefault a no-op from now on (a rank of a multi-rank job touches
 * only its own slices of the weights). */
void q3_prefault_disable(void);
/* Switch prefaulting on or off; returns the previous setting. */
int q3_prefault_set(int enabled);
/* Bytes of memory the kernel reports as available (MemAvailable), or 0. */
size_t q3_mem_available(void);

/* Read a whole (small) file into a NUL-terminated heap buffer. */
char *q3_read_file(const char *path, size_t *len_out);

int q3_is_dir(const char *path);
int q3_file_exists(const char *path);
/* Whether a file that a command is about to write at path can be made:
 * path is not empty and not a directory, an existing file is replaced only
 * with force, and its directory exists and is writable. Checked before the
 * work, so a long run is not lost to a typo in its output path. 0, or -1
 * with q3_err naming path. */
int q3_check_output(const char *path, int force);
/* Remove what a failed write left at path, if it is a regular file (a
 * partial output would pass for a whole one; /dev/full and the like stay). */
void q3_remove_partial(const char *path);
/* Make directory path and its missing parents (mkdir -p). 0, or -1 with
 * q3_err. */
int q3_mkdir_p(const char *path);
/* The directory part of path ("." when it has none), a heap string. */
char *q3_path_dir(const char *path);
/* Join dir and name into a heap string. */
char *q3_path_join(const char *dir, const char *name);
/* Directory holding the running executable (heap string), or NULL. */
char *q3_exe_dir(void);

#endif
