/* Batched datagram I/O for the router's UDP socket: recvmmsg / sendmmsg, bundled frames.
 *
 * The compiled twin of PyDatagramIO in flowrouter/net/udpio.py (read its docstrings first):
 * same arguments, same results, fewer system calls and no Python loop per datagram or frame.
 *
 *   recv_into(fd, buffer, count, slot) -> (total, [((host, port), length, frames), ...],
 *                                          drops)
 *       up to `count` waiting datagrams (MSG_DONTWAIT), their bytes back to back in
 *       buffer[:total] (a writable buffer of count * slot bytes, reused: no allocation and
 *       no fresh pages per call) (a receive
 *       that GRO coalesced counts once and gives the datagrams it joined, by the segment
 *       size its UDP_GRO cmsg names); `frames`
 *       is how many whole frames the datagram holds (0: not whole frames, or truncated);
 *       `drops` the socket's count of dropped datagrams as of the newest datagram that
 *       reported it (SO_RXQ_OVFL), else 0; nothing waiting: (0, [], 0); an error with
 *       nothing received raises OSError.
 *   send(fd, [(sockaddr, buffers[, bundle]), ...][, gso])
 *           -> (sent, congested, failed, errno, gso_errno)
 *       the frames in each item's buffers (whole frames back to back, a frame possibly
 *       spread over consecutive buffers), packed in order into datagrams of at most
 *       `bundle` bytes and MAX_SEGMENTS pieces (bundle_frames in udpio.py: a frame that
 *       does not fit closes the datagram; 0 or absent: one frame per datagram), sent to
 *       `sockaddr`; ValueError (before anything is sent) if the buffers end inside a frame.
 *       With `gso`, runs of equal datagrams to one address leave in one message with
 *       UDP_SEGMENT (gso_runs in udpio.py); if the kernel refuses that (gso_errno, else 0),
 *       that run and the rest of the call go one datagram per message.
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
#ifndef SOL_UDP
#define SOL_UDP 17
#endif
#ifndef UDP_SEGMENT
#define UDP_SEGMENT 103
#endif
#ifndef UDP_GRO
#define UDP_GRO 104
#endif
#define GSO_SEGMENTS 64     /* datagrams per GSO send (the kernel's UDP_MAX_SEGMENTS) */
#define GSO_BYTES 65507     /* bytes per GSO send (an IPv4 datagram's payload limit) */

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
static PyObject *udpio_recv_batch(int fd, char *slots, Py_ssize_t count, Py_ssize_t slot);

static PyObject *udpio_recv_into(PyObject *self, PyObject *args) {
    int fd;
    Py_buffer into;
    Py_ssize_t count, slot;
    if (!PyArg_ParseTuple(args, "iw*nn", &fd, &into, &count, &slot)) return NULL;
    if (count < 1 || count > MAX_BATCH || slot < 1 || slot > (1 << 20)
            || into.len < count * slot) {
        PyBuffer_Release(&into);
        PyErr_SetString(PyExc_ValueError, "count or slot size out of range");
        return NULL;
    }
    char *slots = into.buf;
    PyObject *res = udpio_recv_batch(fd, slots, count, slot);
    PyBuffer_Release(&into);
    return res;
}

/* recv_into's work: datagram i lands at slots + i * slot and is moved down to follow the
 * ones before it. */
static PyObject *udpio_recv_batch(int fd, char *slots, Py_ssize_t count, Py_ssize_t slot) {
    struct mmsghdr msgs[MAX_BATCH];
    struct iovec iov[MAX_BATCH];
    struct sockaddr_storage from[MAX_BATCH];
    union {
        char buf[CMSG_SPACE(sizeof(uint32_t)) + CMSG_SPACE(sizeof(int))];
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
        if (errno == EAGAIN || errno == EWOULDBLOCK) return Py_BuildValue("(i[]i)", 0, 0);
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    Py_ssize_t total = 0, entries = 0;
    unsigned long drops = 0;
    size_t gro[MAX_BATCH]; /* per message: the segment size GRO coalesced it from, or 0 */
    for (int i = 0; i < got; i++) {
        size_t n = msgs[i].msg_len;
        total += (Py_ssize_t)n;
        struct msghdr *mh = &msgs[i].msg_hdr;
        gro[i] = 0;
        for (struct cmsghdr *c = CMSG_FIRSTHDR(mh); c; c = CMSG_NXTHDR(mh, c)) {
            if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SO_RXQ_OVFL
                    && c->cmsg_len >= CMSG_LEN(sizeof(uint32_t))) {
                uint32_t d;
                memcpy(&d, CMSG_DATA(c), sizeof d);
                if (d > drops) drops = d;
            } else if (c->cmsg_level == SOL_UDP && c->cmsg_type == UDP_GRO
                       && c->cmsg_len >= CMSG_LEN(sizeof(int))) {
                int gs;
                memcpy(&gs, CMSG_DATA(c), sizeof gs);
                if (gs > 0 && !(mh->msg_flags & MSG_TRUNC)) gro[i] = (size_t)gs;
            }
        }
        entries += gro[i] && n > gro[i] ? (Py_ssize_t)((n + gro[i] - 1) / gro[i]) : 1;
    }
    PyObject *grams = PyList_New(entries);
    PyObject *addr = NULL; /* the current datagram's address (owned), reused while it repeats */
    if (!grams) goto fail;
    char *dst = slots;
    Py_ssize_t e = 0;
    for (int i = 0; i < got; i++) {
        size_t n = msgs[i].msg_len;
        if (dst != iov[i].iov_base) memmove(dst, iov[i].iov_base, n);
        socklen_t alen = msgs[i].msg_hdr.msg_namelen;
        if (!addr || alen != msgs[i - 1].msg_hdr.msg_namelen
                || memcmp(&from[i], &from[i - 1], alen) != 0) {
            Py_XDECREF(addr);
            addr = addr_tuple(&from[i], alen);
            if (!addr) goto fail;
        }
        size_t seg = gro[i] && n > gro[i] ? gro[i] : n; /* GRO: the datagrams it joined */
        size_t off = 0;
        do {
            size_t len = n - off < seg ? n - off : seg;
            long frames = (msgs[i].msg_hdr.msg_flags & MSG_TRUNC)
                              ? 0 : frames_in((const unsigned char *)dst + off, len);
            PyObject *item = Py_BuildValue("(Onl)", addr, (Py_ssize_t)len, frames);
            if (!item) goto fail;
            PyList_SET_ITEM(grams, e++, item);
            off += len;
        } while (off < n);
        dst += n;
    }
    Py_XDECREF(addr);
    PyObject *res = Py_BuildValue("(nOk)", total, grams, drops);
    Py_DECREF(grams);
    return res;
fail:
    Py_XDECREF(addr);
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

typedef union {
    char buf[CMSG_SPACE(sizeof(uint16_t))];
    struct cmsghdr align;
} Ctrl;

static int same_dest(const Py_buffer *a, const Py_buffer *b) {
    return a == b || (a->len == b->len && memcmp(a->buf, b->buf, (size_t)a->len) == 0);
}

/* The messages for datagrams from..n-1 (as gso_runs in udpio.py): with gso, a run of
 * datagrams to one address, each as large as the first (the last may be smaller), the
 * first no larger than its item's bundle, at most GSO_SEGMENTS of them, GSO_BYTES in all
 * and MAX_SEGMENTS pieces, leaves in one message with UDP_SEGMENT; msg_first[m] is the
 * first datagram of message m. Returns the number of messages. */
static Py_ssize_t build_msgs(const Plan *p, const Py_buffer *dests, const Py_ssize_t *bundles,
                             const size_t *sizes, Py_ssize_t from, int gso,
                             struct mmsghdr *msgs, Ctrl *ctrl, Py_ssize_t *msg_first) {
    Py_ssize_t n = p->ngrams, nm = 0;
    for (Py_ssize_t g = from; g < n;) {
        Py_ssize_t h = g + 1;
        size_t seg = sizes[g];
        Py_ssize_t bundle = bundles[p->dest[g]];
        if (gso && bundle > 0 && seg <= (size_t)bundle && seg > 0) {
            size_t total = seg;
            Py_ssize_t pieces = (g + 1 < n ? p->first[g + 1] : p->niov) - p->first[g];
            while (h < n && h - g < GSO_SEGMENTS && sizes[h] <= seg && sizes[h] > 0
                   && total + sizes[h] <= GSO_BYTES
                   && same_dest(&dests[p->dest[h]], &dests[p->dest[g]])) {
                Py_ssize_t more = (h + 1 < n ? p->first[h + 1] : p->niov) - p->first[h];
                if (pieces + more > MAX_SEGMENTS) break;
                pieces += more;
                total += sizes[h];
                h++;
                if (sizes[h - 1] < seg) break; /* a shorter datagram ends the run */
            }
        }
        Py_ssize_t end = h < n ? p->first[h] : p->niov;
        struct msghdr *mh = &msgs[nm].msg_hdr;
        memset(&msgs[nm], 0, sizeof msgs[nm]);
        mh->msg_iov = p->iov + p->first[g];
        mh->msg_iovlen = (size_t)(end - p->first[g]);
        mh->msg_name = dests[p->dest[g]].buf;
        mh->msg_namelen = (socklen_t)dests[p->dest[g]].len;
        if (h - g > 1) {
            memset(&ctrl[nm], 0, sizeof ctrl[nm]);
            mh->msg_control = ctrl[nm].buf;
            mh->msg_controllen = sizeof ctrl[nm].buf;
            struct cmsghdr *c = CMSG_FIRSTHDR(mh);
            c->cmsg_level = SOL_UDP;
            c->cmsg_type = UDP_SEGMENT;
            c->cmsg_len = CMSG_LEN(sizeof(uint16_t));
            uint16_t gs = (uint16_t)seg;
            memcpy(CMSG_DATA(c), &gs, sizeof gs);
        }
        msg_first[nm++] = g;
        g = h;
    }
    return nm;
}

static PyObject *udpio_send(PyObject *self, PyObject *args) {
    int fd, gso = 0;
    PyObject *items_in;
    if (!PyArg_ParseTuple(args, "iO|p", &fd, &items_in, &gso)) return NULL;
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
    Ctrl *ctrl = NULL;
    size_t *sizes = NULL;
    Py_ssize_t *bundles = NULL, *msg_first = NULL;
    dests = PyMem_Calloc((size_t)(nitems ? nitems : 1), sizeof *dests);
    seqs = PyMem_Calloc((size_t)(nitems ? nitems : 1), sizeof *seqs);
    bundles = PyMem_Calloc((size_t)(nitems ? nitems : 1), sizeof *bundles);
    if (!dests || !seqs || !bundles) { PyErr_NoMemory(); goto done; }
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
        bundles[i] = bundle;
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
    ctrl = PyMem_Calloc((size_t)(n ? n : 1), sizeof *ctrl);
    sizes = PyMem_Calloc((size_t)(n ? n : 1), sizeof *sizes);
    msg_first = PyMem_Calloc((size_t)(n ? n : 1), sizeof *msg_first);
    if (!msgs || !ctrl || !sizes || !msg_first) { PyErr_NoMemory(); goto done; }
    for (Py_ssize_t g = 0; g < n; g++) {
        Py_ssize_t end = g + 1 < n ? plan.first[g + 1] : plan.niov;
        for (Py_ssize_t k = plan.first[g]; k < end; k++) sizes[g] += plan.iov[k].iov_len;
    }
    long sent = 0, congested = 0, failed = 0;
    int err = 0, gso_err = 0;
    Py_ssize_t nm = build_msgs(&plan, dests, bundles, sizes, 0, gso, msgs, ctrl, msg_first);
    Py_ssize_t m = 0;
    while (m < nm) {
        Py_ssize_t chunk = nm - m < SEND_CHUNK ? nm - m : SEND_CHUNK;
        int rc = sendmmsg(fd, msgs + m, (unsigned int)chunk, MSG_DONTWAIT);
        if (rc < 0) {
            if (errno == EINTR) continue;
            Py_ssize_t segs = (m + 1 < nm ? msg_first[m + 1] : n) - msg_first[m];
            if (segs > 1 && !gso_err && (errno == EIO || errno == EINVAL
                    || errno == EOPNOTSUPP || errno == ENOPROTOOPT)) {
                /* no GSO here after all: the rest, this message's datagrams included,
                 * one by one */
                gso_err = errno;
                nm = build_msgs(&plan, dests, bundles, sizes, msg_first[m], 0, msgs, ctrl,
                                msg_first);
                m = 0;
                continue;
            }
            if (errno == EAGAIN || errno == EWOULDBLOCK) {
                congested += segs;
            } else {
                failed += segs;
                err = errno;
            }
            m++; /* those datagrams are lost; go on with the next */
        } else {
            for (int k = 0; k < rc; k++, m++)
                sent += (m + 1 < nm ? msg_first[m + 1] : n) - msg_first[m];
        }
    }
    res = Py_BuildValue("(lllIi)", sent, congested, failed, (unsigned int)err, gso_err);
done:
    PyMem_Free(msgs);
    PyMem_Free(ctrl);
    PyMem_Free(sizes);
    PyMem_Free(bundles);
    PyMem_Free(msg_first);
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
    {"recv_into", udpio_recv_into, METH_VARARGS,
     "recv_into(fd, buffer, count, slot) -> (total, [((host, port), length, frames)], "
     "drops)."},
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
