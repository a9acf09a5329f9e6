/* The compiled engine's hot table (see _fastpath_tables.h): its memory, and building it
 * again from the dense array of flows: larger when it fills up (from flow_slot in
 * _fastpath_tables.c), smaller when most of its flows went (hot_trim), since a router whose
 * subscriber of 10^5 flows left should not keep megabytes of tombstones.
 */
#include "_fastpath_tables.h"
#include <sys/mman.h>

/* The hot table's memory: zeroed; a large one (HOT_HUGE bytes or more) in its own mapping
 * advised to use huge pages, so that a lookup in megabytes of slots does not also miss
 * the TLB (measured in a router with 10^5 flows: about 10% more frames a second; the
 * engine alone does not move). Either way it is counted where tracemalloc sees the rest
 * of the engine. */
#ifndef HOT_HUGE
#define HOT_HUGE (4 << 20)
#endif
#define HUGE_PAGE (2 << 20)
Hot *hot_alloc(Py_ssize_t cap) {
    size_t bytes = (size_t)cap * sizeof(Hot);
    if (bytes < HOT_HUGE) return PyMem_Calloc((size_t)cap, sizeof(Hot));
    /* over-map by a huge page and keep the aligned part: only aligned 2 MiB ranges get
     * huge pages */
    uint8_t *raw = mmap(NULL, bytes + HUGE_PAGE, PROT_READ | PROT_WRITE,
                        MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (raw == MAP_FAILED) return NULL;
    uintptr_t at = ((uintptr_t)raw + HUGE_PAGE - 1) & ~(uintptr_t)(HUGE_PAGE - 1);
    if (at > (uintptr_t)raw) munmap(raw, at - (uintptr_t)raw);
    size_t tail = (size_t)((uintptr_t)raw + bytes + HUGE_PAGE - (at + bytes));
    if (tail) munmap((void *)(at + bytes), tail);
    madvise((void *)at, bytes, MADV_HUGEPAGE); /* a hint: without THP, plain pages */
    PyTraceMalloc_Track(0, at, bytes);
    return (Hot *)at;
}

void hot_free(Hot *ht, Py_ssize_t cap) {
    size_t bytes = (size_t)cap * sizeof(Hot);
    if (!ht) return;
    if (bytes < HOT_HUGE) {
        PyMem_Free(ht);
        return;
    }
    PyTraceMalloc_Untrack(0, (uintptr_t)ht);
    munmap(ht, bytes);
}

/* Move every hot slot's counters into its flow's FlowCount (before the slots are built
 * again, or read all at once). */
void hot_spill(Engine *e) {
    for (Py_ssize_t i = 0; i < e->hot_cap; i++) {
        Hot *s = &e->hot[i];
        if (s->pos != 0 && s->pos != HOT_GONE && (s->frames || s->bytes)) hot_spill_slot(e, s);
    }
}

/* Make *ht* (cap slots, a power of two, zeroed) the hot table, filled from the dense
 * array: the old table's counters must have been spilled into the FlowCounts. */
void hot_fill(Engine *e, Hot *ht, Py_ssize_t cap) {
    Py_ssize_t longest = 0;
    for (Py_ssize_t j = 0; j < e->nflows; j++) {
        const Flow *f = &e->flows[j];
        Py_ssize_t home = hot_home(hash_key(f->key, e->seed), cap);
        for (Py_ssize_t i = home;; i = (i + 1) & (cap - 1)) {
            if (ht[i].pos == 0) {
                memcpy(ht[i].key, f->key, 16);
                ht[i].pos = (uint32_t)(j + 1);
                ht[i].cls = flow_cls(f);
                Py_ssize_t probe = ((i - home) & (cap - 1)) + 1;
                if (probe > longest) longest = probe;
                break;
            }
        }
    }
    hot_free(e->hot, e->hot_cap);
    e->hot = ht;
    e->hot_cap = cap;
    e->hot_filled = e->nflows;
    e->hot_longest = longest;
}

/* Build the hot table again at *cap* slots from the dense array. */
int hot_rebuild(Engine *e, Py_ssize_t cap) {
    Hot *ht = hot_alloc(cap);
    if (!ht) { PyErr_NoMemory(); return -1; }
    hot_spill(e);
    hot_fill(e, ht, cap);
    return 0;
}

/* The hot table's size for n flows. */
Py_ssize_t hot_size(Py_ssize_t n) {
    Py_ssize_t cap = 64;
    while (n * 16 > cap * HOT_BUILT) cap *= 2;
    return cap;
}

/* After flows went: a hot table an eighth full or less is built again at the size of the
 * flows left (it grows back as flows come: at three quarters, to at most half), so that its
 * memory goes back and lookups of absent keys stop walking the tombstones; the dense arrays
 * a quarter used or less are cut to twice what is used. Either only when the memory can be
 * had; what is kept is unchanged if not. Once per halving at most: at most about eight slots
 * built again per flow removed. */
void hot_trim(Engine *e) {
    if (e->hot_cap > 64 && e->nflows * 16 <= e->hot_cap * 2
            && hot_rebuild(e, hot_size(e->nflows)) < 0)
        PyErr_Clear();
    if (e->flows_cap > 64 && e->nflows * 4 <= e->flows_cap) {
        Py_ssize_t cap = e->nflows * 2 < 64 ? 64 : e->nflows * 2;
        Flow *nf = PyMem_Realloc(e->flows, (size_t)cap * sizeof(Flow));
        if (!nf) { PyErr_Clear(); return; }
        e->flows = nf;
        FlowCount *nc = PyMem_Realloc(e->counts, (size_t)cap * sizeof(FlowCount));
        if (!nc) { PyErr_Clear(); return; } /* flows_cap stays: both hold at least it */
        e->counts = nc;
        e->flows_cap = cap;
    }
}
