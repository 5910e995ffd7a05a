/* The two streams a cache key hashes for a string or binary column, in one call per column.
 *
 * The column is read through Arrow's C stream (or array) interface, so that its chunks cost no
 * Python call each. Its length stream gives each value one byte when its length is under 254,
 * else the byte 255 and the length as 8 little-endian bytes; a null is the byte 254. Values
 * and nulls are in that one stream whatever the offsets' width, the chunking or the slicing.
 * The data stream is the values' bytes as they lie, less any bytes a null slot spans (Arrow
 * leaves them undefined). Both go to the caller's hashers' update methods, the length stream a
 * scratch buffer at a time (it stays in the CPU's cache until hashed). Twin of
 * caching.columns._column_numpy, which must give the same streams.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

/* Arrow's C data interface (https://arrow.apache.org/docs/format/CDataInterface.html): an ABI,
 * stable by the specification, so the structures are declared here rather than included. */
struct ArrowSchema {
    const char *format, *name, *metadata;
    int64_t flags, n_children;
    struct ArrowSchema **children, *dictionary;
    void (*release)(struct ArrowSchema *);
    void *private_data;
};

struct ArrowArray {
    int64_t length, null_count, offset, n_buffers, n_children;
    const void **buffers;
    struct ArrowArray **children, *dictionary;
    void (*release)(struct ArrowArray *);
    void *private_data;
};

struct ArrowArrayStream {
    int (*get_schema)(struct ArrowArrayStream *, struct ArrowSchema *);
    int (*get_next)(struct ArrowArrayStream *, struct ArrowArray *);
    const char *(*get_last_error)(struct ArrowArrayStream *);
    void (*release)(struct ArrowArrayStream *);
    void *private_data;
};

/* Where the compiler can, AVX-512 and AVX2 clones of the chunk loop, picked at load time. */
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__linux__)
#define CLONES __attribute__((target_clones("arch=x86-64-v4", "avx2", "default")))
#else
#define CLONES
#endif

#define GROUP 64           /* values per step: one 64-bit word of the validity bitmap */
#define SCRATCH (1 << 15)  /* bytes of the length stream hashed per update */
/* Bytes of offsets prefetched ahead, every cache line of them: on flights' string columns, read
 * from memory, 8 KiB took the pass from 1.3x the time of an xxh3 pass over the same offsets to
 * 1.0x (2 KiB: 1.2x, 32 KiB: 1.25x). */
#define AHEAD 8192
#define NULL_CODE 254
#define LONG_CODE 255

typedef struct {
    PyObject *lengths_update, *data_update;
    uint8_t *buf;
    Py_ssize_t used;
    int64_t *spans;  /* the current chunk's null slots that span bytes: (start, stop) pairs */
    Py_ssize_t n_spans, cap_spans;
} Sink;

/* Hand [p, p + size) to an update method; the memoryview is released before the memory can be
 * (the hashers keep no reference to what they are given). */
static int feed(PyObject *update, const void *p, Py_ssize_t size) {
    if (size <= 0) return 0;
    PyObject *view = PyMemoryView_FromMemory((char *)p, size, PyBUF_READ);
    if (view == NULL) return -1;
    PyObject *r = PyObject_CallOneArg(update, view);
    Py_DECREF(view);
    if (r == NULL) return -1;
    Py_DECREF(r);
    return 0;
}

static int flush(Sink *s) {
    int rc = feed(s->lengths_update, s->buf, s->used);
    s->used = 0;
    return rc;
}

static int add_span(Sink *s, int64_t start, int64_t stop) {
    if (s->n_spans && s->spans[2 * s->n_spans - 1] == start) {  /* adjacent: extend */
        s->spans[2 * s->n_spans - 1] = stop;
        return 0;
    }
    if (s->n_spans == s->cap_spans) {
        Py_ssize_t cap = s->cap_spans ? 2 * s->cap_spans : 16;
        int64_t *grown = PyMem_Realloc(s->spans, (size_t)cap * 2 * sizeof(int64_t));
        if (grown == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        s->spans = grown, s->cap_spans = cap;
    }
    s->spans[2 * s->n_spans] = start, s->spans[2 * s->n_spans + 1] = stop;
    s->n_spans++;
    return 0;
}

/* The validity bits of slots [bit, bit + count), count <= 64, read without passing the end
 * of a bitmap of `size` bytes. */
static inline uint64_t bits_at(const uint8_t *v, int64_t size, int64_t bit, int64_t count) {
    const uint8_t *p = v + (bit >> 3);
    int shift = (int)(bit & 7);
    int64_t left = size - (bit >> 3);
    uint64_t word, high;
    if (left >= 9) {
        memcpy(&word, p, 8);
        high = p[8];
    } else {
        uint8_t tmp[9] = {0};
        memcpy(tmp, p, (size_t)left);
        memcpy(&word, tmp, 8);
        high = tmp[8];
    }
    if (shift) word = (word >> shift) | (high << (64 - shift));
    return count == 64 ? word : word & ((UINT64_C(1) << count) - 1);
}

#define OFFSET(i) (wide ? ((const int64_t *)offsets)[i] : (int64_t)((const int32_t *)offsets)[i])

/* A group the fast loop left: escapes for long values, codes for nulls (and their spans). */
static Py_ssize_t slow_group(Sink *s, uint8_t *dst, const void *offsets, int wide,
                             int64_t first, int64_t count, uint64_t valid) {
    uint8_t *out = dst;
    for (int64_t j = 0; j < count; j++) {
        int64_t start = OFFSET(first + j), stop = OFFSET(first + j + 1);
        if (stop < start) {
            PyErr_SetString(PyExc_ValueError, "string column: offsets decrease");
            return -1;
        }
        uint64_t length = (uint64_t)(stop - start);
        if (!(valid >> j & 1)) {
            *out++ = NULL_CODE;
            if (length && add_span(s, start, stop) < 0) return -1;
        } else if (length < NULL_CODE) {
            *out++ = (uint8_t)length;
        } else {
            *out++ = LONG_CODE;
            for (int k = 0; k < 8; k++) *out++ = (uint8_t)(length >> (8 * k));
        }
    }
    return out - dst;
}

/* A group of 64 values: each length saturated to a byte; whether one is 254 or more. Written
 * for the vectoriser: a fixed count, and the test on the byte rather than on the length. */
static inline int group64(uint8_t *restrict dst, const int64_t *restrict o) {
    uint8_t big = 0;
    for (int j = 0; j < GROUP; j++) {
        uint64_t d = (uint64_t)o[j + 1] - (uint64_t)o[j];
        uint8_t code = d < LONG_CODE ? (uint8_t)d : LONG_CODE;
        dst[j] = code;
        big |= code >= NULL_CODE;
    }
    return big;
}

static inline int group32(uint8_t *restrict dst, const int32_t *restrict o) {
    uint8_t big = 0;
    for (int j = 0; j < GROUP; j++) {
        uint32_t d = (uint32_t)o[j + 1] - (uint32_t)o[j];
        uint8_t code = d < LONG_CODE ? (uint8_t)d : LONG_CODE;
        dst[j] = code;
        big |= code >= NULL_CODE;
    }
    return big;
}

/* One chunk's lengths into the sink, 64 values a step: the step is redone value by value only
 * when a length is 254 or more, and a null's byte is patched in place. The last, partial step
 * goes value by value. */
CLONES static int chunk_lengths(Sink *s, const void *offsets, int wide, int64_t first,
                                int64_t n, const uint8_t *validity) {
    int64_t vsize = (first + n + 7) >> 3;
    for (int64_t i = 0; i < n; i += GROUP) {
        int64_t count = n - i < GROUP ? n - i : GROUP;
        if (s->used + 9 * GROUP > SCRATCH && flush(s) < 0) return -1;
        uint8_t *dst = s->buf + s->used;
        uint64_t all = count == GROUP ? ~UINT64_C(0) : (UINT64_C(1) << count) - 1;
        uint64_t valid = validity ? bits_at(validity, vsize, first + i, count) : all;
        int big = 1;
        if (count == GROUP && wide) {
            const int64_t *o = (const int64_t *)offsets + first + i;
            for (int line = 0; line < GROUP * 8; line += 64)
                __builtin_prefetch((const char *)o + AHEAD + line);
            big = group64(dst, o);
        } else if (count == GROUP) {
            const int32_t *o = (const int32_t *)offsets + first + i;
            for (int line = 0; line < GROUP * 4; line += 64)
                __builtin_prefetch((const char *)o + AHEAD + line);
            big = group32(dst, o);
        }
        if (!big) {  /* each byte is its value's length: nulls are patched in place */
            for (uint64_t nulls = ~valid & all; nulls; nulls &= nulls - 1) {
                int j = __builtin_ctzll(nulls);
                if (dst[j] && add_span(s, OFFSET(first + i + j), OFFSET(first + i + j + 1)) < 0)
                    return -1;
                dst[j] = NULL_CODE;
            }
            s->used += count;
            continue;
        }
        Py_ssize_t written = slow_group(s, dst, offsets, wide, first + i, count, valid);
        if (written < 0) return -1;
        s->used += written;
    }
    return 0;
}

static int chunk(Sink *s, const struct ArrowArray *a, int wide) {
    if (a->length == 0) return 0;
    if (a->n_buffers != 3 || a->buffers[1] == NULL) {
        PyErr_SetString(PyExc_ValueError, "string column: a chunk without offsets");
        return -1;
    }
    const void *offsets = a->buffers[1];
    const uint8_t *validity = a->null_count ? a->buffers[0] : NULL;  /* -1: not counted */
    const uint8_t *data = a->buffers[2];
    int64_t first = a->offset, n = a->length;
    s->n_spans = 0;
    if (chunk_lengths(s, offsets, wide, first, n, validity) < 0) return -1;
    int64_t at = OFFSET(first), stop = OFFSET(first + n);
    for (Py_ssize_t k = 0; k < s->n_spans; k++) {
        if (feed(s->data_update, data + at, s->spans[2 * k] - at) < 0) return -1;
        at = s->spans[2 * k + 1];
    }
    return stop > at ? feed(s->data_update, data + at, stop - at) : 0;
}

/* 1 for 32-bit offsets, 2 for 64-bit ones, 0 (TypeError set) for another type. */
static int width_of(const char *format) {
    if (strcmp(format, "u") == 0 || strcmp(format, "z") == 0) return 1;
    if (strcmp(format, "U") == 0 || strcmp(format, "Z") == 0) return 2;
    PyErr_Format(PyExc_TypeError, "string column: Arrow format '%s' is not a string or binary "
                 "type with offsets", format);
    return 0;
}

static int from_stream(Sink *s, PyObject *capsule) {
    struct ArrowArrayStream *owned = PyCapsule_GetPointer(capsule, "arrow_array_stream");
    if (owned == NULL) return -1;
    struct ArrowArrayStream stream = *owned;  /* moved out: the capsule no longer releases it */
    owned->release = NULL;
    struct ArrowSchema schema = {0};
    int rc = -1, wide;
    if (stream.get_schema(&stream, &schema) != 0) {
        PyErr_Format(PyExc_ValueError, "string column: %s", stream.get_last_error(&stream));
        goto done;
    }
    int width = width_of(schema.format);
    if (!width) goto done;
    wide = width == 2;
    for (;;) {
        struct ArrowArray array = {0};
        if (stream.get_next(&stream, &array) != 0) {
            PyErr_Format(PyExc_ValueError, "string column: %s", stream.get_last_error(&stream));
            goto done;
        }
        if (array.release == NULL) break;  /* the end of the stream */
        int failed = chunk(s, &array, wide) < 0;
        array.release(&array);
        if (failed) goto done;
    }
    rc = 0;
done:
    if (schema.release) schema.release(&schema);
    stream.release(&stream);
    return rc;
}

static int from_array(Sink *s, PyObject *pair) {
    if (!PyTuple_Check(pair) || PyTuple_GET_SIZE(pair) != 2) {
        PyErr_SetString(PyExc_TypeError, "string column: expected an __arrow_c_stream__ capsule "
                        "or an __arrow_c_array__ pair");
        return -1;
    }
    struct ArrowSchema *schema = PyCapsule_GetPointer(PyTuple_GET_ITEM(pair, 0), "arrow_schema");
    struct ArrowArray *owned = PyCapsule_GetPointer(PyTuple_GET_ITEM(pair, 1), "arrow_array");
    if (schema == NULL || owned == NULL) return -1;
    int width = width_of(schema->format);
    if (!width) return -1;
    struct ArrowArray array = *owned;
    owned->release = NULL;
    int rc = chunk(s, &array, width == 2);
    array.release(&array);
    return rc;
}

/* column(source, lengths_update, data_update) -> None
 *
 * source: a string or binary column's ChunkedArray.__arrow_c_stream__() capsule, or an
 * Array.__arrow_c_array__() pair (string_view columns are cast before). */
static PyObject *column(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "column takes 3 arguments");
        return NULL;
    }
    Sink s = {args[1], args[2], PyMem_Malloc(SCRATCH), 0, NULL, 0, 0};
    if (s.buf == NULL) return PyErr_NoMemory();
    int rc = PyCapsule_CheckExact(args[0]) ? from_stream(&s, args[0]) : from_array(&s, args[0]);
    if (rc == 0) rc = flush(&s);
    PyMem_Free(s.buf);
    PyMem_Free(s.spans);
    if (rc < 0) return NULL;
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"column", (PyCFunction)(void (*)(void))column, METH_FASTCALL,
     "column(source, lengths_update, data_update) -> None"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_lengths",
                                    "The length and data streams of string columns, for cache "
                                    "keys.", -1, methods};

PyMODINIT_FUNC PyInit__lengths(void) { return PyModule_Create(&module); }
