/* The native Avro decoder's container file side: BlockStream and the block scanner (see
 * _cdecode.h). */
#include "_cdecode.h"
#include <dlfcn.h>

/* -- raw inflate through the system's libdeflate ------------------------------------------
 * A deflate container file's blocks are inflated inside BlockStream's GIL-released loop when
 * libdeflate is installed: a shared library with a small, stable C interface, opened at run
 * time, so nothing extra is needed to build. Inflating there spares each 16 kB block a Python
 * call that gives the GIL up and takes it back, which two reading threads wait on. Without
 * libdeflate the Python caller inflates (ISA-L or zlib) and feeds BlockStream the result. */

enum { INFLATE_OK = 0, INFLATE_NO_ROOM = 3 }; /* libdeflate_result values */
/* Deflate's largest expansion: a 258-byte match coded in 2 bits is 1032 bytes per byte. */
#define INFLATE_MAX_RATIO 1032

static struct {
    int tried;
    void *(*alloc)(void);
    int (*inflate)(void *, const void *, size_t, void *, size_t, size_t *);
    void (*free)(void *);
} libdeflate;

static void *symbol(void *lib, const char *name) {
    return lib ? dlsym(lib, name) : NULL;
}

/* Whether libdeflate could be opened; called with the GIL held, so it runs once. */
static int inflater_loaded(void) {
    if (!libdeflate.tried) {
        libdeflate.tried = 1;
        void *lib = NULL;
        const char *names[] = {"libdeflate.so.0", "libdeflate.0.dylib", "libdeflate.so"};
        for (size_t k = 0; !lib && k < sizeof names / sizeof *names; k++)
            lib = dlopen(names[k], RTLD_NOW | RTLD_LOCAL);
        void *alloc = symbol(lib, "libdeflate_alloc_decompressor");
        void *inflate = symbol(lib, "libdeflate_deflate_decompress");
        void *release = symbol(lib, "libdeflate_free_decompressor");
        if (alloc && inflate && release) { /* function pointers from dlsym's data pointers */
            memcpy(&libdeflate.alloc, &alloc, sizeof alloc);
            memcpy(&libdeflate.inflate, &inflate, sizeof inflate);
            memcpy(&libdeflate.free, &release, sizeof release);
        } else if (lib) {
            dlclose(lib);
        }
    }
    return libdeflate.alloc != NULL;
}

PyObject *cd_native_inflate(PyObject *self, PyObject *unused) {
    return PyBool_FromLong(inflater_loaded());
}

/* -- a stream of blocks --------------------------------------------------------------------
 * BlockStream decodes blocks handed over one at a time into one set of buffers: a thread that
 * inflates a container file's blocks decodes each one while it is still in the cache and lets
 * it go, instead of holding every inflated block until all are decoded. It only says whether
 * the blocks were good: on a failure the caller decodes the blocks again in file order (with
 * decode_list) to report the first error exactly as the batch decoders do. */

typedef struct {
    PyObject_HEAD
    CPlan *plan; /* held: its nodes */
    const Node *nodes;
    int nnodes, busy, failed, finished, presized;
    Ctx *ctx;
    int64_t done;     /* bytes decoded */
    int64_t max_done; /* bytes a deflated stream may inflate to in all, or -1: no limit */
    void *inflater;   /* a libdeflate decompressor: blocks come deflated */
    uint8_t *inflated; /* the block being decoded, inflated */
    size_t inflated_cap;
} Stream;

static void stream_dealloc(Stream *self) {
    if (self->inflater) libdeflate.free(self->inflater);
    free(self->inflated);
    if (self->ctx) cd_free_cols(self->ctx->cols, self->nnodes);
    free(self->ctx);
    Py_XDECREF(self->plan);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int stream_init(Stream *self, PyObject *args, PyObject *kwds) {
    CPlan *plan;
    int validate_utf8, deflated = 0;
    if (!PyArg_ParseTuple(args, "O!p|p", &cd_PlanType, &plan, &validate_utf8, &deflated))
        return -1;
    if (self->nodes) {
        PyErr_SetString(PyExc_RuntimeError, "BlockStream is already initialised");
        return -1;
    }
    if (deflated) {
        if (!inflater_loaded()) {
            PyErr_SetString(PyExc_RuntimeError, "deflated blocks need libdeflate, which the "
                            "system does not have");
            return -1;
        }
        if (!self->inflater && !(self->inflater = libdeflate.alloc())) {
            PyErr_NoMemory();
            return -1;
        }
    }
    Py_INCREF(plan);
    self->plan = plan;
    const Node *nodes = self->nodes = plan->nodes;
    int nnodes = self->nnodes = plan->nnodes;
    self->ctx = cd_zalloc_lines(sizeof(Ctx));
    if (!self->ctx) {
        PyErr_NoMemory();
        return -1;
    }
    Ctx *c = self->ctx;
    c->nodes = nodes, c->nnodes = nnodes, c->validate_utf8 = validate_utf8;
    c->cols = cd_zalloc_lines((size_t)nnodes * sizeof(Col));
    if (!c->cols || cd_reset_cols(c)) {
        PyErr_NoMemory();
        return -1;
    }
    return 0;
}

/* Inflate seg into self->inflated, growing it (and inflating again) while it is too small, up
 * to deflate's largest expansion of the block and what is left of max_done; the inflated size,
 * or -1 if the block is not raw deflate data, inflates past that, or memory runs out. */
static int64_t inflate_block(Stream *self, const Seg *seg) {
    size_t in = (size_t)seg->len, got = 0;
    if (in > (SIZE_MAX - 65536) / INFLATE_MAX_RATIO) return -1;
    size_t limit = in * INFLATE_MAX_RATIO + 65536;
    if (self->max_done >= 0) {
        int64_t room = self->max_done - self->done;
        if (room < 1) room = 1;
        if ((uint64_t)room < limit) limit = (size_t)room;
    }
    for (;;) {
        if (self->inflated_cap) {
            int r = libdeflate.inflate(self->inflater, seg->ptr, in, self->inflated,
                                       self->inflated_cap, &got);
            if (r == INFLATE_OK) return got > limit ? -1 : (int64_t)got;
            if (r != INFLATE_NO_ROOM || self->inflated_cap >= limit) return -1;
        }
        size_t cap = self->inflated_cap ? self->inflated_cap : 32768; /* doubled at least once */
        do cap = cap > limit / 2 ? limit : cap * 2;
        while (cap < in * 4 && cap < limit);
        free(self->inflated);
        self->inflated_cap = 0;
        if (!(self->inflated = malloc(cap))) return -1;
        self->inflated_cap = cap;
    }
}

/* Inflate and decode segs[0, n) one at a time, each while it is in the cache; sizes the
 * buffers once a 32nd of the whole is decoded, at the ratio of inflated to deflated bytes
 * seen so far in this call. */
static void feed_deflated(Stream *self, const Seg *segs, Py_ssize_t n) {
    Ctx *c = self->ctx;
    int64_t packed = 0, packed_done = 0, unpacked_done = 0;
    for (Py_ssize_t i = 0; i < n; i++) packed += segs[i].len;
    for (Py_ssize_t i = 0; i < n && !self->failed; i++) {
        int64_t got = inflate_block(self, &segs[i]);
        if (got < 0) {
            self->failed = 1;
            break;
        }
        packed_done += segs[i].len;
        unpacked_done += got;
        int64_t left = got + (int64_t)((double)(packed - packed_done) * (double)unpacked_done
                                       / (double)packed_done);
        if (!self->presized && self->done > 0 && self->done * 32 >= self->done + left) {
            cd_presize(c, self->done, left, PRESIZE_MARGIN);
            self->presized = 1;
        }
        Seg one = {self->inflated, got, segs[i].count};
        c->segs = &one, c->seg_begin = 0, c->seg_end = 1, c->all_bytes = 0;
        cd_run_range(c);
        self->done += got;
        if (c->err || c->utf8_bad || (c->validate_utf8 && !cd_strings_valid(c)))
            self->failed = 1;
    }
}

/* feed(blocks, counts, bytes_left[, max_done]): decode counts[i] datums that fill blocks[i]
 * exactly (once inflated, for a deflated stream: to max_done bytes in all, if given), for each
 * block in turn; bytes_left guesses the decoded bytes of these blocks and the ones after them
 * (0: unknown; a deflated stream guesses itself), to size the buffers once. Several blocks per call: a call takes the GIL back, which another
 * thread of the caller may hold. Returns whether every block so far was good. */
static PyObject *stream_feed(Stream *self, PyObject *args) {
    PyObject *blocks, *counts;
    long long left, max_done = -1;
    if (!self->ctx || self->finished || self->busy) {
        PyErr_SetString(PyExc_RuntimeError, "BlockStream is not ready to feed");
        return NULL;
    }
    if (!PyArg_ParseTuple(args, "OOL|L", &blocks, &counts, &left, &max_done)) return NULL;
    self->max_done = max_done < 0 ? -1 : max_done;
    PyObject *bs = PySequence_Fast(blocks, "blocks must be a sequence");
    PyObject *cs = bs ? PySequence_Fast(counts, "counts must be a sequence") : NULL;
    Py_ssize_t n = bs ? PySequence_Fast_GET_SIZE(bs) : 0, held = 0;
    Seg *segs = cs ? calloc((size_t)n + 1, sizeof(Seg)) : NULL;
    Py_buffer *views = segs ? calloc((size_t)n + 1, sizeof(Py_buffer)) : NULL;
    PyObject *result = NULL;
    if (cs && (!segs || !views)) PyErr_NoMemory();
    if (views && PySequence_Fast_GET_SIZE(cs) != n)
        PyErr_SetString(PyExc_ValueError, "one count per block");
    int64_t bytes = 0;
    for (; views && !PyErr_Occurred() && held < n; held++) {
        long long count = PyLong_AsLongLong(PySequence_Fast_GET_ITEM(cs, held));
        if (count < 0) {
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_ValueError, "block counts must not be negative");
            break;
        }
        if (PyObject_GetBuffer(PySequence_Fast_GET_ITEM(bs, held), &views[held],
                               PyBUF_C_CONTIGUOUS) < 0)
            break;
        segs[held] = (Seg){(const uint8_t *)views[held].buf, (int64_t)views[held].len, count};
        bytes += views[held].len;
    }
    if (views && !PyErr_Occurred()) {
        if (!self->failed && n > 0) {
            Ctx *c = self->ctx;
            c->segs = segs, c->seg_begin = 0, c->seg_end = n, c->all_bytes = 0;
            self->busy = 1;
            Py_BEGIN_ALLOW_THREADS
            if (self->inflater) {
                feed_deflated(self, segs, n);
            } else {
                /* left counts these blocks: size once a 32nd of the guessed whole is decoded */
                if (!self->presized && left > 0 && self->done > 0 &&
                    self->done * 32 >= self->done + left) {
                    cd_presize(c, self->done, left, PRESIZE_MARGIN);
                    self->presized = 1;
                }
                cd_run_range(c);
                self->done += bytes;
                if (c->err || c->utf8_bad || (c->validate_utf8 && !cd_strings_valid(c)))
                    self->failed = 1;
            }
            Py_END_ALLOW_THREADS
            self->busy = 0;
            c->segs = NULL;
        }
        result = PyBool_FromLong(!self->failed);
    }
    for (Py_ssize_t i = 0; i < held; i++) PyBuffer_Release(&views[i]);
    free(views);
    free(segs);
    Py_XDECREF(cs);
    Py_XDECREF(bs);
    return result;
}

/* finish(): the batch, as decode_list's result gives it (cd_result); None if a block was bad. */
static PyObject *stream_finish(Stream *self, PyObject *unused) {
    if (!self->ctx || self->finished || self->busy) {
        PyErr_SetString(PyExc_RuntimeError, "BlockStream is not ready to finish");
        return NULL;
    }
    self->finished = 1;
    if (self->failed) Py_RETURN_NONE;
    return cd_result(self->plan, self->ctx->cols);
}

static PyMethodDef stream_methods[] = {
    {"feed", (PyCFunction)stream_feed, METH_VARARGS,
     "feed(blocks, counts, bytes_left[, max_done]) -> whether every block so far was good"},
    {"finish", (PyCFunction)stream_finish, METH_NOARGS,
     "finish() -> the batch as decode_list gives it, or None if a block was bad"},
    {NULL, NULL, 0, NULL},
};

PyTypeObject cd_StreamType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "arrowstash.avro._native._cdecode.BlockStream",
    .tp_basicsize = sizeof(Stream),
    .tp_dealloc = (destructor)stream_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "BlockStream(plan, validate_utf8, deflated=False): blocks decoded one by one "
              "into one batch (inflated first if deflated).",
    .tp_methods = stream_methods,
    .tp_init = (initproc)stream_init,
    .tp_new = PyType_GenericNew,
};

/* -- container file blocks ------------------------------------------------------------------ */

/* A varint of at most 10 bytes ending before end, as a signed long; 0 if malformed. */
static int scan_long(const uint8_t **pp, const uint8_t *end, int64_t *out) {
    const uint8_t *p = *pp;
    uint64_t v = 0;
    for (int i = 0; i < 10 && p < end; i++) {
        uint8_t b = *p++;
        if (i == 9 && b > 1) return 0;
        v |= (uint64_t)(b & 0x7f) << (7 * i);
        if (b < 0x80) {
            *pp = p;
            *out = (int64_t)((v >> 1) ^ (0 - (v & 1)));
            return 1;
        }
    }
    return 0;
}

/* cd_scan_blocks(data, pos, sync) -> (table, pos): the well-formed blocks from pos on, as int64
 * quadruples (block start, datum count, payload start, payload size), and where the scan
 * stopped: at the end, or at a block it did not accept (the caller's scanner says why). */
PyObject *cd_scan_blocks(PyObject *self, PyObject *args) {
    Py_buffer data, sync;
    Py_ssize_t pos;
    if (!PyArg_ParseTuple(args, "y*ny*", &data, &pos, &sync)) return NULL;
    PyObject *result = NULL;
    Buf out = {0};
    if (sync.len != 16 || pos < 0 || pos > data.len) {
        PyErr_SetString(PyExc_ValueError, "bad sync marker or position");
        goto done;
    }
    const uint8_t *base = data.buf, *end = base + data.len, *p = base + pos;
    while (p < end) {
        const uint8_t *q = p;
        int64_t rec[4];
        if (!scan_long(&q, end, &rec[1]) || rec[1] < 0 || !scan_long(&q, end, &rec[3]) ||
            rec[3] < 0 || rec[3] > end - q || end - q - rec[3] < 16 ||
            memcmp(q + rec[3], sync.buf, 16) != 0)
            break;
        rec[0] = p - base;
        rec[2] = q - base;
        if (buf_put(&out, rec, sizeof rec)) {
            PyErr_NoMemory();
            goto done;
        }
        p = q + rec[3] + 16;
    }
    result = Py_BuildValue("y#n", out.p ? (const char *)out.p : "", (Py_ssize_t)out.len,
                           (Py_ssize_t)(p - base));
done:
    cd_blk_free(out.p, out.cap);
    PyBuffer_Release(&data);
    PyBuffer_Release(&sync);
    return result;
}
