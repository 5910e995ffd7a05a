/* Native Avro encoder: Arrow arrays (through the Arrow C Data Interface) -> Avro binary datums.
 *
 * Python (encoder.py) compiles the Avro schema against the input's Arrow types into a plan (a
 * tuple tree of nodes) and normalises every column to the one physical layout each node reads,
 * so this file only walks buffers: validity bitmaps, offsets, values and children. The GIL is
 * released for the whole batch; rows are split across pthreads, each thread writes its rows into
 * its own scratch buffer, then every thread copies its part into the single output buffer.
 *
 * Rows are encoded one after the other, column by column: the top-level record's fields (and
 * the fields of the records nested in it) are "columns" that occur once per row, in order. The
 * common ones (booleans, ints, longs, floats, doubles, strings and bytes, nullable or not, and
 * arrays and maps of those) have code of their own, chosen through one jump table per column,
 * with the write position in a register and room checked once a row (plus once per long
 * string, array or map) instead of once per value. Every other column (unions, enums, nested
 * arrays, logical types...) is first sized, which also checks its value, then written, by
 * generic functions that walk its plan; a check that it came out at that size turns a
 * disagreement between the two into an error instead of wrong data.
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

/* Error codes: keep in step with ERR_* in _encode.py. E_INTERNAL: a generic write came out at
 * another size than its sizing said (a bug). */
enum { E_NULL = 1, E_INT_RANGE, E_ENUM_INDEX, E_ENUM_SYMBOL, E_UNION, E_DECIMAL, E_DURATION,
       E_NOMEM, E_INTERNAL };

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

typedef struct Bound {
    int kind;              /* n->kind */
    int optional;          /* may be null, or writes a union index first */
    int null_byte, value_byte; /* zigzag union index of a null / before a value; -1: none */
    const Node *n;
    const uint8_t *valid;  /* NULL when no element is null */
    const uint8_t *b1;     /* values, offsets or type ids */
    const uint8_t *b2;     /* string data or union offsets */
    const uint8_t *data_end; /* K_BINARY: the end of its last string */
    int64_t off;
    int n_kids;
    struct Bound *kids;
} Bound;

/* A node that occurs once per row: element `at + r` (in its buffers' coordinates: the offset
 * is in) of `b` is row r's value. Its buffers are copied here, next to each other. */
typedef struct {
    int shape;             /* which code encodes it: see column_shape */
    int optional, null_byte, value_byte;
    int64_t at;
    const uint8_t *valid, *b1, *b2;
    const uint8_t *b2_end;
    int64_t item_off, key_off; /* arrays and maps: their items' (values') and keys' offsets */
    const uint8_t *item_b1, *item_b2, *item_b2_end, *key_b1, *key_b2, *key_b2_end;
    const Bound *b;
} Column;

typedef struct {
    Bound *root;
    Column *cols;
    int n_cols;
    int64_t bound;         /* the sum of the columns' column_bound */
    int64_t length;
    int64_t first_row;
} Segment;

typedef struct Writer {
    uint8_t *base, *p, *end; /* a block from blk_alloc, `end - base` bytes */
    int64_t row;
    int failed;
    int64_t err_row, err_node, err_code, err_index, err_value;
} Writer;

/* ---------------------------------------------------------------- primitives */

/* Reused memory. A fresh page costs a page fault (and the kernel's zeroing) on its first write:
 * Arrow's pool hands its freed pages back to the system after a while, so an encode called now
 * and then (a batch of 100,000 userdata rows: 12 MB out, 16 MB of scratch) spent a quarter of
 * its time in page faults. Blocks of BLK_MIN bytes or more are kept when freed (the output's
 * once Arrow releases it, scratch after a call), up to BLK_KEEP bytes in all, and later calls
 * take them (best fit, at most 4 times too large). */
#define BLK_MIN ((size_t)64 << 10)
#define BLK_KEEP ((size_t)64 << 20)
#define BLK_SLOTS 32
static struct { void *p; size_t cap; } blk_slot[BLK_SLOTS];
static int blk_count;
static size_t blk_bytes;
static pthread_mutex_t blk_mu = PTHREAD_MUTEX_INITIALIZER;

/* A block of at least *cap bytes (*cap becomes its size), or NULL. */
static void *blk_alloc(size_t *cap) {
    void *p = NULL;
    if (*cap < 64) *cap = 64;
    if (*cap >= BLK_MIN) {
        pthread_mutex_lock(&blk_mu);
        int best = -1;
        for (int i = 0; i < blk_count; i++)
            if (blk_slot[i].cap >= *cap && blk_slot[i].cap / 4 <= *cap &&
                (best < 0 || blk_slot[i].cap < blk_slot[best].cap))
                best = i;
        if (best >= 0) {
            p = blk_slot[best].p;
            *cap = blk_slot[best].cap;
            blk_bytes -= *cap;
            blk_slot[best] = blk_slot[--blk_count];
        }
        pthread_mutex_unlock(&blk_mu);
    }
    return p ? p : malloc(*cap);
}

/* Keep (or free) a block; a larger block pushes out smaller kept ones when there is no room. */
static void blk_free(void *p, size_t cap) {
    if (p == NULL || cap < BLK_MIN || cap > BLK_KEEP) {
        free(p);
        return;
    }
    void *drop[BLK_SLOTS];
    int n_drop = 0, kept = 0;
    pthread_mutex_lock(&blk_mu);
    while (blk_count > 0 && (blk_count == BLK_SLOTS || blk_bytes + cap > BLK_KEEP)) {
        int small = 0;
        for (int i = 1; i < blk_count; i++)
            if (blk_slot[i].cap < blk_slot[small].cap) small = i;
        if (blk_slot[small].cap >= cap) break;
        drop[n_drop++] = blk_slot[small].p;
        blk_bytes -= blk_slot[small].cap;
        blk_slot[small] = blk_slot[--blk_count];
    }
    if (blk_count < BLK_SLOTS && blk_bytes + cap <= BLK_KEEP) {
        blk_slot[blk_count].p = p;
        blk_slot[blk_count++].cap = cap;
        blk_bytes += cap;
        kept = 1;
    }
    pthread_mutex_unlock(&blk_mu);
    for (int i = 0; i < n_drop; i++) free(drop[i]);
    if (!kept) free(p);
}

static __attribute__((noinline, cold)) int grow(Writer *w, size_t need) {
    size_t used = (size_t)(w->p - w->base);
    size_t want = (size_t)(w->end - w->base) * 2;
    while (want - used < need) want *= 2;
    uint8_t *nb = blk_alloc(&want);
    if (nb == NULL) {
        w->failed = 1;
        w->err_row = w->row;
        w->err_node = -1;
        w->err_code = E_NOMEM;
        return -1;
    }
    if (used) memcpy(nb, w->base, used);
    blk_free(w->base, (size_t)(w->end - w->base));
    w->base = nb;
    w->p = nb + used;
    w->end = nb + want;
    return 0;
}

static __attribute__((noinline, cold)) int64_t fail(Writer *w, const Node *n, int code,
                                                    int64_t index, int64_t value) {
    w->failed = 1; /* the caller, which knows the row, sets err_row */
    w->err_node = n ? n->id : -1;
    w->err_code = code;
    w->err_index = index;
    w->err_value = value;
    return -1;
}

#define BIT(bits, i) (((bits)[(i) >> 3] >> ((i) & 7)) & 1)
#define INLINE static inline __attribute__((always_inline))

/* The row loop is compiled twice on x86-64 with GCC, for the baseline and for x86-64-v3 (AVX2:
 * a string's 32-byte move is one instruction, not two), the loader picking the one the CPU
 * runs: about 4% of a userdata encode. The loader's pick is an ifunc: glibc has them,
 * musl does not. */
#if defined(__x86_64__) && defined(__GLIBC__) && defined(__GNUC__) && !defined(__clang__) \
    && __GNUC__ >= 11
#define HOT_CLONES __attribute__((target_clones("arch=x86-64-v3", "default")))
#else
#define HOT_CLONES
#endif

static const char HEX[] = "0123456789abcdef";

INLINE uint64_t zigzag(int64_t v) { return ((uint64_t)v << 1) ^ (uint64_t)(v >> 63); }

/* Bytes of the varint of z: ceil(bits / 7), at least 1. */
INLINE int64_t varint_size(uint64_t z) {
    int bits = 64 - __builtin_clzll(z | 1);
    return (bits * 9 + 64) / 64;
}

INLINE int64_t long_size(int64_t v) { return varint_size(zigzag(v)); }

INLINE uint8_t *put_varint(uint8_t *p, uint64_t z) {
    while (z >= 0x80) {
        *p++ = (uint8_t)(z | 0x80);
        z >>= 7;
    }
    *p++ = (uint8_t)z;
    return p;
}

INLINE uint8_t *put_long(uint8_t *p, int64_t v) { return put_varint(p, zigzag(v)); }

/* Exactly n bytes (the generic writes store nothing past a value's size), short strings as two
 * overlapping moves instead of a call into memcpy (source and destination never overlap: the
 * second move rewrites some bytes of the first with the same values). */
INLINE uint8_t *put_raw(uint8_t *p, const uint8_t *s, int64_t n) {
    if (n <= 16) {
        if (n >= 8) {
            memcpy(p, s, 8);
            memcpy(p + n - 8, s + n - 8, 8);
        } else if (n >= 4) {
            memcpy(p, s, 4);
            memcpy(p + n - 4, s + n - 4, 4);
        } else if (n > 0) {
            p[0] = s[0];
            p[n >> 1] = s[n >> 1];
            p[n - 1] = s[n - 1];
        }
    } else if (n <= 32) {
        memcpy(p, s, 16);
        memcpy(p + n - 16, s + n - 16, 16);
    } else if (n <= 64) { /* uuids, emails, urls */
        memcpy(p, s, 32);
        memcpy(p + n - 32, s + n - 32, 32);
    } else {
        memcpy(p, s, (size_t)n);
    }
    return p + n;
}

INLINE int64_t bytes_size(int64_t n) { return n + varint_size((uint64_t)n << 1); }

INLINE uint8_t *put_bytes(uint8_t *p, const uint8_t *s, int64_t n) {
    if (n < 64) {
        *p++ = (uint8_t)(n << 1);
    } else {
        p = put_varint(p, (uint64_t)n << 1);
    }
    return put_raw(p, s, n);
}

/* ---------------------------------------------------------------- generic: sizes */

/* Sizes return -1 after fail() for a value that does not fit; the caller records the row. */
static int64_t size_node(Writer *w, const Bound *b, int64_t i);
static uint8_t *write_node(const Bound *b, int64_t i, uint8_t *d);

/* The size of a non-null value of `kind`: a constant where a column's loop inlines it, so the
 * common leaves cost no dispatch; containers and rare kinds go through size_node. */
INLINE int64_t size_value(Writer *w, const Bound *b, int64_t i, int kind) {
    int64_t p = b->off + i;
    switch (kind) {
    case K_NULL: return 0;
    case K_BOOL: return 1;
    case K_INT32: return long_size(((const int32_t *)b->b1)[p]);
    case K_INT64: return long_size(((const int64_t *)b->b1)[p]);
    case K_FLOAT: return 4;
    case K_DOUBLE: return 8;
    case K_BINARY: {
        const int32_t *o = (const int32_t *)b->b1 + p;
        return bytes_size((int64_t)o[1] - o[0]);
    }
    case K_FIXED: return b->n->p1;
    case K_UUID_STRING: return 37;
    default: return size_node(w, b, i);
    }
}

/* One element: a null (its union index, or an error), or its union index and value. */
INLINE int64_t size_element(Writer *w, const Bound *b, int64_t i, int kind) {
    if (!b->optional) return size_value(w, b, i, kind);
    if (b->valid != NULL && !BIT(b->valid, b->off + i)) {
        if (b->null_byte < 0) return fail(w, b->n, E_NULL, i, 0);
        return 1;
    }
    int64_t s = size_value(w, b, i, kind);
    return s < 0 ? s : s + (b->value_byte >= 0);
}

#define SIZE_OF(kid, at) size_element(w, (kid), (at), (kid)->kind)

static int64_t enum_symbol(const Bound *b, int64_t p) {
    const Node *n = b->n;
    const int32_t *o = (const int32_t *)b->b1 + p;
    const uint8_t *s = b->b2 + o[0];
    Py_ssize_t len = o[1] - o[0];
    for (int64_t k = 0; k < n->p1; k++)
        if (n->sym_len[k] == len && memcmp(n->sym[k], s, (size_t)len) == 0) return k;
    return -1;
}

/* Minimal big-endian two's complement, as Java's BigInteger.toByteArray writes it. */
static int decimal_length(const uint8_t *le, int width) {
    int n = width;
    while (n > 1 && ((le[n - 1] == 0x00 && !(le[n - 2] & 0x80)) ||
                     (le[n - 1] == 0xFF && (le[n - 2] & 0x80))))
        n--;
    return n;
}

static __attribute__((noinline)) int64_t size_node(Writer *w, const Bound *b, int64_t i) {
    int64_t p = b->off + i;
    switch (b->kind) {
    case K_INT64_AS_INT: {
        int64_t v = ((const int64_t *)b->b1)[p];
        if (v < INT32_MIN || v > INT32_MAX) return fail(w, b->n, E_INT_RANGE, i, v);
        return long_size(v);
    }
    case K_LARGE_BINARY: {
        const int64_t *o = (const int64_t *)b->b1 + p;
        return bytes_size(o[1] - o[0]);
    }
    case K_ENUM: {
        int32_t v = ((const int32_t *)b->b1)[p];
        if (v < 0 || v >= b->n->p1) return fail(w, b->n, E_ENUM_INDEX, i, v);
        return long_size(v);
    }
    case K_ENUM_STRING: {
        int64_t k = enum_symbol(b, p);
        return k < 0 ? fail(w, b->n, E_ENUM_SYMBOL, i, 0) : long_size(k);
    }
    case K_RECORD: {
        int64_t s = 0;
        for (const Bound *kid = b->kids, *stop = b->kids + b->n_kids; kid < stop; kid++) {
            int64_t k = SIZE_OF(kid, p);
            if (k < 0) return -1;
            s += k;
        }
        return s;
    }
    case K_ARRAY:
    case K_MAP: { /* one block of `count` items (or entries), then the 0 that ends the list */
        const int32_t *o = (const int32_t *)b->b1 + p;
        int64_t start = o[0], stop = o[1];
        if (stop == start) return 1;
        int64_t s = long_size(stop - start) + 1;
        const Bound *item = &b->kids[0];
        for (int64_t j = start; j < stop; j++) {
            int64_t k = SIZE_OF(item, j);
            if (k < 0) return -1;
            s += k;
        }
        if (b->kind == K_MAP) {
            const Bound *value = &b->kids[1];
            for (int64_t j = start; j < stop; j++) {
                int64_t k = SIZE_OF(value, j);
                if (k < 0) return -1;
                s += k;
            }
        }
        return s;
    }
    case K_UNION: {
        int8_t t = ((const int8_t *)b->b1)[p];
        if (t < 0 || t >= b->n_kids) return fail(w, b->n, E_UNION, i, t);
        int64_t at = b->b2 ? ((const int32_t *)b->b2)[p] : p;
        int64_t k = SIZE_OF(&b->kids[t], at);
        return k < 0 ? k : k + 1; /* unions have < 64 branches here: a one-byte index */
    }
    case K_DECIMAL_BYTES: {
        int width = (int)b->n->p2;
        return bytes_size(decimal_length(b->b1 + width * p, width));
    }
    case K_DECIMAL_FIXED: {
        int width = (int)b->n->p2, size = (int)b->n->p1;
        const uint8_t *le = b->b1 + width * p;
        uint8_t sign = (le[width - 1] & 0x80) ? 0xFF : 0x00;
        if (size < width) {
            for (int k = size; k < width; k++)
                if (le[k] != sign) return fail(w, b->n, E_DECIMAL, i, 0);
            if (size == 0 || (le[size - 1] & 0x80) != (sign & 0x80))
                return fail(w, b->n, E_DECIMAL, i, 0);
        }
        return size;
    }
    case K_DURATION: {
        const uint8_t *v = b->b1 + 16 * p;
        int32_t months, days;
        int64_t nanos;
        memcpy(&months, v, 4);
        memcpy(&days, v + 4, 4);
        memcpy(&nanos, v + 8, 8);
        if (months < 0 || days < 0 || nanos < 0 || nanos % 1000000 != 0 ||
            nanos / 1000000 > (int64_t)UINT32_MAX)
            return fail(w, b->n, E_DURATION, i, 0);
        return 12;
    }
    default: /* the leaves are size_value's */
        return fail(w, b->n, E_INTERNAL, i, b->kind);
    }
}

/* ---------------------------------------------------------------- generic: writes */

/* Writes assume that sizing accepted the value, and that its bytes were reserved. */
INLINE uint8_t *write_value(const Bound *b, int64_t i, uint8_t *d, int kind) {
    int64_t p = b->off + i;
    switch (kind) {
    case K_NULL: return d;
    case K_BOOL: *d = (uint8_t)BIT(b->b1, p); return d + 1;
    case K_INT32: return put_long(d, ((const int32_t *)b->b1)[p]);
    case K_INT64: return put_long(d, ((const int64_t *)b->b1)[p]);
    case K_FLOAT: memcpy(d, b->b1 + 4 * p, 4); return d + 4;
    case K_DOUBLE: memcpy(d, b->b1 + 8 * p, 8); return d + 8;
    case K_BINARY: {
        const int32_t *o = (const int32_t *)b->b1 + p;
        return put_bytes(d, b->b2 + o[0], (int64_t)o[1] - o[0]);
    }
    default: return write_node(b, i, d);
    }
}

INLINE uint8_t *write_element(const Bound *b, int64_t i, uint8_t *d, int kind) {
    if (b->optional) {
        if (b->valid != NULL && !BIT(b->valid, b->off + i)) {
            *d = (uint8_t)b->null_byte;
            return d + 1;
        }
        if (b->value_byte >= 0) *d++ = (uint8_t)b->value_byte;
    }
    return write_value(b, i, d, kind);
}

#define WRITE(kid, at, d) write_element((kid), (at), (d), (kid)->kind)

static __attribute__((noinline)) uint8_t *write_node(const Bound *b, int64_t i, uint8_t *d) {
    int64_t p = b->off + i;
    switch (b->kind) {
    case K_INT64_AS_INT: return put_long(d, ((const int64_t *)b->b1)[p]);
    case K_LARGE_BINARY: {
        const int64_t *o = (const int64_t *)b->b1 + p;
        return put_bytes(d, b->b2 + o[0], o[1] - o[0]);
    }
    case K_FIXED: {
        int64_t size = b->n->p1;
        memcpy(d, b->b1 + size * p, (size_t)size);
        return d + size;
    }
    case K_ENUM: return put_long(d, ((const int32_t *)b->b1)[p]);
    case K_ENUM_STRING: return put_long(d, enum_symbol(b, p));
    case K_RECORD:
        for (const Bound *kid = b->kids, *stop = b->kids + b->n_kids; kid < stop; kid++)
            d = WRITE(kid, p, d);
        return d;
    case K_ARRAY:
    case K_MAP: {
        const int32_t *o = (const int32_t *)b->b1 + p;
        int64_t start = o[0], stop = o[1];
        if (stop > start) {
            d = put_long(d, stop - start);
            const Bound *item = &b->kids[0];
            if (b->kind == K_ARRAY) {
                for (int64_t j = start; j < stop; j++) d = WRITE(item, j, d);
            } else {
                const Bound *value = &b->kids[1];
                for (int64_t j = start; j < stop; j++) d = WRITE(value, j, WRITE(item, j, d));
            }
        }
        *d = 0;
        return d + 1;
    }
    case K_UNION: {
        int8_t t = ((const int8_t *)b->b1)[p];
        *d++ = (uint8_t)(t << 1);
        int64_t at = b->b2 ? ((const int32_t *)b->b2)[p] : p;
        return WRITE(&b->kids[t], at, d);
    }
    case K_DECIMAL_BYTES: {
        int width = (int)b->n->p2;
        const uint8_t *le = b->b1 + width * p;
        int n = decimal_length(le, width);
        *d++ = (uint8_t)(n << 1); /* n <= 32 */
        for (int k = n - 1; k >= 0; k--) *d++ = le[k];
        return d;
    }
    case K_DECIMAL_FIXED: {
        int width = (int)b->n->p2, size = (int)b->n->p1;
        const uint8_t *le = b->b1 + width * p;
        uint8_t sign = (le[width - 1] & 0x80) ? 0xFF : 0x00;
        for (int k = size - 1; k >= 0; k--) *d++ = k < width ? le[k] : sign;
        return d;
    }
    case K_UUID_STRING: {
        const uint8_t *u = b->b1 + 16 * p;
        *d++ = 72; /* zigzag(36) */
        for (int k = 0; k < 16; k++) {
            if (k == 4 || k == 6 || k == 8 || k == 10) *d++ = '-';
            *d++ = (uint8_t)HEX[u[k] >> 4];
            *d++ = (uint8_t)HEX[u[k] & 15];
        }
        return d;
    }
    case K_DURATION: {
        const uint8_t *v = b->b1 + 16 * p;
        int64_t nanos;
        memcpy(d, v, 8); /* months, days */
        memcpy(&nanos, v + 8, 8);
        uint32_t millis = (uint32_t)(nanos / 1000000);
        memcpy(d + 8, &millis, 4);
        return d + 12;
    }
    default: return d; /* the leaves are write_value's */
    }
}

/* ---------------------------------------------------------------- rows */

/* The common leaves, and the shapes of columns with code of their own in encode_rows: a leaf,
 * a leaf that may be null or comes with a union index, an array or a map (string keys) of
 * non-null leaves; every other column is S_GENERIC (sized, then written, by the functions
 * above). Dense numbers: one jump table. */
enum { L_BOOL, L_INT32, L_INT64, L_FLOAT, L_DOUBLE, L_BINARY, N_LEAF };
enum { S_LEAF = 0, S_OPTIONAL = N_LEAF, S_LIST = 2 * N_LEAF, S_MAP = 3 * N_LEAF,
       S_GENERIC = 4 * N_LEAF };

static int leaf_index(const Bound *b) {
    switch (b->kind) {
    case K_BOOL: return L_BOOL;
    case K_INT32: return L_INT32;
    case K_INT64: return L_INT64;
    case K_FLOAT: return L_FLOAT;
    case K_DOUBLE: return L_DOUBLE;
    case K_BINARY: return L_BINARY;
    default: return -1;
    }
}

static int column_shape(const Bound *b) {
    int leaf = leaf_index(b);
    if (leaf >= 0) return (b->optional ? S_OPTIONAL : S_LEAF) + leaf;
    if (b->optional) return S_GENERIC;
    const Bound *k0 = b->n_kids > 0 ? &b->kids[0] : NULL, *k1 = b->n_kids > 1 ? &b->kids[1] : NULL;
    if (b->kind == K_ARRAY && !k0->optional && leaf_index(k0) >= 0) return S_LIST + leaf_index(k0);
    if (b->kind == K_MAP && !k0->optional && k0->kind == K_BINARY && !k1->optional &&
        leaf_index(k1) >= 0)
        return S_MAP + leaf_index(k1);
    return S_GENERIC;
}

/* Bytes a writer may store past its end: put_fast copies strings in 32- or 64-byte moves and
 * varints as 8-byte words; the bytes past a value are rewritten by the next ones. */
#define SPILL 64

/* A zigzag varint with fewer than 8 data bytes (56 bits: every int, and longs up to 2^55), as
 * one 8-byte word without branches on its length: ages, map values and timestamps have
 * lengths that vary from value to value, and a mispredicted loop exit costs more. */
INLINE uint8_t *put_varint_fast(uint8_t *p, uint64_t z) {
    if (z < 0x4000) { /* one or two bytes */
        uint64_t big = z >= 0x80;
        p[0] = (uint8_t)(z | (big << 7));
        p[1] = (uint8_t)(z >> 7);
        return p + 1 + big;
    }
    if (__builtin_expect(z >= (1ull << 56), 0)) return put_varint(p, z);
    uint64_t x = (z & 0x7f) | ((z << 1) & (0x7full << 8)) | ((z << 2) & (0x7full << 16)) |
                 ((z << 3) & (0x7full << 24)) | ((z << 4) & (0x7full << 32)) |
                 ((z << 5) & (0x7full << 40)) | ((z << 6) & (0x7full << 48)) |
                 ((z << 7) & (0x7full << 56));
    int64_t len = varint_size(z); /* 3..8: continuation bits on the first len - 1 bytes */
    x |= 0x8080808080808080ull & ((1ull << (8 * (len - 1))) - 1);
    memcpy(p, &x, 8);
    return p + len;
}

/* 32 bytes as one unaligned vector move: memcpy's 32 bytes come out as two 16-byte moves under
 * GCC's generic tuning, even in the AVX2 clone. */
typedef uint8_t Bytes32 __attribute__((vector_size(32), aligned(1), may_alias));

INLINE void copy32(uint8_t *d, const uint8_t *s) { *(Bytes32 *)d = *(const Bytes32 *)s; }

/* A length-prefixed string: up to 32 (or 64) bytes as one (or two) 32-byte moves when the
 * source has the bytes to read. */
INLINE uint8_t *put_bytes_fast(uint8_t *d, const uint8_t *src, int64_t n,
                               const uint8_t *src_end) {
    if (__builtin_expect(n < 64, 1)) {
        *d++ = (uint8_t)(n << 1);
        if (n <= 32 && src + 32 <= src_end) {
            copy32(d, src);
            return d + n;
        }
        if (src + 64 <= src_end) {
            copy32(d, src);
            copy32(d + 32, src + 32);
            return d + n;
        }
        return put_raw(d, src, n);
    }
    return put_bytes(d, src, n);
}

/* A non-null leaf value at p of buffers b1 (values, bits or offsets) and b2 (bytes, ending at
 * b2_end); the caller reserved leaf_need's bytes and SPILL more. */
INLINE uint8_t *put_leaf(uint8_t *d, int leaf, const uint8_t *b1, const uint8_t *b2,
                         const uint8_t *b2_end, int64_t p) {
    switch (leaf) {
    case L_BOOL: *d = (uint8_t)BIT(b1, p); return d + 1;
    case L_INT32: return put_varint_fast(d, zigzag(((const int32_t *)b1)[p]));
    case L_INT64: return put_varint_fast(d, zigzag(((const int64_t *)b1)[p]));
    case L_FLOAT: memcpy(d, b1 + 4 * p, 4); return d + 4;
    case L_DOUBLE: memcpy(d, b1 + 8 * p, 8); return d + 8;
    default: { /* L_BINARY */
        const int32_t *o = (const int32_t *)b1 + p;
        return put_bytes_fast(d, b2 + o[0], (int64_t)o[1] - o[0], b2_end);
    }
    }
}

/* The entries of an array or a map (keys first). Up to SMALL entries (most arrays and maps in
 * messages) are written without a branch on their count, whose exit a CPU cannot predict when
 * counts vary: all SMALL slots are written, slot j from entry min(j, count - 1), and the write
 * position only moves past the first `count`; the other slots are written over each other just
 * past them (the caller reserved room for one more last entry) and rewritten by what follows. */
enum { SMALL = 4 };

INLINE uint8_t *put_entries(uint8_t *d, const Column *c, int leaf, int is_map, int64_t j0,
                            int64_t k0, int64_t count) {
    if (count <= SMALL) {
        for (int64_t j = 0; j < SMALL; j++) {
            int64_t at = j < count ? j : count - 1;
            uint8_t *e = d;
            if (is_map) e = put_leaf(e, L_BINARY, c->key_b1, c->key_b2, c->key_b2_end, k0 + at);
            e = put_leaf(e, leaf, c->item_b1, c->item_b2, c->item_b2_end, j0 + at);
            d = j < count ? e : d;
        }
        return d;
    }
    for (int64_t j = 0; j < count; j++) {
        if (is_map) d = put_leaf(d, L_BINARY, c->key_b1, c->key_b2, c->key_b2_end, k0 + j);
        d = put_leaf(d, leaf, c->item_b1, c->item_b2, c->item_b2_end, j0 + j);
    }
    return d;
}

/* Bytes to reserve for leaves [j0, j1): at most 10 a value, plus the strings' bytes. */
INLINE int64_t leaf_need(int leaf, const uint8_t *b1, int64_t j0, int64_t j1) {
    int64_t need = 10 * (j1 - j0);
    if (leaf == L_BINARY) need += (int64_t)((const int32_t *)b1)[j1] - ((const int32_t *)b1)[j0];
    return need;
}

/* The most a column writes without reserving room of its own: its union index and a leaf
 * (a string under 64 bytes: its length and a 64-byte move), or the 0 that ends an array. */
static int64_t column_bound(int shape) {
    static const int64_t leaf[N_LEAF] = {1, 10, 10, 4, 8, 65};
    if (shape < S_LIST) return 1 + leaf[shape % N_LEAF];
    return shape < S_GENERIC ? 1 : 0;
}

/* Grows the writer (a cold call) unless `need` bytes, then `bound` (what the rest of the row
 * may write unchecked) and the spill are left after d. Every row starts with RESERVE(0); a
 * string of 64 bytes or more, an array, a map or a generic column reserve their own bytes. */
#define RESERVE(need)                                                                      \
    do {                                                                                   \
        int64_t need_ = (need) + bound + SPILL;                                            \
        if (__builtin_expect(end - d < need_, 0)) {                                        \
            w->p = d;                                                                      \
            w->row = row0 + (r - lo);                                                      \
            if (grow(w, (size_t)need_) < 0) return -1;                                     \
            d = w->p;                                                                      \
            end = w->end;                                                                  \
        }                                                                                  \
    } while (0)

#define FAIL_ROW(...)                                                                      \
    do {                                                                                   \
        fail(w, __VA_ARGS__);                                                              \
        w->err_row = row0 + (r - lo);                                                      \
        return -1;                                                                         \
    } while (0)

/* Rows [lo, hi) of a segment (rows row0.. of the batch), row by row, column by column; row r's
 * end goes to ends[r - lo + 1], relative to the writer's base. `bound`: the columns' bounds.
 * The write position and the end of the buffer live in locals: kept in a struct, every byte
 * stored would make the compiler reload them (a byte store may alias anything). */
HOT_CLONES static int encode_rows(Writer *w, const Column *cols, int n_cols, int64_t bound,
                                  int64_t lo, int64_t hi, int64_t row0, int64_t *ends) {
    uint8_t *d = w->p, *end = w->end;
    const Column *stop = cols + n_cols;
    for (int64_t r = lo; r < hi; r++) {
        RESERVE(0);
        for (const Column *c = cols; c < stop; c++) {
            int64_t p = c->at + r;
            switch (c->shape) {
#define LEAF(L)                                                                            \
            case S_OPTIONAL + L:                                                           \
                if (c->null_byte >= 0 && c->value_byte >= 0) {                             \
                    /* no branch on nullness: the value is written after the index either  \
                     * way, and d moves past it only for a value (reads stay in bounds) */  \
                    int null = c->valid != NULL && !BIT(c->valid, p);                      \
                    *d++ = (uint8_t)(null ? c->null_byte : c->value_byte);                 \
                    if (L == L_BINARY) {                                                   \
                        const int32_t *o = (const int32_t *)c->b1 + p;                     \
                        int64_t n = (int64_t)o[1] - o[0];                                  \
                        n = null ? 0 : n;                                                  \
                        if (__builtin_expect(n >= 64, 0)) {                                \
                            RESERVE(n + 10);                                               \
                            d = put_bytes(d, c->b2 + o[0], n);                             \
                            break;                                                         \
                        }                                                                  \
                        uint8_t *e = put_bytes_fast(d, c->b2 + o[0], n, c->b2_end);        \
                        d = null ? d : e;                                                  \
                    } else {                                                               \
                        uint8_t *e = put_leaf(d, L, c->b1, c->b2, c->b2_end, p);           \
                        d = null ? d : e;                                                  \
                    }                                                                      \
                    break;                                                                 \
                }                                                                          \
                if (c->valid != NULL && !BIT(c->valid, p)) {                               \
                    if (c->null_byte < 0) FAIL_ROW(c->b->n, E_NULL, p - c->b->off, 0);     \
                    *d++ = (uint8_t)c->null_byte;                                          \
                    break;                                                                 \
                }                                                                          \
                if (c->value_byte >= 0) *d++ = (uint8_t)c->value_byte;                     \
                /* fall through */                                                         \
            case S_LEAF + L:                                                               \
                if (L == L_BINARY) {                                                       \
                    const int32_t *o = (const int32_t *)c->b1 + p;                         \
                    int64_t n = (int64_t)o[1] - o[0];                                      \
                    if (__builtin_expect(n >= 64, 0)) {                                    \
                        RESERVE(n + 10);                                                   \
                        d = put_bytes(d, c->b2 + o[0], n);                                 \
                        break;                                                             \
                    }                                                                      \
                }                                                                          \
                d = put_leaf(d, L, c->b1, c->b2, c->b2_end, p);                            \
                break;                                                                     \
            case S_LIST + L:                                                               \
            case S_MAP + L: {                                                              \
                const int32_t *o = (const int32_t *)c->b1 + p;                             \
                int64_t start = o[0], count = o[1] - start;                                \
                if (count > 0) {                                                           \
                    int64_t j0 = start + c->item_off, k0 = start + c->key_off;             \
                    int64_t need = 10 + leaf_need(L, c->item_b1, j0, j0 + count);          \
                    if (c->shape == S_MAP + L)                                             \
                        need += leaf_need(L_BINARY, c->key_b1, k0, k0 + count);            \
                    if (count <= SMALL) { /* room for a slot past the last: put_entries */ \
                        need += leaf_need(L, c->item_b1, j0 + count - 1, j0 + count);      \
                        if (c->shape == S_MAP + L)                                         \
                            need += leaf_need(L_BINARY, c->key_b1, k0 + count - 1, k0 + count); \
                    }                                                                      \
                    RESERVE(need);                                                         \
                    d = put_varint(d, (uint64_t)count << 1);                               \
                    d = put_entries(d, c, L, c->shape == S_MAP + L, j0, k0, count);        \
                }                                                                          \
                *d++ = 0;                                                                  \
                break;                                                                     \
            }
            LEAF(L_BOOL)
            LEAF(L_INT32)
            LEAF(L_INT64)
            LEAF(L_FLOAT)
            LEAF(L_DOUBLE)
            LEAF(L_BINARY)
#undef LEAF
            default: /* no other shape: no bounds check before the jump table */
                __builtin_unreachable();
            case S_GENERIC: {
                int64_t i = p - c->b->off, s = size_element(w, c->b, i, c->b->kind);
                if (s < 0) {
                    w->err_row = row0 + (r - lo);
                    return -1;
                }
                RESERVE(s);
                uint8_t *e = write_element(c->b, i, d, c->b->kind);
                if (e - d != s) FAIL_ROW(c->b->n, E_INTERNAL, i, s);
                d = e;
            }
            }
        }
        ends[r - lo + 1] = d - w->base;
    }
    w->p = d;
    return 0;
}

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
        b->data_end = b->b2;
        if (n->kind == K_BINARY && a->length > 0)
            b->data_end = b->b2 + ((const int32_t *)b->b1)[a->offset + a->length];
    }
    b->kind = n->kind;
    b->optional = b->valid != NULL || n->value_branch >= 0;
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

/* The nodes that occur once per row: the fields of the top-level record, and of the records
 * (never null, no union index) nested in them; `base` is where row 0 lies in b's coordinates. */
static int flatten(const Bound *b, int64_t base, Column *out) {
    if (b->kind != K_RECORD || b->optional) {
        if (out) {
            memset(out, 0, sizeof(*out));
            out->b = b;
            out->shape = column_shape(b);
            out->at = base + b->off;
            out->optional = b->optional;
            out->null_byte = b->null_byte;
            out->value_byte = b->value_byte;
            out->valid = b->valid;
            out->b1 = b->b1;
            out->b2 = b->b2;
            out->b2_end = b->data_end;
            if (out->shape >= S_LIST && out->shape < S_GENERIC) {
                const Bound *item = &b->kids[b->kind == K_MAP ? 1 : 0], *key = &b->kids[0];
                out->item_off = item->off;
                out->item_b1 = item->b1;
                out->item_b2 = item->b2;
                out->item_b2_end = item->data_end;
                out->key_off = key->off;
                out->key_b1 = key->b1;
                out->key_b2 = key->b2;
                out->key_b2_end = key->data_end;
            }
        }
        return 1;
    }
    int count = 0;
    for (int k = 0; k < b->n_kids; k++)
        count += flatten(&b->kids[k], base + b->off, out ? out + count : NULL);
    return count;
}

/* ---------------------------------------------------------------- threads */

/* Memory: every buffer is a block (blk_alloc). Each thread writes its rows into its own scratch
 * block; thread 0's (sized for the whole output) becomes the output when it has the room, the
 * other threads' parts are copied after its own (in parallel, equal slices), or every part is
 * copied into a new block. The output and its offsets go to Python as Block objects, which give
 * their block back when Arrow releases them. */
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
    const uint8_t *part;    /* this thread's bytes, `len` of them, going to `start` in the output */
    int64_t len, start;
} Task;

static void *encode_range(void *arg) {
    Task *t = arg;
    Shared *sh = t->sh;
    int64_t r = t->r0;
    for (int s = 0; s < sh->n_segs && r < t->r1; s++) {
        const Segment *sg = &sh->segs[s];
        int64_t lo = sg->first_row, hi = sg->first_row + sg->length;
        if (hi > t->r1) hi = t->r1;
        if (r >= hi) continue;
        if (encode_rows(&t->w, sg->cols, sg->n_cols, sg->bound, r - lo, hi - lo, r,
                        sh->ends + r) < 0)
            return NULL;
        r = hi;
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
        int64_t p0 = part->start, p1 = p0 + part->len;
        int64_t x0 = a > p0 ? a : p0, x1 = b < p1 ? b : p1;
        if (x0 < x1) memcpy(sh->data + x0, part->part + (x0 - p0), (size_t)(x1 - x0));
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

typedef struct {
    PyObject_HEAD
    uint8_t *p;
    Py_ssize_t len;
    size_t cap;
} Block;

static void block_dealloc(Block *self) {
    blk_free(self->p, self->cap);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int block_getbuffer(Block *self, Py_buffer *view, int flags) {
    return PyBuffer_FillInfo(view, (PyObject *)self, self->p, self->len, 1, flags);
}

static PyBufferProcs block_as_buffer = {(getbufferproc)block_getbuffer, NULL};

static PyTypeObject BlockType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "arrowstash.avro._cencode.Block",
    .tp_basicsize = sizeof(Block),
    .tp_dealloc = (destructor)block_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_as_buffer = &block_as_buffer,
    .tp_doc = "Bytes written by the native Avro encoder; the memory is reused once released.",
};

/* A Block owning *p's `cap` bytes, of which `len` are used (*p becomes NULL), or NULL. */
static PyObject *block_take(uint8_t **p, int64_t len, size_t cap) {
    Block *o = PyObject_New(Block, &BlockType);
    if (o == NULL) return NULL;
    o->p = *p;
    o->len = (Py_ssize_t)len;
    o->cap = cap;
    *p = NULL;
    return (PyObject *)o;
}

/* encode(plan, capsules, threads, guess)
 *   -> (data, offsets, large, size, None) or (None, None, 0, 0, (row, node, code, value)):
 * thread 0's scratch has `guess` bytes, the others' guess / threads. */
static PyObject *py_encode(PyObject *self, PyObject *args) {
    PyObject *plan, *caps;
    int n_threads;
    long long guess;
    (void)self;
    if (!PyArg_ParseTuple(args, "O!O!iL", &PyTuple_Type, &plan, &PyList_Type, &caps, &n_threads,
                          &guess))
        return NULL;
    int n_segs = (int)PyList_GET_SIZE(caps);
    if (n_threads < 1 || n_threads > 256 || guess < 0) {
        PyErr_SetString(PyExc_ValueError, "between 1 and 256 threads, and a guess >= 0");
        return NULL;
    }
    Node root;
    Segment *segs = NULL;
    Task *tasks = NULL;
    Shared sh;
    size_t ends_cap = 0, offs_cap = 0, data_cap = 0;
    uint8_t *ends = NULL, *offs = NULL, *data = NULL;
    PyObject *data_obj = NULL, *offs_obj = NULL, *result = NULL;
    memset(&sh, 0, sizeof(sh));
    if (parse_node(plan, &root) < 0) goto done;
    segs = calloc((size_t)n_segs + 1, sizeof(Segment));
    tasks = calloc((size_t)n_threads, sizeof(Task));
    if (segs == NULL || tasks == NULL) {
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
        segs[s].n_cols = flatten(segs[s].root, 0, NULL);
        segs[s].cols = calloc((size_t)segs[s].n_cols, sizeof(Column));
        if (segs[s].cols == NULL) {
            PyErr_NoMemory();
            goto done;
        }
        flatten(segs[s].root, 0, segs[s].cols);
        for (int k = 0; k < segs[s].n_cols; k++)
            segs[s].bound += column_bound(segs[s].cols[k].shape);
        segs[s].length = a->length;
        segs[s].first_row = sh.total;
        sh.total += a->length;
    }
    sh.segs = segs;
    sh.n_segs = n_segs;
    sh.n_threads = n_threads;
    ends_cap = (size_t)(sh.total + 1) * 8;
    ends = blk_alloc(&ends_cap);
    if (ends == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    sh.ends = (int64_t *)ends;
    sh.ends[0] = 0;
    for (int k = 0; k < n_threads; k++) {
        size_t cap = (size_t)(k == 0 ? guess : guess / n_threads + 4096);
        tasks[k].sh = &sh;
        tasks[k].index = k;
        tasks[k].r0 = sh.total * k / n_threads;
        tasks[k].r1 = sh.total * (k + 1) / n_threads;
        tasks[k].w.base = tasks[k].w.p = blk_alloc(&cap);
        if (tasks[k].w.base == NULL) {
            PyErr_NoMemory();
            goto done;
        }
        tasks[k].w.end = tasks[k].w.base + cap;
    }
    Py_BEGIN_ALLOW_THREADS
    parallel(encode_range, tasks, n_threads);
    Py_END_ALLOW_THREADS
    for (int k = 0; k < n_threads; k++) {
        Writer *w = &tasks[k].w;
        if (!w->failed) continue;
        if (w->err_code == E_NOMEM) {
            PyErr_NoMemory();
        } else if (w->err_code == E_INTERNAL) {
            PyErr_Format(PyExc_RuntimeError, "native Avro encoder: row %lld came out at another "
                         "size than measured (a bug: please report it)",
                         (long long)w->err_row);
        } else {
            result = Py_BuildValue("(OOii(LLLL))", Py_None, Py_None, 0, 0, w->err_row,
                                   w->err_node, (long long)w->err_code, w->err_value);
        }
        goto done;
    }
    int64_t pos = 0;
    for (int k = 0; k < n_threads; k++) {
        tasks[k].part = tasks[k].w.base;
        tasks[k].len = tasks[k].w.p - tasks[k].w.base;
        tasks[k].start = pos;
        pos += tasks[k].len;
    }
    sh.large = pos > INT32_MAX;
    if (!sh.large) {
        offs_cap = (size_t)(sh.total + 1) * 4;
        offs = blk_alloc(&offs_cap);
        if (offs == NULL) {
            PyErr_NoMemory();
            goto done;
        }
        sh.offsets32 = (int32_t *)offs;
        sh.offsets32[0] = 0;
    }
    if (tasks[0].w.end - tasks[0].w.base >= pos) {
        /* thread 0's scratch is the output: its part stays, the others are copied after it */
        data = tasks[0].w.base;
        data_cap = (size_t)(tasks[0].w.end - tasks[0].w.base);
        tasks[0].w.base = NULL;
        sh.in_place = 1;
    } else {
        data_cap = (size_t)pos;
        data = blk_alloc(&data_cap);
        if (data == NULL) {
            PyErr_NoMemory();
            goto done;
        }
    }
    sh.data = data;
    sh.tasks = tasks;
    sh.size = pos;
    sh.copy_from = sh.in_place ? tasks[0].len : 0;
    Py_BEGIN_ALLOW_THREADS
    parallel(copy_out, tasks, n_threads);
    Py_END_ALLOW_THREADS
    if (data_cap > BLK_KEEP && (size_t)pos < data_cap) {
        /* too large to be kept for reuse: give the scratch's unused end back to the system */
        uint8_t *fit = realloc(data, pos ? (size_t)pos : 1);
        if (fit != NULL) {
            data = fit;
            data_cap = pos ? (size_t)pos : 1;
        }
    }
    data_obj = block_take(&data, pos, data_cap);
    offs_obj = sh.large ? block_take(&ends, (sh.total + 1) * 8, ends_cap)
                        : block_take(&offs, (sh.total + 1) * 4, offs_cap);
    if (data_obj != NULL && offs_obj != NULL)
        result = Py_BuildValue("(OOiLO)", data_obj, offs_obj, sh.large, (long long)pos, Py_None);
done:
    Py_XDECREF(data_obj);
    Py_XDECREF(offs_obj);
    blk_free(data, data_cap);
    blk_free(offs, offs_cap);
    blk_free(ends, ends_cap);
    if (tasks)
        for (int k = 0; k < n_threads; k++)
            blk_free(tasks[k].w.base, (size_t)(tasks[k].w.end - tasks[k].w.base));
    if (segs)
        for (int s = 0; s < n_segs; s++)
            if (segs[s].root) {
                free_bound(segs[s].root);
                free(segs[s].root);
                free(segs[s].cols);
            }
    free(tasks);
    free(segs);
    free_node(&root);
    return result;
}

static PyMethodDef methods[] = {
    {"encode", py_encode, METH_VARARGS,
     "encode(plan, arrays, threads, guess) -> (data, offsets, large, size, error): the Avro "
     "datums of the rows of the Arrow arrays (C Data Interface capsules), one per row, back to "
     "back, as buffer objects; `guess`: the expected output size."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_cencode",
                                    "Native Avro encoder over Arrow buffers.", -1, methods};

PyMODINIT_FUNC PyInit__cencode(void) {
    if (PyType_Ready(&BlockType) < 0) return NULL;
    return PyModule_Create(&module);
}
