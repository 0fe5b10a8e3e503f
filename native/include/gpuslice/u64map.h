/* A small open-addressing hash map from a 64-bit key (device pointer, handle) to three 64-bit words,
 * for the enforcer's per-process books (VMM mappings and handles, pool allocations). Not
 * thread-safe: the owner holds its own lock. Allocates with calloc; on host out-of-memory a put
 * fails (-1) and the caller decides how to err on the safe side. */
#ifndef GPUSLICE_U64MAP_H
#define GPUSLICE_U64MAP_H
#include <stddef.h>
#include <stdint.h>

struct gs_u64val {
    uint64_t a, b, c;
};
struct gs_u64slot {
    uint64_t key;
    struct gs_u64val v;
    uint32_t state; /* 0 empty, 1 live, 2 tombstone */
};
struct gs_u64map {
    struct gs_u64slot *slot;
    size_t cap, filled, live;
};

/* The live value of key, or NULL. The pointer is valid until the next put/take/clear. */
struct gs_u64val *gs_u64map_get(struct gs_u64map *m, uint64_t key);
/* Insert or replace. 0, or -1 when the host is out of memory (nothing changed). */
int gs_u64map_put(struct gs_u64map *m, uint64_t key, struct gs_u64val v);
/* Remove key; 1 and *out (if not NULL) when it was there, else 0. */
int gs_u64map_take(struct gs_u64map *m, uint64_t key, struct gs_u64val *out);
/* Visit every live entry; when fn returns non-zero the entry is removed. */
void gs_u64map_filter(struct gs_u64map *m, int (*fn)(uint64_t key, struct gs_u64val *v, void *arg), void *arg);
/* Free everything (the map is empty and usable afterwards). */
void gs_u64map_clear(struct gs_u64map *m);
#endif
