/* mrc._native: the batch kernels of mrc/core/fastpath.py, in C.
 *
 * pack_burst() writes the headers of a burst of data packets (fastpath.py_pack_burst is the
 * reference; tests/core/test_pack_burst.py checks both against wire.pack_data).
 *
 * place_train() walks a GRO train (each segment's datagram after `skip` bytes of it: a
 * protected segment unsealed in place), and for every segment that is a plain WRITE ONLY the
 * responder expects (this QP, this rkey, untrimmed, unprotected, full length, in bounds, new,
 * inside the PSN window) copies the payload into the region and reports the segment's sequence
 * number and marks. It stops at the first segment that is anything else: Python's general path
 * takes that one. Semantics, argument by argument, are those of fastpath.py_place_train, the
 * reference this file must match byte for byte (tests/core/test_fastpath.py checks it).
 *
 * note_arrivals() sets the SACK bits of what place_train reported (fastpath.py_note_arrivals
 * is the reference), one dict update per 64-packet block rather than per packet. note_runs()
 * does that for a whole train, run by run, with the cumulative point and the ACK counters
 * (fastpath.py_note_runs).
 *
 * Keyed mode's kernels (sealing, and unsealing in place) are mrc/_native_gcm.c's: they do
 * their own AES-GCM with OpenSSL, which this extension does not link (it builds without).
 *
 * Every length is checked before the read or write it guards; no state outlives a call.
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <limits.h>
#include <errno.h>
#include <sys/socket.h>
#include <netinet/in.h>
#include <arpa/inet.h>
#include <stdint.h>
#include <string.h>

#define HDR_LEN 28 /* BTH (12) + RETH (16) */
#define OP_WRITE 0x0A
#define OP_WRITE_IMM 0x0B
#define IMM_HDR_LEN 32
#define PKEY 0xFFFF
#define QPN_MASK 0xFFFFFFu
#define TVER 0
#define PSN_MASK 0xFFFFFFu
#define HALF (1u << 23)
#define BTH_FECN 0x80
#define BTH_TRIMMED 0x20
#define BTH_ACKREQ 0x80
#define BTH_SECURE 0x40
#define MARK_FECN 1
#define MARK_ACKREQ 2

static uint32_t be32(const unsigned char *p)
{
    return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | p[3];
}

static uint64_t be64(const unsigned char *p)
{
    return ((uint64_t)be32(p) << 32) | be32(p + 4);
}

/* 1 if bit (seq & 63) of blocks[seq >> 6] is set, 0 if not, -1 with an exception set. */
static int block_has(PyObject *blocks, long long seq)
{
    PyObject *key = PyLong_FromLongLong(seq >> 6);
    if (key == NULL)
        return -1;
    PyObject *val = PyDict_GetItemWithError(blocks, key); /* borrowed */
    Py_DECREF(key);
    if (val == NULL)
        return PyErr_Occurred() ? -1 : 0;
    unsigned long long bits = PyLong_AsUnsignedLongLongMask(val);
    if (bits == (unsigned long long)-1 && PyErr_Occurred())
        return -1;
    return (int)((bits >> (seq & 63)) & 1);
}

static int as_u32(PyObject *o, uint32_t *out, const char *what)
{
    unsigned long long v = PyLong_AsUnsignedLongLong(o);
    if (v == (unsigned long long)-1 && PyErr_Occurred())
        return -1;
    if (v > 0xFFFFFFFFull) {
        PyErr_Format(PyExc_OverflowError, "%s does not fit 32 bits", what);
        return -1;
    }
    *out = (uint32_t)v;
    return 0;
}

static PyObject *place_train(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    if (nargs != 14 && nargs != 15) {
        PyErr_Format(PyExc_TypeError, "place_train takes 14 or 15 arguments (%zd given)", nargs);
        return NULL;
    }
    Py_ssize_t off = PyLong_AsSsize_t(args[1]);
    Py_ssize_t seg = PyLong_AsSsize_t(args[2]);
    Py_ssize_t skip = nargs == 15 ? PyLong_AsSsize_t(args[14]) : 0;
    if ((off == -1 || seg == -1 || skip == -1) && PyErr_Occurred())
        return NULL;
    if (seg <= 0 || off < 0 || skip < 0) {
        PyErr_SetString(PyExc_ValueError,
                        "segment size must be positive and the offset and skip not negative");
        return NULL;
    }
    uint32_t qpn, rkey, initial_psn;
    if (as_u32(args[3], &qpn, "qpn") < 0 || as_u32(args[4], &rkey, "rkey") < 0 ||
        as_u32(args[7], &initial_psn, "initial_psn") < 0)
        return NULL;
    unsigned long long region_addr = PyLong_AsUnsignedLongLong(args[6]);
    if (region_addr == (unsigned long long)-1 && PyErr_Occurred())
        return NULL;
    long long cum = PyLong_AsLongLong(args[8]);
    long long hi = PyLong_AsLongLong(args[9]);
    long long window = PyLong_AsLongLong(args[10]);
    if (PyErr_Occurred())
        return NULL;
    if (cum < -1 || window < 0 || cum > LLONG_MAX - window - 1) {
        PyErr_SetString(PyExc_OverflowError, "cum/window out of range for the native kernel");
        return NULL;
    }
    PyObject *blocks = args[11];
    if (!PyDict_Check(blocks)) {
        PyErr_SetString(PyExc_TypeError, "blocks must be a dict");
        return NULL;
    }

    Py_buffer vb, rb, sb, mb;
    if (PyObject_GetBuffer(args[0], &vb, PyBUF_SIMPLE) < 0)
        return NULL;
    if (PyObject_GetBuffer(args[5], &rb, PyBUF_WRITABLE) < 0) {
        PyBuffer_Release(&vb);
        return NULL;
    }
    if (PyObject_GetBuffer(args[12], &sb, PyBUF_WRITABLE | PyBUF_FORMAT) < 0) {
        PyBuffer_Release(&rb);
        PyBuffer_Release(&vb);
        return NULL;
    }
    if (PyObject_GetBuffer(args[13], &mb, PyBUF_WRITABLE) < 0) {
        PyBuffer_Release(&sb);
        PyBuffer_Release(&rb);
        PyBuffer_Release(&vb);
        return NULL;
    }
    PyObject *result = NULL;
    if (sb.itemsize != 8 || sb.format == NULL || strcmp(sb.format, "q") != 0) {
        PyErr_SetString(PyExc_TypeError, "seqs must be an array('q')");
        goto done;
    }

    const unsigned char *data = (const unsigned char *)vb.buf;
    unsigned char *region = (unsigned char *)rb.buf;
    long long *seqs = (long long *)sb.buf;
    unsigned char *marks = (unsigned char *)mb.buf;
    Py_ssize_t n = vb.len;
    Py_ssize_t cap = sb.len / 8 < mb.len ? sb.len / 8 : mb.len;
    uint64_t region_len = (uint64_t)rb.len;
    uint32_t near_psn = (uint32_t)(((uint64_t)initial_psn + (uint64_t)(cum + 1)) & PSN_MASK);
    Py_ssize_t placed = 0;
    long long nbytes = 0;
    Py_ssize_t o = off;

    while (o < n && placed < cap) {
        Py_ssize_t size = n - o < seg ? n - o : seg;
        if (size - skip < HDR_LEN)
            break;
        const unsigned char *h = data + o + skip;
        uint32_t qpw = be32(h + 4), psnw = be32(h + 8);
        uint64_t va = be64(h + 12);
        uint32_t key = be32(h + 20), length = be32(h + 24);
        if (h[0] != OP_WRITE || (h[1] & 0x0F) != TVER || (qpw & 0xFFFFFFu) != qpn ||
            (h[4] & BTH_TRIMMED) || (h[8] & BTH_SECURE) || key != rkey ||
            (uint64_t)length != (uint64_t)(size - skip - HDR_LEN))
            break;
        if (va < region_addr)
            break;
        uint64_t offset = va - region_addr;
        if (offset > region_len || (uint64_t)length > region_len - offset)
            break;
        uint32_t psn = psnw & PSN_MASK;
        long long delta = (long long)((psn - near_psn + HALF) & PSN_MASK) - (long long)HALF;
        long long seq = cum + 1 + delta;
        if (seq <= cum || seq > cum + window)
            break;
        if (seq <= hi) {
            int has = block_has(blocks, seq);
            if (has < 0)
                goto done;
            if (has)
                break;
            Py_ssize_t i;
            for (i = 0; i < placed && seqs[i] != seq; i++)
                ;
            if (i < placed)
                break;
        } else {
            hi = seq;
        }
        memmove(region + offset, h + HDR_LEN, length);
        seqs[placed] = seq;
        marks[placed] = (unsigned char)(((h[4] & BTH_FECN) ? MARK_FECN : 0) |
                                        ((h[8] & BTH_ACKREQ) ? MARK_ACKREQ : 0));
        placed++;
        nbytes += length;
        o += size;
    }
    result = Py_BuildValue("(nnL)", o < n ? o : n, placed, nbytes);
done:
    PyBuffer_Release(&mb);
    PyBuffer_Release(&sb);
    PyBuffer_Release(&rb);
    PyBuffer_Release(&vb);
    return result;
}

/* blocks[b] |= bits, and b added to dirty; 0, or -1 with an exception set. A block's map must
 * be an int of 64 bits at most (the responder never stores anything else). */
static int set_bits(PyObject *blocks, PyObject *dirty, long long b, unsigned long long bits)
{
    int rc = -1;
    PyObject *val = NULL;
    PyObject *key = PyLong_FromLongLong(b);
    if (key == NULL)
        return -1;
    PyObject *old = PyDict_GetItemWithError(blocks, key); /* borrowed */
    if (old == NULL && PyErr_Occurred())
        goto done;
    if (old != NULL) {
        unsigned long long have = PyLong_AsUnsignedLongLong(old);
        if (have == (unsigned long long)-1 && PyErr_Occurred())
            goto done;
        bits |= have;
    }
    val = PyLong_FromUnsignedLongLong(bits);
    if (val == NULL || PyDict_SetItem(blocks, key, val) < 0 || PySet_Add(dirty, key) < 0)
        goto done;
    rc = 0;
done:
    Py_XDECREF(val);
    Py_DECREF(key);
    return rc;
}

/* The arrivals' PSNs (an array('q')) and marks (bytes) as buffers, for note_arrivals and
   note_runs alike: 0, or -1 with an exception set and nothing held. */
static int arrival_buffers(PyObject *seqs, PyObject *marks, Py_buffer *sb, Py_buffer *mb)
{
    if (PyObject_GetBuffer(seqs, sb, PyBUF_FORMAT) < 0)
        return -1;
    if (sb->itemsize != 8 || sb->format == NULL || strcmp(sb->format, "q") != 0) {
        PyErr_SetString(PyExc_TypeError, "seqs must be an array('q')");
        PyBuffer_Release(sb);
        return -1;
    }
    if (PyObject_GetBuffer(marks, mb, PyBUF_SIMPLE) < 0) {
        PyBuffer_Release(sb);
        return -1;
    }
    return 0;
}

/* The SACK bits of seqs[j..stop) into blocks (one dict update per block), stopping after the
   first packet marked ACKREQ (*force then 1), the highest PSN into *hi: a run's arrivals, for
   note_arrivals and note_runs alike. Returns the index after the last packet taken, or -1
   with an exception set. */
static long long mark_run(PyObject *blocks, PyObject *dirty, const long long *seqs,
                          const unsigned char *marks, long long j, long long stop,
                          long long *hi, int *force)
{
    long long block = 0;
    unsigned long long bits = 0; /* of `block`, not yet in blocks */
    *force = 0;
    while (j < stop) {
        long long seq = seqs[j];
        long long b = seq >> 6; /* arithmetic shift: floor, as Python's >> */
        if (bits && b != block) {
            if (set_bits(blocks, dirty, block, bits) < 0)
                return -1;
            bits = 0;
        }
        block = b;
        bits |= 1ull << (seq & 63);
        if (seq > *hi)
            *hi = seq;
        if (marks[j++] & MARK_ACKREQ) {
            *force = 1;
            break;
        }
    }
    if (bits && set_bits(blocks, dirty, block, bits) < 0)
        return -1;
    return j;
}

static PyObject *note_arrivals(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    if (nargs != 7) {
        PyErr_Format(PyExc_TypeError, "note_arrivals takes 7 arguments (%zd given)", nargs);
        return NULL;
    }
    Py_ssize_t start = PyLong_AsSsize_t(args[2]);
    Py_ssize_t stop = PyLong_AsSsize_t(args[3]);
    long long hi = PyLong_AsLongLong(args[6]);
    if (PyErr_Occurred())
        return NULL;
    if (start < 0) {
        PyErr_SetString(PyExc_ValueError, "start must not be negative");
        return NULL;
    }
    PyObject *blocks = args[4], *dirty = args[5];
    if (!PyDict_Check(blocks) || !PySet_Check(dirty)) {
        PyErr_SetString(PyExc_TypeError, "blocks must be a dict and dirty a set");
        return NULL;
    }
    Py_buffer sb, mb;
    if (arrival_buffers(args[0], args[1], &sb, &mb) < 0)
        return NULL;
    PyObject *result = NULL;
    const long long *seqs = (const long long *)sb.buf;
    const unsigned char *marks = (const unsigned char *)mb.buf;
    Py_ssize_t cap = sb.len / 8 < mb.len ? sb.len / 8 : mb.len;
    if (stop > cap)
        stop = cap;
    int force;
    long long j = mark_run(blocks, dirty, seqs, marks, start, stop, &hi, &force);
    if (j < 0)
        goto done;
    result = Py_BuildValue("(nLO)", (Py_ssize_t)j, hi, force ? Py_True : Py_False);
done:
    PyBuffer_Release(&mb);
    PyBuffer_Release(&sb);
    return result;
}

static int arg_ll(PyObject *o, long long *out);

/* note_runs() flags (fastpath.RUN_*) and the bound of its counters */
#define RUN_DUE 1
#define RUN_FLUSH 2
#define RUN_CE 4
#define RUN_LIMIT (1ll << 62)

/* Move *cum over every contiguous arrival in blocks, dropping each block it passes whole
 * (Responder._advance, less its WRITE_IMMs): 0, or -1 with an exception set. */
static int advance_cum(PyObject *blocks, long long *cum)
{
    long long c = *cum;
    for (;;) {
        long long nxt = c + 1;
        PyObject *key = PyLong_FromLongLong(nxt >> 6);
        if (key == NULL)
            return -1;
        PyObject *val = PyDict_GetItemWithError(blocks, key); /* borrowed */
        if (val == NULL) {
            Py_DECREF(key);
            if (PyErr_Occurred())
                return -1;
            break;
        }
        unsigned long long bits = PyLong_AsUnsignedLongLong(val);
        if (bits == (unsigned long long)-1 && PyErr_Occurred()) {
            Py_DECREF(key);
            return -1;
        }
        unsigned long long bm = bits >> (nxt & 63);
        if (!(bm & 1)) {
            Py_DECREF(key);
            break;
        }
        c += ~bm ? __builtin_ctzll(~bm) : 64; /* its trailing ones */
        if ((c & 63) == 63 && PyDict_DelItem(blocks, key) < 0) {
            Py_DECREF(key);
            return -1;
        }
        Py_DECREF(key);
    }
    *cum = c;
    return 0;
}

/* an int argument of note_runs as a long long; one beyond 64 bits is out of range
 * (ValueError, as the twin's range checks say), not an OverflowError */
static int run_arg(PyObject *o, long long *out)
{
    if (arg_ll(o, out) == 0)
        return 0;
    if (PyErr_ExceptionMatches(PyExc_OverflowError)) {
        PyErr_Clear();
        PyErr_SetString(PyExc_ValueError, "a counter is out of range");
    }
    return -1;
}

static PyObject *note_runs(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    if (nargs != 13) {
        PyErr_Format(PyExc_TypeError, "note_runs takes 13 arguments (%zd given)", nargs);
        return NULL;
    }
    PyObject *blocks = args[4], *dirty = args[5];
    if (!PyDict_Check(blocks) || !PySet_Check(dirty)) {
        PyErr_SetString(PyExc_TypeError, "blocks must be a dict and dirty a set");
        return NULL;
    }
    long long start, count, hi, cum, pending, next_due, ack_every, ack_batch_max;
    if (run_arg(args[2], &start) < 0 || run_arg(args[3], &count) < 0 || run_arg(args[6], &hi) < 0 ||
        run_arg(args[7], &cum) < 0 || run_arg(args[8], &pending) < 0 ||
        run_arg(args[9], &next_due) < 0 || run_arg(args[11], &ack_every) < 0 ||
        run_arg(args[12], &ack_batch_max) < 0)
        return NULL;
    int ack_due = PyObject_IsTrue(args[10]);
    if (ack_due < 0)
        return NULL;
    Py_buffer sb, mb;
    if (arrival_buffers(args[0], args[1], &sb, &mb) < 0)
        return NULL;
    PyObject *result = NULL;
    Py_ssize_t cap = sb.len / 8 < mb.len ? sb.len / 8 : mb.len;
    if (!(0 <= start && start <= count && count <= cap)) {
        PyErr_SetString(PyExc_ValueError, "start and count must lie within the arrivals");
        goto done;
    }
    if (!(-RUN_LIMIT < hi && hi < RUN_LIMIT && -RUN_LIMIT < cum && cum < RUN_LIMIT &&
          0 <= pending && pending < RUN_LIMIT && 0 <= next_due && next_due < RUN_LIMIT &&
          0 < ack_every && ack_every < RUN_LIMIT && 0 < ack_batch_max &&
          ack_batch_max < RUN_LIMIT)) {
        PyErr_SetString(PyExc_ValueError, "a counter is out of range");
        goto done;
    }
    const long long *seqs = (const long long *)sb.buf;
    const unsigned char *marks = (const unsigned char *)mb.buf;
    int flags = 0;
    long long i = start;
    while (i < count) {
        long long owed = next_due;
        if (ack_due && ack_batch_max < owed)
            owed = ack_batch_max;
        long long step = owed - pending > 1 ? owed - pending : 1;
        long long stop = count - i < step ? count : i + step;
        /* the run's SACK bits, as note_arrivals sets them (mark_run) */
        int force;
        long long j = mark_run(blocks, dirty, seqs, marks, i, stop, &hi, &force);
        if (j < 0)
            goto done;
        if (advance_cum(blocks, &cum) < 0)
            goto done;
        flags = (flags & RUN_DUE) | ((marks[j - 1] & MARK_FECN) ? RUN_CE : 0);
        pending += j - i;
        i = j;
        if (force || pending >= next_due) {
            next_due = pending + ack_every;
            if ((flags & RUN_CE) || pending >= ack_batch_max) {
                flags |= RUN_FLUSH;
                break;
            }
            ack_due = 1;
            flags |= RUN_DUE;
        } else if (ack_due && pending >= ack_batch_max) {
            flags |= RUN_FLUSH;
            break;
        }
    }
    result = Py_BuildValue("(LLLLLi)", i, hi, cum, pending, next_due, flags);
done:
    PyBuffer_Release(&mb);
    PyBuffer_Release(&sb);
    return result;
}

static void put32(unsigned char *p, uint32_t v)
{
    p[0] = (unsigned char)(v >> 24);
    p[1] = (unsigned char)(v >> 16);
    p[2] = (unsigned char)(v >> 8);
    p[3] = (unsigned char)v;
}

static void put_hdr(unsigned char *h, unsigned char op, uint32_t qpn, uint32_t psnw, uint64_t va,
                    uint32_t rkey, uint32_t length)
{
    h[0] = op;
    h[1] = TVER;
    h[2] = (unsigned char)(PKEY >> 8);
    h[3] = (unsigned char)PKEY;
    put32(h + 4, qpn);
    put32(h + 8, psnw);
    put32(h + 12, (uint32_t)(va >> 32));
    put32(h + 16, (uint32_t)va);
    put32(h + 20, rkey);
    put32(h + 24, length);
}

/* A Python int in [lo, hi] as a long long, or -1 with ValueError set (any int, however big,
 * is answered with ValueError, as py_pack_burst does). */
static int in_range(PyObject *o, long long lo, long long hi, long long *out)
{
    int overflow = 0;
    long long v = PyLong_AsLongLongAndOverflow(o, &overflow);
    if (v == -1 && PyErr_Occurred())
        return -1;
    if (overflow || v < lo || v > hi) {
        PyErr_SetString(PyExc_ValueError, "a header field is out of range");
        return -1;
    }
    *out = v;
    return 0;
}

static PyObject *pack_burst(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    if (nargs != 11) {
        PyErr_Format(PyExc_TypeError, "pack_burst takes 11 arguments (%zd given)", nargs);
        return NULL;
    }
    long long off, qpn, psn, rkey, size, count, last_size, imm;
    const long long u32 = 0xFFFFFFFFll;
    if (in_range(args[7], LLONG_MIN, LLONG_MAX, &count) < 0)
        return NULL;
    if (count < 1) {
        PyErr_SetString(PyExc_ValueError, "a burst has at least one packet");
        return NULL;
    }
    if (in_range(args[2], 0, QPN_MASK, &qpn) < 0 || in_range(args[3], 0, PSN_MASK, &psn) < 0 ||
        in_range(args[5], 0, u32, &rkey) < 0 || in_range(args[6], 0, u32, &size) < 0 ||
        in_range(args[8], 0, u32, &last_size) < 0 || in_range(args[10], -1, u32, &imm) < 0)
        return NULL;
    unsigned long long va = PyLong_AsUnsignedLongLong(args[4]);
    if (va == (unsigned long long)-1 && PyErr_Occurred()) {
        if (!PyErr_ExceptionMatches(PyExc_OverflowError))
            return NULL;
        PyErr_Clear();
        PyErr_SetString(PyExc_ValueError, "a header field is out of range");
        return NULL;
    }
    /* the last packet's va, va + (count - 1) * size, must fit 64 bits (as struct's Q) */
    if (size > 0 && (unsigned long long)(count - 1) > (UINT64_MAX - va) / (unsigned long long)size) {
        PyErr_SetString(PyExc_ValueError, "a header field is out of range");
        return NULL;
    }
    if (in_range(args[1], LLONG_MIN, LLONG_MAX, &off) < 0)
        return NULL;
    int last = PyObject_IsTrue(args[9]);
    if (last < 0)
        return NULL;
    Py_buffer bb;
    if (PyObject_GetBuffer(args[0], &bb, PyBUF_WRITABLE) < 0)
        return NULL;
    long long final_len = imm < 0 ? HDR_LEN : IMM_HDR_LEN;
    /* off + (count - 1) * HDR_LEN + final_len <= len, without overflowing */
    if (off < 0 || off > (long long)bb.len || (long long)bb.len - off < final_len ||
        count - 1 > ((long long)bb.len - off - final_len) / HDR_LEN) {
        PyBuffer_Release(&bb);
        PyErr_SetString(PyExc_ValueError, "the headers do not fit the buffer");
        return NULL;
    }
    unsigned char *h = (unsigned char *)bb.buf + off;
    uint32_t p = (uint32_t)psn;
    for (long long i = 0; i < count - 1; i++) {
        put_hdr(h, OP_WRITE, (uint32_t)qpn, p, va, (uint32_t)rkey, (uint32_t)size);
        p = (p + 1) & PSN_MASK;
        va += (unsigned long long)size;
        h += HDR_LEN;
    }
    uint32_t psnw = p | (last ? ((uint32_t)BTH_ACKREQ << 24) : 0);
    if (imm < 0) {
        put_hdr(h, OP_WRITE, (uint32_t)qpn, psnw, va, (uint32_t)rkey, (uint32_t)last_size);
    } else {
        put_hdr(h, OP_WRITE_IMM, (uint32_t)qpn, psnw, va, (uint32_t)rkey, (uint32_t)last_size);
        put32(h + HDR_LEN, (uint32_t)imm);
    }
    long long end = off + (count - 1) * HDR_LEN + final_len;
    PyBuffer_Release(&bb);
    return PyLong_FromLongLong(end);
}

/* ---- the sender's records: Packet, record_burst, take_acked ----------------------------
 *
 * A packet in flight has a record (mrc.core.fastpath.PyPacket is the reference: the same
 * attributes, the same constructor). Packet is that record as a C struct: made in one
 * allocation, read by take_acked without attribute lookups. It takes no part in the cyclic
 * GC: a record refers to its work request (which refers to no record) and, for a tail loss
 * probe, to a list of (EV, send time) tuples, so it can close no cycle. */

typedef struct {
    PyObject_HEAD
    PyObject *wr;
    PyObject *probed;
    Py_ssize_t offset;
    Py_ssize_t length;
    double sent_at;
    double deadline;
    int ev;
    int timeouts;
    int nacks;
    char last;
    char nacked;
    char retransmitted;
    char ambiguous;
    char silenced;
} PacketObject;

static PyTypeObject PacketType;

static PyMemberDef packet_members[] = {
    {"wr", T_OBJECT_EX, offsetof(PacketObject, wr), 0, "the work request it belongs to"},
    {"offset", T_PYSSIZET, offsetof(PacketObject, offset), 0, "its first byte in the request"},
    {"length", T_PYSSIZET, offsetof(PacketObject, length), 0, "its payload bytes"},
    {"last", T_BOOL, offsetof(PacketObject, last), 0, "the request's last packet"},
    {"ev", T_INT, offsetof(PacketObject, ev), 0, "the EV index of its latest transmission"},
    {"sent_at", T_DOUBLE, offsetof(PacketObject, sent_at), 0, "when that one left"},
    {"deadline", T_DOUBLE, offsetof(PacketObject, deadline), 0, "its retransmission deadline"},
    {"timeouts", T_INT, offsetof(PacketObject, timeouts), 0, NULL},
    {"nacks", T_INT, offsetof(PacketObject, nacks), 0, NULL},
    {"nacked", T_BOOL, offsetof(PacketObject, nacked), 0, NULL},
    {"retransmitted", T_BOOL, offsetof(PacketObject, retransmitted), 0, NULL},
    {"ambiguous", T_BOOL, offsetof(PacketObject, ambiguous), 0, NULL},
    {"probed", T_OBJECT, offsetof(PacketObject, probed), 0, NULL},
    {"silenced", T_BOOL, offsetof(PacketObject, silenced), 0, NULL},
    {NULL, 0, 0, 0, NULL},
};

static PacketObject *packet_make(PyObject *wr, Py_ssize_t offset, Py_ssize_t length, int last,
                                 int ev, double sent_at, double deadline)
{
    PacketObject *p = PyObject_New(PacketObject, &PacketType);
    if (p == NULL)
        return NULL;
    Py_INCREF(wr);
    p->wr = wr;
    p->probed = NULL;
    p->offset = offset;
    p->length = length;
    p->sent_at = sent_at;
    p->deadline = deadline;
    p->ev = ev;
    p->timeouts = 0;
    p->nacks = 0;
    p->last = (char)(last != 0);
    p->nacked = p->retransmitted = p->ambiguous = p->silenced = 0;
    return p;
}

static PyObject *packet_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    (void)type;
    static char *names[] = {"wr", "offset", "length", "last", "ev", "sent_at", "deadline", NULL};
    PyObject *wr;
    Py_ssize_t offset, length;
    int last, ev;
    double sent_at, deadline;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "Onnpidd:Packet", names, &wr, &offset, &length,
                                     &last, &ev, &sent_at, &deadline))
        return NULL;
    return (PyObject *)packet_make(wr, offset, length, last, ev, sent_at, deadline);
}

static void packet_dealloc(PacketObject *p)
{
    Py_XDECREF(p->wr);
    Py_XDECREF(p->probed);
    PyObject_Free(p);
}

static PyTypeObject PacketType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "mrc._native.Packet",
    .tp_basicsize = sizeof(PacketObject),
    .tp_dealloc = (destructor)packet_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A packet in flight: the record mrc.core.fastpath.PyPacket is in Python.",
    .tp_members = packet_members,
    .tp_new = packet_new,
};

/* a Python int argument as a long long (TypeError/OverflowError as PyLong_AsLongLong) */
static int arg_ll(PyObject *o, long long *out)
{
    long long v = PyLong_AsLongLong(o);
    if (v == -1 && PyErr_Occurred())
        return -1;
    *out = v;
    return 0;
}

/* Whether `view` is a memoryview of plain bytes (1-D, item size 1, contiguous): one that
 * append_slice may cut by hand. */
static int plain_bytes(PyObject *view)
{
    if (!PyMemoryView_Check(view))
        return 0;
    Py_buffer *b = PyMemoryView_GET_BUFFER(view);
    return b->ndim == 1 && b->itemsize == 1 && b->shape != NULL &&
           (b->strides == NULL || b->strides[0] == 1) && b->suboffsets == NULL;
}

/* bufs.append(view[start:stop]), 0 <= start <= stop <= len(view). A plain-bytes memoryview
 * is cut as memoryview slicing cuts one (a new view of the same managed buffer, its private
 * Py_buffer moved to the slice), without the slice object and index ints; anything else is
 * sliced by the sequence protocol. */
static int append_slice(PyObject *bufs, PyObject *view, Py_ssize_t start, Py_ssize_t stop,
                        int plain)
{
    PyObject *part;
    if (plain && 0 <= start && start <= stop && stop <= PyMemoryView_GET_BUFFER(view)->len) {
        part = PyMemoryView_FromObject(view);
        if (part == NULL)
            return -1;
        Py_buffer *b = PyMemoryView_GET_BUFFER(part);
        b->buf = (char *)b->buf + start;
        b->len = stop - start;
        b->shape[0] = stop - start;
    } else {
        part = PySequence_GetSlice(view, start, stop);
    }
    if (part == NULL)
        return -1;
    int rc = PyList_Append(bufs, part);
    Py_DECREF(part);
    return rc;
}

static PyObject *record_burst(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    if (nargs != 18) {
        PyErr_Format(PyExc_TypeError, "record_burst takes 18 arguments (%zd given)", nargs);
        return NULL;
    }
    PyObject *outstanding = args[0], *ring = args[1], *wr = args[2], *hview = args[3];
    PyObject *view = args[4], *bufs = args[17];
    long long seq, n, ev, ev_value, h, off, payload, last_len, final_hdr;
    if (arg_ll(args[5], &seq) < 0 || arg_ll(args[6], &n) < 0 || arg_ll(args[7], &ev) < 0 ||
        arg_ll(args[8], &ev_value) < 0 || arg_ll(args[9], &h) < 0 || arg_ll(args[10], &off) < 0 ||
        arg_ll(args[11], &payload) < 0 || arg_ll(args[12], &last_len) < 0 ||
        arg_ll(args[14], &final_hdr) < 0)
        return NULL;
    int last = PyObject_IsTrue(args[13]);
    if (last < 0)
        return NULL;
    double now = PyFloat_AsDouble(args[15]);
    if (now == -1.0 && PyErr_Occurred())
        return NULL;
    double deadline = PyFloat_AsDouble(args[16]);
    if (deadline == -1.0 && PyErr_Occurred())
        return NULL;
    if (!PyDict_CheckExact(outstanding) || (bufs != Py_None && !PyList_CheckExact(bufs))) {
        PyErr_SetString(PyExc_TypeError, "record_burst wants a dict and a list or None");
        return NULL;
    }
    /* the ring is an array('q'): its entries are set in place, no int object made per
     * packet. Its buffer is held to the end (a collection run by an allocation below could
     * run code that resizes an array whose buffer nobody holds) */
    Py_buffer rb;
    if (PyObject_GetBuffer(ring, &rb, PyBUF_WRITABLE | PyBUF_FORMAT) < 0)
        return NULL;
    PyObject *result = NULL;
    Py_ssize_t size = rb.len / 8;
    if (rb.itemsize != 8 || rb.format == NULL || strcmp(rb.format, "q") != 0) {
        PyErr_SetString(PyExc_TypeError, "the ring must be an array('q')");
        goto done;
    }
    if (size < 1 || (size & (size - 1)) != 0) {
        PyErr_SetString(PyExc_ValueError, "the ring's length must be a power of two");
        goto done;
    }
    if (n < 1 || seq < 0 || seq > (LLONG_MAX >> 33) || n > (LLONG_MAX >> 33) - seq ||
        ev < 0 || ev > INT_MAX || ev_value < 0 || ev_value > 0xFFFFFFFFll || h < 0 ||
        off < 0 || payload < 0 || last_len < 0 || final_hdr < 0) {
        PyErr_SetString(PyExc_ValueError, "a burst's field is out of range");
        goto done;
    }
    long long *slots = (long long *)rb.buf;
    Py_ssize_t mask = size - 1;
    int plain_h = plain_bytes(hview), plain_v = plain_bytes(view);
    long long o = off;
    for (long long s = seq; s < seq + n; s++) {
        int final = s == seq + n - 1;
        long long len = final ? last_len : payload;
        long long hl = final ? final_hdr : HDR_LEN;
        PacketObject *p = packet_make(wr, (Py_ssize_t)o, (Py_ssize_t)len, final && last, (int)ev,
                                      now, deadline);
        if (p == NULL)
            goto done;
        PyObject *key = PyLong_FromLongLong(s);
        if (key == NULL) {
            Py_DECREF(p);
            goto done;
        }
        int rc = PyDict_SetItem(outstanding, key, (PyObject *)p);
        Py_DECREF(key);
        Py_DECREF(p);
        slots[s & mask] = (long long)(((unsigned long long)s << 32) | (unsigned long long)ev_value);
        if (rc < 0 ||
            (bufs != Py_None &&
             (append_slice(bufs, hview, (Py_ssize_t)h, (Py_ssize_t)(h + hl), plain_h) < 0 ||
              append_slice(bufs, view, (Py_ssize_t)o, (Py_ssize_t)(o + len), plain_v) < 0)))
            goto done;
        h += hl;
        o += len;
    }
    result = Py_NewRef(Py_None);
done:
    PyBuffer_Release(&rb);
    return result;
}

/* gather_burst(dst, pos, hview, h, view, off, n, payload, last_len, final_hdr) -> end: the
 * burst's datagrams back to back in dst from pos, each its header (HDR_LEN bytes of hview from
 * h, consecutive; the last final_hdr bytes) then its payload (payload bytes of view from off,
 * consecutive; the last last_len bytes); returns where they end. One buffer for a GSO send
 * instead of two views a datagram (mrc/core/fastpath.py: py_gather_burst). */
static PyObject *gather_burst(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    if (nargs != 10) {
        PyErr_Format(PyExc_TypeError, "gather_burst takes 10 arguments (%zd given)", nargs);
        return NULL;
    }
    long long pos, h, off, n, payload, last_len, final_hdr;
    if (arg_ll(args[1], &pos) < 0 || arg_ll(args[3], &h) < 0 || arg_ll(args[5], &off) < 0 ||
        arg_ll(args[6], &n) < 0 || arg_ll(args[7], &payload) < 0 ||
        arg_ll(args[8], &last_len) < 0 || arg_ll(args[9], &final_hdr) < 0)
        return NULL;
    if (n < 1 || n > 1024 || pos < 0 || h < 0 || off < 0 || payload < 0 || payload > (1 << 20) ||
        last_len < 0 || last_len > payload || final_hdr < HDR_LEN || final_hdr > 64) {
        PyErr_SetString(PyExc_ValueError, "a burst's field is out of range");
        return NULL;
    }
    Py_buffer db, hb, vb;
    if (PyObject_GetBuffer(args[0], &db, PyBUF_WRITABLE) < 0)
        return NULL;
    if (PyObject_GetBuffer(args[2], &hb, PyBUF_SIMPLE) < 0) {
        PyBuffer_Release(&db);
        return NULL;
    }
    if (PyObject_GetBuffer(args[4], &vb, PyBUF_SIMPLE) < 0) {
        PyBuffer_Release(&hb);
        PyBuffer_Release(&db);
        return NULL;
    }
    PyObject *result = NULL;
    long long total = (n - 1) * (HDR_LEN + payload) + final_hdr + last_len;
    if (pos > db.len || total > db.len - pos || h > hb.len ||
        (n - 1) * HDR_LEN + final_hdr > hb.len - h || off > vb.len ||
        (n - 1) * payload + last_len > vb.len - off) {
        PyErr_SetString(PyExc_ValueError, "a burst does not fit its buffers");
        goto done;
    }
    unsigned char *d = (unsigned char *)db.buf + pos;
    const unsigned char *hp = (const unsigned char *)hb.buf + h;
    const unsigned char *vp = (const unsigned char *)vb.buf + off;
    for (long long i = 0; i < n - 1; i++) {
        memcpy(d, hp, HDR_LEN);
        memcpy(d + HDR_LEN, vp, (size_t)payload);
        d += HDR_LEN + payload;
        hp += HDR_LEN;
        vp += payload;
    }
    memcpy(d, hp, (size_t)final_hdr);
    memcpy(d + final_hdr, vp, (size_t)last_len);
    result = PyLong_FromLongLong(pos + total);
done:
    PyBuffer_Release(&vb);
    PyBuffer_Release(&hb);
    PyBuffer_Release(&db);
    return result;
}

/* obj.name as a double */
static int attr_double(PyObject *obj, const char *name, double *out)
{
    PyObject *o = PyObject_GetAttrString(obj, name);
    if (o == NULL)
        return -1;
    *out = PyFloat_AsDouble(o);
    Py_DECREF(o);
    return (*out == -1.0 && PyErr_Occurred()) ? -1 : 0;
}

/* a record's ev, sent_at and deadline: from the struct, or (a PyPacket) by attribute */
static int packet_fields(PyObject *pkt, long long *ev, double *sent_at, double *deadline)
{
    if (Py_IS_TYPE(pkt, &PacketType)) {
        PacketObject *p = (PacketObject *)pkt;
        *ev = p->ev;
        *sent_at = p->sent_at;
        *deadline = p->deadline;
        return 0;
    }
    PyObject *o = PyObject_GetAttrString(pkt, "ev");
    if (o == NULL)
        return -1;
    *ev = PyLong_AsLongLong(o);
    Py_DECREF(o);
    if (*ev == -1 && PyErr_Occurred())
        return -1;
    return attr_double(pkt, "sent_at", sent_at) < 0 || attr_double(pkt, "deadline", deadline) < 0
               ? -1
               : 0;
}

/* list[i] as a double / an index, with the bounds and types checked */
static int list_double(PyObject *list, long long i, double *out)
{
    if (i < 0 || i >= PyList_GET_SIZE(list)) {
        PyErr_SetString(PyExc_IndexError, "take_acked: an index is out of range");
        return -1;
    }
    *out = PyFloat_AsDouble(PyList_GET_ITEM(list, i));
    return (*out == -1.0 && PyErr_Occurred()) ? -1 : 0;
}

static int list_index(PyObject *list, long long i, long long *out)
{
    if (i < 0 || i >= PyList_GET_SIZE(list)) {
        PyErr_SetString(PyExc_IndexError, "take_acked: an index is out of range");
        return -1;
    }
    *out = PyLong_AsLongLong(PyList_GET_ITEM(list, i));
    return (*out == -1 && PyErr_Occurred()) ? -1 : 0;
}

static int list_put_double(PyObject *list, long long i, double v)
{
    PyObject *f = PyFloat_FromDouble(v);
    if (f == NULL)
        return -1;
    return PyList_SetItem(list, (Py_ssize_t)i, f);
}

/* The latest send times an ACK's records note, per plane (`delivered`) and per route
 * (`route_alive`), held in C for the length of one take_acked / take_ack call and written
 * back at its end (or before it raises): one float object per index raised, not one per
 * record. An index is held once read as an exact float (anything else is read and written
 * through, as the Python twin does, until it holds a float); nothing is held while `judge`
 * (Python, run per record) could look at the lists, nor where two of the lists are one. */
#define HELD_MAX 512 /* indexes held per list at most (planes <= 16; routes <= the EVs) */

typedef struct {
    PyObject *list;
    Py_ssize_t n;     /* indexes that may be held: min(len(list), HELD_MAX), 0: none */
    int hold;         /* holding at all (nothing else can change the lists meanwhile) */
    long long memo_ev, memo_ix; /* the EV last looked up and its index (held_index) */
    double val[HELD_MAX];
    char state[HELD_MAX]; /* 0: not held, 1: held, 2: held and raised (to write back) */
} Held;

static void held_init(Held *h, PyObject *list, int hold)
{
    h->list = list;
    h->n = 0;
    h->hold = hold;
    h->memo_ev = -1;
    if (hold && list != Py_None) {
        Py_ssize_t n = PyList_GET_SIZE(list);
        h->n = n < HELD_MAX ? n : HELD_MAX;
        memset(h->state, 0, (size_t)h->n);
    }
}

/* list[i] as a double (IndexError, TypeError as list_double) */
static int held_get(Held *h, long long i, double *out)
{
    if (i >= 0 && i < h->n && h->state[i]) {
        *out = h->val[i];
        return 0;
    }
    if (list_double(h->list, i, out) < 0)
        return -1;
    if (i < h->n && PyFloat_CheckExact(PyList_GET_ITEM(h->list, i))) {
        h->val[i] = *out;
        h->state[i] = 1;
    }
    return 0;
}

/* index_list[ev] (list_index), the list's index of EV `ev`: while holding, remembered for
 * the records that follow on the same EV (a burst's: up to 64 in a row) */
static int held_index(Held *h, PyObject *index_list, long long ev, long long *out)
{
    if (h->hold && ev == h->memo_ev) {
        *out = h->memo_ix;
        return 0;
    }
    if (list_index(index_list, ev, out) < 0)
        return -1;
    if (h->hold) {
        h->memo_ev = ev;
        h->memo_ix = *out;
    }
    return 0;
}

/* list[i] = v, i read by held_get just before */
static int held_put(Held *h, long long i, double v)
{
    if (i >= 0 && i < h->n && h->state[i]) {
        h->val[i] = v;
        h->state[i] = 2;
        return 0;
    }
    return list_put_double(h->list, i, v);
}

/* Write back what was raised. With `failing`, the error already set is kept (a write-back
 * that fails then is dropped: it can only be out of memory). */
static int held_flush(Held *h, int failing)
{
    PyObject *type = NULL, *value = NULL, *tb = NULL;
    int rc = 0;
    if (failing)
        PyErr_Fetch(&type, &value, &tb);
    for (Py_ssize_t i = 0; i < h->n; i++)
        if (h->state[i] == 2) {
            h->state[i] = 1;
            if (list_put_double(h->list, i, h->val[i]) < 0) {
                rc = -1;
                if (failing)
                    PyErr_Clear();
                break;
            }
        }
    if (failing)
        PyErr_Restore(type, value, tb);
    return rc;
}

#if PY_VERSION_HEX < 0x030D0000
/* what _PyDict_Pop returns for a key not there: an object no dict can hold */
static PyObject missing = {_PyObject_EXTRA_INIT 1, &PyBaseObject_Type};
#endif

/* the dict entry of `key` removed and returned (a new reference), or NULL: none (no error
 * set) or an error (set). One lookup, where a get and a delete took two: each compares a
 * fresh int key with the dict's, per record taken. */
static PyObject *dict_pop(PyObject *dict, PyObject *key)
{
#if PY_VERSION_HEX >= 0x030D0000
    PyObject *out = NULL;
    return PyDict_Pop(dict, key, &out) < 0 ? NULL : out;
#else
    PyObject *out = _PyDict_Pop(dict, key, &missing); /* (PyDict_Pop is 3.13's) */
    if (out == &missing) {
        Py_DECREF(out);
        return NULL;
    }
    return out;
#endif
}

/* One acknowledged sequence number: pop its record, if any, and note what it delivered. */
static int take_one(PyObject *outstanding, long long seq, PyObject *planes, Held *delivered,
                    PyObject *route_ix, Held *route_alive, PyObject *judge,
                    long long *newly, long long *cancelled)
{
    PyObject *key = PyLong_FromLongLong(seq);
    if (key == NULL)
        return -1;
    PyObject *pkt = dict_pop(outstanding, key);
    Py_DECREF(key);
    if (pkt == NULL)
        return PyErr_Occurred() ? -1 : 0;
    long long ev, plane;
    double sent_at, deadline, seen;
    int rc = packet_fields(pkt, &ev, &sent_at, &deadline);
    Py_DECREF(pkt);
    if (rc < 0)
        return -1;
    (*newly)++;
    if (route_ix != Py_None) {
        long long r;
        if (held_index(route_alive, route_ix, ev, &r) < 0 || held_get(route_alive, r, &seen) < 0)
            return -1;
        if (sent_at > seen && held_put(route_alive, r, sent_at) < 0)
            return -1;
    }
    if (judge != Py_None) {
        PyObject *res = PyObject_CallFunction(judge, "Ld", ev, sent_at);
        if (res == NULL)
            return -1;
        Py_DECREF(res);
    }
    if (deadline == Py_HUGE_VAL)
        (*cancelled)++;
    if (held_index(delivered, planes, ev, &plane) < 0 || held_get(delivered, plane, &seen) < 0)
        return -1;
    if (sent_at > seen && held_put(delivered, plane, sent_at) < 0)
        return -1;
    return 1;
}

/* Whether take_one may hold `delivered` and `route_alive` in C (Held): no judge, and no two
 * of the lists it reads and writes are the same list. */
static int may_hold(PyObject *planes, PyObject *delivered, PyObject *route_ix,
                    PyObject *route_alive, PyObject *judge)
{
    if (judge != Py_None || planes == delivered)
        return 0;
    if (route_ix == Py_None)
        return 1;
    return route_alive != delivered && route_alive != planes && route_ix != delivered &&
           route_ix != route_alive;
}

/* The end of take_acked / take_ack: what Held kept written back; -1 (an error set) if `rc`
 * says the call failed or the write-back did. */
static int held_done(Held *delivered, Held *route_alive, int rc)
{
    int failing = rc < 0;
    if (held_flush(route_alive, failing) < 0 || held_flush(delivered, failing) < 0)
        return -1;
    return failing ? -1 : 0;
}

static PyObject *take_acked(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    if (nargs != 9) {
        PyErr_Format(PyExc_TypeError, "take_acked takes 9 arguments (%zd given)", nargs);
        return NULL;
    }
    PyObject *outstanding = args[0], *sacked = args[3], *planes = args[4];
    PyObject *delivered = args[5], *route_ix = args[6], *route_alive = args[7], *judge = args[8];
    long long start, stop;
    if (arg_ll(args[1], &start) < 0 || arg_ll(args[2], &stop) < 0)
        return NULL;
    if (!PyDict_CheckExact(outstanding) || !PyList_CheckExact(sacked) ||
        !PyList_CheckExact(planes) || !PyList_CheckExact(delivered) ||
        (route_ix != Py_None && (!PyList_CheckExact(route_ix) || !PyList_CheckExact(route_alive)))) {
        PyErr_SetString(PyExc_TypeError, "take_acked wants a dict and lists");
        return NULL;
    }
    long long newly = 0, cancelled = 0;
    int hold = may_hold(planes, delivered, route_ix, route_alive, judge), rc = 0;
    Held dh, rh;
    held_init(&dh, delivered, hold);
    held_init(&rh, route_ix != Py_None ? route_alive : Py_None, hold);
    for (long long seq = start; seq < stop && rc >= 0; seq++)
        rc = take_one(outstanding, seq, planes, &dh, route_ix, &rh, judge, &newly, &cancelled);
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(sacked) && rc >= 0; i++) {
        long long seq = PyLong_AsLongLong(PyList_GET_ITEM(sacked, i));
        if (seq == -1 && PyErr_Occurred())
            rc = -1;
        else
            rc = take_one(outstanding, seq, planes, &dh, route_ix, &rh, judge, &newly,
                          &cancelled);
    }
    if (held_done(&dh, &rh, rc) < 0)
        return NULL;
    return Py_BuildValue("(LL)", newly, cancelled);
}

#define U32_MAX_LL 0xFFFFFFFFll

/* the sequence number of wire PSN `psn` nearest `near_seq` (mrc.core.psn.to_seq) */
static long long to_seq(long long initial_psn, long long psn, long long near_seq)
{
    long long near_psn = (initial_psn + near_seq) & PSN_MASK;
    return near_seq + (((psn - near_psn + HALF) & PSN_MASK) - HALF);
}

static PyObject *take_ack(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    if (nargs != 12) {
        PyErr_Format(PyExc_TypeError, "take_ack takes 12 arguments (%zd given)", nargs);
        return NULL;
    }
    PyObject *outstanding = args[0], *planes = args[7], *delivered = args[8];
    PyObject *route_ix = args[9], *route_alive = args[10], *judge = args[11];
    if (!PyDict_CheckExact(outstanding) || !PyList_CheckExact(planes) ||
        !PyList_CheckExact(delivered) ||
        (route_ix != Py_None && (!PyList_CheckExact(route_ix) || !PyList_CheckExact(route_alive)))) {
        PyErr_SetString(PyExc_TypeError, "take_ack wants a dict and lists");
        return NULL;
    }
    long long ip, una, nxt, psnw, base;
    if (run_arg(args[1], &ip) < 0 || run_arg(args[2], &una) < 0 || run_arg(args[3], &nxt) < 0 ||
        run_arg(args[4], &psnw) < 0 || run_arg(args[5], &base) < 0)
        return NULL;
    unsigned long long bitmap = 0;
    if (!PyLong_Check(args[6])) {
        PyErr_SetString(PyExc_TypeError, "the bitmap must be an int");
        return NULL;
    }
    bitmap = PyLong_AsUnsignedLongLong(args[6]); /* OverflowError if negative or too wide */
    if (bitmap == (unsigned long long)-1 && PyErr_Occurred()) {
        if (!PyErr_ExceptionMatches(PyExc_OverflowError))
            return NULL;
        PyErr_Clear();
        PyErr_SetString(PyExc_ValueError, "an ACK field or sequence number is out of range");
        return NULL;
    }
    if (!(0 <= ip && ip <= PSN_MASK && 0 <= una && una <= nxt && nxt < RUN_LIMIT && 0 <= psnw &&
          psnw <= U32_MAX_LL && 0 <= base && base <= U32_MAX_LL)) {
        PyErr_SetString(PyExc_ValueError, "an ACK field or sequence number is out of range");
        return NULL;
    }
    long long cum = to_seq(ip, psnw & PSN_MASK, una);
    int beyond = cum >= nxt;
    if (beyond)
        cum = nxt - 1; /* what the receiver has beyond that, it did not get from us */
    long long start = una;
    if (cum >= una)
        una = cum + 1;
    long long cum_una = una;
    long long base_seq = to_seq(ip, base & PSN_MASK, una);
    if (bitmap && base_seq + 64 > nxt) {
        long long keep = nxt - base_seq; /* bits for PSNs we sent: fewer than 64 here */
        unsigned long long mask = keep > 0 ? (1ull << keep) - 1 : 0;
        if (bitmap & ~mask) {
            beyond = 1;
            bitmap &= mask;
        }
    }
    long long newly = 0, cancelled = 0;
    int hold = may_hold(planes, delivered, route_ix, route_alive, judge), rc = 0;
    Held dh, rh;
    held_init(&dh, delivered, hold);
    held_init(&rh, route_ix != Py_None ? route_alive : Py_None, hold);
    for (long long seq = start; seq <= cum && rc >= 0; seq++)
        rc = take_one(outstanding, seq, planes, &dh, route_ix, &rh, judge, &newly, &cancelled);
    if (rc >= 0 && bitmap && base_seq + 64 > una) {
        if (base_seq < una)
            bitmap &= ~0ull << (una - base_seq); /* 1 to 63 places here */
        while (bitmap && rc >= 0) {
            long long seq = base_seq + __builtin_ctzll(bitmap);
            bitmap &= bitmap - 1;
            rc = take_one(outstanding, seq, planes, &dh, route_ix, &rh, judge, &newly,
                          &cancelled);
        }
    }
    if (held_done(&dh, &rh, rc) < 0)
        return NULL;
    while (una < nxt) {
        PyObject *key = PyLong_FromLongLong(una);
        if (key == NULL)
            return NULL;
        int has = PyDict_Contains(outstanding, key);
        Py_DECREF(key);
        if (has < 0)
            return NULL;
        if (has)
            break;
        una++;
    }
    return Py_BuildValue("(LLLLLO)", cum_una, base_seq, una, newly, cancelled,
                         beyond ? Py_True : Py_False);
}

/* ---- the receive batch: recv_batch ------------------------------------------------------
 *
 * Up to `most` receives from a nonblocking UDP socket into consecutive `slot`-byte slots of
 * `buf` (64 at most), without the GIL; then, per receive, a tuple (bytes, GRO segment size as
 * the control message said, CE, flow label's EV bits, source port, kernel receive time: the
 * SCM_TIMESTAMPNS message's CLOCK_REALTIME seconds, 0.0 without one). What
 * mrc.transport.rxbatch.py_recv_batch does with recvmsg_into and rx_meta, the reference. */

#define META 6 /* the sixth: the timestamp's nanoseconds */
#define MAX_SLOTS 64 /* receives per call at most */
#define LABEL_MASK 0xFFFFu
#define CE_IN_FLOWINFO (3u << 20)
#ifndef SOL_UDP
#define SOL_UDP 17
#endif
#ifndef UDP_GRO
#define UDP_GRO 104
#endif
#ifndef IPV6_FLOWINFO
#define IPV6_FLOWINFO 11
#endif
#ifndef IPV6_TCLASS
#define IPV6_TCLASS 67
#endif
#ifndef SCM_TIMESTAMPNS
#define SCM_TIMESTAMPNS 35
#endif

/* the least significant byte of a control message's integer, as Python's
 * int.from_bytes(data, sys.byteorder) reads it */
static unsigned char low_byte(const unsigned char *p, size_t len)
{
    const uint16_t one = 1;
    return *(const unsigned char *)&one ? p[0] : p[len - 1];
}

static void read_meta(struct msghdr *mh, int ecn, long long *out)
{
    long long seg = 0, ce = 0, label = 0, stamp = 0;
    for (struct cmsghdr *c = CMSG_FIRSTHDR(mh); c != NULL; c = CMSG_NXTHDR(mh, c)) {
        const unsigned char *d = CMSG_DATA(c);
        size_t len = c->cmsg_len - (size_t)(d - (const unsigned char *)c);
        if (c->cmsg_level == SOL_UDP && c->cmsg_type == UDP_GRO) {
            if (len >= 4) {
                int v;
                memcpy(&v, d, sizeof v);
                seg = v;
            } else if (len >= 2) {
                uint16_t v;
                memcpy(&v, d, sizeof v);
                seg = v;
            } else {
                seg = 0;
            }
        } else if (c->cmsg_level == IPPROTO_IPV6 && c->cmsg_type == IPV6_FLOWINFO) {
            /* int.from_bytes(data, "big"): the bytes as they came, most significant first */
            unsigned long long info = 0;
            for (size_t i = 0; i < len && i < 8; i++)
                info = (info << 8) | d[i];
            label = (long long)(info & LABEL_MASK);
            if (ecn && (info & CE_IN_FLOWINFO) == CE_IN_FLOWINFO)
                ce = 1;
        } else if ((c->cmsg_level == IPPROTO_IPV6 && c->cmsg_type == IPV6_TCLASS) ||
                   (c->cmsg_level == IPPROTO_IP && c->cmsg_type == IP_TOS)) {
            if (len > 0 && (low_byte(d, len) & 3) == 3)
                ce = 1;
        } else if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_TIMESTAMPNS) {
            if (len >= sizeof(struct timespec)) {
                struct timespec ts;
                memcpy(&ts, d, sizeof ts);
                stamp = (long long)ts.tv_sec * 1000000000LL + (long long)ts.tv_nsec;
            }
        }
    }
    out[1] = seg;
    out[2] = ce;
    out[3] = label;
    out[5] = stamp;
}

static PyObject *recv_batch(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    if (nargs != 6) {
        PyErr_Format(PyExc_TypeError, "recv_batch takes 6 arguments (%zd given)", nargs);
        return NULL;
    }
    int fd = PyObject_AsFileDescriptor(args[0]);
    if (fd < 0)
        return NULL;
    long long slot, most;
    if (arg_ll(args[2], &slot) < 0 || arg_ll(args[3], &most) < 0)
        return NULL;
    int ecn = PyObject_IsTrue(args[4]);
    if (ecn < 0)
        return NULL;
    if (slot < 1) {
        PyErr_SetString(PyExc_ValueError, "a slot holds at least one byte");
        return NULL;
    }
    Py_buffer bb;
    if (PyObject_GetBuffer(args[1], &bb, PyBUF_WRITABLE) < 0)
        return NULL;
    long long slots = (long long)bb.len / slot;
    if (slots > MAX_SLOTS)
        slots = MAX_SLOTS;
    long long meta[MAX_SLOTS * META];
    long long got = 0, tries = 0;
    int empty = 0;
    Py_BEGIN_ALLOW_THREADS
    union {
        struct cmsghdr align;
        char bytes[256];
    } control;
    struct sockaddr_storage src;
    while (tries < most && got < slots) {
        struct iovec iov = {(char *)bb.buf + got * slot, (size_t)slot};
        struct msghdr mh;
        memset(&mh, 0, sizeof mh);
        mh.msg_name = &src;
        mh.msg_namelen = sizeof src;
        mh.msg_iov = &iov;
        mh.msg_iovlen = 1;
        mh.msg_control = control.bytes;
        mh.msg_controllen = sizeof control.bytes;
        ssize_t n = recvmsg(fd, &mh, MSG_DONTWAIT);
        if (n < 0) {
            if (errno == EINTR)
                continue; /* retried, as Python retries an interrupted call (PEP 475) */
            if (errno == EAGAIN || errno == EWOULDBLOCK) {
                empty = 1;
                break;
            }
            tries++; /* a pending socket error (ICMP): nothing was read */
            continue;
        }
        tries++;
        long long *out = meta + got * META;
        out[0] = (long long)n;
        read_meta(&mh, ecn, out);
        if (src.ss_family == AF_INET6)
            out[4] = ntohs(((struct sockaddr_in6 *)&src)->sin6_port);
        else if (src.ss_family == AF_INET)
            out[4] = ntohs(((struct sockaddr_in *)&src)->sin_port);
        else
            out[4] = 0;
        got++;
    }
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&bb);
    PyObject *list = PyList_New((Py_ssize_t)got);
    if (list == NULL)
        return NULL;
    for (long long i = 0; i < got; i++) {
        const long long *m = meta + i * META;
        /* seconds and nanoseconds apart, as the reference adds them */
        double stamp = m[5] ? (double)(m[5] / 1000000000LL) + (double)(m[5] % 1000000000LL) * 1e-9
                            : 0.0;
        PyObject *row = Py_BuildValue("(LLOLLd)", m[0], m[1], m[2] ? Py_True : Py_False, m[3], m[4],
                                      stamp);
        if (row == NULL) {
            Py_DECREF(list);
            return NULL;
        }
        PyList_SET_ITEM(list, (Py_ssize_t)i, row);
    }
    return Py_BuildValue("(NLO)", list, tries, empty ? Py_True : Py_False);
}

static PyMethodDef methods[] = {
    {"place_train", (PyCFunction)(void (*)(void))place_train, METH_FASTCALL,
     "Place the common-case segments of a GRO train (see mrc/core/fastpath.py)."},
    {"note_arrivals", (PyCFunction)(void (*)(void))note_arrivals, METH_FASTCALL,
     "Set the SACK bits of a run of placed arrivals (see mrc/core/fastpath.py)."},
    {"note_runs", (PyCFunction)(void (*)(void))note_runs, METH_FASTCALL,
     "Record a train's arrivals, run by run, with the ACK counters (see mrc/core/fastpath.py)."},
    {"pack_burst", (PyCFunction)(void (*)(void))pack_burst, METH_FASTCALL,
     "Write the headers of a burst of data packets (see mrc/core/fastpath.py)."},
    {"record_burst", (PyCFunction)(void (*)(void))record_burst, METH_FASTCALL,
     "The records, ring entries and send buffers of a burst (see mrc/core/fastpath.py)."},
    {"gather_burst", (PyCFunction)(void (*)(void))gather_burst, METH_FASTCALL,
     "A burst's datagrams copied back to back into one buffer (see mrc/core/fastpath.py)."},
    {"take_acked", (PyCFunction)(void (*)(void))take_acked, METH_FASTCALL,
     "Remove the records an ACK acknowledged (see mrc/core/fastpath.py)."},
    {"take_ack", (PyCFunction)(void (*)(void))take_ack, METH_FASTCALL,
     "Take what an ACK acknowledges and move the cumulative point (see mrc/core/fastpath.py)."},
    {"recv_batch", (PyCFunction)(void (*)(void))recv_batch, METH_FASTCALL,
     "Receive a batch of datagrams with their metadata (see mrc/transport/rxbatch.py)."},
    {NULL, NULL, 0, NULL},
};

/* What the kernels can do, for mrc/native.py to refuse a stale build whole (its own
 * KERNEL_VERSION must equal this one, and mrc/_native_gcm.c's too):
 * 2 = place_train takes `skip` (protected trains); 3 = note_arrivals; 4 = open_in_place and
 * seal_data; 5 = open_in_place takes `encrypt`; 6 = Packet, record_burst, take_acked and
 * recv_batch; 7 = open_in_place and seal_data gone to mrc._native_gcm (as open_in_place and
 * seal_packet, with their AES-GCM); 8 = mrc._native_gcm's seal_burst and open_train; 9 = recv_batch
 * returns each receive's kernel timestamp; 10 = note_runs and take_ack; 11 = take_acked and
 * take_ack hold the latest send times in C until they return; 12 = record_burst's ring is an
 * array('q') and its bufs may be None, and gather_burst. */
#define KERNEL_VERSION 12

static int exec_module(PyObject *m)
{
    if (PyType_Ready(&PacketType) < 0)
        return -1;
    Py_INCREF(&PacketType);
    if (PyModule_AddObject(m, "Packet", (PyObject *)&PacketType) < 0) {
        Py_DECREF(&PacketType);
        return -1;
    }
    return PyModule_AddIntConstant(m, "KERNEL_VERSION", KERNEL_VERSION);
}

static PyModuleDef_Slot slots[] = {
    {Py_mod_exec, exec_module},
    {0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "mrc._native", "The native batch kernels of mrc.core.fastpath.",
    0, methods, slots, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__native(void)
{
    return PyModuleDef_Init(&module);
}
