/* Batched datagram I/O for the router's UDP socket: recvmmsg / sendmmsg, bundled frames.
 *
 * The compiled twin of PyDatagramIO in flowrouter/net/udpio.py (read its docstrings first):
 * same arguments, same results, fewer system calls and no Python loop per datagram or frame.
 *
 *   recv(fd, count, slot) -> (bytes, [((host, port), length, frames), ...], drops)
 *       up to `count` waiting datagrams (MSG_DONTWAIT), their bytes back to back; `frames`
 *       is how many whole frames the datagram holds (0: not whole frames, or truncated);
 *       `drops` the socket's count of dropped datagrams as of the newest datagram that
 *       reported it (SO_RXQ_OVFL), else 0; nothing waiting: (b"", [], 0); an error with
 *       nothing received raises OSError.
 *   send(fd, [(sockaddr, buffers[, bundle]), ...]) -> (sent, congested, failed, errno)
 *       the frames in each item's buffers (whole frames back to back, a frame possibly
 *       spread over consecutive buffers), packed in order into datagrams of at most
 *       `bundle` bytes and MAX_SEGMENTS pieces (bundle_frames in udpio.py: a frame that
 *       does not fit closes the datagram; 0 or absent: one frame per datagram), sent to
 *       `sockaddr`; ValueError (before anything is sent) if the buffers end inside a frame.
 *   sockaddr(host, port) -> bytes: a numeric IPv4/IPv6 address in the kernel's form
 *       (ValueError for anything else).
 *
 * Linux only (recvmmsg / sendmmsg); elsewhere the build fails and the optional extension is
 * skipped, leaving the Python loops. The GIL is held throughout (the socket is non-blocking).
 */
#define PY_SSIZE_T_CLEAN
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <Python.h>

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdint.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>

#define HEADER 24
#define MAX_BATCH 256
#define SEND_CHUNK 1024 /* messages per sendmmsg (UIO_MAXIOV) */
#define MAX_SEGMENTS 1024 /* buffer pieces per datagram (UIO_MAXIOV) */
#ifndef SO_RXQ_OVFL
#define SO_RXQ_OVFL 40
#endif

static size_t frame_size(const unsigned char *h) {
    return ((size_t)h[16] << 24) | ((size_t)h[17] << 16) | ((size_t)h[18] << 8) | (size_t)h[19];
}

/* How many whole frames a datagram holds back to back; 0 if it is not whole frames. */
static long frames_in(const unsigned char *data, size_t n) {
    size_t pos = 0;
    long count = 0;
    while (pos < n) {
        if (n - pos < HEADER) return 0;
        size_t size = frame_size(data + pos);
        if (size > n - pos - HEADER) return 0;
        pos += HEADER + size;
        count++;
    }
    return count;
}

/* ------------------------------------------------------------------ addresses */
static PyObject *addr_tuple(const struct sockaddr_storage *sa, socklen_t len) {
    char host[INET6_ADDRSTRLEN];
    int port = 0;
    if (sa->ss_family == AF_INET && len >= (socklen_t)sizeof(struct sockaddr_in)) {
        const struct sockaddr_in *in = (const struct sockaddr_in *)sa;
        if (!inet_ntop(AF_INET, &in->sin_addr, host, sizeof host)) host[0] = 0;
        port = ntohs(in->sin_port);
    } else if (sa->ss_family == AF_INET6 && len >= (socklen_t)sizeof(struct sockaddr_in6)) {
        const struct sockaddr_in6 *in6 = (const struct sockaddr_in6 *)sa;
        if (!inet_ntop(AF_INET6, &in6->sin6_addr, host, sizeof host)) host[0] = 0;
        port = ntohs(in6->sin6_port);
    } else {
        strcpy(host, "?");
    }
    return Py_BuildValue("(si)", host, port);
}

static PyObject *udpio_sockaddr(PyObject *self, PyObject *args) {
    const char *host;
    int port;
    if (!PyArg_ParseTuple(args, "si", &host, &port)) return NULL;
    if (port < 0 || port > 65535) {
        PyErr_SetString(PyExc_ValueError, "port out of range");
        return NULL;
    }
    struct sockaddr_in in;
    memset(&in, 0, sizeof in);
    if (inet_pton(AF_INET, host, &in.sin_addr) == 1) {
        in.sin_family = AF_INET;
        in.sin_port = htons((uint16_t)port);
        return PyBytes_FromStringAndSize((const char *)&in, sizeof in);
    }
    struct sockaddr_in6 in6;
    memset(&in6, 0, sizeof in6);
    if (inet_pton(AF_INET6, host, &in6.sin6_addr) == 1) {
        in6.sin6_family = AF_INET6;
        in6.sin6_port = htons((uint16_t)port);
        return PyBytes_FromStringAndSize((const char *)&in6, sizeof in6);
    }
    PyErr_Format(PyExc_ValueError, "not a numeric address: %s", host);
    return NULL;
}

/* ------------------------------------------------------------------ receive */
static char *slots;            /* count * slot bytes, kept between calls */
static size_t slots_size;

static PyObject *udpio_recv(PyObject *self, PyObject *args) {
    int fd;
    Py_ssize_t count, slot;
    if (!PyArg_ParseTuple(args, "inn", &fd, &count, &slot)) return NULL;
    if (count < 1 || count > MAX_BATCH || slot < 1 || slot > (1 << 20)) {
        PyErr_SetString(PyExc_ValueError, "count or slot size out of range");
        return NULL;
    }
    size_t need = (size_t)count * (size_t)slot;
    if (slots_size < need) {
        char *ns = PyMem_Realloc(slots, need);
        if (!ns) return PyErr_NoMemory();
        slots = ns;
        slots_size = need;
    }
    struct mmsghdr msgs[MAX_BATCH];
    struct iovec iov[MAX_BATCH];
    struct sockaddr_storage from[MAX_BATCH];
    union {
        char buf[CMSG_SPACE(sizeof(uint32_t))];
        struct cmsghdr align;
    } ctrl[MAX_BATCH];
    memset(msgs, 0, sizeof(struct mmsghdr) * (size_t)count);
    for (Py_ssize_t i = 0; i < count; i++) {
        iov[i].iov_base = slots + (size_t)i * (size_t)slot;
        iov[i].iov_len = (size_t)slot;
        msgs[i].msg_hdr.msg_iov = &iov[i];
        msgs[i].msg_hdr.msg_iovlen = 1;
        msgs[i].msg_hdr.msg_name = &from[i];
        msgs[i].msg_hdr.msg_namelen = sizeof from[i];
        msgs[i].msg_hdr.msg_control = ctrl[i].buf;
        msgs[i].msg_hdr.msg_controllen = sizeof ctrl[i].buf;
    }
    int got = recvmmsg(fd, msgs, (unsigned int)count, MSG_DONTWAIT, NULL);
    if (got < 0) {
        if (errno == EAGAIN || errno == EWOULDBLOCK) return Py_BuildValue("(y#[]i)", "", 0, 0);
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    Py_ssize_t total = 0;
    unsigned long drops = 0;
    for (int i = 0; i < got; i++) {
        total += (Py_ssize_t)msgs[i].msg_len;
        struct msghdr *mh = &msgs[i].msg_hdr;
        for (struct cmsghdr *c = CMSG_FIRSTHDR(mh); c; c = CMSG_NXTHDR(mh, c)) {
            if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SO_RXQ_OVFL
                    && c->cmsg_len >= CMSG_LEN(sizeof(uint32_t))) {
                uint32_t d;
                memcpy(&d, CMSG_DATA(c), sizeof d);
                if (d > drops) drops = d;
            }
        }
    }
    PyObject *blob = PyBytes_FromStringAndSize(NULL, total);
    PyObject *grams = PyList_New(got);
    PyObject *prev = NULL; /* the previous datagram's address, reused while it repeats */
    if (!blob || !grams) goto fail;
    char *dst = PyBytes_AS_STRING(blob);
    for (int i = 0; i < got; i++) {
        size_t n = msgs[i].msg_len;
        memcpy(dst, iov[i].iov_base, n);
        long frames = (msgs[i].msg_hdr.msg_flags & MSG_TRUNC)
                          ? 0 : frames_in((const unsigned char *)dst, n);
        dst += n;
        socklen_t alen = msgs[i].msg_hdr.msg_namelen;
        PyObject *addr;
        if (prev && alen == msgs[i - 1].msg_hdr.msg_namelen
                && memcmp(&from[i], &from[i - 1], alen) == 0) {
            addr = prev;
            Py_INCREF(addr);
        } else {
            addr = addr_tuple(&from[i], alen);
            if (!addr) goto fail;
        }
        prev = addr;
        PyObject *item = Py_BuildValue("(Onl)", addr, (Py_ssize_t)n, frames);
        Py_DECREF(addr); /* the item holds it; prev stays valid while grams holds the item */
        if (!item) goto fail;
        PyList_SET_ITEM(grams, i, item);
    }
    PyObject *res = Py_BuildValue("(OOk)", blob, grams, drops);
    Py_DECREF(blob);
    Py_DECREF(grams);
    return res;
fail:
    Py_XDECREF(blob);
    Py_XDECREF(grams);
    return NULL;
}

/* ------------------------------------------------------------------ send */
typedef struct {
    struct iovec *iov;
    Py_ssize_t niov, iov_cap;
    Py_ssize_t *first; /* per datagram: its first iovec */
    Py_ssize_t *dest;  /* per datagram: its item */
    Py_ssize_t ngrams, grams_cap;
} Plan;

static int add_seg(Plan *p, char *base, size_t len) {
    if (p->niov == p->iov_cap) {
        Py_ssize_t cap = p->iov_cap ? p->iov_cap * 2 : 256;
        struct iovec *ni = PyMem_Realloc(p->iov, (size_t)cap * sizeof *ni);
        if (!ni) { PyErr_NoMemory(); return -1; }
        p->iov = ni;
        p->iov_cap = cap;
    }
    p->iov[p->niov].iov_base = base;
    p->iov[p->niov].iov_len = len;
    p->niov++;
    return 0;
}

static int add_gram(Plan *p, Py_ssize_t first, Py_ssize_t dest) {
    if (p->ngrams == p->grams_cap) {
        Py_ssize_t cap = p->grams_cap ? p->grams_cap * 2 : 128;
        Py_ssize_t *nf = PyMem_Realloc(p->first, (size_t)cap * sizeof *nf);
        if (!nf) { PyErr_NoMemory(); return -1; }
        p->first = nf;
        Py_ssize_t *nd = PyMem_Realloc(p->dest, (size_t)cap * sizeof *nd);
        if (!nd) { PyErr_NoMemory(); return -1; }
        p->dest = nd;
        p->grams_cap = cap;
    }
    p->first[p->ngrams] = first;
    p->dest[p->ngrams] = dest;
    p->ngrams++;
    return 0;
}

/* The datagram being filled while an item is planned (bundles). */
typedef struct {
    Py_ssize_t first; /* its first iovec, -1: none open */
    size_t bytes;
    Py_ssize_t segs;
} Open;

/* A frame whose pieces are iov[frame_first:] is complete: put it in a datagram (as
 * bundle_frames in udpio.py: a frame that does not fit closes the open datagram). */
static int frame_done(Plan *p, Open *o, Py_ssize_t frame_first, size_t bytes,
                      Py_ssize_t item, Py_ssize_t bundle) {
    if (bundle <= 0) return add_gram(p, frame_first, item);
    Py_ssize_t segs = p->niov - frame_first;
    if (o->first >= 0 && (o->bytes + bytes > (size_t)bundle || o->segs + segs > MAX_SEGMENTS)) {
        if (add_gram(p, o->first, item) < 0) return -1;
        o->first = -1;
    }
    if (o->first < 0) {
        o->first = frame_first;
        o->bytes = 0;
        o->segs = 0;
    }
    o->bytes += bytes;
    o->segs += segs;
    return 0;
}

/* Split one item's buffers (whole frames back to back) into frames (as split_frames) and
 * pack them into datagrams (as bundle_frames). */
static int plan_item(Plan *p, Py_buffer *bufs, Py_ssize_t nbufs, Py_ssize_t item,
                     Py_ssize_t bundle) {
    unsigned char head[HEADER];
    size_t have = 0;     /* header bytes gathered while a header is spread over buffers */
    size_t left = 0;     /* payload bytes of the current frame still to take */
    size_t fbytes = 0;   /* the current frame's size */
    int in_frame = 0;
    Open o = {-1, 0, 0};
    Py_ssize_t first = p->niov;
    for (Py_ssize_t b = 0; b < nbufs; b++) {
        char *data = bufs[b].buf;
        size_t pos = 0, n = (size_t)bufs[b].len;
        while (pos < n) {
            if (!in_frame) {
                if (!have && n - pos >= HEADER) {
                    size_t size = frame_size((const unsigned char *)data + pos);
                    if (size <= n - pos - HEADER) { /* the whole frame is here */
                        if (add_seg(p, data + pos, HEADER + size) < 0) return -1;
                        if (frame_done(p, &o, p->niov - 1, HEADER + size, item, bundle) < 0)
                            return -1;
                        first = p->niov;
                        pos += HEADER + size;
                        continue;
                    }
                }
                size_t take = HEADER - have;
                if (take > n - pos) take = n - pos;
                memcpy(head + have, data + pos, take);
                if (add_seg(p, data + pos, take) < 0) return -1;
                have += take;
                pos += take;
                if (have < HEADER) continue;
                left = frame_size(head);
                fbytes = HEADER + left;
                have = 0;
                in_frame = 1;
            }
            size_t take = left < n - pos ? left : n - pos;
            if (take) {
                if (add_seg(p, data + pos, take) < 0) return -1;
                pos += take;
                left -= take;
            }
            if (!left) {
                if (frame_done(p, &o, first, fbytes, item, bundle) < 0) return -1;
                first = p->niov;
                in_frame = 0;
            }
        }
    }
    if (have || in_frame || first != p->niov) {
        PyErr_SetString(PyExc_ValueError, "the buffers end inside a frame");
        return -1;
    }
    if (o.first >= 0 && add_gram(p, o.first, item) < 0) return -1;
    return 0;
}

static PyObject *udpio_send(PyObject *self, PyObject *args) {
    int fd;
    PyObject *items_in;
    if (!PyArg_ParseTuple(args, "iO", &fd, &items_in)) return NULL;
    PyObject *items = PySequence_Fast(items_in, "items must be a sequence");
    if (!items) return NULL;
    Py_ssize_t nitems = PySequence_Fast_GET_SIZE(items);
    PyObject *res = NULL;
    Plan plan = {0};
    Py_buffer *bufs = NULL, *dests = NULL;
    Py_ssize_t nbufs = 0, bufs_cap = 0, ndests = 0;
    PyObject **seqs = NULL; /* each item's buffers as a fast sequence (owned) */
    Py_ssize_t nseqs = 0;
    struct mmsghdr *msgs = NULL;
    dests = PyMem_Calloc((size_t)(nitems ? nitems : 1), sizeof *dests);
    seqs = PyMem_Calloc((size_t)(nitems ? nitems : 1), sizeof *seqs);
    if (!dests || !seqs) { PyErr_NoMemory(); goto done; }
    for (Py_ssize_t i = 0; i < nitems; i++) {
        PyObject *it = PySequence_Fast_GET_ITEM(items, i);
        if (!PyTuple_Check(it) || PyTuple_GET_SIZE(it) < 2 || PyTuple_GET_SIZE(it) > 3) {
            PyErr_SetString(PyExc_TypeError, "each item is (sockaddr, buffers[, bundle])");
            goto done;
        }
        Py_ssize_t bundle = 0;
        if (PyTuple_GET_SIZE(it) == 3) {
            bundle = PyLong_AsSsize_t(PyTuple_GET_ITEM(it, 2));
            if (bundle == -1 && PyErr_Occurred()) goto done;
        }
        if (PyObject_GetBuffer(PyTuple_GET_ITEM(it, 0), &dests[ndests], PyBUF_SIMPLE) < 0)
            goto done;
        ndests++;
        PyObject *seq = PySequence_Fast(PyTuple_GET_ITEM(it, 1), "buffers must be a sequence");
        if (!seq) goto done;
        seqs[nseqs++] = seq;
        Py_ssize_t nb = PySequence_Fast_GET_SIZE(seq);
        Py_ssize_t start = nbufs;
        for (Py_ssize_t j = 0; j < nb; j++) {
            if (nbufs == bufs_cap) {
                Py_ssize_t cap = bufs_cap ? bufs_cap * 2 : 64;
                Py_buffer *nbf = PyMem_Realloc(bufs, (size_t)cap * sizeof *nbf);
                if (!nbf) { PyErr_NoMemory(); goto done; }
                bufs = nbf;
                bufs_cap = cap;
            }
            if (PyObject_GetBuffer(PySequence_Fast_GET_ITEM(seq, j), &bufs[nbufs],
                                   PyBUF_SIMPLE) < 0)
                goto done;
            nbufs++;
        }
        if (plan_item(&plan, bufs + start, nbufs - start, i, bundle) < 0) goto done;
    }
    Py_ssize_t n = plan.ngrams;
    msgs = PyMem_Calloc((size_t)(n ? n : 1), sizeof *msgs);
    if (!msgs) { PyErr_NoMemory(); goto done; }
    for (Py_ssize_t g = 0; g < n; g++) {
        Py_ssize_t end = g + 1 < n ? plan.first[g + 1] : plan.niov;
        msgs[g].msg_hdr.msg_iov = plan.iov + plan.first[g];
        msgs[g].msg_hdr.msg_iovlen = (size_t)(end - plan.first[g]);
        msgs[g].msg_hdr.msg_name = dests[plan.dest[g]].buf;
        msgs[g].msg_hdr.msg_namelen = (socklen_t)dests[plan.dest[g]].len;
    }
    long sent = 0, congested = 0, failed = 0;
    int err = 0;
    Py_ssize_t g = 0;
    while (g < n) {
        Py_ssize_t chunk = n - g < SEND_CHUNK ? n - g : SEND_CHUNK;
        int rc = sendmmsg(fd, msgs + g, (unsigned int)chunk, MSG_DONTWAIT);
        if (rc < 0) {
            if (errno == EINTR) continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK) {
                congested++;
            } else {
                failed++;
                err = errno;
            }
            g++; /* that datagram is lost; go on with the next */
        } else {
            sent += rc;
            g += rc;
        }
    }
    res = Py_BuildValue("(lllI)", sent, congested, failed, (unsigned int)err);
done:
    PyMem_Free(msgs);
    for (Py_ssize_t i = 0; i < nbufs; i++) PyBuffer_Release(&bufs[i]);
    for (Py_ssize_t i = 0; i < ndests; i++) PyBuffer_Release(&dests[i]);
    for (Py_ssize_t i = 0; i < nseqs; i++) Py_DECREF(seqs[i]);
    PyMem_Free(bufs);
    PyMem_Free(dests);
    PyMem_Free(seqs);
    PyMem_Free(plan.iov);
    PyMem_Free(plan.first);
    PyMem_Free(plan.dest);
    Py_DECREF(items);
    return res;
}

/* ------------------------------------------------------------------ module */
static PyMethodDef methods[] = {
    {"recv", udpio_recv, METH_VARARGS,
     "recv(fd, count, slot) -> (bytes, [((host, port), length, frames)], drops)."},
    {"send", udpio_send, METH_VARARGS,
     "send(fd, [(sockaddr, buffers[, bundle])]) -> (sent, congested, failed, errno)."},
    {"sockaddr", udpio_sockaddr, METH_VARARGS,
     "sockaddr(host, port) -> bytes: a numeric address in the kernel's form."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "flowrouter.net._udpio",
    "Batched datagram I/O (recvmmsg / sendmmsg); see flowrouter/net/udpio.py.", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__udpio(void) {
    PyObject *m = PyModule_Create(&module);
    if (!m) return NULL;
    if (PyModule_AddIntConstant(m, "MAX_BATCH", MAX_BATCH) < 0
            || PyModule_AddIntConstant(m, "MAX_SEGMENTS", MAX_SEGMENTS) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
