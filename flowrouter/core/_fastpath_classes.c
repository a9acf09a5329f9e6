/* Routing classes of the compiled engine's mirrored flows (see FlowClass in
 * _fastpath_tables.h).
 *
 * With many flows to one subscriber, consecutive frames are mostly of different flows that
 * every link decides alike. The forwarding pass used to prove that frame by frame, reading
 * five fields of the flow's entry against the last decided one; it now compares the class
 * numbers kept in the hot slots, and reads no entry at all. A class is exact (the whole
 * upstream link, downstream link and both band masks), so two flows share one only when
 * every frame of theirs would be decided the same way.
 *
 * Classes are interned in a chained hash table (buckets of class ids, each class linking
 * to the next) and counted: a flow's class is released when its routing changes or it
 * goes, and a class no flow holds goes back to a free list. At most MAX_CLASSES live at
 * once; a flow that finds none free gets class 0 (counted in cls_full) and is decided on
 * its own, more slowly but the same.
 */
#include "_fastpath_tables.h"

static int class_fields(const Flow *f, FlowClass *c) {
    if (f->ndown > 1) return 0; /* several downstream links, or absent: no class */
    memset(c, 0, sizeof(*c));
    c->up = f->up;
    c->ndown = f->ndown;
    c->agg = f->agg;
    if (f->ndown == 1) {
        c->link = f->d.one.link;
        c->mask = f->d.one.mask;
    } else {
        c->link = -1;
    }
    return 1;
}

static int class_same(const FlowClass *a, const FlowClass *b) {
    return a->up == b->up && a->link == b->link && a->ndown == b->ndown
           && a->agg.lo == b->agg.lo && a->agg.hi == b->agg.hi
           && a->mask.lo == b->mask.lo && a->mask.hi == b->mask.hi;
}

static uint32_t class_bucket(const FlowClass *c) {
    uint64_t h = hash_long((long)(((uint64_t)(uint32_t)c->up << 32) | (uint32_t)c->link));
    h ^= (c->agg.lo + c->ndown) * 0x9E3779B97F4A7C15ULL;
    h ^= c->agg.hi * 0xBF58476D1CE4E5B9ULL;
    h ^= c->mask.lo * 0x94D049BB133111EBULL;
    h ^= (c->mask.hi + 0x632BE59BD9B4E019ULL) * 0xD6E8FEB86659FD93ULL;
    h ^= h >> 31;
    return (uint32_t)(h & (CLASS_BUCKETS - 1));
}

uint32_t fp_class_acquire(Engine *e, const Flow *f) {
    FlowClass want;
    if (!class_fields(f, &want)) return 0;
    if (!e->cls_buckets) {
        e->cls_buckets = PyMem_Calloc(CLASS_BUCKETS, sizeof(uint32_t));
        if (!e->cls_buckets) { e->cls_full++; return 0; } /* no class: decided alone */
    }
    uint32_t b = class_bucket(&want);
    for (uint32_t id = e->cls_buckets[b]; id; id = e->classes[id - 1].next) {
        if (class_same(&e->classes[id - 1], &want)) {
            e->classes[id - 1].refs++;
            return id;
        }
    }
    uint32_t id = e->cls_free;
    if (id) {
        e->cls_free = e->classes[id - 1].next;
    } else {
        if (e->ncls >= MAX_CLASSES) { e->cls_full++; return 0; }
        if (e->ncls == e->cls_cap) {
            uint32_t cap = e->cls_cap ? e->cls_cap * 2 : 64;
            FlowClass *nc = PyMem_Realloc(e->classes, (size_t)cap * sizeof(FlowClass));
            if (!nc) { e->cls_full++; return 0; }
            e->classes = nc;
            e->cls_cap = cap;
        }
        id = ++e->ncls;
    }
    FlowClass *c = &e->classes[id - 1];
    *c = want;
    c->refs = 1;
    e->cls_live++;
    c->next = e->cls_buckets[b];
    e->cls_buckets[b] = id;
    return id;
}

void fp_class_release(Engine *e, uint32_t id) {
    if (!id) return;
    FlowClass *c = &e->classes[id - 1];
    if (--c->refs) return;
    uint32_t *at = &e->cls_buckets[class_bucket(c)];
    while (*at != id) at = &e->classes[*at - 1].next;
    *at = c->next;
    c->next = e->cls_free;
    e->cls_free = id;
    e->cls_live--;
}

void fp_classes_clear(Engine *e) {
    PyMem_Free(e->classes);
    PyMem_Free(e->cls_buckets);
    e->classes = NULL;
    e->cls_buckets = NULL;
    e->ncls = e->cls_cap = e->cls_free = e->cls_live = 0;
}

/* classes() -> (held, most, flows that found none): for the router's status */
PyObject *Engine_classes(Engine *e, PyObject *Py_UNUSED(ignored)) {
    return Py_BuildValue("(IIK)", e->cls_live, (unsigned)MAX_CLASSES,
                         (unsigned long long)e->cls_full);
}
