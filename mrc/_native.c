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
 * is the reference), one dict update per 64-packet block rather than per packet.
 *
 * Every length is checked before the read or write it guards; no state outlives a call.
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
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
    if (PyObject_GetBuffer(args[0], &sb, PyBUF_FORMAT) < 0)
        return NULL;
    if (PyObject_GetBuffer(args[1], &mb, PyBUF_SIMPLE) < 0) {
        PyBuffer_Release(&sb);
        return NULL;
    }
    PyObject *result = NULL;
    if (sb.itemsize != 8 || sb.format == NULL || strcmp(sb.format, "q") != 0) {
        PyErr_SetString(PyExc_TypeError, "seqs must be an array('q')");
        goto done;
    }
    const long long *seqs = (const long long *)sb.buf;
    const unsigned char *marks = (const unsigned char *)mb.buf;
    Py_ssize_t cap = sb.len / 8 < mb.len ? sb.len / 8 : mb.len;
    if (stop > cap)
        stop = cap;
    int force = 0;
    Py_ssize_t j = start;
    long long block = 0;
    unsigned long long bits = 0; /* of `block`, not yet in blocks */
    while (j < stop) {
        long long seq = seqs[j];
        long long b = seq >> 6; /* arithmetic shift: floor, as Python's >> */
        if (bits && b != block) {
            if (set_bits(blocks, dirty, block, bits) < 0)
                goto done;
            bits = 0;
        }
        block = b;
        bits |= 1ull << (seq & 63);
        if (seq > hi)
            hi = seq;
        if (marks[j++] & MARK_ACKREQ) {
            force = 1;
            break;
        }
    }
    if (bits && set_bits(blocks, dirty, block, bits) < 0)
        goto done;
    result = Py_BuildValue("(nLO)", j, hi, force ? Py_True : Py_False);
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

static PyMethodDef methods[] = {
    {"place_train", (PyCFunction)(void (*)(void))place_train, METH_FASTCALL,
     "Place the common-case segments of a GRO train (see mrc/core/fastpath.py)."},
    {"note_arrivals", (PyCFunction)(void (*)(void))note_arrivals, METH_FASTCALL,
     "Set the SACK bits of a run of placed arrivals (see mrc/core/fastpath.py)."},
    {"pack_burst", (PyCFunction)(void (*)(void))pack_burst, METH_FASTCALL,
     "Write the headers of a burst of data packets (see mrc/core/fastpath.py)."},
    {NULL, NULL, 0, NULL},
};

/* What the kernels can do, for mrc.core.fastpath to tell a stale build from this one:
 * 2 = place_train takes `skip` (protected trains); 3 = note_arrivals. */
#define KERNEL_VERSION 3

static int exec_module(PyObject *m)
{
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
