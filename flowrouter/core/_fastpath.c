/* The forwarding engine of the fast path, compiled: the twin of fastpath_py.py.
 *
 * Same interface and the same decisions as flowrouter/core/fastpath_py.py (read its module
 * docstring first): a mirror of the forwarding tables, and forward() over a whole received
 * buffer with no Python object per message. Python objects are made once per call: one
 * bytes object per output link (a few views with large payloads), the result tuple. The engine does no I/O and takes no locks; the GIL is held throughout.
 *
 * The tables it forwards from are in _fastpath_tables.c (declarations in
 * _fastpath_tables.h).
 */
#include "_fastpath_tables.h"

/* ------------------------------------------------------------------ forwarding */
static int plan_copy(Engine *e, Py_ssize_t slot, Py_ssize_t src, uint32_t size, int lt,
                     int left, int ttl, int ref) {
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
    c->ref = (uint8_t)ref;
    Link *l = &e->links[slot];
    l->len += HEADER + (ref ? 0 : (Py_ssize_t)size);
    l->nrefs += ref;
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

/* Append data[lo:hi] (a memoryview slice) to list; 0 or -1 */
static int append_slice(PyObject *list, PyObject *mv, Py_ssize_t lo, Py_ssize_t hi) {
    PyObject *piece = PySequence_GetSlice(mv, lo, hi);
    if (!piece) return -1;
    int rc = PyList_Append(list, piece);
    Py_DECREF(piece);
    return rc;
}

static PyObject *Engine_forward(Engine *e, PyObject *args) {
    long in_id;
    PyObject *data;
    Py_buffer view;
    Py_ssize_t pos;
    long long fwd_budget, drop_budget;
    unsigned long max_in;
    Py_ssize_t ref_min = PY_SSIZE_T_MAX;
    if (!PyArg_ParseTuple(args, "lOnLLk|n", &in_id, &data, &pos, &fwd_budget, &drop_budget,
                          &max_in, &ref_min))
        return NULL;
    if (PyObject_GetBuffer(data, &view, PyBUF_SIMPLE) < 0) return NULL;
    PyObject *inview = NULL; /* a memoryview of data, made for the first reference */
    const uint8_t *d = view.buf;
    Py_ssize_t n = view.len;
    long long counts[NCOUNTS] = {0};
    int stop = STOP_END;
    PyObject *outputs = NULL, *result = NULL;
    /* slots: the output links of the frame's flow and band (kept for the next frame of the
     * same flow and band: the cache below); sends, lefts: the copies actually sent */
    Py_ssize_t stack_slots[MAX_TARGETS_STACK], stack_sends[MAX_TARGETS_STACK];
    uint8_t stack_left[MAX_TARGETS_STACK];
    Py_ssize_t *slots = stack_slots, *sends = stack_sends;
    uint8_t *lefts = stack_left;
    Py_ssize_t slots_cap = MAX_TARGETS_STACK;
    /* the last flow looked up, and the flow and band whose outputs slots holds (the tables
     * do not change during a call: a run of frames of one flow decides its links once) */
    Flow *lastf = NULL, *cf = NULL;
    int cband = -1, c_drop = 0, c_missing = 0;
    Py_ssize_t c_nt = 0;
    int failed = 0;
    if (pos < 0 || pos > n) {
        PyErr_SetString(PyExc_ValueError, "pos outside the buffer");
        failed = 1;
        goto done;
    }
    Py_ssize_t in_slot = fp_link_find(e, in_id);
    if (in_slot < 0) { stop = STOP_MISS_LINK; goto done; }
    int in_router = e->links[in_slot].router;
    for (;;) {
        if (n - pos < HEADER) { stop = pos == n ? STOP_END : STOP_PARTIAL; break; }
        const uint8_t *h = d + pos;
        uint32_t size = ((uint32_t)h[16] << 24) | ((uint32_t)h[17] << 16)
                        | ((uint32_t)h[18] << 8) | h[19];
        int band = h[20], lt = h[21], lv = h[22], ttl = h[23];
        if (size > max_in || band >= NUM_BANDS || lt >= NUM_LOC) { stop = STOP_SLOW; break; }
        Py_ssize_t end = pos + HEADER + (Py_ssize_t)size;
        if (end > n) { stop = STOP_PARTIAL; break; }
        if (band < ROUTER_BANDS_END || (h[8] | h[9] | h[10] | h[11]) == 0
            || (!in_router && band >= ROUTER_ONLY_FIRST && band <= ROUTER_ONLY_LAST)) {
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
        Flow *f = lastf && memcmp(lastf->key, h, 16) == 0 ? lastf : fp_flow_find(e, h);
        if (!f) { stop = STOP_MISS_FLOW; break; }
        lastf = f;
        int drop_kind = 0;
        Py_ssize_t nt = 0;
        int missing = 0;
        if (f == cf && band == cband) {
            drop_kind = c_drop;
            nt = c_nt;
            missing = c_missing;
        } else if (f->ndown == FLOW_ABSENT) { /* toward the location service (slots has room for one) */
            uint32_t lsid = ((uint32_t)h[8] << 24) | ((uint32_t)h[9] << 16)
                            | ((uint32_t)h[10] << 8) | h[11];
            Route *r = fp_route_find(e, lsid);
            if (!r) { stop = STOP_MISS_ROUTE; break; }
            if (r->link == in_id) { stop = STOP_SLOW; break; } /* the core: NOT_ON_TREE */
            if (r->link < 0) {
                if (counts[7] + 1 >= drop_budget) { stop = STOP_SLOW; break; }
                counts[r->link == ROUTE_NO_MEMBERS ? 10 : 11]++;
                counts[7]++;
                counts[8]++;
                pos = end;
                continue;
            }
            cf = NULL;
            Py_ssize_t s = fp_link_find(e, r->link);
            if (s < 0) missing = 1;
            else slots[nt++] = s;
        } else {
            cf = NULL;
            const int32_t *downs = flow_downs(f);
            const mask128 *masks = flow_masks(f);
            if ((Py_ssize_t)f->ndown + 1 > slots_cap) {
                Py_ssize_t cap = (Py_ssize_t)f->ndown + 1;
                Py_ssize_t *ns = PyMem_Malloc((size_t)cap * sizeof(Py_ssize_t));
                Py_ssize_t *nw = PyMem_Malloc((size_t)cap * sizeof(Py_ssize_t));
                uint8_t *nl = PyMem_Malloc((size_t)cap);
                if (!ns || !nw || !nl) {
                    PyMem_Free(ns);
                    PyMem_Free(nw);
                    PyMem_Free(nl);
                    PyErr_NoMemory();
                    failed = 1;
                    break;
                }
                if (slots != stack_slots) {
                    PyMem_Free(slots);
                    PyMem_Free(sends);
                    PyMem_Free(lefts);
                }
                slots = ns;
                sends = nw;
                lefts = nl;
                slots_cap = cap;
            }
            if (in_id == f->up) {
                if (!mask_has(f->agg, band)) {
                    drop_kind = 2;
                } else {
                    for (uint32_t i = 0; i < f->ndown; i++) {
                        if (!mask_has(masks[i], band)) continue;
                        Py_ssize_t s = fp_link_find(e, downs[i]);
                        if (s < 0) { missing = 1; break; }
                        slots[nt++] = s;
                    }
                }
            } else {
                for (uint32_t i = 0; i < f->ndown; i++) {
                    if (!mask_has(masks[i], band) || downs[i] == in_id) continue;
                    Py_ssize_t s = fp_link_find(e, downs[i]);
                    if (s < 0) { missing = 1; break; }
                    slots[nt++] = s;
                }
                if (!missing && f->up >= 0) {
                    Py_ssize_t s = fp_link_find(e, f->up);
                    if (s < 0) missing = 1;
                    else slots[nt++] = s;
                }
            }
            if (!drop_kind && !missing && nt == 0) drop_kind = 3;
            cf = f;
            cband = band;
            c_drop = drop_kind;
            c_nt = nt;
            c_missing = missing;
        }
        if (drop_kind) { /* never for an absent key */
            if (counts[7] + 1 >= drop_budget) { stop = STOP_SLOW; break; }
            counts[drop_kind]++;
            counts[7]++;
            counts[8]++;
            FlowCount *fc = &e->counts[f - e->flows];
            fc->frames++;
            fc->bytes += (uint64_t)(end - pos);
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
            sends[nsend] = slots[i];
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
        if (f->ndown == FLOW_ABSENT) {
            counts[9]++;
        } else { /* the flow's counters, as the core counts them in its entry */
            FlowCount *fc = &e->counts[f - e->flows];
            fc->frames++;
            fc->bytes += (uint64_t)(end - pos);
        }
        if (nsend) {
            counts[6]++;
            counts[0] += nsend;
        }
        for (Py_ssize_t i = 0; i < nsend; i++) {
            if (plan_copy(e, sends[i], pos, size, lt, lefts[i], out_ttl,
                          (Py_ssize_t)size >= ref_min) < 0) {
                failed = 1;
                break;
            }
        }
        if (failed) break;
        pos = end;
    }
done:
    if (slots != stack_slots) { PyMem_Free(slots); PyMem_Free(sends); PyMem_Free(lefts); }
    /* make each link's bytes object at its final size, then copy every planned frame
     * into it in arrival order (and forget the plan even on failure). A link with frames
     * passed by reference gets a list of pieces instead: views of its bytes object (the
     * copied frames and headers) alternating with views of the input (the payloads). */
    if (!failed) outputs = PyList_New(e->ndirty);
    for (Py_ssize_t i = 0; i < e->ndirty && outputs; i++) {
        Link *l = &e->links[e->dirty[i]];
        PyObject *b = PyBytes_FromStringAndSize(NULL, l->len);
        PyObject *t = NULL;
        if (b && l->nrefs) {
            l->bview = PyMemoryView_FromObject(b);
            l->pieces = l->bview ? PyList_New(0) : NULL;
            if (l->pieces) {
                l->bytes = b;
                Py_INCREF(l->pieces);
                t = Py_BuildValue("(lNl)", l->id, l->pieces, l->frames);
            } else {
                Py_DECREF(b);
            }
        } else if (b) {
            t = Py_BuildValue("(lNl)", l->id, b, l->frames);
        }
        if (!t) { Py_CLEAR(outputs); failed = 1; break; }
        l->wp = PyBytes_AS_STRING(b);
        l->prev = 0;
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
            if (!c->ref) {
                memcpy(w + HEADER, d + c->src + HEADER, c->size);
                l->wp = w + HEADER + c->size;
                continue;
            }
            l->wp = w + HEADER;
            Py_ssize_t at = l->wp - PyBytes_AS_STRING(l->bytes);
            if (!inview) inview = PyMemoryView_FromObject(data);
            if (!inview || append_slice(l->pieces, l->bview, l->prev, at) < 0
                    || append_slice(l->pieces, inview, c->src + HEADER,
                                    c->src + HEADER + (Py_ssize_t)c->size) < 0) {
                Py_CLEAR(outputs);
                failed = 1;
                break;
            }
            l->prev = at;
        }
    }
    for (Py_ssize_t i = 0; i < e->ndirty; i++) {
        Link *l = &e->links[e->dirty[i]];
        if (l->pieces && outputs && l->prev < l->len
                && append_slice(l->pieces, l->bview, l->prev, l->len) < 0) {
            Py_CLEAR(outputs);
            failed = 1;
        }
        Py_CLEAR(l->pieces);
        Py_CLEAR(l->bview);
        Py_CLEAR(l->bytes);
        l->len = 0;
        l->frames = 0;
        l->dirty = 0;
        l->nrefs = 0;
        l->wp = NULL;
    }
    Py_XDECREF(inview);
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
        return NULL;
    }
    result = Py_BuildValue("(niN(LLLLLLLLLLLL))", pos, stop, outputs, counts[0],
                           counts[1], counts[2], counts[3], counts[4], counts[5], counts[6],
                           counts[7], counts[8], counts[9], counts[10], counts[11]);
    return result;
}

/* ------------------------------------------------------------------ type */
static int Engine_init(Engine *e, PyObject *args, PyObject *kw) {
    static char *kwlist[] = {NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kw, "", kwlist)) return -1;
    return 0;
}

static void Engine_dealloc(Engine *e) {
    fp_engine_clear(e);
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
    {"forget_flow", (PyCFunction)Engine_forget_flow, METH_O,
     "forget_flow(key) -> (frames, bytes) its entry took, or None (absent, not mirrored)"},
    {"flow_counts", (PyCFunction)Engine_flow_counts, METH_O,
     "flow_counts(key) -> (frames, bytes) taken since mirrored, or None"},
    {"all_flow_counts", (PyCFunction)Engine_all_flow_counts, METH_NOARGS,
     "[(key, frames, bytes)] of every mirrored entry that took frames"},
    {"has_flow", (PyCFunction)Engine_has_flow, METH_O, "has_flow(key) -> bool"},
    {"set_absent", (PyCFunction)Engine_set_absent, METH_O,
     "set_absent(key): the core holds no entry for key"},
    {"forget_absent", (PyCFunction)Engine_forget_absent, METH_NOARGS,
     "forget every absent key"},
    {"set_route", (PyCFunction)Engine_set_route, METH_VARARGS,
     "set_route(lsid, link): where frames of absent flows with this LSID go"},
    {"forget_routes", (PyCFunction)Engine_forget_routes, METH_NOARGS, "forget every route"},
    {"has_route", (PyCFunction)Engine_has_route, METH_O, "has_route(lsid) -> bool"},
    {"clear", (PyCFunction)Engine_clear, METH_NOARGS, "forget every flow, link and route"},
    {"sizes", (PyCFunction)Engine_sizes, METH_NOARGS, "(flows, links) mirrored"},
    {"forward", (PyCFunction)Engine_forward, METH_VARARGS,
     "forward(link, data, pos, fwd_budget, drop_budget, max_payload) -> "
     "(pos, stop, outputs, counts)"},
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
    if (fp_init() < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
