/* Native Avro encoder: Arrow arrays (through the Arrow C Data Interface) -> Avro binary datums.
 *
 * Python (encoder.py) compiles the Avro schema against the input's Arrow types into a plan (a
 * tuple tree of nodes) and normalises every column to the one physical layout each node reads,
 * so this file only walks buffers: validity bitmaps, offsets, values and children. The GIL is
 * released for the whole batch; rows are split across pthreads, each thread writes its rows into
 * its own scratch buffer, then every thread copies its part into the single output buffer.
 *
 * Errors (a value that does not fit the schema) stop the thread that meets them; the earliest
 * row wins, so the result does not depend on the thread count. They come back as a tuple
 * (row, node id, code, element index, value) that Python turns into AvroEncodeError; the
 * pure-Python twin (_encode.py) reports the same tuple for the same input.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the Avro encoder copies little-endian Arrow values as Avro's little-endian floats"
#endif

/* The Arrow C Data Interface (ABI-stable; copied from its specification, no Arrow headers). */
struct ArrowArray {
    int64_t length;
    int64_t null_count;
    int64_t offset;
    int64_t n_buffers;
    int64_t n_children;
    const void **buffers;
    struct ArrowArray **children;
    struct ArrowArray *dictionary;
    void (*release)(struct ArrowArray *);
    void *private_data;
};

/* Node kinds: keep in step with KIND_* in _encode.py. */
enum {
    K_NULL = 0, K_BOOL, K_INT32, K_INT64, K_INT64_AS_INT, K_FLOAT, K_DOUBLE, K_BINARY,
    K_LARGE_BINARY, K_FIXED, K_ENUM, K_ENUM_STRING, K_RECORD, K_ARRAY, K_MAP, K_UNION,
    K_DECIMAL_BYTES, K_DECIMAL_FIXED, K_UUID_STRING, K_DURATION, K_COUNT
};

/* Error codes: keep in step with ERR_* in _encode.py. */
enum { E_NULL = 1, E_INT_RANGE, E_ENUM_INDEX, E_ENUM_SYMBOL, E_UNION, E_DECIMAL, E_DURATION,
       E_NOMEM };

typedef struct Node {
    int kind;
    int64_t id;
    int64_t null_branch;   /* union index written for a null; -1: null is an error */
    int64_t value_branch;  /* union index written before a value; -1: none */
    int64_t p1, p2;        /* fixed size / decimal width / symbol count / sparse flag */
    int n_kids;
    struct Node *kids;
    const char **sym;      /* K_ENUM_STRING: the symbols */
    Py_ssize_t *sym_len;
} Node;

struct Bound;
struct Writer;
typedef int (*EncFn)(struct Writer *, const struct Bound *, int64_t);

typedef struct Bound {
    int op;                /* n->kind, or K_COUNT when a null or a union index may come first */
    EncFn value_fn;        /* encodes a (non-null) value of kinds not inlined in enc_element */
    int nullable_or_branch; /* may be null, or writes a union index first */
    int null_byte, value_byte; /* zigzag union index of a null / before a value; -1: none */
    const Node *n;
    const uint8_t *valid;  /* NULL when no element is null */
    const uint8_t *b1;     /* values, offsets or type ids */
    const uint8_t *b2;     /* string data or union offsets */
    const uint8_t *data_end; /* K_BINARY/K_ENUM_STRING: end of the last string */
    int64_t off;
    int n_kids;
    struct Bound *kids;
} Bound;

typedef struct {
    Bound *root;
    int64_t length;
    int64_t first_row;
} Segment;

typedef struct Writer {
    uint8_t *base, *p, *end;
    int owned;              /* base was malloc'd here (the scratch outgrew its Arrow buffer) */
    int64_t row;
    int failed;
    int64_t err_row, err_node, err_code, err_index, err_value;
} Writer;

/* ---------------------------------------------------------------- writing primitives */

static __attribute__((noinline, cold)) int grow(Writer *w, size_t need) {
    size_t used = (size_t)(w->p - w->base);
    size_t cap = (size_t)(w->end - w->base);
    size_t want = cap ? cap * 2 : 1 << 16;
    while (want - used < need) want *= 2;
    uint8_t *nb = w->owned ? realloc(w->base, want) : malloc(want);
    if (nb != NULL && !w->owned && used) memcpy(nb, w->base, used);
    if (nb == NULL) {
        w->failed = 1;
        w->err_row = w->row;
        w->err_node = -1;
        w->err_code = E_NOMEM;
        return -1;
    }
    w->base = nb;
    w->p = nb + used;
    w->end = nb + want;
    w->owned = 1;
    return 0;
}

#define ENSURE(w, n)                                                                       \
    do {                                                                                   \
        if (__builtin_expect((size_t)((w)->end - (w)->p) < (size_t)(n), 0) && grow((w), (n)) < 0) \
            return -1;                                                                     \
    } while (0)

static inline void put_varint(Writer *w, uint64_t z) {
    uint8_t *p = w->p;
    if (z < 0x80) { /* most lengths, counts and small ints: one or two bytes, no loop */
        *p = (uint8_t)z;
        w->p = p + 1;
        return;
    }
    if (z < 0x4000) {
        p[0] = (uint8_t)(z | 0x80);
        p[1] = (uint8_t)(z >> 7);
        w->p = p + 2;
        return;
    }
    while (z >= 0x80) {
        *p++ = (uint8_t)(z | 0x80);
        z >>= 7;
    }
    *p++ = (uint8_t)z;
    w->p = p;
}

static inline int put_long(Writer *w, int64_t v) {
    ENSURE(w, 10);
    put_varint(w, ((uint64_t)v << 1) ^ (uint64_t)(v >> 63));
    return 0;
}

/* A length-prefixed string; short ones (most of them) are copied as one 16-byte move when the
 * source has 16 readable bytes, which saves a call into memcpy per value. */
static inline int put_bytes(Writer *w, const uint8_t *src, int64_t n, const uint8_t *src_end) {
    ENSURE(w, (size_t)n + 10 + 16);
    if (n < 64) {
        *w->p++ = (uint8_t)(n << 1);
    } else {
        put_varint(w, (uint64_t)n << 1);
    }
    if (n <= 16 && src + 16 <= src_end) {
        memcpy(w->p, src, 16);
    } else {
        memcpy(w->p, src, (size_t)n);
    }
    w->p += n;
    return 0;
}

static __attribute__((noinline, cold)) int fail(Writer *w, const Node *n, int code,
                                                int64_t index, int64_t value) {
    w->failed = 1;
    w->err_row = w->row;
    w->err_node = n->id;
    w->err_code = code;
    w->err_index = index;
    w->err_value = value;
    return -1;
}

#define BIT(bits, i) (((bits)[(i) >> 3] >> ((i) & 7)) & 1)

static const char HEX[] = "0123456789abcdef";

/* ---------------------------------------------------------------- the encoder */

/* Every bound node gets the small function for its kind at bind time; enc_element writes the
 * common leaves (strings, ints, longs, booleans, floats, doubles) inline through a switch on the
 * kind, and calls the function for the others (containers, logical types).
 * `i` is the element in the node's own coordinates; b->off + i indexes its buffers. */
#define ENC(name) static int name(Writer *w, const Bound *b, int64_t i)
#define CALL(kid, at) enc_element(w, (kid), (at))

static inline int enc_element(Writer *w, const Bound *b, int64_t i);

ENC(enc_null) {
    (void)w; (void)b; (void)i;
    return 0;
}

static inline __attribute__((always_inline)) int enc_bool(Writer *w, const Bound *b, int64_t i) {
    ENSURE(w, 1);
    int64_t p = b->off + i;
    *w->p++ = (uint8_t)BIT(b->b1, p);
    return 0;
}

static inline __attribute__((always_inline)) int enc_int32(Writer *w, const Bound *b, int64_t i) { return put_long(w, ((const int32_t *)b->b1)[b->off + i]); }

static inline __attribute__((always_inline)) int enc_int64(Writer *w, const Bound *b, int64_t i) { return put_long(w, ((const int64_t *)b->b1)[b->off + i]); }

ENC(enc_int64_as_int) {
    int64_t v = ((const int64_t *)b->b1)[b->off + i];
    if (v < INT32_MIN || v > INT32_MAX) return fail(w, b->n, E_INT_RANGE, i, v);
    return put_long(w, v);
}

static inline __attribute__((always_inline)) int enc_float(Writer *w, const Bound *b, int64_t i) {
    ENSURE(w, 4);
    memcpy(w->p, b->b1 + 4 * (b->off + i), 4);
    w->p += 4;
    return 0;
}

static inline __attribute__((always_inline)) int enc_double(Writer *w, const Bound *b, int64_t i) {
    ENSURE(w, 8);
    memcpy(w->p, b->b1 + 8 * (b->off + i), 8);
    w->p += 8;
    return 0;
}

static __attribute__((noinline)) int enc_binary_slow(Writer *w, const Bound *b, int64_t i) {
    const int32_t *o = (const int32_t *)b->b1 + b->off + i;
    return put_bytes(w, b->b2 + o[0], (int64_t)o[1] - o[0], b->data_end);
}

static inline __attribute__((always_inline)) int enc_binary(Writer *w, const Bound *b, int64_t i) {
    /* The common case without calls (so without saving registers): a string of up to 32 (or
     * 63) bytes, copied as one (or two) 32-byte moves when both sides have the room. */
    const int32_t *o = (const int32_t *)b->b1 + b->off + i;
    const uint8_t *src = b->b2 + o[0];
    int64_t n = (int64_t)o[1] - o[0];
    if (n <= 32 && src + 32 <= b->data_end && w->end - w->p >= 33) {
        uint8_t *d = w->p;
        *d = (uint8_t)(n << 1);
        memcpy(d + 1, src, 32);
        w->p = d + 1 + n;
        return 0;
    }
    if (n < 64 && src + 64 <= b->data_end && w->end - w->p >= 65) { /* uuids, emails, urls */
        uint8_t *d = w->p;
        *d = (uint8_t)(n << 1);
        memcpy(d + 1, src, 32);
        memcpy(d + 33, src + 32, 32);
        w->p = d + 1 + n;
        return 0;
    }
    return enc_binary_slow(w, b, i);
}

ENC(enc_large_binary) {
    const int64_t *o = (const int64_t *)b->b1 + b->off + i;
    return put_bytes(w, b->b2 + o[0], o[1] - o[0], b->data_end);
}

ENC(enc_fixed) {
    int64_t size = b->n->p1;
    ENSURE(w, (size_t)size);
    memcpy(w->p, b->b1 + size * (b->off + i), (size_t)size);
    w->p += size;
    return 0;
}

ENC(enc_enum) {
    int32_t v = ((const int32_t *)b->b1)[b->off + i];
    if (v < 0 || v >= b->n->p1) return fail(w, b->n, E_ENUM_INDEX, i, v);
    return put_long(w, v);
}

ENC(enc_enum_string) {
    const Node *n = b->n;
    const int32_t *o = (const int32_t *)b->b1 + b->off + i;
    const uint8_t *s = b->b2 + o[0];
    Py_ssize_t len = o[1] - o[0];
    for (int64_t k = 0; k < n->p1; k++) {
        if (n->sym_len[k] != len) continue;
        const char *sym = n->sym[k];
        Py_ssize_t c = 0;
        while (c < len && sym[c] == (char)s[c]) c++;
        if (c == len) return put_long(w, k);
    }
    return fail(w, n, E_ENUM_SYMBOL, i, 0);
}

/* One element of a node: a null (its union index, or an error), or its index and value.
 * Union indexes below 64 are one byte, precomputed at bind time (-1: none / null refused). */
static inline __attribute__((always_inline)) int enc_leaf(Writer *w, const Bound *b, int64_t i,
                                                          int kind) {
    switch (kind) {
    case K_BINARY: return enc_binary(w, b, i);
    case K_INT32: return enc_int32(w, b, i);
    case K_INT64: return enc_int64(w, b, i);
    case K_BOOL: return enc_bool(w, b, i);
    case K_DOUBLE: return enc_double(w, b, i);
    case K_FLOAT: return enc_float(w, b, i);
    default: return b->value_fn(w, b, i);
    }
}

static __attribute__((noinline)) int enc_optional(Writer *w, const Bound *b, int64_t i) {
    if (b->valid != NULL && !BIT(b->valid, b->off + i)) {
        if (b->null_byte < 0) return fail(w, b->n, E_NULL, i, 0);
        ENSURE(w, 1);
        *w->p++ = (uint8_t)b->null_byte;
        return 0;
    }
    if (b->value_byte >= 0) {
        ENSURE(w, 1);
        *w->p++ = (uint8_t)b->value_byte;
    }
    return enc_leaf(w, b, i, b->n->kind);
}

/* One element of a node: a null (its union index, or an error), or its index and value.
 * Union indexes below 64 are one byte, precomputed at bind time (-1: none / null refused).
 * One switch decides both whether a null or an index may come first and the kind. */
static inline int enc_element(Writer *w, const Bound *b, int64_t i) {
    if (b->op == K_COUNT) return enc_optional(w, b, i);
    return enc_leaf(w, b, i, b->op);
}

ENC(enc_record) {
    int64_t p = b->off + i;
    const Bound *kid = b->kids, *stop = b->kids + b->n_kids;
    for (; kid < stop; kid++)
        if (CALL(kid, p) < 0) return -1;
    return 0;
}

ENC(enc_array) {
    const int32_t *o = (const int32_t *)b->b1 + b->off + i;
    int64_t start = o[0], stop = o[1];
    if (stop > start) {
        if (put_long(w, stop - start) < 0) return -1;
        const Bound *item = &b->kids[0];
        for (int64_t j = start; j < stop; j++)
            if (CALL(item, j) < 0) return -1;
    }
    ENSURE(w, 1);
    *w->p++ = 0;
    return 0;
}

ENC(enc_map) {
    const int32_t *o = (const int32_t *)b->b1 + b->off + i;
    int64_t start = o[0], stop = o[1];
    if (stop > start) {
        if (put_long(w, stop - start) < 0) return -1;
        const Bound *key = &b->kids[0], *value = &b->kids[1];
        for (int64_t j = start; j < stop; j++)
            if (CALL(key, j) < 0 || CALL(value, j) < 0) return -1;
    }
    ENSURE(w, 1);
    *w->p++ = 0;
    return 0;
}

ENC(enc_union) {
    int64_t p = b->off + i;
    int8_t t = ((const int8_t *)b->b1)[p];
    if (t < 0 || t >= b->n_kids) return fail(w, b->n, E_UNION, i, t);
    ENSURE(w, 1);
    *w->p++ = (uint8_t)(t << 1); /* zigzag of a small index: unions have < 64 branches here */
    int64_t at = b->b2 ? ((const int32_t *)b->b2)[p] : p;
    return CALL(&b->kids[t], at);
}

ENC(enc_decimal_bytes) {
    /* Minimal big-endian two's complement, as Java's BigInteger.toByteArray writes it. */
    int width = (int)b->n->p2;
    const uint8_t *le = b->b1 + width * (b->off + i);
    int n = width;
    while (n > 1 && ((le[n - 1] == 0x00 && !(le[n - 2] & 0x80)) ||
                     (le[n - 1] == 0xFF && (le[n - 2] & 0x80))))
        n--;
    ENSURE(w, (size_t)n + 10);
    put_varint(w, (uint64_t)n << 1);
    for (int k = n - 1; k >= 0; k--) *w->p++ = le[k];
    return 0;
}

ENC(enc_decimal_fixed) {
    int width = (int)b->n->p2, size = (int)b->n->p1;
    const uint8_t *le = b->b1 + width * (b->off + i);
    uint8_t sign = (le[width - 1] & 0x80) ? 0xFF : 0x00;
    if (size < width) {
        for (int k = size; k < width; k++)
            if (le[k] != sign) return fail(w, b->n, E_DECIMAL, i, 0);
        if (size == 0 || (le[size - 1] & 0x80) != (sign & 0x80))
            return fail(w, b->n, E_DECIMAL, i, 0);
    }
    ENSURE(w, (size_t)size);
    for (int k = size - 1; k >= 0; k--) *w->p++ = k < width ? le[k] : sign;
    return 0;
}

ENC(enc_uuid_string) {
    const uint8_t *u = b->b1 + 16 * (b->off + i);
    ENSURE(w, 37);
    *w->p++ = 72; /* zigzag(36) */
    for (int k = 0; k < 16; k++) {
        if (k == 4 || k == 6 || k == 8 || k == 10) *w->p++ = '-';
        *w->p++ = (uint8_t)HEX[u[k] >> 4];
        *w->p++ = (uint8_t)HEX[u[k] & 15];
    }
    return 0;
}

ENC(enc_duration) {
    const uint8_t *v = b->b1 + 16 * (b->off + i);
    int32_t months, days;
    int64_t nanos;
    memcpy(&months, v, 4);
    memcpy(&days, v + 4, 4);
    memcpy(&nanos, v + 8, 8);
    if (months < 0 || days < 0 || nanos < 0 || nanos % 1000000 != 0 ||
        nanos / 1000000 > (int64_t)UINT32_MAX)
        return fail(w, b->n, E_DURATION, i, 0);
    uint32_t millis = (uint32_t)(nanos / 1000000);
    ENSURE(w, 12);
    memcpy(w->p, &months, 4);
    memcpy(w->p + 4, &days, 4);
    memcpy(w->p + 8, &millis, 4);
    w->p += 12;
    return 0;
}

static EncFn const VALUE_FN[K_COUNT] = {
    enc_null, enc_bool, enc_int32, enc_int64, enc_int64_as_int, enc_float, enc_double,
    enc_binary, enc_large_binary, enc_fixed, enc_enum, enc_enum_string, enc_record, enc_array,
    enc_map, enc_union, enc_decimal_bytes, enc_decimal_fixed, enc_uuid_string, enc_duration,
};

/* ---------------------------------------------------------------- plans and binding */

static void free_node(Node *n) {
    for (int k = 0; k < n->n_kids; k++) free_node(&n->kids[k]);
    free(n->kids);
    if (n->sym) {
        for (int64_t k = 0; k < n->p1; k++) free((void *)n->sym[k]);
        free(n->sym);
        free(n->sym_len);
    }
}

/* plan node = (kind, id, null_branch, value_branch, p1, p2, (kids...), (symbols...)) */
static int parse_node(PyObject *t, Node *n) {
    PyObject *kids, *syms;
    memset(n, 0, sizeof(*n));
    if (!PyArg_ParseTuple(t, "iLLLLLO!O!", &n->kind, &n->id, &n->null_branch, &n->value_branch,
                          &n->p1, &n->p2, &PyTuple_Type, &kids, &PyTuple_Type, &syms))
        return -1;
    if (n->kind < 0 || n->kind >= K_COUNT) {
        PyErr_Format(PyExc_ValueError, "unknown plan node kind %d", n->kind);
        return -1;
    }
    n->n_kids = (int)PyTuple_GET_SIZE(kids);
    if (n->n_kids) {
        n->kids = calloc((size_t)n->n_kids, sizeof(Node));
        if (n->kids == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        for (int k = 0; k < n->n_kids; k++)
            if (parse_node(PyTuple_GET_ITEM(kids, k), &n->kids[k]) < 0) return -1;
    }
    if (n->kind == K_ENUM_STRING) {
        if (PyTuple_GET_SIZE(syms) != n->p1) {
            PyErr_SetString(PyExc_ValueError, "enum plan: symbol count mismatch");
            return -1;
        }
        n->sym = calloc((size_t)n->p1 + 1, sizeof(char *));
        n->sym_len = calloc((size_t)n->p1 + 1, sizeof(Py_ssize_t));
        if (n->sym == NULL || n->sym_len == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        for (int64_t k = 0; k < n->p1; k++) {
            char *s;
            Py_ssize_t len;
            if (PyBytes_AsStringAndSize(PyTuple_GET_ITEM(syms, k), &s, &len) < 0) return -1;
            n->sym[k] = malloc((size_t)len + 1);
            if (n->sym[k] == NULL) {
                PyErr_NoMemory();
                return -1;
            }
            memcpy((void *)n->sym[k], s, (size_t)len);
            n->sym_len[k] = len;
        }
    }
    return 0;
}

static void free_bound(Bound *b) {
    for (int k = 0; k < b->n_kids; k++) free_bound(&b->kids[k]);
    free(b->kids);
}

static int layout_error(const Node *n, const char *what) {
    PyErr_Format(PyExc_ValueError, "plan node %lld: array layout does not match (%s)",
                 (long long)n->id, what);
    return -1;
}

/* Expected (buffers, children) of the normalised Arrow array each kind reads. */
static int bind(Bound *b, const Node *n, const struct ArrowArray *a, int64_t extra_off) {
    static const int nbuf[K_COUNT] = {0, 2, 2, 2, 2, 2, 2, 3, 3, 2, 2, 3, 1, 2, 2, 2, 2, 2, 2, 2};
    memset(b, 0, sizeof(*b));
    b->n = n;
    b->off = a->offset + extra_off;
    int want_buf = nbuf[n->kind];
    if (n->kind == K_UNION) want_buf = n->p1 ? 1 : 2;
    if (a->n_buffers != want_buf) return layout_error(n, "buffer count");
    if (n->kind == K_UNION) {
        b->b1 = a->buffers[0];
        b->b2 = n->p1 ? NULL : a->buffers[1];
    } else if (want_buf > 0) {
        b->valid = a->null_count != 0 ? a->buffers[0] : NULL;
        if (want_buf > 1) b->b1 = a->buffers[1];
        if (want_buf > 2) b->b2 = a->buffers[2];
        if (want_buf > 1 && b->b1 == NULL && a->length > 0) return layout_error(n, "no data");
        if (b->b2 == NULL && want_buf > 2) b->b2 = (const uint8_t *)"";
        if (want_buf > 2 && a->length > 0) {
            int64_t last = a->offset + a->length;
            b->data_end = b->b2 + (n->kind == K_LARGE_BINARY ? ((const int64_t *)b->b1)[last]
                                                             : ((const int32_t *)b->b1)[last]);
        }
    }
    b->value_fn = VALUE_FN[n->kind];
    b->nullable_or_branch = b->valid != NULL || n->value_branch >= 0;
    b->op = b->nullable_or_branch ? K_COUNT : n->kind;
    if (n->null_branch > 63 || n->value_branch > 63) return layout_error(n, "union too wide");
    b->null_byte = n->null_branch >= 0 ? (int)(n->null_branch << 1) : -1;
    b->value_byte = n->value_branch >= 0 ? (int)(n->value_branch << 1) : -1;
    if (n->kind == K_UNION && n->n_kids > 63) return layout_error(n, "more than 63 branches");
    const struct ArrowArray *src = a;
    int64_t kid_off = 0;
    if (n->kind == K_MAP) { /* map -> entries struct -> (key, value) */
        if (a->n_children != 1 || a->children[0]->n_children != 2)
            return layout_error(n, "map entries");
        src = a->children[0];
        kid_off = src->offset;
        if (n->n_kids != 2) return layout_error(n, "map plan");
    }
    if (src->n_children != n->n_kids) return layout_error(n, "children");
    b->n_kids = n->n_kids;
    if (n->n_kids) {
        b->kids = calloc((size_t)n->n_kids, sizeof(Bound));
        if (b->kids == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        for (int k = 0; k < n->n_kids; k++)
            if (bind(&b->kids[k], &n->kids[k], src->children[k], kid_off) < 0) return -1;
    }
    return 0;
}

/* ---------------------------------------------------------------- threads */

/* Memory: every buffer comes from Python (pyarrow's pool: its allocator keeps freed pages, so
 * a call does not fault in fresh pages for megabytes of output). Each thread writes its rows
 * into its own scratch buffer; a single thread's scratch becomes the output as it is, several
 * threads' parts are copied (in parallel, equal slices) into one output buffer. A scratch that fills up
 * moves to malloc'd memory, which is then copied into an output buffer too. */
typedef struct {
    Segment *segs;
    int n_segs;
    int64_t total;
    int n_threads;
    int64_t *ends;          /* ends[r + 1]: end of row r's datum, relative to its thread's part */
    uint8_t *data;          /* the output; thread 0's scratch when it has room for every part */
    int in_place;           /* thread 0's part already lies at the start of `data` */
    int large;              /* offsets need 64 bits: they are `ends`, made absolute in place */
    int32_t *offsets32;
    struct Task *tasks;
    int64_t copy_from, size; /* the output bytes [copy_from, size) are copied from the parts */
} Shared;

typedef struct Task {
    Shared *sh;
    int index;
    int64_t r0, r1;
    Writer w;
    int64_t start;          /* where this thread's bytes go in the output */
} Task;

static void *encode_range(void *arg) {
    Task *t = arg;
    Shared *sh = t->sh;
    Writer *w = &t->w;
    int64_t r = t->r0;
    for (int s = 0; s < sh->n_segs && r < t->r1; s++) {
        Segment *sg = &sh->segs[s];
        int64_t lo = sg->first_row, hi = sg->first_row + sg->length;
        for (; r < hi && r < t->r1; r++) {
            w->row = r;
            if (enc_element(w, sg->root, r - lo) < 0) return NULL;
            sh->ends[r + 1] = w->p - w->base;
        }
    }
    return NULL;
}

/* Each thread copies an equal slice of the bytes to copy (whichever parts they come from: with
 * thread 0's part in place, thread 0 would have nothing to do while thread 1 copied its whole
 * part), then makes its own rows' offsets absolute. */
static void *copy_out(void *arg) {
    Task *t = arg;
    Shared *sh = t->sh;
    int64_t span = sh->size - sh->copy_from;
    int64_t a = sh->copy_from + span * t->index / sh->n_threads;
    int64_t b = sh->copy_from + span * (t->index + 1) / sh->n_threads;
    for (int k = 0; k < sh->n_threads && a < b; k++) {
        const Task *part = &sh->tasks[k];
        int64_t p0 = part->start, p1 = p0 + (part->w.p - part->w.base);
        int64_t x0 = a > p0 ? a : p0, x1 = b < p1 ? b : p1;
        if (x0 < x1) memcpy(sh->data + x0, part->w.base + (x0 - p0), (size_t)(x1 - x0));
    }
    if (sh->large) {
        for (int64_t r = t->r0; r < t->r1; r++) sh->ends[r + 1] += t->start;
    } else {
        int32_t *o = sh->offsets32;
        for (int64_t r = t->r0; r < t->r1; r++) o[r + 1] = (int32_t)(t->start + sh->ends[r + 1]);
    }
    return NULL;
}

/* Run fn over every task, tasks 1.. on their own threads (inline if a thread cannot start). */
static void parallel(void *(*fn)(void *), Task *tasks, int n) {
    pthread_t tid[256];
    int started[256];
    for (int k = 1; k < n; k++) {
        started[k] = pthread_create(&tid[k], NULL, fn, &tasks[k]) == 0;
        if (!started[k]) fn(&tasks[k]);
    }
    fn(&tasks[0]);
    for (int k = 1; k < n; k++)
        if (started[k]) pthread_join(tid[k], NULL);
}

/* ---------------------------------------------------------------- the Python entry point */


/* A writable buffer of `size` bytes from allocate(size); NULL with an exception set. */
static PyObject *allocate_view(PyObject *allocate, int64_t size, Py_buffer *view) {
    PyObject *buf = PyObject_CallFunction(allocate, "L", (long long)size);
    if (buf == NULL) return NULL;
    if (PyObject_GetBuffer(buf, view, PyBUF_WRITABLE) < 0) {
        Py_DECREF(buf);
        return NULL;
    }
    if (view->len < size) {
        PyBuffer_Release(view);
        Py_DECREF(buf);
        PyErr_SetString(PyExc_ValueError, "allocate returned a buffer that is too small");
        return NULL;
    }
    return buf;
}

/* encode(plan, capsules, scratch, allocate)
 *   -> (data, offsets, large, size, None) or (None, None, 0, 0, (row, node, code, value)) */
static PyObject *py_encode(PyObject *self, PyObject *args) {
    PyObject *plan, *caps, *scratch, *allocate;
    (void)self;
    if (!PyArg_ParseTuple(args, "O!O!O!O", &PyTuple_Type, &plan, &PyList_Type, &caps,
                          &PyList_Type, &scratch, &allocate))
        return NULL;
    int n_threads = (int)PyList_GET_SIZE(scratch);
    int n_segs = (int)PyList_GET_SIZE(caps);
    if (n_threads < 1 || n_threads > 256) {
        PyErr_SetString(PyExc_ValueError, "between 1 and 256 scratch buffers");
        return NULL;
    }
    Node root;
    Segment *segs = NULL;
    Task *tasks = NULL;
    Py_buffer *views = NULL;
    int n_views = 0;
    Shared sh;
    Py_buffer ends_view, offs_view, data_view;
    PyObject *ends_obj = NULL, *offs_obj = NULL, *data_obj = NULL, *result = NULL;
    memset(&sh, 0, sizeof(sh));
    if (parse_node(plan, &root) < 0) goto done;
    segs = calloc((size_t)n_segs + 1, sizeof(Segment));
    tasks = calloc((size_t)n_threads, sizeof(Task));
    views = calloc((size_t)n_threads, sizeof(Py_buffer));
    if (segs == NULL || tasks == NULL || views == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (int s = 0; s < n_segs; s++) {
        const struct ArrowArray *a = PyCapsule_GetPointer(PyList_GET_ITEM(caps, s), "arrow_array");
        if (a == NULL) goto done;
        segs[s].root = calloc(1, sizeof(Bound));
        if (segs[s].root == NULL) {
            PyErr_NoMemory();
            goto done;
        }
        if (bind(segs[s].root, &root, a, 0) < 0) goto done;
        segs[s].length = a->length;
        segs[s].first_row = sh.total;
        sh.total += a->length;
    }
    sh.segs = segs;
    sh.n_segs = n_segs;
    sh.n_threads = n_threads;
    ends_obj = allocate_view(allocate, (sh.total + 1) * 8, &ends_view);
    if (ends_obj == NULL) goto done;
    sh.ends = ends_view.buf;
    sh.ends[0] = 0;
    for (int k = 0; k < n_threads; k++) {
        if (PyObject_GetBuffer(PyList_GET_ITEM(scratch, k), &views[k], PyBUF_WRITABLE) < 0)
            goto done;
        n_views++;
        tasks[k].sh = &sh;
        tasks[k].index = k;
        tasks[k].r0 = sh.total * k / n_threads;
        tasks[k].r1 = sh.total * (k + 1) / n_threads;
        tasks[k].w.base = tasks[k].w.p = views[k].buf;
        tasks[k].w.end = tasks[k].w.base + views[k].len;
    }
    Py_BEGIN_ALLOW_THREADS
    parallel(encode_range, tasks, n_threads);
    Py_END_ALLOW_THREADS
    for (int k = 0; k < n_threads; k++) {
        Writer *w = &tasks[k].w;
        if (!w->failed) continue;
        if (w->err_code == E_NOMEM) {
            PyErr_NoMemory();
        } else {
            result = Py_BuildValue("(OOii(LLLL))", Py_None, Py_None, 0, 0, w->err_row,
                                   w->err_node, (long long)w->err_code, w->err_value);
        }
        goto done;
    }
    int64_t pos = 0;
    for (int k = 0; k < n_threads; k++) {
        tasks[k].start = pos;
        pos += tasks[k].w.p - tasks[k].w.base;
    }
    sh.large = pos > INT32_MAX;
    if (!sh.large) {
        offs_obj = allocate_view(allocate, (sh.total + 1) * 4, &offs_view);
        if (offs_obj == NULL) goto done;
        sh.offsets32 = offs_view.buf;
        sh.offsets32[0] = 0;
    }
    int own_data = 0;
    if (!tasks[0].w.owned && views[0].len >= pos) {
        /* thread 0's scratch is the output: its part stays, the others are copied after it */
        data_obj = PyList_GET_ITEM(scratch, 0);
        Py_INCREF(data_obj);
        sh.data = views[0].buf;
        sh.in_place = 1;
    } else {
        data_obj = allocate_view(allocate, pos ? pos : 1, &data_view);
        if (data_obj == NULL) goto done;
        sh.data = data_view.buf;
        own_data = 1;
    }
    sh.tasks = tasks;
    sh.size = pos;
    sh.copy_from = sh.in_place ? tasks[0].w.p - tasks[0].w.base : 0;
    Py_BEGIN_ALLOW_THREADS
    parallel(copy_out, tasks, n_threads);
    Py_END_ALLOW_THREADS
    if (own_data) PyBuffer_Release(&data_view);
    result = Py_BuildValue("(OOiLO)", data_obj, sh.large ? ends_obj : offs_obj, sh.large,
                           (long long)pos, Py_None);
done:
    if (ends_obj) PyBuffer_Release(&ends_view);
    if (offs_obj) PyBuffer_Release(&offs_view);
    Py_XDECREF(ends_obj);
    Py_XDECREF(offs_obj);
    Py_XDECREF(data_obj);
    for (int k = 0; k < n_views; k++) PyBuffer_Release(&views[k]);
    if (tasks)
        for (int k = 0; k < n_threads; k++)
            if (tasks[k].w.owned) free(tasks[k].w.base);
    if (segs)
        for (int s = 0; s < n_segs; s++)
            if (segs[s].root) {
                free_bound(segs[s].root);
                free(segs[s].root);
            }
    free(views);
    free(tasks);
    free(segs);
    free_node(&root);
    return result;
}

static PyMethodDef methods[] = {
    {"encode", py_encode, METH_VARARGS,
     "encode(plan, arrays, scratch, allocate) -> (data, offsets, large, size, error): the Avro "
     "datums of the rows of the Arrow arrays (C Data Interface capsules), one per row, back to "
     "back; one thread per scratch buffer."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_cencode",
                                    "Native Avro encoder over Arrow buffers.", -1, methods};

PyMODINIT_FUNC PyInit__cencode(void) { return PyModule_Create(&module); }
