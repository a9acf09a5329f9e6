/* The compiled engine's outputs: what one forward() call planned (_fastpath.c: copies per
 * link, shared runs) made into the Python objects it returns, each byte copied once.
 *
 * Part of the twin of flowrouter/core/fastpath_py.py (its module docstring says what a
 * link's output is); the GIL is held throughout.
 */
#include "_fastpath_out.h"

/* Write one planned frame at *w (its header rewritten; its payload too unless passed by
 * reference); returns where the next goes. */
static inline char *put_frame(char *w, const uint8_t *d, const Copy *c) {
    memcpy(w, d + c->src, 21);
    w[21] = (char)c->lt;
    w[22] = (char)c->left;
    w[23] = (char)c->ttl;
    if (c->ref) return w + HEADER;
    memcpy(w + HEADER, d + c->src + HEADER, c->size);
    return w + HEADER + c->size;
}

/* Append data[lo:hi] (a memoryview slice) to list; 0 or -1 */
static int append_slice(PyObject *list, PyObject *mv, Py_ssize_t lo, Py_ssize_t hi) {
    PyObject *piece = PySequence_GetSlice(mv, lo, hi);
    if (!piece) return -1;
    int rc = PyList_Append(list, piece);
    Py_DECREF(piece);
    return rc;
}

/* Make each shared run's bytes object, and each link's at its final size, then copy every
 * planned frame into them in arrival order (and forget the plan even on failure). A link's
 * output is its bytes object; or the one shared run it gets, when that is all it gets and
 * is bytes; else a list of pieces: views of its bytes object (the copied frames and
 * headers) between views of the input (payloads passed by reference) and the pieces of the
 * shared runs it gets. */
PyObject *fp_build_outputs(Engine *e, const uint8_t *d, PyObject *data, int failed,
                           int in_place) {
    PyObject *inview = NULL; /* a memoryview of data, made for the first reference */
    PyObject *outputs = NULL;
    if (!failed) outputs = PyList_New(e->ndirty);
    for (Py_ssize_t i = 0; i < e->nruns && outputs; i++) {
        Run *r = &e->runs[i];
        PyObject *b = PyBytes_FromStringAndSize(NULL, r->own);
        if (!b) { Py_CLEAR(outputs); break; }
        char *w = PyBytes_AS_STRING(b);
        const Copy *fr = &e->rframes[r->first];
        if (!r->nrefs) {
            for (Py_ssize_t j = 0; j < r->nframes; j++) w = put_frame(w, d, &fr[j]);
            r->obj = b;
            continue;
        }
        PyObject *bv = PyMemoryView_FromObject(b);
        Py_DECREF(b); /* the view holds it */
        r->obj = bv ? PyList_New(0) : NULL;
        if (!inview && bv) inview = PyMemoryView_FromObject(data);
        Py_ssize_t prev = 0;
        for (Py_ssize_t j = 0; j < r->nframes && r->obj; j++) {
            w = put_frame(w, d, &fr[j]);
            if (!fr[j].ref) continue;
            Py_ssize_t at = w - PyBytes_AS_STRING(b);
            if (!inview || append_slice(r->obj, bv, prev, at) < 0
                    || append_slice(r->obj, inview, fr[j].src + HEADER,
                                    fr[j].src + HEADER + (Py_ssize_t)fr[j].size) < 0)
                Py_CLEAR(r->obj);
            prev = at;
        }
        if (r->obj && prev < r->own && append_slice(r->obj, bv, prev, r->own) < 0)
            Py_CLEAR(r->obj);
        Py_XDECREF(bv);
        if (!r->obj) Py_CLEAR(outputs);
    }
    for (Py_ssize_t i = 0; i < e->ndirty && outputs; i++) {
        Link *l = &e->links[e->dirty[i]];
        if (in_place && l->vcontig && !l->nrefs && !l->nshared) {
            l->vout = 1; /* a view of the input, its headers rewritten there */
            continue;
        }
        int list = l->nrefs || l->nshared > 1 || (l->nshared && l->len);
        if (l->nshared && !list) continue; /* its run's bytes, found below */
        if (l->len || !list) {
            l->bytes = PyBytes_FromStringAndSize(NULL, l->len);
            if (!l->bytes) { Py_CLEAR(outputs); break; }
            l->wp = PyBytes_AS_STRING(l->bytes);
        }
        if (list) {
            l->pieces = PyList_New(0);
            if (!l->pieces || (l->bytes && !(l->bview = PyMemoryView_FromObject(l->bytes)))) {
                Py_CLEAR(outputs);
                break;
            }
        }
        l->prev = 0;
    }
    for (Py_ssize_t i = 0; i < e->ncopies && outputs; i++) {
        Copy *c = &e->copies[i];
        if (c->slot < 0) { /* a shared run: each of its links takes its pieces */
            Run *r = &e->runs[-1 - c->slot];
            const Py_ssize_t *tg = &e->rtargets[r->tgt];
            for (Py_ssize_t k = 0; k < r->nt; k++) {
                Link *l = &e->links[tg[k]];
                if (!l->pieces) { /* it is all the link gets */
                    Py_INCREF(r->obj);
                    l->bytes = r->obj;
                    continue;
                }
                Py_ssize_t at = l->bytes ? l->wp - PyBytes_AS_STRING(l->bytes) : 0;
                int rc = at > l->prev ? append_slice(l->pieces, l->bview, l->prev, at) : 0;
                if (rc == 0)
                    rc = PyList_CheckExact(r->obj)
                        ? PyList_SetSlice(l->pieces, PY_SSIZE_T_MAX, PY_SSIZE_T_MAX, r->obj)
                        : PyList_Append(l->pieces, r->obj);
                if (rc < 0) {
                    Py_CLEAR(outputs);
                    break;
                }
                l->prev = at;
            }
            continue;
        }
        Link *l = &e->links[c->slot];
        if (l->vout) { /* bytes 0..20 are the input's already */
            uint8_t *h = (uint8_t *)d + c->src;
            h[21] = c->lt;
            h[22] = c->left;
            h[23] = c->ttl;
            continue;
        }
        l->wp = put_frame(l->wp, d, c);
        if (!c->ref) continue;
        Py_ssize_t at = l->wp - PyBytes_AS_STRING(l->bytes);
        if (!inview) inview = PyMemoryView_FromObject(data);
        if (!inview || append_slice(l->pieces, l->bview, l->prev, at) < 0
                || append_slice(l->pieces, inview, c->src + HEADER,
                                c->src + HEADER + (Py_ssize_t)c->size) < 0) {
            Py_CLEAR(outputs);
            break;
        }
        l->prev = at;
    }
    for (Py_ssize_t i = 0; i < e->ndirty; i++) {
        Link *l = &e->links[e->dirty[i]];
        if (outputs && l->pieces && l->prev < l->len
                && append_slice(l->pieces, l->bview, l->prev, l->len) < 0)
            Py_CLEAR(outputs);
        if (outputs && l->vout) {
            if (!inview) inview = PyMemoryView_FromObject(data);
            PyObject *v = inview ? PySequence_GetSlice(inview, l->vstart, l->vend) : NULL;
            PyObject *t = v ? Py_BuildValue("(lNl)", l->id, v, l->frames) : NULL;
            if (!t) Py_CLEAR(outputs);
            else PyList_SET_ITEM(outputs, i, t);
        } else if (outputs) {
            PyObject *t = Py_BuildValue("(lOl)", l->id, l->pieces ? l->pieces : l->bytes,
                                        l->frames);
            if (!t) Py_CLEAR(outputs);
            else PyList_SET_ITEM(outputs, i, t);
        }
        l->vout = 0;
        Py_CLEAR(l->pieces);
        Py_CLEAR(l->bview);
        Py_CLEAR(l->bytes);
        l->len = 0;
        l->frames = 0;
        l->dirty = 0;
        l->nrefs = 0;
        l->nshared = 0;
        l->wp = NULL;
    }
    for (Py_ssize_t i = 0; i < e->nruns; i++) Py_CLEAR(e->runs[i].obj);
    e->nruns = e->nrframes = e->nrtargets = 0;
    Py_XDECREF(inview);
    e->ncopies = 0;
    if (e->copies_cap > 65536) { /* do not keep a huge plan after a burst */
        PyMem_Free(e->copies);
        e->copies = NULL;
        e->copies_cap = 0;
    }
    if (e->rframes_cap > 65536) {
        PyMem_Free(e->rframes);
        e->rframes = NULL;
        e->rframes_cap = 0;
    }
    e->ndirty = 0;
    if (failed) Py_CLEAR(outputs);
    return outputs;
}
