/* The compiled engine's mirror of the router's tables: links and flows.
 *
 * Links: an array of slots and an open-addressing map from link id to slot (rebuilt when a
 * link comes or goes, which is rare). Flows: a dense array of 64-byte entries (one cache
 * line; the one downstream link most flows have is inline) and the hot table, 32-byte
 * slots by flow key holding the key, the entry's position, its routing class and recent
 * counters (_fastpath_tables.h), open addressing with tombstones, rebuilt at three
 * quarters full to at most half and at an eighth full or less to the flows' size (its
 * memory and building it again: _fastpath_hot.c); a key the core holds no entry for is kept
 * there as absent.
 * Beside the flows, an array of their counters indexed like them (with the hot slot's,
 * what each took; forget_flow hands it back). Routing classes: _fastpath_classes.c.
 * Routes: an open-addressing table by LSID (a handful), emptied whole. Filled and emptied
 * only through the Python methods below, by flowrouter/core/fastpath.py on the core's
 * behalf.
 */
#include "_fastpath_tables.h"

/* ------------------------------------------------------------------ links */
Py_ssize_t fp_link_find(Engine *e, long id) {
    if (e->lmap_cap == 0) return -1;
    Py_ssize_t m = e->lmap_cap - 1;
    for (Py_ssize_t i = (Py_ssize_t)(hash_long(id) & m);; i = (i + 1) & m) {
        Py_ssize_t s = e->lmap[i];
        if (s == 0) return -1;
        if (e->links[s - 1].id == id) return s - 1;
    }
}

static int lmap_rebuild(Engine *e, Py_ssize_t cap) {
    Py_ssize_t *map = PyMem_Calloc((size_t)cap, sizeof(Py_ssize_t));
    if (!map) { PyErr_NoMemory(); return -1; }
    for (Py_ssize_t s = 0; s < e->nlinks; s++) {
        if (!e->links[s].used) continue;
        for (Py_ssize_t i = (Py_ssize_t)(hash_long(e->links[s].id) & (cap - 1));;
             i = (i + 1) & (cap - 1)) {
            if (map[i] == 0) { map[i] = s + 1; break; }
        }
    }
    PyMem_Free(e->lmap);
    e->lmap = map;
    e->lmap_cap = cap;
    return 0;
}

PyObject *Engine_set_link(Engine *e, PyObject *args) {
    long id;
    int router;
    unsigned long max_payload;
    PyObject *mods;
    if (!PyArg_ParseTuple(args, "lpkO", &id, &router, &max_payload, &mods)) return NULL;
    if (id < 0) { PyErr_SetString(PyExc_ValueError, "link ids are not negative"); return NULL; }
    PyObject *seq = PySequence_Fast(mods, "modifiers must be a sequence");
    if (!seq) return NULL;
    if (PySequence_Fast_GET_SIZE(seq) != NUM_LOC) {
        Py_DECREF(seq);
        PyErr_SetString(PyExc_ValueError, "modifiers: one per locality type");
        return NULL;
    }
    uint8_t m[NUM_LOC];
    for (int i = 0; i < NUM_LOC; i++) {
        long v = PyLong_AsLong(PySequence_Fast_GET_ITEM(seq, i));
        if (v == -1 && PyErr_Occurred()) { Py_DECREF(seq); return NULL; }
        if (v < 0 || v > 255) {
            Py_DECREF(seq);
            PyErr_SetString(PyExc_ValueError, "a locality modifier is 0..255");
            return NULL;
        }
        m[i] = (uint8_t)v;
    }
    Py_DECREF(seq);
    Py_ssize_t s = fp_link_find(e, id);
    if (s < 0) {
        for (s = 0; s < e->nlinks && e->links[s].used; s++) {}
        if (s == e->links_cap) {
            Py_ssize_t cap = e->links_cap ? e->links_cap * 2 : 16;
            Link *nl = PyMem_Realloc(e->links, (size_t)cap * sizeof(Link));
            if (!nl) return PyErr_NoMemory();
            memset(nl + e->links_cap, 0, (size_t)(cap - e->links_cap) * sizeof(Link));
            e->links = nl;
            e->links_cap = cap;
        }
        if (s == e->nlinks) e->nlinks++;
        Link *l = &e->links[s];
        l->used = 1;
        l->id = id;
        l->len = 0;
        l->frames = 0;
        l->dirty = 0;
        l->nrefs = 0;
        if (e->lmap_cap < 4 * e->nlinks || e->lmap_cap == 0) {
            Py_ssize_t cap = 64;
            while (cap < 4 * e->nlinks) cap *= 2;
            if (lmap_rebuild(e, cap) < 0) { l->used = 0; return NULL; }
        } else if (lmap_rebuild(e, e->lmap_cap) < 0) {
            l->used = 0;
            return NULL;
        }
    }
    Link *l = &e->links[s];
    l->router = router;
    l->max_payload = max_payload > 0xFFFFFFFFUL ? 0xFFFFFFFFU : (uint32_t)max_payload;
    memcpy(l->mods, m, NUM_LOC);
    Py_RETURN_NONE;
}

PyObject *Engine_forget_link(Engine *e, PyObject *arg) {
    long id = PyLong_AsLong(arg);
    if (id == -1 && PyErr_Occurred()) return NULL;
    Py_ssize_t s = fp_link_find(e, id);
    if (s >= 0) {
        Link *l = &e->links[s];
        memset(l, 0, sizeof(Link));
        if (lmap_rebuild(e, e->lmap_cap) < 0) return NULL;
    }
    Py_RETURN_NONE;
}

PyObject *Engine_has_link(Engine *e, PyObject *arg) {
    long id = PyLong_AsLong(arg);
    if (id == -1 && PyErr_Occurred()) return NULL;
    return PyBool_FromLong(fp_link_find(e, id) >= 0);
}

/* ------------------------------------------------------------------ flows */
Hot *fp_hot_find(Engine *e, const uint8_t *key) {
    if (e->hot_cap == 0) return NULL;
    return hot_probe(e, key, hot_home(hash_key(key, e->seed), e->hot_cap));
}

static Flow *flow_of(Engine *e, const Hot *s) {
    return &e->flows[s->pos - 1];
}

/* Empty entry *f* of everything but its key: its arrays freed, its class released. */
static void flow_release(Engine *e, Flow *f) {
    if (f->ndown != FLOW_ABSENT && f->ndown > 1) {
        PyMem_Free(f->d.many.links);
        PyMem_Free(f->d.many.masks);
    } else if (f->ndown <= 1) {
        fp_class_release(e, f->d.one.cls);
    }
    f->ndown = 0;
    f->d.one.cls = 0;
}

static PyObject *MASK64, *SHIFT64;

int fp_init(void) {
    MASK64 = PyLong_FromUnsignedLongLong(~0ULL);
    SHIFT64 = PyLong_FromLong(64);
    return MASK64 && SHIFT64 ? 0 : -1;
}

static int mask_from(PyObject *o, mask128 *out) {
    /* a Python int of at most 128 bits, not negative; only the public long API */
    if (!PyLong_Check(o)) { PyErr_SetString(PyExc_TypeError, "a band mask is an int"); return -1; }
    PyObject *lo = PyNumber_And(o, MASK64);
    if (!lo) return -1;
    PyObject *hi = PyNumber_Rshift(o, SHIFT64);
    if (!hi) { Py_DECREF(lo); return -1; }
    out->lo = PyLong_AsUnsignedLongLong(lo);
    int bad = out->lo == (uint64_t)-1 && PyErr_Occurred();
    if (!bad) {
        out->hi = PyLong_AsUnsignedLongLong(hi);
        bad = out->hi == (uint64_t)-1 && PyErr_Occurred();
    }
    Py_DECREF(lo);
    Py_DECREF(hi);
    if (bad) {
        PyErr_Clear();
        PyErr_SetString(PyExc_ValueError, "band masks are 128-bit");
        return -1;
    }
    return 0;
}

/* The hot slot of *key*, its entry emptied (flow_release) if it exists, else a new one
 * at the end of the dense array; NULL and an exception when the tables cannot grow. */
static Hot *flow_slot(Engine *e, const uint8_t *key) {
    Hot *hs = fp_hot_find(e, key);
    if (hs) {
        flow_release(e, flow_of(e, hs));
        hs->cls = 0;
        return hs;
    }
    if (e->nflows >= 0xFFFFFFF0) { PyErr_SetString(PyExc_ValueError, "too many flows"); return NULL; }
    if ((e->hot_filled + 1) * 16 > e->hot_cap * HOT_FULL
            && hot_rebuild(e, hot_size(e->nflows + 1)) < 0)
        return NULL;
    if (e->nflows == e->flows_cap) {
        Py_ssize_t cap = e->flows_cap < 64 ? 64 : e->flows_cap + e->flows_cap / 2;
        Flow *nf = PyMem_Realloc(e->flows, (size_t)cap * sizeof(Flow));
        if (!nf) { PyErr_NoMemory(); return NULL; }
        e->flows = nf;
        FlowCount *nc = PyMem_Realloc(e->counts, (size_t)cap * sizeof(FlowCount));
        if (!nc) { PyErr_NoMemory(); return NULL; } /* flows_cap stays: both hold it */
        e->counts = nc;
        e->flows_cap = cap;
    }
    Py_ssize_t m = e->hot_cap - 1;
    Py_ssize_t home = hot_home(hash_key(key, e->seed), m + 1);
    for (Py_ssize_t i = home;; i = (i + 1) & m) {
        hs = &e->hot[i];
        if (hs->pos == 0 || hs->pos == HOT_GONE) {
            if (hs->pos == 0) e->hot_filled++;
            if (((i - home) & m) + 1 > e->hot_longest) e->hot_longest = ((i - home) & m) + 1;
            memset(hs, 0, sizeof(Hot));
            memcpy(hs->key, key, 16);
            hs->pos = (uint32_t)(e->nflows + 1);
            break;
        }
    }
    memset(&e->counts[e->nflows], 0, sizeof(FlowCount));
    Flow *f = &e->flows[e->nflows++];
    memset(f, 0, sizeof(Flow));
    memcpy(f->key, key, 16);
    return hs;
}

/* Remove the entry of hot slot *hs* (a tombstone after): the last entry of the dense array
 * (and its counters) moves into its place, and its hot slot follows it. */
static void flow_remove(Engine *e, Hot *hs) {
    uint32_t pos = hs->pos - 1;
    flow_release(e, &e->flows[pos]);
    hs->pos = HOT_GONE;
    hs->frames = hs->bytes = 0;
    Py_ssize_t last = e->nflows - 1;
    if ((Py_ssize_t)pos != last) {
        Hot *moved = fp_hot_find(e, e->flows[last].key);
        e->flows[pos] = e->flows[last];
        e->counts[pos] = e->counts[last];
        moved->pos = pos + 1;
    }
    e->nflows--;
}

static int link_id_from(PyObject *o, int32_t *out) {
    long v = PyLong_AsLong(o);
    if (v == -1 && PyErr_Occurred()) return -1;
    if (v < -1 || v > INT32_MAX) {
        PyErr_SetString(PyExc_ValueError, "link ids in a flow are 0..2**31-1 (-1: none)");
        return -1;
    }
    *out = (int32_t)v;
    return 0;
}

PyObject *Engine_set_flow(Engine *e, PyObject *args) {
    Py_buffer key;
    PyObject *upo, *down, *aggo;
    if (!PyArg_ParseTuple(args, "y*OOO", &key, &upo, &down, &aggo)) return NULL;
    PyObject *seq = NULL;
    int32_t *ids = NULL;
    mask128 *masks = NULL;
    mask128 agg;
    int32_t up;
    if (key.len != 16) { PyErr_SetString(PyExc_ValueError, "a flow key is 16 bytes"); goto fail; }
    if (link_id_from(upo, &up) < 0) goto fail;
    if (mask_from(aggo, &agg) < 0) goto fail;
    seq = PySequence_Fast(down, "down must be a sequence of (link, mask)");
    if (!seq) goto fail;
    Py_ssize_t nd = PySequence_Fast_GET_SIZE(seq);
    if (nd > FLOW_MAX_DOWN) {
        PyErr_SetString(PyExc_ValueError, "at most 65535 downstream links per flow");
        goto fail;
    }
    ids = PyMem_Malloc((size_t)(nd ? nd : 1) * sizeof(int32_t));
    masks = PyMem_Malloc((size_t)(nd ? nd : 1) * sizeof(mask128));
    if (!ids || !masks) { PyErr_NoMemory(); goto fail; }
    for (Py_ssize_t i = 0; i < nd; i++) {
        PyObject *it = PySequence_Fast_GET_ITEM(seq, i);
        if (!PyTuple_Check(it) || PyTuple_GET_SIZE(it) != 2) {
            PyErr_SetString(PyExc_TypeError, "down must be a sequence of (link, mask)");
            goto fail;
        }
        if (link_id_from(PyTuple_GET_ITEM(it, 0), &ids[i]) < 0) goto fail;
        if (mask_from(PyTuple_GET_ITEM(it, 1), &masks[i]) < 0) goto fail;
    }
    Py_DECREF(seq);
    seq = NULL;
    Hot *hs = flow_slot(e, key.buf);
    if (!hs) goto fail;
    Flow *f = flow_of(e, hs);
    f->up = up;
    f->agg = agg;
    f->ndown = (uint32_t)nd;
    if (nd <= 1) { /* inline: the arrays go */
        if (nd == 1) {
            f->d.one.link = ids[0];
            f->d.one.mask = masks[0];
        }
        PyMem_Free(ids);
        PyMem_Free(masks);
    } else {
        f->d.many.links = ids;
        f->d.many.masks = masks;
    }
    if (nd <= 1) f->d.one.cls = hs->cls = fp_class_acquire(e, f);
    PyBuffer_Release(&key);
    Py_RETURN_NONE;
fail:
    Py_XDECREF(seq);
    PyMem_Free(ids);
    PyMem_Free(masks);
    PyBuffer_Release(&key);
    return NULL;
}

static PyObject *count_tuple(const FlowCount *c) {
    return Py_BuildValue("(KK)", (unsigned long long)c->frames, (unsigned long long)c->bytes);
}

/* (frames, bytes) the flow of hot slot *hs* took: its FlowCount and its slot's */
static PyObject *flow_total(Engine *e, const Hot *hs) {
    const FlowCount *c = &e->counts[hs->pos - 1];
    return count_tuple(&(FlowCount){c->frames + hs->frames, c->bytes + hs->bytes});
}

PyObject *Engine_forget_flow(Engine *e, PyObject *arg) {
    Py_buffer key;
    if (PyObject_GetBuffer(arg, &key, PyBUF_SIMPLE) < 0) return NULL;
    Hot *hs = key.len == 16 ? fp_hot_find(e, key.buf) : NULL;
    PyBuffer_Release(&key);
    if (!hs) Py_RETURN_NONE;
    PyObject *out = NULL;
    if (flow_of(e, hs)->ndown != FLOW_ABSENT) {
        out = flow_total(e, hs);
        if (!out) return NULL;
    }
    flow_remove(e, hs);
    hot_trim(e);
    if (out) return out;
    Py_RETURN_NONE;
}

/* The counters of *key*'s mirrored entry (None: absent or not mirrored). */
PyObject *Engine_flow_counts(Engine *e, PyObject *arg) {
    Py_buffer key;
    if (PyObject_GetBuffer(arg, &key, PyBUF_SIMPLE) < 0) return NULL;
    Hot *hs = key.len == 16 ? fp_hot_find(e, key.buf) : NULL;
    PyBuffer_Release(&key);
    if (!hs || flow_of(e, hs)->ndown == FLOW_ABSENT) Py_RETURN_NONE;
    return flow_total(e, hs);
}

PyObject *Engine_all_flow_counts(Engine *e, PyObject *Py_UNUSED(ignored)) {
    PyObject *out = PyList_New(0);
    if (!out) return NULL;
    hot_spill(e);
    for (Py_ssize_t j = 0; j < e->nflows; j++) {
        const FlowCount *c = &e->counts[j];
        if (e->flows[j].ndown == FLOW_ABSENT || !c->frames) continue;
        PyObject *t = Py_BuildValue("(y#KK)", (const char *)e->flows[j].key, (Py_ssize_t)16,
                                    (unsigned long long)c->frames,
                                    (unsigned long long)c->bytes);
        if (!t || PyList_Append(out, t) < 0) { Py_XDECREF(t); Py_DECREF(out); return NULL; }
        Py_DECREF(t);
    }
    return out;
}

PyObject *Engine_set_absent(Engine *e, PyObject *arg) {
    Py_buffer key;
    if (PyObject_GetBuffer(arg, &key, PyBUF_SIMPLE) < 0) return NULL;
    if (key.len != 16) {
        PyBuffer_Release(&key);
        PyErr_SetString(PyExc_ValueError, "a flow key is 16 bytes");
        return NULL;
    }
    Hot *hs = flow_slot(e, key.buf);
    PyBuffer_Release(&key);
    if (!hs) return NULL;
    Flow *f = flow_of(e, hs);
    f->up = -1;
    f->ndown = FLOW_ABSENT;
    memset(&e->counts[hs->pos - 1], 0, sizeof(FlowCount)); /* nothing to hand over */
    hs->frames = hs->bytes = 0;
    Py_RETURN_NONE;
}

PyObject *Engine_forget_absent(Engine *e, PyObject *Py_UNUSED(ignored)) {
    Py_ssize_t kept = 0;
    for (Py_ssize_t j = 0; j < e->nflows; j++) kept += e->flows[j].ndown != FLOW_ABSENT;
    if (kept == e->nflows) Py_RETURN_NONE;
    /* the new table first: nothing changes if it cannot be had */
    Py_ssize_t cap = hot_size(kept);
    Hot *ht = hot_alloc(cap);
    if (!ht) return PyErr_NoMemory();
    hot_spill(e); /* while the slots still name the old positions */
    kept = 0;
    for (Py_ssize_t j = 0; j < e->nflows; j++) { /* compact, then fill the table again */
        if (e->flows[j].ndown == FLOW_ABSENT) continue;
        e->counts[kept] = e->counts[j];
        e->flows[kept++] = e->flows[j];
    }
    e->nflows = kept;
    hot_fill(e, ht, cap);
    hot_trim(e); /* the dense arrays too */
    Py_RETURN_NONE;
}

PyObject *Engine_has_flow(Engine *e, PyObject *arg) {
    Py_buffer key;
    if (PyObject_GetBuffer(arg, &key, PyBUF_SIMPLE) < 0) return NULL;
    int found = key.len == 16 && fp_hot_find(e, key.buf) != NULL;
    PyBuffer_Release(&key);
    return PyBool_FromLong(found);
}

/* ------------------------------------------------------------------ routes */
static inline uint64_t hash_lsid(uint32_t v) { return hash_long((long)v); }

Route *fp_route_find(Engine *e, uint32_t lsid) {
    if (e->routes_cap == 0) return NULL;
    Py_ssize_t m = e->routes_cap - 1;
    for (Py_ssize_t i = (Py_ssize_t)(hash_lsid(lsid) & m);; i = (i + 1) & m) {
        Route *r = &e->routes[i];
        if (!r->used) return NULL;
        if (r->lsid == lsid) return r;
    }
}

static int routes_resize(Engine *e, Py_ssize_t cap) {
    Route *nr = PyMem_Calloc((size_t)cap, sizeof(Route));
    if (!nr) { PyErr_NoMemory(); return -1; }
    for (Py_ssize_t j = 0; j < e->routes_cap; j++) {
        Route *r = &e->routes[j];
        if (!r->used) continue;
        for (Py_ssize_t i = (Py_ssize_t)(hash_lsid(r->lsid) & (cap - 1));;
             i = (i + 1) & (cap - 1)) {
            if (!nr[i].used) { nr[i] = *r; break; }
        }
    }
    PyMem_Free(e->routes);
    e->routes = nr;
    e->routes_cap = cap;
    return 0;
}

PyObject *Engine_set_route(Engine *e, PyObject *args) {
    unsigned long long lsid;
    long link;
    if (!PyArg_ParseTuple(args, "Kl", &lsid, &link)) return NULL;
    if (lsid > 0xFFFFFFFFULL || link < ROUTE_NONE) {
        PyErr_SetString(PyExc_ValueError, "an LSID is 32 bits; a route is a link or ROUTE_*");
        return NULL;
    }
    Route *r = fp_route_find(e, (uint32_t)lsid);
    if (!r) {
        if ((e->routes_used + 1) * 2 > e->routes_cap
                && routes_resize(e, e->routes_cap ? e->routes_cap * 2 : 16) < 0)
            return NULL;
        Py_ssize_t m = e->routes_cap - 1;
        for (Py_ssize_t i = (Py_ssize_t)(hash_lsid((uint32_t)lsid) & m);; i = (i + 1) & m) {
            if (!e->routes[i].used) { r = &e->routes[i]; break; }
        }
        r->used = 1;
        r->lsid = (uint32_t)lsid;
        e->routes_used++;
    }
    r->link = link;
    Py_RETURN_NONE;
}

static void routes_clear(Engine *e) {
    PyMem_Free(e->routes);
    e->routes = NULL;
    e->routes_cap = e->routes_used = 0;
}

PyObject *Engine_forget_routes(Engine *e, PyObject *Py_UNUSED(ignored)) {
    routes_clear(e);
    Py_RETURN_NONE;
}

PyObject *Engine_has_route(Engine *e, PyObject *arg) {
    unsigned long long lsid = PyLong_AsUnsignedLongLong(arg);
    if (lsid == (unsigned long long)-1 && PyErr_Occurred()) return NULL;
    return PyBool_FromLong(lsid <= 0xFFFFFFFFULL && fp_route_find(e, (uint32_t)lsid) != NULL);
}

void fp_engine_clear(Engine *e) {
    for (Py_ssize_t j = 0; j < e->nflows; j++) flow_release(e, &e->flows[j]);
    fp_classes_clear(e);
    e->cls_full = 0;
    PyMem_Free(e->flows);
    e->flows = NULL;
    PyMem_Free(e->counts);
    e->counts = NULL;
    e->nflows = e->flows_cap = 0;
    hot_free(e->hot, e->hot_cap);
    e->hot = NULL;
    e->hot_cap = e->hot_filled = e->hot_longest = 0;
    PyMem_Free(e->links);
    e->links = NULL;
    e->nlinks = e->links_cap = 0;
    PyMem_Free(e->lmap);
    e->lmap = NULL;
    e->lmap_cap = 0;
    routes_clear(e);
}

PyObject *Engine_clear(Engine *e, PyObject *Py_UNUSED(ignored)) {
    fp_engine_clear(e);
    Py_RETURN_NONE;
}

/* hot_stats() -> (slots, tombstones, slots the longest probe for a flow reads): how full
 * the lookup table is beside sizes()'s flows and how far its worst key is from home, for
 * the router's status (the longest probe only grows until the table is built again) */
PyObject *Engine_hot_stats(Engine *e, PyObject *Py_UNUSED(ignored)) {
    return Py_BuildValue("(nnn)", e->hot_cap, e->hot_filled - e->nflows, e->hot_longest);
}

PyObject *Engine_sizes(Engine *e, PyObject *Py_UNUSED(ignored)) {
    Py_ssize_t nl = 0;
    for (Py_ssize_t s = 0; s < e->nlinks; s++) nl += e->links[s].used;
    return Py_BuildValue("(nn)", e->nflows, nl);
}
