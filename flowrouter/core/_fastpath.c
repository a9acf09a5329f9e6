/* The forwarding engine of the fast path, compiled: the twin of fastpath_py.py.
 *
 * Same interface and the same decisions as flowrouter/core/fastpath_py.py (read its module
 * docstring first): a mirror of the forwarding tables, and forward() over a whole received
 * buffer with no Python object per message. Python objects are made once per call: one
 * bytes object per output link (a few views with large payloads) or per shared run (the
 * frames that several links get alike: fan-out), the result tuple. The engine does no I/O
 * and takes no locks; the GIL is held throughout.
 *
 * The tables it forwards from are in _fastpath_tables.c (declarations in
 * _fastpath_tables.h); the Python objects its plan becomes are built in _fastpath_out.c.
 */
#include "_fastpath_out.h"
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

/* ------------------------------------------------------------------ forwarding */
/* Make *arr (items of isz bytes) hold at least need items (doubling, from first). */
static int grow(void **arr, Py_ssize_t *cap, Py_ssize_t need, size_t isz, Py_ssize_t first) {
    if (need <= *cap) return 0;
    Py_ssize_t c = *cap ? *cap : first;
    while (c < need) c *= 2;
    void *na = PyMem_Realloc(*arr, (size_t)c * isz);
    if (!na) { PyErr_NoMemory(); return -1; }
    *arr = na;
    *cap = c;
    return 0;
}

static int mark_dirty(Engine *e, Py_ssize_t slot) {
    Link *l = &e->links[slot];
    if (l->dirty) return 0;
    if (grow((void **)&e->dirty, &e->dirty_cap, e->ndirty + 1, sizeof(Py_ssize_t), 16) < 0)
        return -1;
    e->dirty[e->ndirty++] = slot;
    l->dirty = 1;
    return 0;
}

/* (inline, with the common cases tested here: one call per copy of a unicast stream) */
static inline int plan_copy(Engine *e, Py_ssize_t slot, Py_ssize_t src, uint32_t size,
                            int lt, int left, int ttl, int ref) {
    if (e->ncopies == e->copies_cap
            && grow((void **)&e->copies, &e->copies_cap, e->ncopies + 1, sizeof(Copy), 1024) < 0)
        return -1;
    e->copies[e->ncopies++] = (Copy){slot, src, size, (uint8_t)lt, (uint8_t)left,
                                     (uint8_t)ttl, (uint8_t)ref};
    Link *l = &e->links[slot];
    Py_ssize_t end = src + HEADER + (Py_ssize_t)size;
    if (!l->frames) {
        l->vstart = src;
        l->vend = end;
        l->vcontig = 1;
    } else if (src == l->vend) {
        l->vend = end;
    } else {
        l->vcontig = 0;
    }
    l->len += HEADER + (ref ? 0 : (Py_ssize_t)size);
    l->nrefs += ref;
    l->frames++;
    return l->dirty ? 0 : mark_dirty(e, slot);
}

/* End the run being gathered (*open: its index, or -1): shared by its links if it holds
 * share_min bytes or more (one marker in the plan, slot -1 - run), else its frames are
 * planned as copies to each link, frame by frame, and the run is forgotten. */
static int close_run(Engine *e, Py_ssize_t *open, Py_ssize_t share_min) {
    if (*open < 0) return 0;
    Run *r = &e->runs[*open];
    const Py_ssize_t *tg = &e->rtargets[r->tgt];
    if (r->wire >= share_min) {
        if (grow((void **)&e->copies, &e->copies_cap, e->ncopies + 1, sizeof(Copy), 1024) < 0)
            return -1;
        Copy *c = &e->copies[e->ncopies++];
        c->slot = -1 - *open;
        for (Py_ssize_t i = 0; i < r->nt; i++) {
            Link *l = &e->links[tg[i]];
            l->frames += r->nframes;
            l->nshared++;
            l->nrefs += r->nrefs; /* its output holds pieces of the run's list */
            if (mark_dirty(e, tg[i]) < 0) return -1;
        }
        *open = -1;
        return 0;
    }
    for (Py_ssize_t j = r->first; j < r->first + r->nframes; j++) {
        Copy f = e->rframes[j];
        for (Py_ssize_t i = 0; i < r->nt; i++)
            if (plan_copy(e, tg[i], f.src, f.size, f.lt, r->left, f.ttl, f.ref) < 0) return -1;
    }
    e->nrframes = r->first;
    e->nrtargets = r->tgt;
    e->nruns--;
    *open = -1;
    return 0;
}

/* Plan one frame for the shared runs: it goes to nsend (two or more) links with one
 * locality value. It joins the open run when that goes to the same links, else starts
 * one (same: it goes where the last frame planned went, so to the open run's links if one
 * is open); 1 (nothing planned): it goes to a link twice and is no run's (a frame from
 * neither end of a flow whose upstream link is one of its downstream links too). */
static int plan_shared(Engine *e, Py_ssize_t *open, Py_ssize_t share_min,
                       const Py_ssize_t *sends, Py_ssize_t nsend, int left, int same,
                       Py_ssize_t src, uint32_t size, int lt, int ttl, int ref) {
    Run *r = *open >= 0 ? &e->runs[*open] : NULL;
    if (!r || (!same && (r->nt != nsend || r->left != left
                         || memcmp(&e->rtargets[r->tgt], sends,
                                   (size_t)nsend * sizeof(Py_ssize_t))))) {
        int twice = 0;
        for (Py_ssize_t i = 0; i < nsend; i++) {
            twice |= e->links[sends[i]].seen;
            e->links[sends[i]].seen = 1;
        }
        for (Py_ssize_t i = 0; i < nsend; i++) e->links[sends[i]].seen = 0;
        if (twice) return 1;
        if (close_run(e, open, share_min) < 0
                || grow((void **)&e->runs, &e->runs_cap, e->nruns + 1, sizeof(Run), 16) < 0
                || grow((void **)&e->rtargets, &e->rtargets_cap, e->nrtargets + nsend,
                        sizeof(Py_ssize_t), 256) < 0)
            return -1;
        *open = e->nruns++;
        r = &e->runs[*open];
        memset(r, 0, sizeof(Run));
        r->first = e->nrframes;
        r->tgt = e->nrtargets;
        r->nt = nsend;
        r->left = (uint8_t)left;
        memcpy(&e->rtargets[r->tgt], sends, (size_t)nsend * sizeof(Py_ssize_t));
        e->nrtargets += nsend;
    }
    if (grow((void **)&e->rframes, &e->rframes_cap, e->nrframes + 1, sizeof(Copy), 1024) < 0)
        return -1;
    e->rframes[e->nrframes++] = (Copy){-1, src, size, (uint8_t)lt, (uint8_t)left,
                                       (uint8_t)ttl, (uint8_t)ref};
    r->nframes++;
    r->wire += HEADER + (Py_ssize_t)size;
    r->own += HEADER + (ref ? 0 : (Py_ssize_t)size);
    r->nrefs += ref;
    return 0;
}

#define MAX_TARGETS_STACK 64

static PyObject *Engine_forward(Engine *e, PyObject *args) {
    long in_id;
    PyObject *data;
    Py_buffer view;
    Py_ssize_t pos;
    long long fwd_budget, drop_budget;
    unsigned long max_in;
    Py_ssize_t ref_min = PY_SSIZE_T_MAX, share_min = PY_SSIZE_T_MAX;
    int in_place = 0;
    Py_ssize_t open = -1; /* the shared run being gathered */
    if (!PyArg_ParseTuple(args, "lOnLLk|nnp", &in_id, &data, &pos, &fwd_budget, &drop_budget,
                          &max_in, &ref_min, &share_min, &in_place))
        return NULL;
    /* in place: only in a buffer we may write, and only while no frame of the call goes
     * to two links or leaves its payload by reference (see fastpath_py) */
    int writable = 0;
    if (in_place) {
        if (PyObject_GetBuffer(data, &view, PyBUF_WRITABLE) == 0) writable = 1;
        else PyErr_Clear();
    }
    if (!writable && PyObject_GetBuffer(data, &view, PyBUF_SIMPLE) < 0) return NULL;
    int several = 0;
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
    /* the hot slot of the last flow looked up, and of the flow (with the band) whose
     * outputs slots holds (the tables do not change during a call: a run of frames of one
     * flow, or of flows of one routing class, decides its links once) */
    Hot *lasths = NULL, *chs = NULL;
    int cband = -1, c_drop = 0, c_missing = 0;
    /* the copies the last frame of the cached flow and band went to (sends, lefts: the
     * same for the next frame with the same locality, TTL class and no larger payload,
     * when no link refused the last one for its size; a fan-out's frames then cost no
     * pass over its links) */
    int k_valid = 0, k_lt = 0, k_lv = 0, k_ttl0 = 0, k_alike = 0;
    uint32_t k_fit = 0;
    long long k_dttl = 0, k_dloc = 0;
    Py_ssize_t k_nsend = 0;
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
    Scout scout; /* prefetches the lookups of the frames ahead (_fastpath_tables.h) */
    const int scouting = scout_start(&scout, e, d, n, pos);
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
        uint32_t slot = scouting ? fp_scout_step(&scout, e, d, n, pos, size) : UINT32_MAX;
        if (ttl == 0) {
            if (counts[7] + 1 >= drop_budget) { stop = STOP_SLOW; break; }
            counts[1]++;
            counts[7]++;
            counts[8]++;
            pos = end;
            continue;
        }
        Hot *hs = slot != UINT32_MAX ? hot_probe(e, h, (Py_ssize_t)slot)
                  : lasths && memcmp(lasths->key, h, 16) == 0 ? lasths : fp_hot_find(e, h);
        if (!hs) { stop = STOP_MISS_FLOW; break; }
        lasths = hs;
        int drop_kind = 0, absent = 0;
        Py_ssize_t nt = 0;
        int missing = 0;
        if (band == cband && chs != NULL && (hs == chs || (hs->cls && hs->cls == chs->cls))) {
            /* the flow (or one of its routing class: many flows to one subscriber) whose
             * outputs slots holds: its entry is not even read */
            chs = hs;
            drop_kind = c_drop;
            nt = c_nt;
            missing = c_missing;
        } else if (e->flows[hs->pos - 1].ndown == FLOW_ABSENT) { /* toward the location service (slots has room for one) */
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
            absent = 1;
            chs = NULL;
            k_valid = 0;
            Py_ssize_t s = fp_link_find(e, r->link);
            if (s < 0) missing = 1;
            else slots[nt++] = s;
        } else {
            const Flow *f = &e->flows[hs->pos - 1];
            chs = NULL;
            k_valid = 0;
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
            chs = hs;
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
            hot_count(e, hs, (uint64_t)(end - pos));
            pos = end;
            continue;
        }
        if (missing) { stop = STOP_MISS_LINK; break; }
        /* decide every copy first: a frame is taken whole or not at all */
        int out_ttl = ttl - 1;
        long long d_ttl = 0, d_loc = 0, d_big = 0;
        Py_ssize_t nsend = 0;
        int same = k_valid && lt == k_lt && lv == k_lv && (out_ttl == 0) == k_ttl0
                   && size <= k_fit;
        if (same) {
            nsend = k_nsend;
            d_ttl = k_dttl;
            d_loc = k_dloc;
        } else {
            uint32_t fit = UINT32_MAX;
            for (Py_ssize_t i = 0; i < nt; i++) {
                Link *l = &e->links[slots[i]];
                int left = 0;
                if (lt) {
                    left = lv - l->mods[lt];
                    if (left < 0) { d_loc++; continue; }
                }
                if (out_ttl == 0 && l->router) { d_ttl++; continue; }
                if (size > l->max_payload) { d_big++; continue; }
                if (l->max_payload < fit) fit = l->max_payload;
                sends[nsend] = slots[i];
                lefts[nsend] = (uint8_t)left;
                nsend++;
            }
            k_alike = nsend >= 2;
            for (Py_ssize_t i = 1; i < nsend && k_alike; i++) k_alike = lefts[i] == lefts[0];
            k_valid = chs != NULL && d_big == 0;
            k_lt = lt;
            k_lv = lv;
            k_ttl0 = out_ttl == 0;
            k_fit = fit;
            k_dttl = d_ttl;
            k_dloc = d_loc;
            k_nsend = nsend;
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
        if (absent) counts[9]++;
        else hot_count(e, hs, (uint64_t)(end - pos)); /* as the core counts in its entry */
        if (nsend) {
            counts[6]++;
            counts[0] += nsend;
        }
        int ref = (Py_ssize_t)size >= ref_min;
        if (nsend > 1 || (ref && nsend)) several = 1;
        int shared = k_alike ? plan_shared(e, &open, share_min, sends, nsend, lefts[0],
                                           same, pos, size, lt, out_ttl, ref) : 1;
        if (shared < 0) {
            failed = 1;
            break;
        }
        if (shared && nsend) {
            if (open >= 0 && close_run(e, &open, share_min) < 0) {
                failed = 1;
                break;
            }
            for (Py_ssize_t i = 0; i < nsend; i++) {
                if (plan_copy(e, sends[i], pos, size, lt, lefts[i], out_ttl, ref) < 0) {
                    failed = 1;
                    break;
                }
            }
            if (failed) break;
        }
        pos = end;
    }
done:
    if (slots != stack_slots) { PyMem_Free(slots); PyMem_Free(sends); PyMem_Free(lefts); }
    if (!failed && close_run(e, &open, share_min) < 0) failed = 1;
    outputs = fp_build_outputs(e, d, data, failed, writable && !several);
    PyBuffer_Release(&view);
    if (!outputs) return NULL;
    result = Py_BuildValue("(niN(LLLLLLLLLLLL))", pos, stop, outputs, counts[0],
                           counts[1], counts[2], counts[3], counts[4], counts[5], counts[6],
                           counts[7], counts[8], counts[9], counts[10], counts[11]);
    return result;
}

/* one_flow(buf) -> bool: buf holds whole frames back to back, every one data (band 32 or
 * more) of the first one's flow: an output queue may keep them as one entry of that flow
 * (linkqueue.OutputQueue.push_run) */
static PyObject *Engine_one_flow(Engine *e, PyObject *arg) {
    (void)e;
    Py_buffer v;
    if (PyObject_GetBuffer(arg, &v, PyBUF_SIMPLE) < 0) return NULL;
    const uint8_t *d = v.buf;
    Py_ssize_t n = v.len, pos = 0;
    int ok = n >= HEADER;
    while (ok && pos < n) {
        const uint8_t *h = d + pos;
        if (n - pos < HEADER || h[20] < 32 || memcmp(h, d, 16) != 0) {
            ok = 0;
            break;
        }
        pos += HEADER + (Py_ssize_t)(((uint32_t)h[16] << 24) | ((uint32_t)h[17] << 16)
                                     | ((uint32_t)h[18] << 8) | h[19]);
    }
    PyBuffer_Release(&v);
    return PyBool_FromLong(ok && pos == n);
}

/* ------------------------------------------------------------------ type */
static int Engine_init(Engine *e, PyObject *args, PyObject *kw) {
    static char *kwlist[] = {NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kw, "", kwlist)) return -1;
    if (e->hot_cap == 0 && getrandom(e->seed, sizeof e->seed, 0) != (ssize_t)sizeof e->seed) {
        /* no entropy source: the address and the clock, less than random but not fixed */
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        e->seed[0] = (uint64_t)(uintptr_t)e * 0x9E3779B97F4A7C15ULL ^ (uint64_t)ts.tv_nsec;
        e->seed[1] = (uint64_t)ts.tv_sec * 0xBF58476D1CE4E5B9ULL ^ (uint64_t)getpid();
    }
    return 0;
}

static void Engine_dealloc(Engine *e) {
    fp_engine_clear(e);
    PyMem_Free(e->dirty);
    PyMem_Free(e->copies);
    PyMem_Free(e->runs);
    PyMem_Free(e->rframes);
    PyMem_Free(e->rtargets);
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
    {"hot_stats", (PyCFunction)Engine_hot_stats, METH_NOARGS,
     "(hot table slots, tombstones, slots its longest probe reads)"},
    {"classes", (PyCFunction)Engine_classes, METH_NOARGS,
     "(routing classes held, the most there may be, flows that found none)"},
    {"one_flow", (PyCFunction)Engine_one_flow, METH_O,
     "one_flow(buf) -> bool: whole data frames of one flow, back to back"},
    {"forward", (PyCFunction)Engine_forward, METH_VARARGS,
     "forward(link, data, pos, fwd_budget, drop_budget, max_payload, ref_min, share_min) -> "
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
