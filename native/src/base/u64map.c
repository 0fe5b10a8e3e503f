/* Open addressing with linear probing and tombstones; the table doubles at 3/4 fill (tombstones
 * included) and is rebuilt without them. See u64map.h. */
#include <stdlib.h>

#include "gpuslice/u64map.h"

static size_t home(uint64_t key, size_t cap)
{
    return (size_t)((key * 0x9E3779B97F4A7C15ull) >> 20) & (cap - 1);
}

/* Slot of key if live, else (size_t)-1. */
static size_t find(const struct gs_u64map *m, uint64_t key)
{
    if (!m->cap) return (size_t)-1;
    for (size_t s = home(key, m->cap), n = 0; n < m->cap; s = (s + 1) & (m->cap - 1), n++) {
        if (m->slot[s].state == 0) return (size_t)-1;
        if (m->slot[s].state == 1 && m->slot[s].key == key) return s;
    }
    return (size_t)-1;
}

static int rebuild(struct gs_u64map *m, size_t ncap)
{
    struct gs_u64slot *n = calloc(ncap, sizeof *n);
    if (!n) return -1;
    for (size_t i = 0; i < m->cap; i++) {
        if (m->slot[i].state != 1) continue;
        size_t s = home(m->slot[i].key, ncap);
        while (n[s].state) s = (s + 1) & (ncap - 1);
        n[s] = m->slot[i];
    }
    free(m->slot);
    m->slot = n;
    m->cap = ncap;
    m->filled = m->live;
    return 0;
}

struct gs_u64val *gs_u64map_get(struct gs_u64map *m, uint64_t key)
{
    size_t s = find(m, key);
    return s == (size_t)-1 ? NULL : &m->slot[s].v;
}

int gs_u64map_put(struct gs_u64map *m, uint64_t key, struct gs_u64val v)
{
    size_t s = find(m, key);
    if (s != (size_t)-1) {
        m->slot[s].v = v;
        return 0;
    }
    if ((m->filled + 1) * 4 > m->cap * 3) {
        size_t ncap = m->cap ? (m->live * 2 >= m->cap / 2 ? m->cap * 2 : m->cap) : 64;
        if (rebuild(m, ncap)) return -1;
    }
    s = home(key, m->cap);
    while (m->slot[s].state == 1) s = (s + 1) & (m->cap - 1);
    if (m->slot[s].state == 0) m->filled++;
    m->slot[s] = (struct gs_u64slot){key, v, 1};
    m->live++;
    return 0;
}

int gs_u64map_take(struct gs_u64map *m, uint64_t key, struct gs_u64val *out)
{
    size_t s = find(m, key);
    if (s == (size_t)-1) return 0;
    if (out) *out = m->slot[s].v;
    m->slot[s].state = 2;
    m->live--;
    return 1;
}

void gs_u64map_filter(struct gs_u64map *m, int (*fn)(uint64_t key, struct gs_u64val *v, void *arg), void *arg)
{
    for (size_t i = 0; i < m->cap; i++)
        if (m->slot[i].state == 1 && fn(m->slot[i].key, &m->slot[i].v, arg)) {
            m->slot[i].state = 2;
            m->live--;
        }
}

void gs_u64map_clear(struct gs_u64map *m)
{
    free(m->slot);
    m->slot = NULL;
    m->cap = m->filled = m->live = 0;
}
