/* Dictionary codes of a string column with few distinct values, for compressed frames.
 *
 * Arrow's dictionary_encode spends 3-5 ms on one of flights' string columns (336,776 values,
 * 3 to 6,936 distinct): most of a store's packing. Here one open-addressing table of the
 * distinct values, hashed a word at a time, walks the column's chunks once without the GIL
 * (the store's worker threads pack other columns meanwhile). Twin of
 * serializers._arrow.packing._dictionary's Arrow path, which gives the same codes.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    Py_buffer offsets, data, validity;
    Py_ssize_t first, count;
    int wide, has_validity;
} Chunk;

/* A slot holds what a probe compares, so that most probes read one cache line. */
typedef struct {
    uint64_t head; /* the value's first word (see hash_bytes) */
    uint32_t hash;
    uint32_t code; /* code + 1; 0: empty */
} Slot;

typedef struct {
    Slot *slots;          /* at hash & mask, then the next free one */
    const uint8_t **keys; /* by code: where the value's bytes are, and how many */
    uint32_t *lengths;
    int64_t *rows;        /* by code: the row of its first occurrence (over all chunks) */
    size_t mask, size, limit;
} Table;

/* The bytes p[0:n] (n < 8) as a word, zero above them; end: where p's buffer ends (a whole
 * word is loaded, and masked, where the buffer holds one). */
static inline uint64_t tail_word(const uint8_t *p, size_t n, const uint8_t *end) {
    uint64_t w = 0;
    if (n == 0) return 0;
    if (end - p >= 8) {
        memcpy(&w, p, 8);
        return w & (~0ull >> (64 - 8 * n));
    }
    memcpy(&w, p, n);
    return w;
}

/* Murmur3's finaliser: every output bit depends on every input bit (a product's low bits
 * depend only on its factors' low bits, and the table is indexed by the low bits). */
static inline uint64_t mix(uint64_t h) {
    h ^= h >> 33;
    h *= 0xFF51AFD7ED558CCDull;
    h ^= h >> 33;
    h *= 0xC4CEB9FE1A85EC53ull;
    return h ^ (h >> 33);
}

/* A hash of p[0:n] and, in *head, its first word (its bytes, zero above them if n < 8). */
static inline uint64_t hash_bytes(const uint8_t *p, size_t n, const uint8_t *end,
                                  uint64_t *head) {
    uint64_t h = n * 0x9E3779B97F4A7C15ull;
    if (n < 8) {
        *head = tail_word(p, n, end);
        return mix(h ^ *head);
    }
    memcpy(head, p, 8);
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        h = (h ^ w) * 0x9E3779B97F4A7C15ull;
        h ^= h >> 29;
        p += 8;
        n -= 8;
    }
    return mix(h ^ tail_word(p, n, end));
}

/* Are a[0:n] and b[0:n] equal? (memcmp is a call, for a dozen bytes) */
static inline int same(const uint8_t *a, const uint8_t *b, size_t n) {
    for (; n >= 8; a += 8, b += 8, n -= 8) {
        uint64_t x, y;
        memcpy(&x, a, 8);
        memcpy(&y, b, 8);
        if (x != y) return 0;
    }
    while (n--)
        if (*a++ != *b++) return 0;
    return 1;
}

static int grow(Table *t) {
    size_t capacity = (t->mask + 1) * 2;
    Slot *slots = calloc(capacity, sizeof(Slot));
    if (!slots) return -1;
    for (size_t at = 0; at <= t->mask; at++) {
        if (!t->slots[at].code) continue;
        size_t to = t->slots[at].hash & (capacity - 1);
        while (slots[to].code) to = (to + 1) & (capacity - 1);
        slots[to] = t->slots[at];
    }
    free(t->slots);
    t->slots = slots;
    t->mask = capacity - 1;
    return 0;
}

/* The code of value p[0:n] at row, added if new; -1: out of memory, -2: over the limit.
 * end: where p's buffer ends. */
static int64_t code_of(Table *t, const uint8_t *p, uint32_t n, const uint8_t *end,
                       int64_t row) {
    uint64_t head;
    uint32_t h = (uint32_t)hash_bytes(p, n, end, &head);
    size_t at = h & t->mask;
    for (;;) {
        Slot *slot = &t->slots[at];
        if (!slot->code) break;
        uint32_t code = slot->code - 1;
        if (slot->hash == h && slot->head == head && t->lengths[code] == n &&
            (n <= 8 || same(t->keys[code] + 8, p + 8, n - 8)))
            return code;
        at = (at + 1) & t->mask;
    }
    if (t->size >= t->limit) return -2;
    size_t code = t->size++;
    t->keys[code] = p;
    t->lengths[code] = n;
    t->rows[code] = row;
    t->slots[at] = (Slot){head, h, (uint32_t)code + 1};
    if (t->size * 2 > t->mask + 1 && grow(t) < 0) return -1;
    return (int64_t)code;
}

/* Codes of one chunk into out; -1: no memory, -2: over the limit, -3: bad offsets. */
static int encode_chunk(Table *t, const Chunk *c, int32_t *out, uint8_t *valid, int64_t row) {
    const uint8_t *data = c->data.buf;
    const uint8_t *bits = c->validity.buf;
    Py_ssize_t size = c->data.len;
    for (Py_ssize_t i = 0; i < c->count; i++) {
        Py_ssize_t at = c->first + i;
        int64_t start, end;
        if (c->has_validity && !(bits[at >> 3] >> (at & 7) & 1)) {
            out[i] = 0;
            continue;
        }
        if (c->wide) {
            start = ((const int64_t *)c->offsets.buf)[at];
            end = ((const int64_t *)c->offsets.buf)[at + 1];
        } else {
            start = ((const int32_t *)c->offsets.buf)[at];
            end = ((const int32_t *)c->offsets.buf)[at + 1];
        }
        if (start < 0 || end < start || end > size || end - start > UINT32_MAX) return -3;
        int64_t code = code_of(t, data + start, (uint32_t)(end - start), data + size, row + i);
        if (code < 0) return (int)code;
        out[i] = (int32_t)code;
        if (valid) valid[(row + i) >> 3] |= (uint8_t)(1u << ((row + i) & 7));
    }
    return 0;
}

static void release(Chunk *chunks, Py_ssize_t n) {
    for (Py_ssize_t k = 0; k < n; k++) {
        PyBuffer_Release(&chunks[k].offsets);
        PyBuffer_Release(&chunks[k].data);
        if (chunks[k].has_validity) PyBuffer_Release(&chunks[k].validity);
    }
}

static int take_chunk(PyObject *item, Chunk *c) {
    PyObject *offsets, *data, *validity;
    if (!PyArg_ParseTuple(item, "OOOnnp", &offsets, &data, &validity, &c->first, &c->count,
                          &c->wide))
        return -1;
    if (c->first < 0 || c->count < 0) {
        PyErr_SetString(PyExc_ValueError, "codes: negative first or count");
        return -1;
    }
    if (PyObject_GetBuffer(offsets, &c->offsets, PyBUF_SIMPLE) < 0) return -1;
    if (PyObject_GetBuffer(data, &c->data, PyBUF_SIMPLE) < 0) {
        PyBuffer_Release(&c->offsets);
        return -1;
    }
    c->has_validity = validity != Py_None;
    if (c->has_validity && PyObject_GetBuffer(validity, &c->validity, PyBUF_SIMPLE) < 0) {
        PyBuffer_Release(&c->offsets);
        PyBuffer_Release(&c->data);
        return -1;
    }
    Py_ssize_t width = c->wide ? 8 : 4;
    int short_validity = c->has_validity && c->validity.len * 8 < c->first + c->count;
    if (c->offsets.len / width < c->first + c->count + 1 || short_validity) {
        PyBuffer_Release(&c->offsets);
        PyBuffer_Release(&c->data);
        if (c->has_validity) PyBuffer_Release(&c->validity);
        PyErr_SetString(PyExc_ValueError, "codes: a buffer is shorter than its chunk");
        return -1;
    }
    return 0;
}

/* codes(chunks, out, valid, limit) -> rows or None
 *
 * chunks: a list of (offsets, data, validity or None, first, count, wide) of a string or
 * binary column's chunks (offsets int64 if wide, else int32; first: the chunk's offset).
 * out: a writable buffer of 4 bytes a row of all chunks, given each row's code (int32; 0 for
 * a null); valid: None, or a zeroed writable buffer of a bit a row, given a set bit for each
 * row that is not null. Codes number the distinct values in order of first occurrence; the
 * result lists the row (over all chunks) where each first occurs, or is None if there are
 * more than limit distinct values. */
static PyObject *codes(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 4 || !PyList_Check(args[0])) {
        PyErr_SetString(PyExc_TypeError, "codes takes a list of chunks, out, valid and limit");
        return NULL;
    }
    Py_ssize_t limit = PyLong_AsSsize_t(args[3]);
    if (limit == -1 && PyErr_Occurred()) return NULL;
    if (limit < 0 || limit > INT32_MAX) {
        PyErr_SetString(PyExc_ValueError, "codes: limit must be within 0 and 2**31 - 1");
        return NULL;
    }
    Py_ssize_t n = PyList_GET_SIZE(args[0]);
    Chunk *chunks = calloc(n ? n : 1, sizeof(Chunk));
    if (!chunks) return PyErr_NoMemory();
    Py_ssize_t taken = 0, rows = 0;
    for (; taken < n; taken++) {
        if (take_chunk(PyList_GET_ITEM(args[0], taken), &chunks[taken]) < 0) {
            release(chunks, taken);
            free(chunks);
            return NULL;
        }
        rows += chunks[taken].count;
    }
    Py_buffer out, valid = {0};
    int has_valid = args[2] != Py_None;
    if (PyObject_GetBuffer(args[1], &out, PyBUF_WRITABLE) < 0) {
        release(chunks, n);
        free(chunks);
        return NULL;
    }
    if (has_valid && PyObject_GetBuffer(args[2], &valid, PyBUF_WRITABLE) < 0) {
        PyBuffer_Release(&out);
        release(chunks, n);
        free(chunks);
        return NULL;
    }
    PyObject *result = NULL;
    if (out.len < rows * 4 || (has_valid && valid.len * 8 < rows)) {
        PyErr_SetString(PyExc_ValueError, "codes: out or valid is too short");
        goto done;
    }
    Table t = {0};
    size_t most = (size_t)limit + 1;
    t.mask = 1023;
    t.limit = (size_t)limit;
    t.slots = calloc(t.mask + 1, sizeof(Slot));
    t.keys = malloc(most * sizeof(uint8_t *));
    t.lengths = malloc(most * sizeof(uint32_t));
    t.rows = malloc(most * sizeof(int64_t));
    int status = 0;
    if (!t.slots || !t.keys || !t.lengths || !t.rows) {
        status = -1;
    } else {
        Py_BEGIN_ALLOW_THREADS
        int64_t row = 0;
        for (Py_ssize_t k = 0; k < n && status == 0; k++) {
            status = encode_chunk(&t, &chunks[k], (int32_t *)out.buf + row,
                                  has_valid ? valid.buf : NULL, row);
            row += chunks[k].count;
        }
        Py_END_ALLOW_THREADS
    }
    if (status == -1) {
        PyErr_NoMemory();
    } else if (status == -3) {
        PyErr_SetString(PyExc_ValueError, "codes: offsets out of order or past the data");
    } else if (status == -2) {
        result = Py_NewRef(Py_None);
    } else {
        result = PyList_New((Py_ssize_t)t.size);
        for (size_t code = 0; result && code < t.size; code++) {
            PyObject *at = PyLong_FromLongLong(t.rows[code]);
            if (!at) Py_CLEAR(result);
            else PyList_SET_ITEM(result, (Py_ssize_t)code, at);
        }
    }
    free(t.slots);
    free(t.keys);
    free(t.lengths);
    free(t.rows);
done:
    PyBuffer_Release(&out);
    if (has_valid) PyBuffer_Release(&valid);
    release(chunks, n);
    free(chunks);
    return result;
}

static PyMethodDef methods[] = {
    {"codes", (PyCFunction)(void (*)(void))codes, METH_FASTCALL,
     "codes(chunks, out, valid, limit) -> first rows of the distinct values, or None"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_codes", NULL, -1, methods};

PyMODINIT_FUNC PyInit__codes(void) { return PyModule_Create(&module); }
