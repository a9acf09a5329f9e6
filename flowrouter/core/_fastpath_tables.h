/* The compiled forwarding engine's tables: the types of the mirror (links, flows, the
 * engine that holds them) and the functions of _fastpath_tables.c that fill and search it.
 *
 * The engine is the twin of flowrouter/core/fastpath_py.py; _fastpath_tables.c holds the
 * mirror of the router's tables (links and flows in open-addressing maps) and their Python
 * methods, _fastpath.c the forwarding pass and the Python type. The forwarding pass builds on
 * the tables and the tables know nothing of it: both files include this header, and
 * _fastpath_tables.c nothing of _fastpath.c.
 */
#ifndef FLOWNET_FASTPATH_TABLES_H
#define FLOWNET_FASTPATH_TABLES_H
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#define HEADER 24
#define ROUTER_BANDS_END 16
/* bands 17..19 (faults, overflow notices, membership notices) originate only at routers: a
 * frame on one from an application link is the core's (it drops and counts it) */
#define ROUTER_ONLY_FIRST 17
#define ROUTER_ONLY_LAST 19
#define NUM_BANDS 128
#define NUM_LOC 4

enum { STOP_END = 0, STOP_PARTIAL = 1, STOP_SLOW = 2, STOP_MISS_FLOW = 3, STOP_MISS_LINK = 4,
       STOP_MISS_ROUTE = 5 };

/* what a route says instead of a link: the core drops such frames (no members, no route) */
#define ROUTE_NO_MEMBERS (-1)
#define ROUTE_NONE (-2)
/* counts[]: COUNT_NAMES (0-5), decisions forwarded / dropped (6, 7), frames taken (8),
 * MORE_COUNT_NAMES (9-11): see fastpath_py.py */
#define NCOUNTS 12

typedef struct { uint64_t lo, hi; } mask128;

static inline int mask_has(mask128 m, int bit) {
    return bit < 64 ? (int)((m.lo >> bit) & 1) : (int)((m.hi >> (bit - 64)) & 1);
}

typedef struct {
    long id;
    int used;
    int router;
    uint32_t max_payload;
    uint8_t mods[NUM_LOC];
    /* output planned during one forward() call: bytes, frames, its bytes object */
    Py_ssize_t len;
    long frames;
    int dirty;
    char *wp;
    /* frames passed by reference (payload not copied): their count, and while the output
     * is built: the link's bytes object, a memoryview of it, the list of pieces, and how
     * much of the bytes the pieces cover so far */
    Py_ssize_t nrefs;
    PyObject *bytes, *bview, *pieces;
    Py_ssize_t prev;
    /* shared runs (see Run) this link gets in the call; a mark while a run's links are
     * checked for one given twice */
    Py_ssize_t nshared;
    int seen;
    /* where its frames of the call lie in the input: [vstart, vend), while they lie back
     * to back (vcontig); with in_place, such a link gets a view of that range */
    Py_ssize_t vstart, vend;
    int vcontig, vout;
} Link;

/* One frame copy to one output link, planned in the decision pass and carried out when
 * every link's output size is known, straight into its bytes object (one copy per byte).
 * A large payload (ref_min bytes or more) is not copied: only its rewritten header is, and
 * the payload goes out as a view into the input. */
typedef struct {
    Py_ssize_t slot, src;
    uint32_t size;
    uint8_t lt, left, ttl;
    uint8_t ref; /* the payload is passed as a view into the input, not copied */
} Copy;

/* A run of consecutive frames that each go to the same links (two or more, one locality
 * value for all): built once into one bytes object (or a list of pieces, with payloads
 * passed by reference) that all its links share instead of each getting a copy (fan-out).
 * Its frames are rframes[first .. first + nframes), its links rtargets[tgt .. tgt + nt). */
typedef struct {
    Py_ssize_t first, nframes, tgt, nt;
    Py_ssize_t wire, own, nrefs; /* bytes in all; bytes copied into it; payloads by ref */
    uint8_t left;
    PyObject *obj; /* while the outputs are built: its bytes, or its list of pieces */
} Run;

/* One mirrored flow: 64 bytes, one cache line, in a dense array (the hot table below maps
 * keys to it). A flow with one downstream link (most of them) keeps it inline; more go in
 * two arrays of their own. ndown == FLOW_ABSENT: the core holds no entry for the key. Link
 * ids in a flow are 0..2^31-1 (the router numbers its links from 1). d.one.cls: the
 * routing class (see FlowClass) of a flow with at most one downstream link (the others
 * have none: flow_cls). */
#define FLOW_ABSENT UINT32_MAX
#define FLOW_MAX_DOWN 65535
typedef struct {
    uint8_t key[16];
    mask128 agg;
    union {
        struct { mask128 mask; int32_t link; uint32_t cls; } one; /* ndown <= 1 */
        struct { int32_t *links; mask128 *masks; } many; /* ndown > 1 */
    } d;
    int32_t up; /* -1: none */
    uint32_t ndown;
} Flow;

_Static_assert(sizeof(Flow) == 64, "a mirrored flow is one cache line");

/* What a mirrored flow took since it was mirrored (data frames forwarded or dropped by the
 * tree's masks, and their bytes, headers included): the sum of this, kept beside the
 * entries in an array indexed like the dense array of flows, and of the 32-bit counters in
 * the flow's hot slot (below), which spill into it before they would wrap. Absent keys
 * count nothing (the core holds no entry to hand it to). */
typedef struct {
    uint64_t frames, bytes;
} FlowCount;

/* The hot table: open addressing by flow key, 32-byte slots (two a cache line), each
 * holding its key, where its entry is in the dense array, its routing class and its recent
 * counters. A frame of a flow routed like the frame before it (many flows to one
 * subscriber) is forwarded from its slot alone: one cache line a lookup, where an index of
 * positions took the index's line, the entry's and the counters'. pos: the entry's
 * position + 1; 0 empty; HOT_GONE a tombstone. */
#define HOT_GONE UINT32_MAX
typedef struct {
    uint8_t key[16];
    uint32_t pos, cls;
    uint32_t frames, bytes;
} Hot;

_Static_assert(sizeof(Hot) == 32, "two hot slots a cache line");

/* A routing class: flows whose frames every link would decide alike, in every band (the
 * same upstream link, at most one downstream link, the same one, and the same band masks).
 * Interned, with a count of the flows in it, so that "routed like the last frame" is one
 * comparison of class numbers (1..MAX_CLASSES; a flow past that many classes gets 0 and is
 * decided on its own). Flows with several downstream links get none. */
#ifndef MAX_CLASSES
#define MAX_CLASSES 65536
#endif
#define CLASS_BUCKETS 4096
typedef struct {
    mask128 agg, mask;
    int32_t up, link;
    uint32_t ndown, refs, next; /* next: in its bucket's chain, or in the free list */
} FlowClass;

static inline const int32_t *flow_downs(const Flow *f) {
    return f->ndown <= 1 ? &f->d.one.link : f->d.many.links;
}

static inline const mask128 *flow_masks(const Flow *f) {
    return f->ndown <= 1 ? &f->d.one.mask : f->d.many.masks;
}

static inline uint32_t flow_cls(const Flow *f) {
    return f->ndown <= 1 ? f->d.one.cls : 0;
}

/* Where a frame of an absent flow with this LSID goes: a link, or ROUTE_NO_MEMBERS /
 * ROUTE_NONE. */
typedef struct {
    uint32_t lsid;
    uint8_t used;
    long link;
} Route;

typedef struct {
    PyObject_HEAD
    Link *links;
    Py_ssize_t nlinks, links_cap;
    Py_ssize_t *lmap; /* slot+1, 0 empty; size lmap_cap (power of two) */
    Py_ssize_t lmap_cap;
    /* flows: a dense array (nflows used of flows_cap) and the hot table (hot_cap slots, a
     * power of two) */
    Flow *flows;
    FlowCount *counts; /* counts[j]: what flows[j] took, but for its hot slot's */
    Py_ssize_t nflows, flows_cap;
    Hot *hot;
    Py_ssize_t hot_cap, hot_filled; /* filled = used + tombstones */
    Py_ssize_t hot_longest; /* slots the longest probe for a key in the table reads */
    /* routing classes: classes[id - 1], chained from buckets by hash; ncls ids handed out
     * so far (cls_live of them held), cls_free the first free id (0: none), cls_full
     * flows that found no room */
    FlowClass *classes;
    uint32_t *cls_buckets;
    uint32_t ncls, cls_cap, cls_free, cls_live;
    uint64_t cls_full;
    Py_ssize_t *dirty;
    Py_ssize_t ndirty, dirty_cap;
    Copy *copies;
    Py_ssize_t ncopies, copies_cap;
    /* shared runs planned in one forward() call, their frames and their links */
    Run *runs;
    Py_ssize_t nruns, runs_cap;
    Copy *rframes;
    Py_ssize_t nrframes, rframes_cap;
    Py_ssize_t *rtargets;
    Py_ssize_t nrtargets, rtargets_cap;
    Route *routes; /* open addressing by LSID, grown at half full; never deleted singly */
    uint64_t seed[2]; /* hash_key's, drawn when the engine is made */
    Py_ssize_t routes_cap, routes_used;
} Engine;

/* ------------------------------------------------------------------ hashing */
/* The hash of a flow key in the hot table, mixed with the engine's own random seed: flow
 * keys are chosen by whoever creates a flow, and with a hash known in advance an
 * application could create flows that all land in one run of slots, making every lookup
 * long. Not a keyed cryptographic hash (that would cost more than the rest of a lookup): it
 * takes away keys worked out beforehand. */
static inline uint64_t hash_key(const uint8_t *k, const uint64_t seed[2]) {
    uint64_t a, b;
    memcpy(&a, k, 8);
    memcpy(&b, k + 8, 8);
    a ^= seed[0];
    b ^= seed[1];
    uint64_t h = a * 0x9E3779B97F4A7C15ULL ^ (b + 0x632BE59BD9B4E019ULL);
    h ^= h >> 29;
    h *= 0xBF58476D1CE4E5B9ULL;
    h ^= h >> 32;
    return h;
}

/* The slot where the probe for a key of hash *h* starts, in a hot table of *cap* slots.
 * Starting at the first slot of the line instead (both slots of the line read first) was
 * measured: 0.15 more slots compared a lookup on average and about 0.5 ns more a frame
 * with the table in cache, no faster in a router with 10^5 flows. */
static inline Py_ssize_t hot_home(uint64_t h, Py_ssize_t cap) {
    return (Py_ssize_t)(h & (uint64_t)(cap - 1));
}

static inline uint64_t hash_long(long v) {
    uint64_t h = (uint64_t)v * 0x9E3779B97F4A7C15ULL;
    return h ^ (h >> 31);
}

/* The hot slot of *key*, the probe starting at slot *i*, or NULL (here, inline, for the
 * forwarding pass's lookups). */
static inline Hot *hot_probe(const Engine *e, const uint8_t *key, Py_ssize_t i) {
    Py_ssize_t m = e->hot_cap - 1;
    for (;; i = (i + 1) & m) {
        Hot *s = &e->hot[i];
        if (s->pos == 0) return NULL;
        if (s->pos != HOT_GONE && memcmp(s->key, key, 16) == 0) return s;
    }
}

/* Count a frame of *n* bytes (header included) to the flow of hot slot *s*: in the slot,
 * or, when its 32-bit counters would wrap, into the flow's FlowCount with what they held. */
static inline void hot_spill_slot(Engine *e, Hot *s) {
    FlowCount *c = &e->counts[s->pos - 1];
    c->frames += s->frames;
    c->bytes += s->bytes;
    s->frames = s->bytes = 0;
}

static inline void hot_count(Engine *e, Hot *s, uint64_t n) {
    if (n <= (uint64_t)(UINT32_MAX - s->bytes) && s->frames != UINT32_MAX) {
        s->frames++;
        s->bytes += (uint32_t)n;
        return;
    }
    hot_spill_slot(e, s); /* then this frame straight into the 64-bit counters */
    e->counts[s->pos - 1].frames++;
    e->counts[s->pos - 1].bytes += n;
}

/* ------------------------------------------------------------------ look-ahead */
/* A scout over the frames of one received buffer, for tables larger than the caches: with
 * 10^5 flows a read of small frames is mostly lookups of different flows, each a hot slot
 * somewhere in megabytes that the sender's and the receiver's socket copies have pushed out
 * of the caches since that flow's last frame (without the scout a router forwarded a third
 * as many such frames a second). The scout hashes the key of a frame SCOUT_FAR frames ahead
 * of the one being forwarded and prefetches its hot slot, so the waits overlap. Hints
 * only: the lookups themselves are unchanged. Off below SCOUT_MIN_FLOWS mirrored flows
 * (small tables stay in cache).
 *
 * While the frames are all of one size (a bulk sender's stream), where the frame SCOUT_FAR
 * ahead starts is computed from the current frame's size: nothing is kept from frame to
 * frame. Walking the frames in between instead is a chain of dependent loads (each frame's
 * size says where the next starts) through state kept in memory: the engine alone, 16-byte
 * frames of 10^5 flows in cache, took 7.0 ns a frame walking and 6.3 guessing (one flow:
 * 3.6); routers forwarding them, about 5% more frames a second, within the spread of a
 * row (BENCHMARKS.md). From the first frame of another size on, the scout walks (a guess
 * made before it only prefetched a slot for nothing), hashing each key once and skipping
 * runs of frames of one flow: such reads cost what they cost before, or up to 0.3 ns a
 * frame more. */
#ifndef SCOUT_MIN_FLOWS
#define SCOUT_MIN_FLOWS 4096
#endif
#ifndef SCOUT_FAR
#define SCOUT_FAR 16
#endif
#ifndef SCOUT_RING
#define SCOUT_RING 32 /* a power of two above SCOUT_FAR */
#endif

typedef struct {
    int walking;     /* a frame of another size was met: walking from frame to frame */
    uint32_t size;   /* until then, the size of every frame */
    Py_ssize_t at;   /* walking: where the next frame the scout has not passed starts */
    Py_ssize_t prev; /* walking: the last frame it passed (its key), or -1 */
    uint64_t passed, done; /* walking: frames passed by the scout, and forwarded (or dropped) */
    uint32_t slot[SCOUT_RING]; /* walking: the hot slot of each passed frame's key;
                                * UINT32_MAX: the previous frame's key */
} Scout;

/* The hot slot where the probe for *key* starts. (Each caller prefetches it itself: GCC
 * takes a function that only prefetches for one without side effects, and dropped every
 * call whose result went unused, the guesses' prefetches among them.) */
static inline uint32_t scout_slot(const Engine *e, const uint8_t *key) {
    return (uint32_t)hot_home(hash_key(key, e->seed), e->hot_cap);
}

/* Whether to scout this buffer at all (a small table: no). When it does, the hot slots of
 * the first SCOUT_FAR frames (guessed alike from the first frame's size) are prefetched. */
static inline int scout_start(Scout *s, const Engine *e, const uint8_t *d, Py_ssize_t n,
                              Py_ssize_t pos) {
    s->walking = 0;
    s->size = 0;
    s->at = pos;
    s->prev = -1;
    s->passed = s->done = 0;
    if (e->nflows < SCOUT_MIN_FLOWS || e->hot_cap == 0 || n - pos < HEADER) return 0;
    s->size = ((uint32_t)d[pos + 16] << 24) | ((uint32_t)d[pos + 17] << 16)
              | ((uint32_t)d[pos + 18] << 8) | d[pos + 19];
    Py_ssize_t step = HEADER + (Py_ssize_t)s->size;
    for (Py_ssize_t i = 0, g = pos; i < SCOUT_FAR && g <= n - HEADER; i++, g += step)
        __builtin_prefetch(&e->hot[scout_slot(e, d + g)]);
    return 1;
}

/* Called once for every frame the forwarding pass takes from the buffer, in order (d, n:
 * the buffer; the frame starts at pos and has a payload of size bytes), when scout_start
 * said to. Returns the hot slot where the lookup of this frame's key starts, or UINT32_MAX
 * when its key is the previous frame's. Inline, as the probe above is: a call into
 * _fastpath_tables.c for each was measured at about 1 ns a frame more with 10^5 flows
 * (flows in blocks, each block's probes in one loop, was faster still at 16 B but 8-12 ns
 * slower at 1 KB, and was not kept; walking in batches measured no faster; the walk out of
 * line, in a function of its own, made the computed guess 1 ns a frame slower and a walk
 * 3 ns slower). */
static inline uint32_t fp_scout_step(Scout *s, const Engine *e, const uint8_t *d, Py_ssize_t n,
                                     Py_ssize_t pos, uint32_t size) {
    if (!s->walking) {
        if (size == s->size) {
            Py_ssize_t g = pos + SCOUT_FAR * (HEADER + (Py_ssize_t)size);
            if (g <= n - HEADER) __builtin_prefetch(&e->hot[scout_slot(e, d + g)]);
            return scout_slot(e, d + pos);
        }
        s->walking = 1; /* sizes vary: walk from this frame on */
        s->at = pos;
        s->prev = -1;
        s->passed = s->done = 0;
    }
    while (s->passed < s->done + SCOUT_FAR && n - s->at >= HEADER) {
        const uint8_t *h = d + s->at;
        uint32_t fsize = ((uint32_t)h[16] << 24) | ((uint32_t)h[17] << 16)
                         | ((uint32_t)h[18] << 8) | h[19];
        if ((Py_ssize_t)fsize > n - s->at - HEADER) break; /* not whole yet */
        uint32_t slot = UINT32_MAX;
        if (s->prev < 0 || memcmp(d + s->prev, h, 16) != 0) {
            slot = scout_slot(e, h);
            __builtin_prefetch(&e->hot[slot]);
        }
        s->slot[s->passed % SCOUT_RING] = slot;
        s->prev = s->at;
        s->at += HEADER + (Py_ssize_t)fsize;
        s->passed++;
    }
    return s->slot[s->done++ % SCOUT_RING];
}


/* How full the hot table may get (slots in use and tombstones, in 16ths) before it is
 * built again, and how full it may be when built. Denser (14/16 and 13/16: 10^5 flows in
 * 4 MB of slots, not 8) was measured in a router with 10^5 flows at 16 B: no faster, a
 * little slower in most runs (a quarter of the keys then sit past their home line, which
 * the scout does not prefetch), with a longest probe of 100-200 slots against about 20. */
#ifndef HOT_FULL
#define HOT_FULL 12
#endif
#ifndef HOT_BUILT
#define HOT_BUILT 8
#endif

/* the hot table's memory and building it again (_fastpath_hot.c); hot_alloc's table is
 * zeroed; hot_fill makes ht (cap slots) the table, the old one's counters spilled first
 * (hot_spill), as hot_rebuild does; hot_size: the table's size for n flows */
Hot *hot_alloc(Py_ssize_t cap);
void hot_free(Hot *ht, Py_ssize_t cap);
void hot_spill(Engine *e);
void hot_fill(Engine *e, Hot *ht, Py_ssize_t cap);
int hot_rebuild(Engine *e, Py_ssize_t cap);
Py_ssize_t hot_size(Py_ssize_t n);
void hot_trim(Engine *e);

/* mirror of the tables (_fastpath_tables.c) */
Py_ssize_t fp_link_find(Engine *e, long id);
Hot *fp_hot_find(Engine *e, const uint8_t *key);
Route *fp_route_find(Engine *e, uint32_t lsid);
void fp_engine_clear(Engine *e);
/* routing classes (_fastpath_classes.c): the class of a flow's routing (a new one, or one
 * more flow in an existing one; 0: none), and one flow fewer in class *id* */
uint32_t fp_class_acquire(Engine *e, const Flow *f);
void fp_class_release(Engine *e, uint32_t id);
void fp_classes_clear(Engine *e);
PyObject *Engine_classes(Engine *e, PyObject *ignored);
int fp_init(void);
PyObject *Engine_set_link(Engine *e, PyObject *args);
PyObject *Engine_forget_link(Engine *e, PyObject *arg);
PyObject *Engine_has_link(Engine *e, PyObject *arg);
PyObject *Engine_set_flow(Engine *e, PyObject *args);
PyObject *Engine_forget_flow(Engine *e, PyObject *arg);
PyObject *Engine_has_flow(Engine *e, PyObject *arg);
PyObject *Engine_set_absent(Engine *e, PyObject *arg);
PyObject *Engine_forget_absent(Engine *e, PyObject *ignored);
PyObject *Engine_set_route(Engine *e, PyObject *args);
PyObject *Engine_forget_routes(Engine *e, PyObject *ignored);
PyObject *Engine_has_route(Engine *e, PyObject *arg);
PyObject *Engine_flow_counts(Engine *e, PyObject *arg);
PyObject *Engine_all_flow_counts(Engine *e, PyObject *ignored);
PyObject *Engine_clear(Engine *e, PyObject *ignored);
PyObject *Engine_sizes(Engine *e, PyObject *ignored);
PyObject *Engine_hot_stats(Engine *e, PyObject *ignored);

#endif
