/* The look-ahead of the compiled forwarding engine: the flow lookups of the frames ahead,
 * made in blocks before the forwarding pass reaches them.
 *
 * With 10^5 flows a read of small frames is mostly lookups of different flows, each an
 * index slot and an entry somewhere in megabytes of tables. Looked up one by one inside
 * the forwarding pass, each lookup waited for memory in turn, its probe's branches and
 * dependent loads in the middle of the pass's own chain of work (the link it plans for,
 * the counters it adds to). The scout takes the lookups out of the pass, in two steps:
 *
 *   parse:   walk the frame headers ahead, hash each key, prefetch its index slot;
 *   resolve: a block of SCOUT_BLOCK frames at a time, a block after they were parsed,
 *            finish each probe (the keys compared) and keep the entry found, or NULL when
 *            the table holds no entry for the key.
 *
 * The lookups of a block do not depend on each other, so the processor overlaps their
 * waits for the entries by itself: prefetching the entries a block earlier as well (a
 * third step) measured no faster with 10^5 flows, nor did longer distances or other
 * blocks (4, 16). The pass then takes each frame's entry from the scout. The tables do
 * not change during a call, so a resolved entry is exactly what fp_flow_find would return;
 * a frame the scout did not reach is looked up in the pass as before. The scout only reads
 * the buffer and the tables: a frame the pass stops at (a bad header, the end of its
 * budget) just leaves the lookups made past it unused. Off below SCOUT_MIN_FLOWS mirrored
 * flows: small tables stay in the caches, and a lookup made in the pass costs less than
 * the scout's bookkeeping.
 */
#ifndef FLOWNET_FASTPATH_SCOUT_H
#define FLOWNET_FASTPATH_SCOUT_H
#include "_fastpath_tables.h"

#define SCOUT_MIN_FLOWS 4096
#define SCOUT_BLOCK 8 /* frames resolved at a time */
#define SCOUT_AHEAD 8 /* frames parsed past the last resolved one */
#define SCOUT_RING 32 /* a power of two, at least the frames parsed and not taken */
_Static_assert(SCOUT_BLOCK + SCOUT_AHEAD <= SCOUT_RING, "the ring holds what is ahead");

/* what scout_take returns for a frame the scout did not reach */
#define SCOUT_UNKNOWN ((Flow *)1)

typedef struct {
    Py_ssize_t at; /* where the next frame not yet parsed starts */
    /* frames parsed, resolved and taken by the pass, counted from the buffer's first
     * frame: taken <= resolved <= parsed <= taken + SCOUT_RING */
    uint64_t parsed, resolved, taken;
    Py_ssize_t off[SCOUT_RING]; /* where each frame in the ring starts */
    uint32_t slot[SCOUT_RING];  /* the index slot its key hashes to */
    Flow *flow[SCOUT_RING];     /* resolved: its entry, or NULL */
} Scout;

/* Parse the frames up to SCOUT_AHEAD past the last resolved one (d, n: the buffer). */
static inline void scout_parse(Scout *s, const Engine *e, const uint8_t *d, Py_ssize_t n) {
    const uint64_t m = (uint64_t)(e->index_cap - 1);
    const uint64_t limit = s->resolved + SCOUT_AHEAD;
    Py_ssize_t at = s->at;
    uint64_t i = s->parsed;
    while (i < limit && n - at >= HEADER) {
        const uint8_t *h = d + at;
        uint32_t size = ((uint32_t)h[16] << 24) | ((uint32_t)h[17] << 16)
                        | ((uint32_t)h[18] << 8) | h[19];
        if ((Py_ssize_t)size > n - at - HEADER) break; /* not whole yet */
        uint32_t slot = (uint32_t)(hash_key(h) & m);
        __builtin_prefetch(&e->index[slot]);
        s->off[i % SCOUT_RING] = at;
        s->slot[i % SCOUT_RING] = slot;
        at += HEADER + (Py_ssize_t)size;
        i++;
    }
    s->at = at;
    s->parsed = i;
}

/* Finish the lookups of up to a block of parsed frames. */
static inline void scout_resolve(Scout *s, const Engine *e, const uint8_t *d) {
    uint64_t end = s->resolved + SCOUT_BLOCK < s->parsed ? s->resolved + SCOUT_BLOCK
                                                         : s->parsed;
    for (uint64_t i = s->resolved; i < end; i++) {
        uint64_t r = i % SCOUT_RING;
        s->flow[r] = fp_flow_find_at(e, d + s->off[r], s->slot[r]);
    }
    s->resolved = end;
}

/* Start on a buffer whose first frame is at *pos*: whether to scout it at all (a small
 * table: no). The first frames are parsed at once. */
static inline int scout_start(Scout *s, const Engine *e, const uint8_t *d, Py_ssize_t n,
                              Py_ssize_t pos) {
    if (e->nflows < SCOUT_MIN_FLOWS || e->index_cap == 0) return 0;
    s->at = pos;
    s->parsed = s->resolved = s->taken = 0;
    scout_parse(s, e, d, n);
    return 1;
}

/* The entry of the next frame of the buffer (called once for each frame the pass takes, in
 * order): the entry, NULL when the table holds none for its key, or SCOUT_UNKNOWN when the
 * scout did not reach the frame. When the pass has taken every resolved frame, the next
 * block is resolved and the frames past it parsed. */
static inline Flow *scout_take(Scout *s, const Engine *e, const uint8_t *d, Py_ssize_t n) {
    if (s->taken >= s->resolved) {
        scout_resolve(s, e, d);
        scout_parse(s, e, d, n);
        if (s->taken >= s->resolved) {
            s->taken++;
            return SCOUT_UNKNOWN;
        }
    }
    return s->flow[s->taken++ % SCOUT_RING];
}

#endif
