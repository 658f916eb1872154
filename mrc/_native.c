/* mrc._native: the receive kernel of mrc/core/fastpath.py, in C.
 *
 * place_train() walks a GRO train, and for every segment that is a plain WRITE ONLY the
 * responder expects (this QP, this rkey, untrimmed, unprotected, full length, in bounds, new,
 * inside the PSN window) copies the payload into the region and reports the segment's sequence
 * number and marks. It stops at the first segment that is anything else: Python's general path
 * takes that one. Semantics, argument by argument, are those of fastpath.py_place_train, the
 * reference this file must match byte for byte (tests/core/test_fastpath.py checks it).
 *
 * Every length is checked before the read or write it guards; no state outlives a call.
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#define HDR_LEN 28 /* BTH (12) + RETH (16) */
#define OP_WRITE 0x0A
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
    if (nargs != 14) {
        PyErr_Format(PyExc_TypeError, "place_train takes 14 arguments (%zd given)", nargs);
        return NULL;
    }
    Py_ssize_t off = PyLong_AsSsize_t(args[1]);
    Py_ssize_t seg = PyLong_AsSsize_t(args[2]);
    if ((off == -1 || seg == -1) && PyErr_Occurred())
        return NULL;
    if (seg <= 0 || off < 0) {
        PyErr_SetString(PyExc_ValueError,
                        "segment size must be positive and the offset not negative");
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
        if (size < HDR_LEN)
            break;
        const unsigned char *h = data + o;
        uint32_t qpw = be32(h + 4), psnw = be32(h + 8);
        uint64_t va = be64(h + 12);
        uint32_t key = be32(h + 20), length = be32(h + 24);
        if (h[0] != OP_WRITE || (h[1] & 0x0F) != TVER || (qpw & 0xFFFFFFu) != qpn ||
            (h[4] & BTH_TRIMMED) || (h[8] & BTH_SECURE) || key != rkey ||
            (uint64_t)length != (uint64_t)(size - HDR_LEN))
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

static PyMethodDef methods[] = {
    {"place_train", (PyCFunction)(void (*)(void))place_train, METH_FASTCALL,
     "Place the common-case segments of a GRO train (see mrc/core/fastpath.py)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "mrc._native", "The native receive kernel of mrc.core.fastpath.",
    0, methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__native(void)
{
    return PyModuleDef_Init(&module);
}
