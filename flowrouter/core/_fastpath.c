/* The forwarding engine of the fast path, compiled: the twin of fastpath_py.py.
 *
 * Same interface and the same decisions as flowrouter/core/fastpath_py.py (read its module
 * docstring first): a mirror of the forwarding tables, and forward() over a whole received
 * buffer with no Python object per message. Python objects are made once per call: one
 * bytes object per output link, one per flow whose traffic epoch must be noted, the result
 * tuple. The engine does no I/O and takes no locks; the GIL is held throughout.
 *
 * Tables: links in a small open-addressing map (link id -> slot in an array); flows in an
 * open-addressing table keyed by the 16-byte flow key with tombstones, grown at half full.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#define HEADER 24
#define ROUTER_BANDS_END 16
#define NUM_BANDS 128
#define NUM_LOC 4

enum { STOP_END = 0, STOP_PARTIAL = 1, STOP_SLOW = 2, STOP_MISS_FLOW = 3, STOP_MISS_LINK = 4 };

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
} Link;

/* One frame copy to one output link, planned in the decision pass and carried out when
 * every link's output size is known, straight into its bytes object (one copy per byte). */
typedef struct {
    Py_ssize_t slot, src;
    uint32_t size;
    uint8_t lt, left, ttl;
} Copy;

typedef struct {
    uint8_t key[16];
    uint8_t state; /* 0 empty, 1 used, 2 tombstone */
    long up;       /* -1: none */
    uint32_t ndown;
    long *down;
    mask128 *masks;
    mask128 agg;
    uint64_t mark; /* call serial when last put in `touched` */
} Flow;

typedef struct {
    PyObject_HEAD
    Link *links;
    Py_ssize_t nlinks, links_cap;
    Py_ssize_t *lmap; /* slot+1, 0 empty; size lmap_cap (power of two) */
    Py_ssize_t lmap_cap;
    Flow *flows;
    Py_ssize_t flows_cap, flows_used, flows_filled; /* filled = used + tombstones */
    uint64_t serial;
    Py_ssize_t *dirty;
    Py_ssize_t ndirty, dirty_cap;
    Copy *copies;
    Py_ssize_t ncopies, copies_cap;
} Engine;

/* ------------------------------------------------------------------ hashing */
static inline uint64_t hash_key(const uint8_t *k) {
    uint64_t a, b;
    memcpy(&a, k, 8);
    memcpy(&b, k + 8, 8);
    uint64_t h = a * 0x9E3779B97F4A7C15ULL ^ (b + 0x632BE59BD9B4E019ULL);
    h ^= h >> 29;
    h *= 0xBF58476D1CE4E5B9ULL;
    h ^= h >> 32;
    return h;
}

static inline uint64_t hash_long(long v) {
    uint64_t h = (uint64_t)v * 0x9E3779B97F4A7C15ULL;
    return h ^ (h >> 31);
}

/* ------------------------------------------------------------------ links */
static Py_ssize_t link_find(Engine *e, long id) {
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

static PyObject *Engine_set_link(Engine *e, PyObject *args) {
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
    Py_ssize_t s = link_find(e, id);
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

static PyObject *Engine_forget_link(Engine *e, PyObject *arg) {
    long id = PyLong_AsLong(arg);
    if (id == -1 && PyErr_Occurred()) return NULL;
    Py_ssize_t s = link_find(e, id);
    if (s >= 0) {
        Link *l = &e->links[s];
        memset(l, 0, sizeof(Link));
        if (lmap_rebuild(e, e->lmap_cap) < 0) return NULL;
    }
    Py_RETURN_NONE;
}

static PyObject *Engine_has_link(Engine *e, PyObject *arg) {
    long id = PyLong_AsLong(arg);
    if (id == -1 && PyErr_Occurred()) return NULL;
    return PyBool_FromLong(link_find(e, id) >= 0);
}

/* ------------------------------------------------------------------ flows */
static Flow *flow_find(Engine *e, const uint8_t *key) {
    if (e->flows_cap == 0) return NULL;
    Py_ssize_t m = e->flows_cap - 1;
    for (Py_ssize_t i = (Py_ssize_t)(hash_key(key) & m);; i = (i + 1) & m) {
        Flow *f = &e->flows[i];
        if (f->state == 0) return NULL;
        if (f->state == 1 && memcmp(f->key, key, 16) == 0) return f;
    }
}

static void flow_release(Flow *f) {
    PyMem_Free(f->down);
    PyMem_Free(f->masks);
    f->down = NULL;
    f->masks = NULL;
    f->ndown = 0;
}

static int flows_resize(Engine *e, Py_ssize_t cap) {
    Flow *nf = PyMem_Calloc((size_t)cap, sizeof(Flow));
    if (!nf) { PyErr_NoMemory(); return -1; }
    for (Py_ssize_t j = 0; j < e->flows_cap; j++) {
        Flow *f = &e->flows[j];
        if (f->state != 1) continue;
        for (Py_ssize_t i = (Py_ssize_t)(hash_key(f->key) & (cap - 1));;
             i = (i + 1) & (cap - 1)) {
            if (nf[i].state == 0) { nf[i] = *f; break; }
        }
    }
    PyMem_Free(e->flows);
    e->flows = nf;
    e->flows_cap = cap;
    e->flows_filled = e->flows_used;
    return 0;
}

static PyObject *MASK64, *SHIFT64;

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

static PyObject *Engine_set_flow(Engine *e, PyObject *args) {
    Py_buffer key;
    long up;
    PyObject *down, *aggo;
    if (!PyArg_ParseTuple(args, "y*lOO", &key, &up, &down, &aggo)) return NULL;
    PyObject *seq = NULL;
    long *ids = NULL;
    mask128 *masks = NULL;
    mask128 agg;
    if (key.len != 16) { PyErr_SetString(PyExc_ValueError, "a flow key is 16 bytes"); goto fail; }
    if (mask_from(aggo, &agg) < 0) goto fail;
    seq = PySequence_Fast(down, "down must be a sequence of (link, mask)");
    if (!seq) goto fail;
    Py_ssize_t nd = PySequence_Fast_GET_SIZE(seq);
    ids = PyMem_Malloc((size_t)(nd ? nd : 1) * sizeof(long));
    masks = PyMem_Malloc((size_t)(nd ? nd : 1) * sizeof(mask128));
    if (!ids || !masks) { PyErr_NoMemory(); goto fail; }
    for (Py_ssize_t i = 0; i < nd; i++) {
        PyObject *it = PySequence_Fast_GET_ITEM(seq, i);
        if (!PyTuple_Check(it) || PyTuple_GET_SIZE(it) != 2) {
            PyErr_SetString(PyExc_TypeError, "down must be a sequence of (link, mask)");
            goto fail;
        }
        ids[i] = PyLong_AsLong(PyTuple_GET_ITEM(it, 0));
        if (ids[i] == -1 && PyErr_Occurred()) goto fail;
        if (mask_from(PyTuple_GET_ITEM(it, 1), &masks[i]) < 0) goto fail;
    }
    Py_DECREF(seq);
    seq = NULL;
    Flow *f = flow_find(e, key.buf);
    if (!f) {
        if ((e->flows_filled + 1) * 2 > e->flows_cap) {
            Py_ssize_t cap = e->flows_cap ? e->flows_cap : 64;
            while ((e->flows_used + 1) * 2 > cap) cap *= 2;
            if (e->flows_used * 4 >= cap) cap *= 2; /* leave room to grow */
            if (flows_resize(e, cap) < 0) goto fail;
        }
        Py_ssize_t m = e->flows_cap - 1;
        for (Py_ssize_t i = (Py_ssize_t)(hash_key(key.buf) & m);; i = (i + 1) & m) {
            if (e->flows[i].state != 1) {
                f = &e->flows[i];
                if (f->state == 0) e->flows_filled++;
                break;
            }
        }
        memset(f, 0, sizeof(Flow));
        memcpy(f->key, key.buf, 16);
        f->state = 1;
        e->flows_used++;
    } else {
        flow_release(f);
    }
    f->up = up;
    f->ndown = (uint32_t)nd;
    f->down = ids;
    f->masks = masks;
    f->agg = agg;
    PyBuffer_Release(&key);
    Py_RETURN_NONE;
fail:
    Py_XDECREF(seq);
    PyMem_Free(ids);
    PyMem_Free(masks);
    PyBuffer_Release(&key);
    return NULL;
}

static PyObject *Engine_forget_flow(Engine *e, PyObject *arg) {
    Py_buffer key;
    if (PyObject_GetBuffer(arg, &key, PyBUF_SIMPLE) < 0) return NULL;
    if (key.len == 16) {
        Flow *f = flow_find(e, key.buf);
        if (f) {
            flow_release(f);
            f->state = 2;
            e->flows_used--;
        }
    }
    PyBuffer_Release(&key);
    Py_RETURN_NONE;
}

static PyObject *Engine_has_flow(Engine *e, PyObject *arg) {
    Py_buffer key;
    if (PyObject_GetBuffer(arg, &key, PyBUF_SIMPLE) < 0) return NULL;
    int found = key.len == 16 && flow_find(e, key.buf) != NULL;
    PyBuffer_Release(&key);
    return PyBool_FromLong(found);
}

static void engine_clear(Engine *e) {
    for (Py_ssize_t i = 0; i < e->flows_cap; i++)
        if (e->flows[i].state == 1) flow_release(&e->flows[i]);
    PyMem_Free(e->flows);
    e->flows = NULL;
    e->flows_cap = e->flows_used = e->flows_filled = 0;
    PyMem_Free(e->links);
    e->links = NULL;
    e->nlinks = e->links_cap = 0;
    PyMem_Free(e->lmap);
    e->lmap = NULL;
    e->lmap_cap = 0;
}

static PyObject *Engine_clear(Engine *e, PyObject *Py_UNUSED(ignored)) {
    engine_clear(e);
    Py_RETURN_NONE;
}

static PyObject *Engine_sizes(Engine *e, PyObject *Py_UNUSED(ignored)) {
    Py_ssize_t nl = 0;
    for (Py_ssize_t s = 0; s < e->nlinks; s++) nl += e->links[s].used;
    return Py_BuildValue("(nn)", e->flows_used, nl);
}

/* ------------------------------------------------------------------ forwarding */
static int plan_copy(Engine *e, Py_ssize_t slot, Py_ssize_t src, uint32_t size, int lt,
                     int left, int ttl) {
    if (e->ncopies == e->copies_cap) {
        Py_ssize_t cap = e->copies_cap ? e->copies_cap * 2 : 1024;
        Copy *nc = PyMem_Realloc(e->copies, (size_t)cap * sizeof(Copy));
        if (!nc) { PyErr_NoMemory(); return -1; }
        e->copies = nc;
        e->copies_cap = cap;
    }
    Copy *c = &e->copies[e->ncopies++];
    c->slot = slot;
    c->src = src;
    c->size = size;
    c->lt = (uint8_t)lt;
    c->left = (uint8_t)left;
    c->ttl = (uint8_t)ttl;
    Link *l = &e->links[slot];
    l->len += HEADER + (Py_ssize_t)size;
    l->frames++;
    if (!l->dirty) {
        if (e->ndirty == e->dirty_cap) {
            Py_ssize_t cap = e->dirty_cap ? e->dirty_cap * 2 : 16;
            Py_ssize_t *nd = PyMem_Realloc(e->dirty, (size_t)cap * sizeof(Py_ssize_t));
            if (!nd) { PyErr_NoMemory(); return -1; }
            e->dirty = nd;
            e->dirty_cap = cap;
        }
        e->dirty[e->ndirty++] = slot;
        l->dirty = 1;
    }
    return 0;
}

#define MAX_TARGETS_STACK 64

static PyObject *Engine_forward(Engine *e, PyObject *args) {
    long in_id;
    Py_buffer view;
    Py_ssize_t pos;
    long long fwd_budget, drop_budget;
    unsigned long max_in;
    if (!PyArg_ParseTuple(args, "ly*nLLk", &in_id, &view, &pos, &fwd_budget, &drop_budget,
                          &max_in))
        return NULL;
    const uint8_t *d = view.buf;
    Py_ssize_t n = view.len;
    long long counts[9] = {0};
    int stop = STOP_END;
    PyObject *touched = PyList_New(0);
    PyObject *outputs = NULL, *result = NULL;
    Py_ssize_t stack_slots[MAX_TARGETS_STACK];
    uint8_t stack_left[MAX_TARGETS_STACK];
    Py_ssize_t *slots = stack_slots;
    uint8_t *lefts = stack_left;
    Py_ssize_t slots_cap = MAX_TARGETS_STACK;
    int failed = 0;
    if (!touched) { PyBuffer_Release(&view); return NULL; }
    uint64_t serial = ++e->serial;
    if (pos < 0 || pos > n) {
        PyErr_SetString(PyExc_ValueError, "pos outside the buffer");
        failed = 1;
        goto done;
    }
    if (link_find(e, in_id) < 0) { stop = STOP_MISS_LINK; goto done; }
    for (;;) {
        if (n - pos < HEADER) { stop = pos == n ? STOP_END : STOP_PARTIAL; break; }
        const uint8_t *h = d + pos;
        uint32_t size = ((uint32_t)h[16] << 24) | ((uint32_t)h[17] << 16)
                        | ((uint32_t)h[18] << 8) | h[19];
        int band = h[20], lt = h[21], lv = h[22], ttl = h[23];
        if (size > max_in || band >= NUM_BANDS || lt >= NUM_LOC) { stop = STOP_SLOW; break; }
        Py_ssize_t end = pos + HEADER + (Py_ssize_t)size;
        if (end > n) { stop = STOP_PARTIAL; break; }
        if (band < ROUTER_BANDS_END || (h[8] | h[9] | h[10] | h[11]) == 0) {
            stop = STOP_SLOW;
            break;
        }
        if (ttl == 0) {
            if (counts[7] + 1 >= drop_budget) { stop = STOP_SLOW; break; }
            counts[1]++;
            counts[7]++;
            counts[8]++;
            pos = end;
            continue;
        }
        Flow *f = flow_find(e, h);
        if (!f) { stop = STOP_MISS_FLOW; break; }
        int is_down = 0;
        for (uint32_t i = 0; i < f->ndown; i++)
            if (f->down[i] == in_id) { is_down = 1; break; }
        int drop_kind = 0;
        Py_ssize_t nt = 0;
        if ((Py_ssize_t)f->ndown + 1 > slots_cap) {
            Py_ssize_t cap = (Py_ssize_t)f->ndown + 1;
            Py_ssize_t *ns = PyMem_Malloc((size_t)cap * sizeof(Py_ssize_t));
            uint8_t *nl = PyMem_Malloc((size_t)cap);
            if (!ns || !nl) { PyMem_Free(ns); PyMem_Free(nl); PyErr_NoMemory(); failed = 1; break; }
            if (slots != stack_slots) { PyMem_Free(slots); PyMem_Free(lefts); }
            slots = ns;
            lefts = nl;
            slots_cap = cap;
        }
        int missing = 0;
        if (in_id == f->up) {
            if (!mask_has(f->agg, band)) {
                drop_kind = 2;
            } else {
                for (uint32_t i = 0; i < f->ndown; i++) {
                    if (!mask_has(f->masks[i], band)) continue;
                    Py_ssize_t s = link_find(e, f->down[i]);
                    if (s < 0) { missing = 1; break; }
                    slots[nt++] = s;
                }
            }
        } else {
            for (uint32_t i = 0; i < f->ndown; i++) {
                if (!mask_has(f->masks[i], band) || f->down[i] == in_id) continue;
                Py_ssize_t s = link_find(e, f->down[i]);
                if (s < 0) { missing = 1; break; }
                slots[nt++] = s;
            }
            if (!missing && f->up >= 0) {
                Py_ssize_t s = link_find(e, f->up);
                if (s < 0) missing = 1;
                else slots[nt++] = s;
            }
        }
        if (!drop_kind && !missing && nt == 0) drop_kind = 3;
        if (drop_kind) {
            if (counts[7] + 1 >= drop_budget) { stop = STOP_SLOW; break; }
            counts[drop_kind]++;
            counts[7]++;
            counts[8]++;
            if (is_down && f->mark != serial) {
                PyObject *k = PyBytes_FromStringAndSize((const char *)h, 16);
                if (!k || PyList_Append(touched, k) < 0) { Py_XDECREF(k); failed = 1; break; }
                Py_DECREF(k);
                f->mark = serial;
            }
            pos = end;
            continue;
        }
        if (missing) { stop = STOP_MISS_LINK; break; }
        /* decide every copy first: a frame is taken whole or not at all */
        int out_ttl = ttl - 1;
        long long d_ttl = 0, d_loc = 0, d_big = 0;
        Py_ssize_t nsend = 0;
        for (Py_ssize_t i = 0; i < nt; i++) {
            Link *l = &e->links[slots[i]];
            int left = 0;
            if (lt) {
                left = lv - l->mods[lt];
                if (left < 0) { d_loc++; continue; }
            }
            if (out_ttl == 0 && l->router) { d_ttl++; continue; }
            if (size > l->max_payload) { d_big++; continue; }
            slots[nsend] = slots[i];
            lefts[nsend] = (uint8_t)left;
            nsend++;
        }
        long long nd = d_ttl + d_loc + d_big;
        if (counts[7] + nd >= drop_budget || (nsend && counts[6] + 1 >= fwd_budget)) {
            stop = STOP_SLOW;
            break;
        }
        counts[1] += d_ttl;
        counts[4] += d_loc;
        counts[5] += d_big;
        counts[7] += nd;
        counts[8]++;
        if (nsend) {
            counts[6]++;
            counts[0] += nsend;
        }
        if (is_down && f->mark != serial) {
            PyObject *k = PyBytes_FromStringAndSize((const char *)h, 16);
            if (!k || PyList_Append(touched, k) < 0) { Py_XDECREF(k); failed = 1; break; }
            Py_DECREF(k);
            f->mark = serial;
        }
        for (Py_ssize_t i = 0; i < nsend; i++) {
            if (plan_copy(e, slots[i], pos, size, lt, lefts[i], out_ttl) < 0) {
                failed = 1;
                break;
            }
        }
        if (failed) break;
        pos = end;
    }
done:
    if (slots != stack_slots) { PyMem_Free(slots); PyMem_Free(lefts); }
    /* make each link's bytes object at its final size, then copy every planned frame
     * into it in arrival order (and forget the plan even on failure) */
    if (!failed) outputs = PyList_New(e->ndirty);
    for (Py_ssize_t i = 0; i < e->ndirty && outputs; i++) {
        Link *l = &e->links[e->dirty[i]];
        PyObject *b = PyBytes_FromStringAndSize(NULL, l->len);
        PyObject *t = b ? Py_BuildValue("(lNl)", l->id, b, l->frames) : NULL;
        if (!t) { Py_CLEAR(outputs); failed = 1; break; }
        l->wp = PyBytes_AS_STRING(b);
        PyList_SET_ITEM(outputs, i, t);
    }
    if (outputs) {
        for (Py_ssize_t i = 0; i < e->ncopies; i++) {
            Copy *c = &e->copies[i];
            Link *l = &e->links[c->slot];
            char *w = l->wp;
            memcpy(w, d + c->src, 21);
            w[21] = (char)c->lt;
            w[22] = (char)c->left;
            w[23] = (char)c->ttl;
            memcpy(w + HEADER, d + c->src + HEADER, c->size);
            l->wp = w + HEADER + c->size;
        }
    }
    for (Py_ssize_t i = 0; i < e->ndirty; i++) {
        Link *l = &e->links[e->dirty[i]];
        l->len = 0;
        l->frames = 0;
        l->dirty = 0;
        l->wp = NULL;
    }
    e->ncopies = 0;
    if (e->copies_cap > 65536) { /* do not keep a huge plan after a burst */
        PyMem_Free(e->copies);
        e->copies = NULL;
        e->copies_cap = 0;
    }
    e->ndirty = 0;
    PyBuffer_Release(&view);
    if (failed || !outputs) {
        Py_XDECREF(outputs);
        Py_DECREF(touched);
        return NULL;
    }
    result = Py_BuildValue("(niNN(LLLLLLLLL))", pos, stop, outputs, touched, counts[0],
                           counts[1], counts[2], counts[3], counts[4], counts[5], counts[6],
                           counts[7], counts[8]);
    return result;
}

/* ------------------------------------------------------------------ type */
static int Engine_init(Engine *e, PyObject *args, PyObject *kw) {
    static char *kwlist[] = {NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kw, "", kwlist)) return -1;
    return 0;
}

static void Engine_dealloc(Engine *e) {
    engine_clear(e);
    PyMem_Free(e->dirty);
    PyMem_Free(e->copies);
    Py_TYPE(e)->tp_free((PyObject *)e);
}

static PyMethodDef Engine_methods[] = {
    {"set_link", (PyCFunction)Engine_set_link, METH_VARARGS,
     "set_link(link, router, max_payload, modifiers): mirror a link"},
    {"forget_link", (PyCFunction)Engine_forget_link, METH_O, "forget_link(link)"},
    {"has_link", (PyCFunction)Engine_has_link, METH_O, "has_link(link) -> bool"},
    {"set_flow", (PyCFunction)Engine_set_flow, METH_VARARGS,
     "set_flow(key, upstream, [(link, mask)], agg): mirror a flow entry"},
    {"forget_flow", (PyCFunction)Engine_forget_flow, METH_O, "forget_flow(key)"},
    {"has_flow", (PyCFunction)Engine_has_flow, METH_O, "has_flow(key) -> bool"},
    {"clear", (PyCFunction)Engine_clear, METH_NOARGS, "forget every flow and link"},
    {"sizes", (PyCFunction)Engine_sizes, METH_NOARGS, "(flows, links) mirrored"},
    {"forward", (PyCFunction)Engine_forward, METH_VARARGS,
     "forward(link, data, pos, fwd_budget, drop_budget, max_payload) -> "
     "(pos, stop, outputs, touched, counts)"},
    {NULL, NULL, 0, NULL},
};

static PyObject *Engine_get_native(Engine *e, void *Py_UNUSED(closure)) {
    Py_RETURN_TRUE;
}

static PyGetSetDef Engine_getset[] = {
    {"native", (getter)Engine_get_native, NULL, "True: the compiled engine", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject EngineType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "flowrouter.core._fastpath.Engine",
    .tp_doc = "Compiled forwarding engine (twin of flowrouter.core.fastpath_py.Engine)",
    .tp_basicsize = sizeof(Engine),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Engine_init,
    .tp_dealloc = (destructor)Engine_dealloc,
    .tp_methods = Engine_methods,
    .tp_getset = Engine_getset,
};

static struct PyModuleDef fastpath_module = {
    PyModuleDef_HEAD_INIT, "_fastpath",
    "Compiled forwarding engine of the fast path (see flowrouter/core/fastpath_py.py).", -1,
    NULL, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__fastpath(void) {
    if (PyType_Ready(&EngineType) < 0) return NULL;
    PyObject *m = PyModule_Create(&fastpath_module);
    if (!m) return NULL;
    Py_INCREF(&EngineType);
    if (PyModule_AddObject(m, "Engine", (PyObject *)&EngineType) < 0) {
        Py_DECREF(&EngineType);
        Py_DECREF(m);
        return NULL;
    }
    MASK64 = PyLong_FromUnsignedLongLong(~0ULL);
    SHIFT64 = PyLong_FromLong(64);
    if (!MASK64 || !SHIFT64) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
