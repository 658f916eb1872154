/* mrc._native_gcm: keyed mode's per-packet kernels, with their AES-GCM (OpenSSL's libcrypto).
 *
 * An extension of its own, beside mrc._native, because it links libcrypto: a machine without
 * OpenSSL's headers (libssl-dev) fails to build this one only (setup.py builds each, both
 * optional) and keeps the other C kernels; keyed mode then runs mrc/security/packet.py's
 * Python (mrc/native.py says so, and loads the two as one: same KERNEL_VERSION or neither).
 *
 * GcmKey is one AES-GCM key (16, 24 or 32 bytes) with its two EVP contexts, encrypting and
 * decrypting, whose key schedules are made once, when the key is: every use after that only
 * sets a new 12-byte nonce. (Calling `cryptography`'s AESGCM from C for each ICV cost a Python
 * call, its argument objects and the call's own set-up: more than a header's GHASH.) GMAC is
 * AES-GCM with no plaintext.
 *
 * seal_packet() seals one datagram as mrc.security.packet.Sealer.seal_pair's Python path does
 * (the reference): headers with S set, key id, counter, header ICV, then (data) the payload ICV
 * and the payload as given (integrity), or the ciphertext and its tag in a new buffer
 * (encrypt). open_in_place() checks and unprotects one datagram in its receive buffer as
 * Opener.unseal's Python path does: key id, replay window, header ICV, then (a whole data
 * packet) the payload ICV, or the decryption, its plaintext copied to the packet's end, and the
 * headers moved up to the payload; headers alone (an ACK, a probe, a trimmed data packet) are
 * moved up to where the security block ends. The counter is recorded only on success. The wire
 * format is docs/PROTOCOL.md section 11; tests/security/test_native_gcm.py and
 * test_open_in_place.py hold these to `cryptography` and to the Python, byte for byte.
 *
 * The GIL is held throughout. The work per call is one or two AES-GCM passes over at most a
 * datagram (about 2 us for 8 KiB): releasing the GIL per packet would cost a hand-off each time
 * and, with another thread holding it (the end-to-end hash's), a wait of up to the switch
 * interval, which is far more than the pass. Holding it also means that a key's contexts are
 * never used by two threads at once. Every OpenSSL return value is checked: a failure other
 * than a tag that does not match raises RuntimeError (never a verdict), with OpenSSL's error
 * queue emptied either way. Every length is checked before the read or write it guards.
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <openssl/crypto.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <limits.h>
#include <stdint.h>
#include <string.h>

#define SECURE_BYTE 8    /* BTH byte that carries S */
#define BTH_SECURE 0x40  /* S */
#define KEEP_BYTE4 0x4F  /* BTH byte 4 as authenticated: the switch-set marks F, T, L cleared */
#define SEC_BLOCK_LEN 28 /* key id 4, counter 8, header ICV 16 */
#define KID_CTR_LEN 12   /* key id and counter: the part of the block the header ICV covers */
#define ICV_LEN 16
#define NONCE_LEN 12
#define MAX_HDR_LEN 64 /* the longest fixed headers mrc has are 40 bytes (an ACK) */
#define CHUNK (1 << 30) /* EVP's lengths are ints: longer inputs go in pieces */
/* mrc.wire's: the opcodes of data packets, their fixed headers, the transport version */
#define OP_WRITE 0x0A     /* RDMA_WRITE_ONLY */
#define OP_WRITE_IMM 0x0B /* RDMA_WRITE_ONLY_IMM */
#define DATA_HDR_LEN 28   /* a WRITE's BTH and RETH */
#define MRC_TVER 0
/* where a whole data packet's datagram lies after open_in_place: the security block and
 * payload ICV before it (Protection.in_place_skip, DATA_OVERHEAD) */
#define DATA_SKIP (SEC_BLOCK_LEN + ICV_LEN)

/* ---- GcmKey ---------------------------------------------------------------------------- */

typedef struct {
    PyObject_HEAD
    EVP_CIPHER_CTX *enc; /* the key set, encrypting; each use sets its nonce */
    EVP_CIPHER_CTX *dec; /* the key set, decrypting */
    unsigned char *scratch; /* encrypt mode's plaintext before it is copied into place */
    size_t scratch_len;
} GcmKeyObject;

static PyTypeObject GcmKeyType;

/* Raise RuntimeError for a failed OpenSSL call `what` (OpenSSL's reason if it gave one) and
 * empty its error queue; returns NULL, for `return openssl_error(...)`. */
static PyObject *openssl_error(const char *what)
{
    unsigned long code = ERR_peek_last_error();
    const char *why = code ? ERR_reason_error_string(code) : NULL;
    if (why != NULL)
        PyErr_Format(PyExc_RuntimeError, "OpenSSL: %s failed: %s", what, why);
    else
        PyErr_Format(PyExc_RuntimeError, "OpenSSL: %s failed", what);
    ERR_clear_error();
    return NULL;
}

static const EVP_CIPHER *cipher_for(Py_ssize_t key_len)
{
    switch (key_len) {
    case 16:
        return EVP_aes_128_gcm();
    case 24:
        return EVP_aes_192_gcm();
    case 32:
        return EVP_aes_256_gcm();
    default:
        return NULL;
    }
}

static void gcmkey_dealloc(GcmKeyObject *self)
{
    EVP_CIPHER_CTX_free(self->enc); /* NULL is allowed; the key schedule is cleansed */
    EVP_CIPHER_CTX_free(self->dec);
    if (self->scratch != NULL) {
        OPENSSL_cleanse(self->scratch, self->scratch_len); /* a plaintext was there */
        PyMem_Free(self->scratch);
    }
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *gcmkey_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    if (kwds != NULL && PyDict_GET_SIZE(kwds) != 0) {
        PyErr_SetString(PyExc_TypeError, "GcmKey takes no keyword arguments");
        return NULL;
    }
    Py_buffer key;
    if (!PyArg_ParseTuple(args, "y*:GcmKey", &key))
        return NULL;
    const EVP_CIPHER *cipher = cipher_for(key.len);
    if (cipher == NULL) {
        PyBuffer_Release(&key);
        PyErr_SetString(PyExc_ValueError, "an AES-GCM key is 16, 24 or 32 bytes");
        return NULL;
    }
    GcmKeyObject *self = (GcmKeyObject *)type->tp_alloc(type, 0);
    if (self == NULL) {
        PyBuffer_Release(&key);
        return NULL;
    }
    /* tp_alloc zeroed the fields: a failure below leaves what dealloc can free */
    self->enc = EVP_CIPHER_CTX_new();
    self->dec = EVP_CIPHER_CTX_new();
    if (self->enc == NULL || self->dec == NULL) {
        PyBuffer_Release(&key);
        Py_DECREF(self);
        ERR_clear_error();
        return PyErr_NoMemory();
    }
    const unsigned char *k = (const unsigned char *)key.buf;
    int ok = EVP_EncryptInit_ex(self->enc, cipher, NULL, k, NULL) == 1 &&
             EVP_DecryptInit_ex(self->dec, cipher, NULL, k, NULL) == 1 &&
             EVP_CIPHER_CTX_iv_length(self->enc) == NONCE_LEN &&
             EVP_CIPHER_CTX_iv_length(self->dec) == NONCE_LEN;
    PyBuffer_Release(&key);
    if (!ok) {
        Py_DECREF(self);
        return openssl_error("setting an AES-GCM key");
    }
    return (PyObject *)self;
}

/* Feed `len` bytes of `in` to `c`: additional data when `out` is NULL, else encrypted
 * (`enc`) or decrypted into `out`. 0, or -1 if OpenSSL failed. */
static int feed(EVP_CIPHER_CTX *c, int enc, unsigned char *out, const unsigned char *in,
                size_t len)
{
    while (len > 0) {
        int n = len > (size_t)CHUNK ? CHUNK : (int)len;
        int outl = 0;
        int ok = enc ? EVP_EncryptUpdate(c, out, &outl, in, n)
                     : EVP_DecryptUpdate(c, out, &outl, in, n);
        if (ok != 1 || (out != NULL && outl != n))
            return -1;
        in += n;
        if (out != NULL)
            out += n;
        len -= (size_t)n;
    }
    return 0;
}

/* AES-GCM sealing under `c` (an encrypting context) with nonce `iv`: additional data `aad`,
 * then `len` bytes of `in` encrypted to `out` (both may be NULL when `len` is 0), the tag to
 * `tag`. 0, or -1 if OpenSSL failed (nothing raised: the caller does). */
static int gcm_seal(EVP_CIPHER_CTX *c, const unsigned char *iv, const unsigned char *aad,
                    size_t aad_len, const unsigned char *in, size_t len, unsigned char *out,
                    unsigned char *tag)
{
    unsigned char tail[ICV_LEN]; /* Final writes nothing in GCM: a place for it anyway */
    int outl = 0;
    if (EVP_EncryptInit_ex(c, NULL, NULL, NULL, iv) != 1)
        return -1;
    if (feed(c, 1, NULL, aad, aad_len) < 0 || feed(c, 1, out, in, len) < 0)
        return -1;
    if (EVP_EncryptFinal_ex(c, tail, &outl) != 1 || outl != 0)
        return -1;
    if (EVP_CIPHER_CTX_ctrl(c, EVP_CTRL_AEAD_GET_TAG, ICV_LEN, tag) != 1)
        return -1;
    return 0;
}

/* AES-GCM opening under `c` (a decrypting context): additional data `aad`, then `len` bytes of
 * `in` decrypted to `out` (both may be NULL when `len` is 0), checked against `tag`. 1: it is
 * authentic (the plaintext is in `out`); 0: it is not (`out` holds nothing to use); -1: OpenSSL
 * failed before the check. A mismatch is Final's failure, whose error queue is emptied. */
static int gcm_open(EVP_CIPHER_CTX *c, const unsigned char *iv, const unsigned char *aad,
                    size_t aad_len, const unsigned char *in, size_t len, unsigned char *out,
                    const unsigned char *tag)
{
    unsigned char want[ICV_LEN], tail[ICV_LEN];
    int outl = 0;
    memcpy(want, tag, ICV_LEN); /* the ctrl takes a non-const pointer */
    if (EVP_DecryptInit_ex(c, NULL, NULL, NULL, iv) != 1)
        return -1;
    if (feed(c, 0, NULL, aad, aad_len) < 0 || feed(c, 0, out, in, len) < 0)
        return -1;
    if (EVP_CIPHER_CTX_ctrl(c, EVP_CTRL_AEAD_SET_TAG, ICV_LEN, want) != 1)
        return -1;
    if (EVP_DecryptFinal_ex(c, tail, &outl) != 1) {
        ERR_clear_error();
        return 0;
    }
    return 1;
}

/* The buffer of an optional argument: None gives an empty one. 0 or -1 (raised). */
static int optional_buffer(PyObject *o, Py_buffer *view)
{
    if (o == Py_None) {
        memset(view, 0, sizeof(*view));
        view->buf = NULL;
        view->obj = NULL;
        return 0;
    }
    return PyObject_GetBuffer(o, view, PyBUF_SIMPLE);
}

static void release(Py_buffer *view)
{
    if (view->obj != NULL)
        PyBuffer_Release(view);
}

static int nonce_of(PyObject *o, Py_buffer *view)
{
    if (PyObject_GetBuffer(o, view, PyBUF_SIMPLE) < 0)
        return -1;
    if (view->len != NONCE_LEN) {
        PyBuffer_Release(view);
        PyErr_SetString(PyExc_ValueError, "the nonce must be 12 bytes");
        return -1;
    }
    return 0;
}

/* The arguments of GcmKey.encrypt and .decrypt, (nonce, data, aad): their buffers, all
 * taken or none (gcm_args_release gives them back). */
static int gcm_args(const char *name, PyObject *const *args, Py_ssize_t nargs, Py_buffer *nb,
                    Py_buffer *db, Py_buffer *ab)
{
    if (nargs != 3) {
        PyErr_Format(PyExc_TypeError, "%s takes 3 arguments (%zd given)", name, nargs);
        return -1;
    }
    if (nonce_of(args[0], nb) < 0)
        return -1;
    if (PyObject_GetBuffer(args[1], db, PyBUF_SIMPLE) < 0) {
        PyBuffer_Release(nb);
        return -1;
    }
    if (optional_buffer(args[2], ab) < 0) {
        PyBuffer_Release(db);
        PyBuffer_Release(nb);
        return -1;
    }
    return 0;
}

static void gcm_args_release(Py_buffer *nb, Py_buffer *db, Py_buffer *ab)
{
    release(ab);
    PyBuffer_Release(db);
    PyBuffer_Release(nb);
}

/* GcmKey.encrypt(nonce, data, aad): the ciphertext of `data` followed by its 16-byte tag, as
 * cryptography's AESGCM.encrypt gives it (the tests compare the two). */
static PyObject *gcmkey_encrypt(GcmKeyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    Py_buffer nb, db, ab;
    if (gcm_args("encrypt", args, nargs, &nb, &db, &ab) < 0)
        return NULL;
    PyObject *out = NULL;
    if (db.len > PY_SSIZE_T_MAX - ICV_LEN) {
        PyErr_SetString(PyExc_OverflowError, "the data is too long");
        goto done;
    }
    out = PyBytes_FromStringAndSize(NULL, db.len + ICV_LEN);
    if (out == NULL)
        goto done;
    unsigned char *o = (unsigned char *)PyBytes_AS_STRING(out);
    if (gcm_seal(self->enc, nb.buf, ab.buf, (size_t)ab.len, db.buf, (size_t)db.len, o,
                 o + db.len) < 0) {
        Py_CLEAR(out);
        openssl_error("AES-GCM encryption");
    }
done:
    gcm_args_release(&nb, &db, &ab);
    return out;
}

/* GcmKey.decrypt(nonce, data, aad): the plaintext of `data` (ciphertext, then its tag), or
 * None when it is not authentic (too short for a tag, or a tag that does not match). */
static PyObject *gcmkey_decrypt(GcmKeyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    Py_buffer nb, db, ab;
    if (gcm_args("decrypt", args, nargs, &nb, &db, &ab) < 0)
        return NULL;
    PyObject *out = NULL;
    if (db.len < ICV_LEN) {
        out = Py_NewRef(Py_None);
        goto done;
    }
    Py_ssize_t len = db.len - ICV_LEN;
    out = PyBytes_FromStringAndSize(NULL, len);
    if (out == NULL)
        goto done;
    const unsigned char *d = (const unsigned char *)db.buf;
    int ok = gcm_open(self->dec, nb.buf, ab.buf, (size_t)ab.len, d, (size_t)len,
                      (unsigned char *)PyBytes_AS_STRING(out), d + len);
    if (ok < 0) {
        Py_CLEAR(out);
        openssl_error("AES-GCM decryption");
    } else if (ok == 0) {
        Py_SETREF(out, Py_NewRef(Py_None));
    }
done:
    gcm_args_release(&nb, &db, &ab);
    return out;
}

static PyMethodDef gcmkey_methods[] = {
    {"encrypt", (PyCFunction)(void (*)(void))gcmkey_encrypt, METH_FASTCALL,
     "encrypt(nonce, data, aad): ciphertext + 16-byte tag (as cryptography's AESGCM)."},
    {"decrypt", (PyCFunction)(void (*)(void))gcmkey_decrypt, METH_FASTCALL,
     "decrypt(nonce, data, aad): the plaintext, or None if it is not authentic."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject GcmKeyType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "mrc._native_gcm.GcmKey",
    .tp_basicsize = sizeof(GcmKeyObject),
    .tp_dealloc = (destructor)gcmkey_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "GcmKey(key): one AES-GCM key (16, 24 or 32 bytes), its contexts made once.",
    .tp_methods = gcmkey_methods,
    .tp_new = gcmkey_new,
};

/* ---- the kernels ----------------------------------------------------------------------- */

static uint64_t be64(const unsigned char *p)
{
    uint64_t v = 0;
    for (int i = 0; i < 8; i++)
        v = (v << 8) | p[i];
    return v;
}

/* The nonce of counter `ctr`: 4 zero bytes, then the counter, big-endian. */
static void nonce_for(unsigned char *nb, unsigned long long ctr)
{
    memset(nb, 0, 4);
    for (int i = 0; i < 8; i++)
        nb[4 + i] = (unsigned char)(ctr >> (56 - 8 * i));
}

static GcmKeyObject *key_arg(PyObject *o)
{
    if (!PyObject_TypeCheck(o, &GcmKeyType)) {
        PyErr_SetString(PyExc_TypeError, "a key must be a GcmKey");
        return NULL;
    }
    return (GcmKeyObject *)o;
}

/* Seal one datagram: headers `h` (`hdr_len` bytes, checked by the caller), `payload` (the
 * object, None for an ACK or probe; `pb` its buffer), counter `ctr`. The two parts to
 * *head and *body (new references), 0; or -1 (raised, nothing left). */
static int seal_one(GcmKeyObject *hk, GcmKeyObject *pk, int encrypt, const char *kid,
                    unsigned long long ctr, const unsigned char *h, Py_ssize_t hdr_len,
                    PyObject *payload, const Py_buffer *pb, PyObject **head, PyObject **body)
{
    int is_data = payload != Py_None;
    *head = *body = NULL;
    if (pb->len > PY_SSIZE_T_MAX - ICV_LEN) {
        PyErr_SetString(PyExc_OverflowError, "the payload is too long");
        return -1;
    }
    unsigned char nb[NONCE_LEN];
    nonce_for(nb, ctr);
    Py_ssize_t head_len = hdr_len + SEC_BLOCK_LEN + (is_data && !encrypt ? ICV_LEN : 0);
    PyObject *hd = PyBytes_FromStringAndSize(NULL, head_len);
    if (hd == NULL)
        return -1;
    unsigned char *o = (unsigned char *)PyBytes_AS_STRING(hd);
    memcpy(o, h, (size_t)hdr_len);
    o[4] &= KEEP_BYTE4; /* authenticated as a switch may leave it */
    o[SECURE_BYTE] |= BTH_SECURE;
    memcpy(o + hdr_len, kid, 4);
    memcpy(o + hdr_len + 4, nb + 4, 8);
    if (gcm_seal(hk->enc, nb, o, (size_t)hdr_len + KID_CTR_LEN, NULL, 0, NULL,
                 o + hdr_len + KID_CTR_LEN) < 0) {
        Py_DECREF(hd);
        openssl_error("the header ICV");
        return -1;
    }
    o[4] = h[4]; /* the marks as they are */
    PyObject *bd;
    if (!is_data) {
        bd = PyBytes_FromStringAndSize(NULL, 0);
    } else if (!encrypt) {
        /* the payload ICV: a GMAC of the payload, before it */
        if (gcm_seal(pk->enc, nb, pb->buf, (size_t)pb->len, NULL, 0, NULL,
                     o + hdr_len + SEC_BLOCK_LEN) < 0) {
            Py_DECREF(hd);
            openssl_error("the payload ICV");
            return -1;
        }
        bd = Py_NewRef(payload);
    } else {
        bd = PyBytes_FromStringAndSize(NULL, pb->len + ICV_LEN);
        if (bd != NULL) {
            unsigned char *c = (unsigned char *)PyBytes_AS_STRING(bd);
            if (gcm_seal(pk->enc, nb, NULL, 0, pb->buf, (size_t)pb->len, c, c + pb->len) < 0) {
                Py_CLEAR(bd);
                openssl_error("the payload's encryption");
            }
        }
    }
    if (bd == NULL) {
        Py_DECREF(hd);
        return -1;
    }
    *head = hd;
    *body = bd;
    return 0;
}

/* The key id argument: 4 bytes. NULL: raised. */
static const char *kid_arg(PyObject *kid)
{
    if (!PyBytes_Check(kid) || PyBytes_GET_SIZE(kid) != 4) {
        PyErr_SetString(PyExc_TypeError, "the key id must be 4 bytes");
        return NULL;
    }
    return PyBytes_AS_STRING(kid);
}

/* seal_packet(headers, payload, kid, counter, header_key, payload_key, encrypt): (first part,
 * second part) of one protected datagram, as Sealer.seal_pair returns them. `payload` None: an
 * ACK or probe, second part b"". Integrity: the first part ends with the payload ICV and the
 * second is `payload` itself (sent from where it lies). Encrypt: the second part is the
 * ciphertext, then its tag. */
static PyObject *seal_packet(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    if (nargs != 7) {
        PyErr_Format(PyExc_TypeError, "seal_packet takes 7 arguments (%zd given)", nargs);
        return NULL;
    }
    PyObject *payload = args[1];
    unsigned long long ctr = PyLong_AsUnsignedLongLong(args[3]);
    if (ctr == (unsigned long long)-1 && PyErr_Occurred())
        return NULL;
    GcmKeyObject *hk = key_arg(args[4]), *pk = key_arg(args[5]);
    if (hk == NULL || pk == NULL)
        return NULL;
    int encrypt = PyObject_IsTrue(args[6]);
    if (encrypt < 0)
        return NULL;
    const char *kid = kid_arg(args[2]);
    if (kid == NULL)
        return NULL;
    Py_buffer hb, pb;
    if (PyObject_GetBuffer(args[0], &hb, PyBUF_SIMPLE) < 0)
        return NULL;
    if (optional_buffer(payload, &pb) < 0) {
        PyBuffer_Release(&hb);
        return NULL;
    }
    PyObject *head = NULL, *body = NULL, *result = NULL;
    if (hb.len < SECURE_BYTE + 1 || hb.len > MAX_HDR_LEN) {
        PyErr_SetString(PyExc_ValueError, "the headers must be 9 to 64 bytes");
        goto done;
    }
    if (seal_one(hk, pk, encrypt, kid, ctr, hb.buf, hb.len, payload, &pb, &head, &body) < 0)
        goto done;
    result = PyTuple_Pack(2, head, body);
done:
    Py_XDECREF(body);
    Py_XDECREF(head);
    release(&pb);
    PyBuffer_Release(&hb);
    return result;
}

/* seal_burst(bufs, count, kid, counter, header_key, payload_key, encrypt): one burst sealed
 * in one call, as QueuePair._seal had it done datagram by datagram (reference:
 * mrc.security.trains.seal_burst). `bufs` is the burst's list, (headers, payload) per
 * datagram; datagram i takes counter `counter` + 1 + i. A WRITE or WRITE_IMM is a data packet
 * (its payload sealed as seal_packet does), anything else headers alone (payload part b"").
 * Returns (parts, seg): the new list, (head, body) per datagram, and the sealed burst's segment
 * size if its datagrams still make one GSO burst (all but the last the same size, the last no
 * longer), else -1. */
static PyObject *seal_burst(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    if (nargs != 7) {
        PyErr_Format(PyExc_TypeError, "seal_burst takes 7 arguments (%zd given)", nargs);
        return NULL;
    }
    PyObject *bufs = args[0];
    if (!PyList_Check(bufs)) {
        PyErr_SetString(PyExc_TypeError, "the burst's buffers must be a list");
        return NULL;
    }
    Py_ssize_t count = PyLong_AsSsize_t(args[1]);
    if (count == -1 && PyErr_Occurred())
        return NULL;
    if (count < 1 || count > PyList_GET_SIZE(bufs) / 2) {
        PyErr_SetString(PyExc_ValueError, "count must be 1 to len(bufs) // 2");
        return NULL;
    }
    const char *kid = kid_arg(args[2]);
    if (kid == NULL)
        return NULL;
    unsigned long long ctr = PyLong_AsUnsignedLongLong(args[3]);
    if (ctr == (unsigned long long)-1 && PyErr_Occurred())
        return NULL;
    if (ctr > ULLONG_MAX - (unsigned long long)count) {
        PyErr_SetString(PyExc_OverflowError, "the counter would wrap");
        return NULL;
    }
    GcmKeyObject *hk = key_arg(args[4]), *pk = key_arg(args[5]);
    if (hk == NULL || pk == NULL)
        return NULL;
    int encrypt = PyObject_IsTrue(args[6]);
    if (encrypt < 0)
        return NULL;
    PyObject *parts = PyList_New(2 * count);
    if (parts == NULL)
        return NULL;
    Py_ssize_t seg = -1, first = 0, last = 0;
    int uniform = 1;
    for (Py_ssize_t i = 0; i < count; i++) {
        /* only an exotic buffer's exporter could run Python code that changes the list:
         * its size is checked each time, and the items are held while they are used */
        if (2 * i + 1 >= PyList_GET_SIZE(bufs)) {
            Py_DECREF(parts);
            PyErr_SetString(PyExc_RuntimeError, "the burst's list changed while it was sealed");
            return NULL;
        }
        PyObject *hobj = PyList_GET_ITEM(bufs, 2 * i), *pobj = PyList_GET_ITEM(bufs, 2 * i + 1);
        Py_INCREF(hobj);
        Py_INCREF(pobj);
        Py_buffer hb, pb;
        int rc = -1;
        PyObject *head = NULL, *body = NULL;
        if (PyObject_GetBuffer(hobj, &hb, PyBUF_SIMPLE) == 0) {
            if (hb.len < SECURE_BYTE + 1 || hb.len > MAX_HDR_LEN) {
                PyErr_SetString(PyExc_ValueError, "the headers must be 9 to 64 bytes");
            } else {
                unsigned char op = ((const unsigned char *)hb.buf)[0];
                int is_data = op == OP_WRITE || op == OP_WRITE_IMM;
                if (!is_data) {
                    memset(&pb, 0, sizeof(pb));
                    rc = seal_one(hk, pk, encrypt, kid, ctr + 1 + (unsigned long long)i,
                                  hb.buf, hb.len, Py_None, &pb, &head, &body);
                } else if (PyObject_GetBuffer(pobj, &pb, PyBUF_SIMPLE) == 0) {
                    rc = seal_one(hk, pk, encrypt, kid, ctr + 1 + (unsigned long long)i,
                                  hb.buf, hb.len, pobj, &pb, &head, &body);
                    PyBuffer_Release(&pb);
                }
            }
            PyBuffer_Release(&hb);
        }
        Py_DECREF(pobj);
        Py_DECREF(hobj);
        if (rc < 0) {
            Py_DECREF(parts);
            return NULL;
        }
        /* len() of the payload part, as the Python had it (a memoryview's items) */
        Py_ssize_t body_len = PyObject_Length(body);
        PyList_SET_ITEM(parts, 2 * i, head); /* the references are the list's now */
        PyList_SET_ITEM(parts, 2 * i + 1, body);
        if (body_len < 0) {
            Py_DECREF(parts);
            return NULL;
        }
        Py_ssize_t size = PyBytes_GET_SIZE(head) + body_len;
        if (i == 0)
            first = size;
        else if (i < count - 1 && size != first)
            uniform = 0;
        last = size;
    }
    if (count == 1 || (uniform && last <= first))
        seg = first;
    return Py_BuildValue("(Nn)", parts, seg);
}

/* A plaintext's room in `key`'s scratch buffer (grown as needed, kept). NULL: raised. */
static unsigned char *scratch_for(GcmKeyObject *key, size_t len)
{
    if (len == 0)
        len = 1;
    if (key->scratch_len < len) {
        unsigned char *grown = PyMem_Malloc(len);
        if (grown == NULL) {
            PyErr_NoMemory();
            return NULL;
        }
        if (key->scratch != NULL) {
            OPENSSL_cleanse(key->scratch, key->scratch_len);
            PyMem_Free(key->scratch);
        }
        key->scratch = grown;
        key->scratch_len = len;
    }
    return key->scratch;
}

/* Check and unprotect the datagram of `n` bytes at `data` in place (see the top of this file):
 * 0 with its place in *start and *stop (the counter taken into `seen` and *top); 1, not
 * authentic or not new, with the drop reason in *why (nothing changed); -1, raised (OpenSSL
 * failed; nothing changed). `hdr_len` is 9 to 64, `size` (the window) at least 1. */
static int open_one(unsigned char *data, Py_ssize_t n, Py_ssize_t hdr_len, const char *kid,
                    GcmKeyObject *hk, GcmKeyObject *pk, unsigned char *seen,
                    unsigned long long size, unsigned long long *topp, int encrypt,
                    int is_data, Py_ssize_t *startp, Py_ssize_t *stopp, const char **why)
{
    unsigned long long top = *topp;
    Py_ssize_t end = hdr_len + SEC_BLOCK_LEN;
    if (n < end || !(data[SECURE_BYTE] & BTH_SECURE)) {
        *why = "security_missing";
        return 1;
    }
    if (memcmp(data + hdr_len, kid, 4) != 0) {
        *why = "security_key_id";
        return 1;
    }
    unsigned long long ctr = be64(data + hdr_len + 4);
    if (ctr <= top) {
        const char *old = NULL;
        if (ctr == 0)
            old = "security_replay";
        else if (top - ctr >= size)
            old = "security_too_old";
        else if (seen[ctr % size])
            old = "security_replay";
        if (old != NULL) {
            *why = old;
            return 1;
        }
    }
    unsigned char nb[NONCE_LEN];
    nonce_for(nb, ctr);
    /* the header ICV covers the headers (byte 4 as a switch may leave it), key id, counter */
    unsigned char aad[MAX_HDR_LEN + KID_CTR_LEN];
    memcpy(aad, data, (size_t)(hdr_len + KID_CTR_LEN));
    aad[4] &= KEEP_BYTE4;
    int ok = gcm_open(hk->dec, nb, aad, (size_t)(hdr_len + KID_CTR_LEN), NULL, 0, NULL,
                      data + hdr_len + KID_CTR_LEN);
    if (ok < 0) {
        openssl_error("checking the header ICV");
        return -1;
    }
    if (!ok) {
        *why = "security_bad_tag";
        return 1;
    }
    Py_ssize_t start, stop;
    if (is_data && n > end) {
        if (n < end + ICV_LEN) {
            *why = "security_short";
            return 1;
        }
        Py_ssize_t plain_len = n - end - ICV_LEN; /* the payload's bytes, in either mode */
        if (encrypt) {
            /* ciphertext then tag; the plaintext goes where the packet ends (over the
             * ciphertext's end and the tag), so it is decrypted aside first: the two overlap,
             * and a packet that fails leaves the buffer as it was */
            unsigned char *plain = scratch_for(pk, (size_t)plain_len);
            if (plain == NULL)
                return -1;
            ok = gcm_open(pk->dec, nb, NULL, 0, data + end, (size_t)plain_len, plain,
                          data + n - ICV_LEN);
            if (ok > 0)
                memcpy(data + n - plain_len, plain, (size_t)plain_len);
        } else {
            /* the payload ICV, then the payload: a GMAC of the payload */
            ok = gcm_open(pk->dec, nb, data + end + ICV_LEN, (size_t)plain_len, NULL, 0, NULL,
                          data + end);
        }
        if (ok < 0) {
            openssl_error("checking the payload ICV");
            return -1;
        }
        if (!ok) {
            *why = "security_bad_tag";
            return 1;
        }
        /* the headers right before the payload: DATA_OVERHEAD bytes into the packet */
        start = n - plain_len - hdr_len;
        stop = n;
    } else {
        /* headers alone (an ACK, a probe, a trimmed data packet): they end where the
         * security block ended */
        start = SEC_BLOCK_LEN;
        stop = end;
    }
    memmove(data + start, data, (size_t)hdr_len);
    data[start + SECURE_BYTE] &= (unsigned char)~BTH_SECURE;
    /* the counter is seen (ReplayWindow.accept) */
    if (ctr > top) {
        unsigned long long gap = ctr - top;
        if (gap >= size) {
            memset(seen, 0, (size_t)size);
        } else if (gap > 1) {
            unsigned long long lo = (top + 1) % size, hi = ctr % size;
            if (lo < hi) {
                memset(seen + lo, 0, (size_t)(hi - lo));
            } else {
                memset(seen + lo, 0, (size_t)(size - lo));
                memset(seen, 0, (size_t)hi);
            }
        }
        *topp = ctr;
    }
    seen[ctr % size] = 1;
    *startp = start;
    *stopp = stop;
    return 0;
}

/* open_in_place(data, hdr_len, kid, header_key, payload_key, seen, top, encrypt, is_data):
 * see the top of this file and Opener.unseal. `seen` and `top` are the ReplayWindow's ring
 * and highest counter; the ring is updated here, the new top returned: (reason, top, start,
 * stop), reason None and the datagram at data[start:stop], or the drop reason (start and
 * stop 0). */
static PyObject *open_in_place(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    if (nargs != 9) {
        PyErr_Format(PyExc_TypeError, "open_in_place takes 9 arguments (%zd given)", nargs);
        return NULL;
    }
    Py_ssize_t hdr_len = PyLong_AsSsize_t(args[1]);
    if (hdr_len == -1 && PyErr_Occurred())
        return NULL;
    unsigned long long top = PyLong_AsUnsignedLongLong(args[6]);
    if (top == (unsigned long long)-1 && PyErr_Occurred())
        return NULL;
    int encrypt = PyObject_IsTrue(args[7]);
    if (encrypt < 0)
        return NULL;
    int is_data = PyObject_IsTrue(args[8]);
    if (is_data < 0)
        return NULL;
    if (hdr_len < SECURE_BYTE + 1 || hdr_len > MAX_HDR_LEN) {
        PyErr_SetString(PyExc_ValueError, "hdr_len must be 9 to 64");
        return NULL;
    }
    const char *kid = kid_arg(args[2]);
    if (kid == NULL)
        return NULL;
    GcmKeyObject *hk = key_arg(args[3]), *pk = key_arg(args[4]);
    if (hk == NULL || pk == NULL)
        return NULL;
    Py_buffer db, sb;
    if (PyObject_GetBuffer(args[0], &db, PyBUF_WRITABLE) < 0)
        return NULL;
    if (PyObject_GetBuffer(args[5], &sb, PyBUF_WRITABLE) < 0) {
        PyBuffer_Release(&db);
        return NULL;
    }
    PyObject *result = NULL;
    if (sb.len == 0) {
        PyErr_SetString(PyExc_ValueError, "the replay window is empty");
        goto done;
    }
    Py_ssize_t start = 0, stop = 0;
    const char *why = NULL;
    int rc = open_one(db.buf, db.len, hdr_len, kid, hk, pk, sb.buf, (unsigned long long)sb.len,
                      &top, encrypt, is_data, &start, &stop, &why);
    if (rc == 0)
        result = Py_BuildValue("(OKnn)", Py_None, top, start, stop);
    else if (rc > 0)
        result = Py_BuildValue("(sKnn)", why, top, (Py_ssize_t)0, (Py_ssize_t)0);
done:
    PyBuffer_Release(&sb);
    PyBuffer_Release(&db);
    return result;
}

/* open_train(view, off, seg, cap, qpn, kid, header_key, payload_key, window, encrypt): the
 * segments of a GRO train from byte `off` (`seg` bytes each, the last may be shorter) that
 * are WRITEs naming QP `qpn`, opened in place one after another as open_in_place opens each
 * (the same checks, the same replay window: `window`'s `seen` ring and `top`, the new top set
 * on it before this returns, also when it raises), at most `cap` of them; in one call, the
 * loop QueuePair._receive_sealed_train ran in Python (reference: mrc.security.trains).
 * Stops at the first segment that is not such a WRITE (too short to be a whole one, another
 * opcode, transport version or QP), that does not open (dropped), or that opens to something
 * other than a whole data packet's datagram DATA_SKIP bytes into it. Returns (opened, reason,
 * start, stop): `opened` segments opened whole; reason the drop reason of the one after them
 * (it is dropped: the caller counts it) or None; start and stop, with reason None: where the
 * one after them lies unsealed in `view` when it opened to another form (both 0 otherwise). */
static PyObject *open_train(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    if (nargs != 10) {
        PyErr_Format(PyExc_TypeError, "open_train takes 10 arguments (%zd given)", nargs);
        return NULL;
    }
    Py_ssize_t off = PyLong_AsSsize_t(args[1]);
    if (off == -1 && PyErr_Occurred())
        return NULL;
    Py_ssize_t seg = PyLong_AsSsize_t(args[2]);
    if (seg == -1 && PyErr_Occurred())
        return NULL;
    Py_ssize_t cap = PyLong_AsSsize_t(args[3]);
    if (cap == -1 && PyErr_Occurred())
        return NULL;
    long qpn = PyLong_AsLong(args[4]);
    if (qpn == -1 && PyErr_Occurred())
        return NULL;
    const char *kid = kid_arg(args[5]);
    if (kid == NULL)
        return NULL;
    GcmKeyObject *hk = key_arg(args[6]), *pk = key_arg(args[7]);
    if (hk == NULL || pk == NULL)
        return NULL;
    PyObject *window = args[8];
    int encrypt = PyObject_IsTrue(args[9]);
    if (encrypt < 0)
        return NULL;
    if (seg < 1 || off < 0 || cap < 0) {
        PyErr_SetString(PyExc_ValueError, "seg must be positive, off and cap not negative");
        return NULL;
    }
    PyObject *top_obj = PyObject_GetAttrString(window, "top");
    if (top_obj == NULL)
        return NULL;
    unsigned long long top = PyLong_AsUnsignedLongLong(top_obj);
    Py_DECREF(top_obj);
    if (top == (unsigned long long)-1 && PyErr_Occurred())
        return NULL;
    PyObject *seen_obj = PyObject_GetAttrString(window, "seen");
    if (seen_obj == NULL)
        return NULL;
    Py_buffer db, sb;
    if (PyObject_GetBuffer(seen_obj, &sb, PyBUF_WRITABLE) < 0) {
        Py_DECREF(seen_obj);
        return NULL;
    }
    if (PyObject_GetBuffer(args[0], &db, PyBUF_WRITABLE) < 0) {
        PyBuffer_Release(&sb);
        Py_DECREF(seen_obj);
        return NULL;
    }
    PyObject *result = NULL;
    unsigned long long top0 = top;
    unsigned char *d = (unsigned char *)db.buf;
    Py_ssize_t n = db.len, o = off, opened = 0, ostart = 0, ostop = 0;
    const char *why = NULL;
    int rc = 0;
    if (sb.len == 0) {
        PyErr_SetString(PyExc_ValueError, "the replay window is empty");
        goto done;
    }
    if (off > n) {
        PyErr_SetString(PyExc_ValueError, "off is past the train's end");
        goto done;
    }
    while (o < n && opened < cap) {
        Py_ssize_t len = n - o < seg ? n - o : seg;
        unsigned char *p = d + o;
        if (len < DATA_SKIP + DATA_HDR_LEN || p[0] != OP_WRITE ||
            (p[1] & 0x0F) != MRC_TVER || ((long)p[5] << 16 | (long)p[6] << 8 | p[7]) != qpn)
            break;
        Py_ssize_t start = 0, stop = 0;
        rc = open_one(p, len, DATA_HDR_LEN, kid, hk, pk, sb.buf, (unsigned long long)sb.len,
                      &top, encrypt, 1, &start, &stop, &why);
        if (rc != 0)
            break;
        if (stop - start != len - DATA_SKIP) {
            ostart = o + start;
            ostop = o + stop;
            break;
        }
        o += len;
        opened++;
    }
    if (rc >= 0) {
        if (rc > 0)
            result = Py_BuildValue("(nsnn)", opened, why, (Py_ssize_t)0, (Py_ssize_t)0);
        else
            result = Py_BuildValue("(nOnn)", opened, Py_None, ostart, ostop);
    }
done:
    PyBuffer_Release(&db);
    PyBuffer_Release(&sb);
    Py_DECREF(seen_obj);
    if (top != top0) {
        /* the counters taken are in the ring already: the window's top must follow, whatever
         * happens after them (an exception raised stays raised) */
        PyObject *type, *value, *tb;
        PyErr_Fetch(&type, &value, &tb);
        PyObject *t = PyLong_FromUnsignedLongLong(top);
        if (t == NULL || PyObject_SetAttrString(window, "top", t) < 0)
            Py_CLEAR(result);
        Py_XDECREF(t);
        if (type != NULL) {
            PyErr_Clear(); /* the first failure is the one to report */
            PyErr_Restore(type, value, tb);
        }
    }
    return result;
}

static PyMethodDef methods[] = {
    {"seal_packet", (PyCFunction)(void (*)(void))seal_packet, METH_FASTCALL,
     "The two parts of one protected datagram (see mrc/security/packet.py)."},
    {"open_in_place", (PyCFunction)(void (*)(void))open_in_place, METH_FASTCALL,
     "Check and unprotect one datagram in its receive buffer (see mrc/security/packet.py)."},
    {"seal_burst", (PyCFunction)(void (*)(void))seal_burst, METH_FASTCALL,
     "A burst's datagrams sealed in one call (see mrc/security/trains.py)."},
    {"open_train", (PyCFunction)(void (*)(void))open_train, METH_FASTCALL,
     "A train's WRITEs to one QP opened in place in one call (see mrc/security/trains.py)."},
    {NULL, NULL, 0, NULL},
};

/* The same number as mrc/_native.c's: mrc/native.py uses the two only together, and only when
 * both are its own KERNEL_VERSION. 7 = this extension (the kernels and their AES-GCM); 8 =
 * seal_burst and open_train; 9 = none here (mrc/_native.c: recv_batch returns kernel timestamps);
 * 10 = none here (mrc/_native.c: note_runs and take_ack); 11 = none here (mrc/_native.c:
 * take_acked and take_ack hold send times in C); 12 = none here (mrc/_native.c: record_burst
 * takes an array). */
#define KERNEL_VERSION 12

static int exec_module(PyObject *m)
{
    if (PyType_Ready(&GcmKeyType) < 0)
        return -1;
    Py_INCREF(&GcmKeyType);
    if (PyModule_AddObject(m, "GcmKey", (PyObject *)&GcmKeyType) < 0) {
        Py_DECREF(&GcmKeyType);
        return -1;
    }
    return PyModule_AddIntConstant(m, "KERNEL_VERSION", KERNEL_VERSION);
}

static PyModuleDef_Slot slots[] = {
    {Py_mod_exec, exec_module},
    {0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "mrc._native_gcm", "Keyed mode's native kernels, with AES-GCM.",
    0, methods, slots, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__native_gcm(void)
{
    return PyModuleDef_Init(&module);
}
