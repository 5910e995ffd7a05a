/* The native Avro decoder: Avro datums straight into Arrow buffers.
 *
 * It walks the plan compiled by _plan.py (one node per Arrow array) exactly like the
 * pure-Python decoder in _decode.py, fills the same buffers in Arrow's layouts and reports
 * errors as the same (code, segment, datum, offset, node, detail) tuples. No Python object is
 * made per value; the GIL is released for the whole batch; segments (messages or blocks) are
 * split across pthreads, each filling its own buffers, which are then concatenated. Every read
 * is bounds-checked against the end of its segment.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum { K_NULL, K_BOOL, K_INT, K_LONG, K_FLOAT, K_DOUBLE, K_BYTES, K_STRING, K_FIXED, K_ENUM,
       K_UUID_STR, K_DEC_BYTES, K_DEC_FIXED, K_DURATION, K_RECORD, K_ARRAY, K_MAP, K_UNION,
       K_SKIP /* read past a value of kind param (a field the reader drops) */,
       K_NULLABLE /* not a plan kind: Node.op of a ["null", T] node */ };
/* How deep skipped values may nest: _plan.SKIP_DEPTH. */
#define SKIP_DEPTH 10000

enum { E_TRUNCATED = 1, E_VARINT, E_INT_RANGE, E_UNION_INDEX, E_NEGATIVE, E_UTF8, E_TRAILING,
       E_BOOL, E_ENUM, E_UUID, E_DECIMAL, E_DURATION, E_BLOCK_COUNT, E_TOO_LARGE,
       E_CONFLUENT_SHORT, E_CONFLUENT_MAGIC, E_NULL_MESSAGE, E_NO_MEMORY, E_TIME, E_TOO_DEEP };

struct Ctx;
struct Col;
struct Node;
/* Decodes one value of node n at p into its column and returns the position after it, or NULL
 * after recording an error in c; a function per kind keeps each one small. */
typedef const uint8_t *(*DecFn)(struct Ctx *c, const struct Node *n, struct Col *col,
                                const uint8_t *p);

typedef struct Node {
    int kind, null_branch, nchildren, null_child, index;
    int op;             /* kind, or K_NULLABLE */
    size_t col_offset;  /* index * sizeof(Col): where its column is in a context's array */
    int64_t param, size, min_size, item_min;
    int *children;
    struct Node **kids; /* the children as pointers */
    int *empties, nempties; /* the nodes an empty slot of this one touches, in order */
    DecFn fn;           /* the value */
    DecFn entry;        /* fn, or the ["null", T] wrapper around it */
    uint8_t limit[32];  /* decimals: 10**precision, little-endian, param bytes */
} Node;

typedef struct { uint8_t *p; size_t len, cap; } Buf;

typedef struct Col {
    Buf valid, data, offs, tids; /* validity bits, values (or bits), int32 offsets, int8 ids */
    int64_t length, nulls;
    int64_t checked; /* strings: the values whose UTF-8 is checked */
} Col;

typedef struct { const uint8_t *ptr; int64_t len, count; } Seg; /* len < 0: a null message */

/* Messages given as one buffer and its offsets (message i is data[offs[first + i] ..
 * offs[first + i + 1]], null where bit first + i of valid is clear): each thread fills the
 * segments of its own range from them, instead of the calling thread filling all of them
 * before any thread starts. */
typedef struct {
    const uint8_t *data, *offs, *valid;
    int width;
    int64_t first;
} Lazy;

static inline int64_t lz_off(const Lazy *lz, int64_t i) {
    if (lz->width == 4) {
        int32_t v;
        memcpy(&v, lz->offs + (lz->first + i) * 4, 4);
        return v;
    }
    int64_t v;
    memcpy(&v, lz->offs + (lz->first + i) * 8, 8);
    return v;
}

static void lz_fill(const Lazy *lz, Seg *segs, int64_t a, int64_t b) {
    int64_t lo = a < b ? lz_off(lz, a) : 0;
    for (int64_t i = a; i < b; i++) {
        int64_t hi = lz_off(lz, i + 1), bit = lz->first + i;
        segs[i].ptr = lz->data + lo; /* a null one's too: see run() */
        segs[i].len = hi - lo;
        segs[i].count = 1;
        if (lz->valid && !(lz->valid[bit >> 3] & (1u << (bit & 7)))) segs[i].len = -1;
        lo = hi;
    }
}

typedef struct Ctx {
    const Node *nodes;
    int nnodes, validate_utf8, confluent;
    int strict_utf8; /* check each string as it is read (else whole columns after the range) */
    int utf8_bad;    /* a check of the strings read so far found invalid UTF-8 */
    Col *cols;
    const uint8_t *start, *end;
    const Seg *segs;
    const Lazy *lazy; /* set: fill segs[seg_begin, seg_end) from it first */
    int64_t seg_begin, seg_end;
    int64_t all_bytes; /* the first of several threads sizes its buffers for all of them */
    int32_t *ids;
    /* the first error */
    int err;
    int64_t err_seg, err_datum, err_off, err_detail;
    int err_node, err_unsigned;
} __attribute__((aligned(64))) Ctx; /* own cache lines: each chunk's thread writes its Ctx */

/* -- buffers ------------------------------------------------------------------------------- */

static int buf_grow(Buf *b, size_t extra);

static inline int buf_reserve(Buf *b, size_t extra) {
    if (__builtin_expect(b->len + extra <= b->cap, 1)) return 0;
    return buf_grow(b, extra);
}

/* -- reused memory ---------------------------------------------------------------------------
 * A fresh page costs a page fault on its first write: about 4,500 of them (a third of the time)
 * for a batch of 100,000 records whose output blocks came straight from the system each call.
 * So blocks of BLK_MIN bytes or more are kept when freed (output buffers once Arrow releases
 * them, the threads' parts after a merge), up to BLK_KEEP bytes in all, and the next buffers
 * that grow that large take them. */
#define BLK_MIN ((size_t)64 << 10)
#define BLK_KEEP ((size_t)128 << 20)
#define BLK_SLOTS 256
static struct { void *p; size_t cap; } blk_slot[BLK_SLOTS];
static int blk_count;
static size_t blk_bytes;
static pthread_mutex_t blk_mu = PTHREAD_MUTEX_INITIALIZER;

/* A block of at least *cap bytes (*cap becomes its real size), or NULL. A kept block is taken
 * when it is at most 4 times too large (best fit), so small requests leave the big ones. */
static void *blk_alloc(size_t *cap) {
    void *p = NULL;
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

/* Free (or keep) a block of cap bytes from blk_alloc or realloc. When there is no room, the
 * smallest kept blocks make way for a larger one (the small ones are the steps of growth). */
static void blk_free(void *p, size_t cap) {
    if (!p || cap < BLK_MIN || cap > BLK_KEEP) {
        free(p);
        return;
    }
    void *drop[BLK_SLOTS + 1];
    int ndrop = 0;
    pthread_mutex_lock(&blk_mu);
    while (blk_count == BLK_SLOTS || blk_bytes + cap > BLK_KEEP) {
        int small = 0;
        for (int i = 1; i < blk_count; i++)
            if (blk_slot[i].cap < blk_slot[small].cap) small = i;
        if (blk_slot[small].cap >= cap) break;
        drop[ndrop++] = blk_slot[small].p;
        blk_bytes -= blk_slot[small].cap;
        blk_slot[small] = blk_slot[--blk_count];
    }
    int kept = blk_count < BLK_SLOTS && blk_bytes + cap <= BLK_KEEP;
    if (kept) {
        blk_slot[blk_count].p = p;
        blk_slot[blk_count++].cap = cap;
        blk_bytes += cap;
    }
    pthread_mutex_unlock(&blk_mu);
    for (int i = 0; i < ndrop; i++) free(drop[i]);
    if (!kept) free(p);
}

static int buf_grow(Buf *b, size_t extra) {
    size_t cap = b->cap ? b->cap : 64;
    while (cap < b->len + extra) cap *= 2;
    if (cap < BLK_MIN) { /* small: the C heap reuses its own memory */
        uint8_t *p = realloc(b->p, cap);
        if (!p) return -1;
        b->p = p;
        b->cap = cap;
        return 0;
    }
    uint8_t *p = blk_alloc(&cap);
    if (!p) return -1;
    if (b->len) memcpy(p, b->p, b->len);
    blk_free(b->p, b->cap);
    b->p = p;
    b->cap = cap;
    return 0;
}

static inline int buf_put(Buf *b, const void *src, size_t n) {
    if (buf_reserve(b, n)) return -1;
    memcpy(b->p + b->len, src, n);
    b->len += n;
    return 0;
}

static inline int buf_zeros(Buf *b, size_t n) {
    if (buf_reserve(b, n)) return -1;
    memset(b->p + b->len, 0, n);
    b->len += n;
    return 0;
}

static inline __attribute__((always_inline)) int buf_i32(Buf *b, int32_t v) {
    if (buf_reserve(b, 4)) return -1;
    memcpy(b->p + b->len, &v, 4);
    b->len += 4;
    return 0;
}

/* Set bit i (the buffer grows zero-filled, so clearing is only growing). */
/* Append bit i (0 or 1) of a bitmap filled in order, so that it holds ceil(i / 8) bytes. */
static inline __attribute__((always_inline)) int bit_put(Buf *b, int64_t i, int v) {
    if ((i & 7) == 0) {
        if (buf_reserve(b, 1)) return -1;
        b->p[b->len++] = (uint8_t)v;
    } else {
        b->p[i >> 3] |= (uint8_t)(v << (i & 7));
    }
    return 0;
}

/* Zeroed memory on cache lines of its own (threads write their contexts and columns all the
 * time: sharing a line with another thread's would move it between the cores), or NULL. */
static void *zalloc_lines(size_t size) {
    size = (size + 63) / 64 * 64;
    void *p = aligned_alloc(64, size ? size : 64);
    if (p) memset(p, 0, size ? size : 64);
    return p;
}

/* -- errors -------------------------------------------------------------------------------- */

static int fail(Ctx *c, int code, const uint8_t *at, int node, int64_t detail) {
    c->err = code;
    c->err_off = at - c->start;
    c->err_node = node;
    c->err_detail = detail;
    c->err_unsigned = 0;
    return -1;
}

static int oom(Ctx *c, const uint8_t *at, int node) { return fail(c, E_NO_MEMORY, at, node, 0); }

/* -- primitive reads ----------------------------------------------------------------------- */

static inline int rd_long(Ctx *c, const uint8_t **pp, int node, int64_t *out) {
    const uint8_t *p = *pp, *end = c->end;
    if (p < end && *p < 0x80) {
        uint64_t v = *p;
        *pp = p + 1;
        *out = (int64_t)((v >> 1) ^ (0 - (v & 1)));
        return 0;
    }
    uint64_t v = 0;
    int shift = 0;
    for (int i = 0; i < 10; i++) {
        if (p >= end) return fail(c, E_TRUNCATED, *pp, node, 0);
        uint8_t b = *p++;
        if (i == 9 && b > 1) return fail(c, E_VARINT, *pp, node, 0);
        v |= (uint64_t)(b & 0x7f) << shift;
        if (b < 0x80) {
            *pp = p;
            *out = (int64_t)((v >> 1) ^ (0 - (v & 1)));
            return 0;
        }
        shift += 7;
    }
    return fail(c, E_VARINT, *pp, node, 0); /* not reached: byte 10 ends or fails above */
}

static int utf8_ok(const uint8_t *s, size_t n) {
    size_t i = 0;
    while (i < n) {
        if (i + 8 <= n) {
            uint64_t w;
            memcpy(&w, s + i, 8);
            if (!(w & 0x8080808080808080ULL)) {
                i += 8;
                continue;
            }
        }
        uint8_t ch = s[i];
        if (ch < 0x80) {
            i++;
        } else if (ch < 0xC2) {
            return 0;
        } else if (ch < 0xE0) {
            if (i + 1 >= n || (s[i + 1] & 0xC0) != 0x80) return 0;
            i += 2;
        } else if (ch < 0xF0) {
            if (i + 2 >= n) return 0;
            uint8_t c1 = s[i + 1], c2 = s[i + 2];
            if ((c1 & 0xC0) != 0x80 || (c2 & 0xC0) != 0x80) return 0;
            if (ch == 0xE0 && c1 < 0xA0) return 0; /* overlong */
            if (ch == 0xED && c1 >= 0xA0) return 0; /* surrogate */
            i += 3;
        } else if (ch < 0xF5) {
            if (i + 3 >= n) return 0;
            uint8_t c1 = s[i + 1], c2 = s[i + 2], c3 = s[i + 3];
            if ((c1 & 0xC0) != 0x80 || (c2 & 0xC0) != 0x80 || (c3 & 0xC0) != 0x80) return 0;
            if (ch == 0xF0 && c1 < 0x90) return 0; /* overlong */
            if (ch == 0xF4 && c1 >= 0x90) return 0; /* beyond U+10FFFF */
            i += 4;
        } else {
            return 0;
        }
    }
    return 1;
}

/* hex digit values, 0xFF for anything else */
static const uint8_t HEX[256] = {
    ['0'] = 0, ['1'] = 1, ['2'] = 2, ['3'] = 3, ['4'] = 4, ['5'] = 5, ['6'] = 6, ['7'] = 7,
    ['8'] = 8, ['9'] = 9, ['a'] = 10, ['b'] = 11, ['c'] = 12, ['d'] = 13, ['e'] = 14,
    ['f'] = 15, ['A'] = 10, ['B'] = 11, ['C'] = 12, ['D'] = 13, ['E'] = 14, ['F'] = 15,
};
static uint8_t hex_ok[256]; /* 1 for hex digits; filled at import */

/* 36-character text form -> 16 bytes; -1 if malformed. */
static int parse_uuid(const uint8_t *s, uint8_t *out) {
    static const int8_t at[16] = {0, 2, 4, 6, 9, 11, 14, 16, 19, 21, 24, 26, 28, 30, 32, 34};
    if (s[8] != '-' || s[13] != '-' || s[18] != '-' || s[23] != '-') return -1;
    unsigned bad = 0;
    for (int k = 0; k < 16; k++) {
        uint8_t hi = s[at[k]], lo = s[at[k] + 1];
        bad |= (unsigned)(hex_ok[hi] & hex_ok[lo]) ^ 1u;
        out[k] = (uint8_t)(HEX[hi] << 4 | HEX[lo]);
    }
    return bad ? -1 : 0;
}

/* Big-endian two's complement of len bytes -> width bytes little-endian, within precision. */
static int convert_decimal(const Node *n, const uint8_t *src, int64_t len, uint8_t *out) {
    int w = (int)n->param;
    uint8_t sign = (len > 0 && (src[0] & 0x80)) ? 0xFF : 0x00;
    if (len > w) {
        for (int64_t i = 0; i < len - w; i++)
            if (src[i] != sign) return -1;
        if (((src[len - w] & 0x80) ? 0xFF : 0x00) != sign) return -1;
    }
    for (int j = 0; j < w; j++) {
        int64_t k = len - 1 - j;
        out[j] = k >= 0 ? src[k] : sign;
    }
    uint8_t mag[32];
    if (sign) { /* magnitude = two's complement negation */
        int carry = 1;
        for (int j = 0; j < w; j++) {
            int v = (uint8_t)~out[j] + carry;
            mag[j] = (uint8_t)v;
            carry = v >> 8;
        }
    } else {
        memcpy(mag, out, (size_t)w);
    }
    for (int j = w - 1; j >= 0; j--) {
        if (mag[j] != n->limit[j]) return mag[j] > n->limit[j] ? -1 : 0;
    }
    return -1; /* equal to 10**precision: one digit too many */
}

/* -- the walk ------------------------------------------------------------------------------ */

/* A slot with no value: a null, or a child of a null record. Same as _decode.py's empties, with
 * the recursion flattened into the node's precomputed list (the node, then what it holds). */
static int empty(Ctx *c, int ni) {
    const Node *top = &c->nodes[ni];
    for (int e = 0; e < top->nempties; e++) {
        const Node *n = &c->nodes[top->empties[e]];
        Col *col = &c->cols[n->index];
        int r = 0;
        if (n->null_branch >= 0) {
            if (bit_put(&col->valid, col->length, 0)) return -1;
            col->nulls++;
        }
        switch (n->kind) {
        case K_NULL: case K_RECORD: break;
        case K_BOOL: r = bit_put(&col->data, col->length, 0); break;
        case K_INT: case K_ENUM: case K_FLOAT: r = buf_zeros(&col->data, 4); break;
        case K_LONG: case K_DOUBLE: r = buf_zeros(&col->data, 8); break;
        case K_FIXED: case K_DEC_BYTES: case K_DEC_FIXED:
            r = buf_zeros(&col->data, (size_t)n->param);
            break;
        case K_UUID_STR: case K_DURATION: r = buf_zeros(&col->data, 16); break;
        case K_BYTES: case K_STRING: r = buf_i32(&col->offs, (int32_t)col->data.len); break;
        case K_ARRAY: case K_MAP:
            r = buf_i32(&col->offs, (int32_t)c->cols[n->children[0]].length);
            break;
        case K_UNION: { /* the null branch (or branch 0) gets the empty value, next in the list */
            int8_t tid = (int8_t)n->null_child;
            r = buf_put(&col->tids, &tid, 1);
            if (!r) r = buf_i32(&col->offs, (int32_t)c->cols[n->children[tid]].length);
            break;
        }
        }
        if (r) return -1;
        col->length++;
    }
    return 0;
}


/* One value of kid: the common leaf kinds inline (no call), the rest through its function. */
#define CHILD(c, kid, p) dec_any((c), (kid), (p))
#define FAIL(c, code, at, n, detail) (fail((c), (code), (at), (n)->index, (detail)), NULL)
#define OOM(c, at, n) (oom((c), (at), (n)->index), NULL)

static const uint8_t *d_null(Ctx *c, const Node *n, Col *col, const uint8_t *p) {
    col->length++;
    return p;
}

static inline __attribute__((always_inline)) const uint8_t *d_bool(Ctx *c, const Node *n, Col *col, const uint8_t *p) {
    if (p >= c->end) return FAIL(c, E_TRUNCATED, p, n, 0);
    if (*p > 1) return FAIL(c, E_BOOL, p, n, *p);
    if (bit_put(&col->data, col->length, *p)) return OOM(c, p, n);
    col->length++;
    return p + 1;
}

static inline __attribute__((always_inline)) const uint8_t *d_int(Ctx *c, const Node *n, Col *col, const uint8_t *p) {
    const uint8_t *start = p;
    int64_t v;
    if (rd_long(c, &p, n->index, &v)) return NULL;
    if (v < INT32_MIN || v > INT32_MAX) return FAIL(c, E_INT_RANGE, start, n, v);
    if (n->param && (v < 0 || v >= n->param)) return FAIL(c, E_TIME, start, n, v);
    if (buf_i32(&col->data, (int32_t)v)) return OOM(c, start, n);
    col->length++;
    return p;
}

static const uint8_t *d_enum(Ctx *c, const Node *n, Col *col, const uint8_t *p) {
    const uint8_t *start = p;
    int64_t v;
    if (rd_long(c, &p, n->index, &v)) return NULL;
    if (v < 0 || v >= n->param) return FAIL(c, E_ENUM, start, n, v);
    if (buf_i32(&col->data, (int32_t)v)) return OOM(c, start, n);
    col->length++;
    return p;
}

static inline __attribute__((always_inline)) const uint8_t *d_long(Ctx *c, const Node *n, Col *col, const uint8_t *p) {
    const uint8_t *start = p;
    int64_t v;
    if (rd_long(c, &p, n->index, &v)) return NULL;
    if (n->param && (v < 0 || v >= n->param)) return FAIL(c, E_TIME, start, n, v);
    if (buf_reserve(&col->data, 8)) return OOM(c, start, n);
    memcpy(col->data.p + col->data.len, &v, 8);
    col->data.len += 8;
    col->length++;
    return p;
}

static inline __attribute__((always_inline)) const uint8_t *d_sized(Ctx *c, const Node *n, Col *col, const uint8_t *p) {
    int64_t size = n->size; /* float, double, fixed */
    if (c->end - p < size) return FAIL(c, E_TRUNCATED, p, n, 0);
    if (buf_put(&col->data, p, (size_t)size)) return OOM(c, p, n);
    col->length++;
    return p + size;
}

static const uint8_t *d_duration(Ctx *c, const Node *n, Col *col, const uint8_t *p) {
    if (c->end - p < 12) return FAIL(c, E_TRUNCATED, p, n, 0);
    uint32_t months, days, millis;
    memcpy(&months, p, 4);
    memcpy(&days, p + 4, 4);
    memcpy(&millis, p + 8, 4);
    if (months > INT32_MAX) return FAIL(c, E_DURATION, p, n, months);
    if (days > INT32_MAX) return FAIL(c, E_DURATION, p, n, days);
    int64_t nanos = (int64_t)millis * 1000000;
    if (buf_put(&col->data, p, 8) || buf_put(&col->data, &nanos, 8)) return OOM(c, p, n);
    col->length++;
    return p + 12;
}

static const uint8_t *d_dec_fixed(Ctx *c, const Node *n, Col *col, const uint8_t *p) {
    if (c->end - p < n->size) return FAIL(c, E_TRUNCATED, p, n, 0);
    if (buf_reserve(&col->data, (size_t)n->param)) return OOM(c, p, n);
    if (convert_decimal(n, p, n->size, col->data.p + col->data.len))
        return FAIL(c, E_DECIMAL, p, n, 0);
    col->data.len += (size_t)n->param;
    col->length++;
    return p + n->size;
}

/* The length of a bytes-like value at *p, checked against the data left; *p moves past it. */
static inline int rd_len(Ctx *c, const Node *n, const uint8_t **p, int64_t *len) {
    const uint8_t *start = *p;
    if (rd_long(c, p, n->index, len)) return -1;
    if (*len < 0) return fail(c, E_NEGATIVE, start, n->index, *len);
    if (*len > c->end - *p) return fail(c, E_TRUNCATED, start, n->index, 0);
    return 0;
}

static inline __attribute__((always_inline)) const uint8_t *d_bytes_or_string(
    Ctx *c, const Node *n, Col *col, const uint8_t *p, int is_string) {
    const uint8_t *start = p; /* bytes and string */
    int64_t v;
    if (rd_len(c, n, &p, &v)) return NULL;
    if (is_string && c->strict_utf8 && !utf8_ok(p, (size_t)v))
        return FAIL(c, E_UTF8, start, n, 0);
    Buf *d = &col->data, *o = &col->offs;
    if (buf_reserve(d, (size_t)v + 64) || buf_reserve(o, 4)) return OOM(c, start, n);
    /* Short strings (the common case) are copied in fixed-size moves, without a call into
     * memcpy, when the message has that many bytes left (the output always has them). */
    uint8_t *to = d->p + d->len;
    int64_t left = c->end - p;
    if (v <= 16 && left >= 16) {
        memcpy(to, p, 16);
    } else if (v <= 32 && left >= 32) {
        memcpy(to, p, 32);
    } else if (v <= 64 && left >= 64) {
        memcpy(to, p, 32);
        memcpy(to + 32, p + 32, 32);
    } else {
        memcpy(to, p, (size_t)v);
    }
    d->len += (size_t)v;
    if (d->len > INT32_MAX) return FAIL(c, E_TOO_LARGE, start, n, 0);
    int32_t end = (int32_t)d->len;
    memcpy(o->p + o->len, &end, 4);
    o->len += 4;
    col->length++;
    return p + v;
}

static inline __attribute__((always_inline)) const uint8_t *d_bytes(Ctx *c, const Node *n,
                                                                    Col *col, const uint8_t *p) {
    return d_bytes_or_string(c, n, col, p, 0);
}

static inline __attribute__((always_inline)) const uint8_t *d_string(Ctx *c, const Node *n,
                                                                     Col *col, const uint8_t *p) {
    return d_bytes_or_string(c, n, col, p, 1);
}

static const uint8_t *d_uuid(Ctx *c, const Node *n, Col *col, const uint8_t *p) {
    const uint8_t *start = p;
    int64_t v;
    if (rd_len(c, n, &p, &v)) return NULL;
    if (buf_reserve(&col->data, 16)) return OOM(c, start, n);
    if (v != 36 || parse_uuid(p, col->data.p + col->data.len)) return FAIL(c, E_UUID, start, n, 0);
    col->data.len += 16;
    col->length++;
    return p + v;
}

static const uint8_t *d_dec_bytes(Ctx *c, const Node *n, Col *col, const uint8_t *p) {
    const uint8_t *start = p;
    int64_t v;
    if (rd_len(c, n, &p, &v)) return NULL;
    if (buf_reserve(&col->data, (size_t)n->param)) return OOM(c, start, n);
    if (convert_decimal(n, p, v, col->data.p + col->data.len)) return FAIL(c, E_DECIMAL, start, n, 0);
    col->data.len += (size_t)n->param;
    col->length++;
    return p + v;
}

static inline __attribute__((always_inline)) const uint8_t *dec_leaf_or_call(
    Ctx *c, const Node *n, Col *col, const uint8_t *p) {
    switch (n->kind) {
    case K_STRING: return d_string(c, n, col, p);
    case K_BYTES: return d_bytes(c, n, col, p);
    case K_INT: return d_int(c, n, col, p);
    case K_LONG: return d_long(c, n, col, p);
    case K_BOOL: return d_bool(c, n, col, p);
    case K_FLOAT: case K_DOUBLE: case K_FIXED: return d_sized(c, n, col, p);
    default: return n->fn(c, n, col, p);
    }
}

/* ["null", T] or [T, "null"]: the branch index, then T's value or an empty slot. */
static inline __attribute__((always_inline)) const uint8_t *d_nullable(Ctx *c, const Node *n,
                                                                       Col *col, const uint8_t *p) {
    const uint8_t *start = p;
    int64_t idx;
    if (rd_long(c, &p, n->index, &idx)) return NULL;
    if (idx == n->null_branch) return empty(c, n->index) ? OOM(c, start, n) : p;
    if (idx != 1 - n->null_branch) return FAIL(c, E_UNION_INDEX, start, n, idx);
    if (bit_put(&col->valid, col->length, 1)) return OOM(c, start, n);
    return dec_leaf_or_call(c, n, col, p);
}

static inline __attribute__((always_inline)) const uint8_t *dec_any(Ctx *c, const Node *n,
                                                                    const uint8_t *p) {
    Col *col = (Col *)((char *)c->cols + n->col_offset);
    switch (n->op) { /* the kind, or K_NULLABLE: one jump for both questions */
    case K_NULLABLE: return d_nullable(c, n, col, p);
    case K_STRING: return d_string(c, n, col, p);
    case K_BYTES: return d_bytes(c, n, col, p);
    case K_INT: return d_int(c, n, col, p);
    case K_LONG: return d_long(c, n, col, p);
    case K_BOOL: return d_bool(c, n, col, p);
    case K_FLOAT: case K_DOUBLE: case K_FIXED: return d_sized(c, n, col, p);
    default: return n->fn(c, n, col, p);
    }
}

static const uint8_t *d_record(Ctx *c, const Node *n, Col *col, const uint8_t *p) {
    Node *const *kid = n->kids, *const *last = n->kids + n->nchildren;
    for (; kid < last; kid++)
        if (!(p = CHILD(c, *kid, p))) return NULL;
    col->length++;
    return p;
}

static const uint8_t *d_list(Ctx *c, const Node *n, Col *col, const uint8_t *p) {
    Col *first = &c->cols[n->children[0]]; /* array and map */
    for (;;) {
        const uint8_t *start = p;
        int64_t v;
        if (rd_long(c, &p, n->index, &v)) return NULL;
        if (v == 0) break;
        uint64_t count = (uint64_t)v, need;
        if (v < 0) {
            count = 0 - (uint64_t)v;
            const uint8_t *size_start = p;
            int64_t size;
            if (rd_long(c, &p, n->index, &size)) return NULL;
            if (size < 0) return FAIL(c, E_NEGATIVE, size_start, n, size);
        }
        if (__builtin_mul_overflow(count, (uint64_t)n->item_min, &need) ||
            need > (uint64_t)(c->end - p)) {
            fail(c, E_BLOCK_COUNT, start, n->index, 0);
            c->err_detail = (int64_t)count;
            c->err_unsigned = 1;
            return NULL;
        }
        if (count > (uint64_t)(INT32_MAX - first->length)) return FAIL(c, E_TOO_LARGE, start, n, 0);
        if (n->nchildren == 1) {
            const Node *kid = n->kids[0];
            for (uint64_t i = 0; i < count; i++)
                if (!(p = CHILD(c, kid, p))) return NULL;
        } else {
            const Node *key = n->kids[0], *val = n->kids[1];
            for (uint64_t i = 0; i < count; i++) {
                if (!(p = CHILD(c, key, p))) return NULL;
                if (!(p = CHILD(c, val, p))) return NULL;
            }
        }
    }
    if (buf_i32(&col->offs, (int32_t)first->length)) return OOM(c, p, n);
    col->length++;
    return p;
}

static const uint8_t *d_union(Ctx *c, const Node *n, Col *col, const uint8_t *p) {
    const uint8_t *start = p;
    int64_t v;
    if (rd_long(c, &p, n->index, &v)) return NULL;
    if (v < 0 || v >= n->nchildren) return FAIL(c, E_UNION_INDEX, start, n, v);
    int8_t tid = (int8_t)v;
    const Node *kid = n->kids[v];
    if (buf_put(&col->tids, &tid, 1) || buf_i32(&col->offs, (int32_t)c->cols[kid->index].length))
        return OOM(c, start, n);
    col->length++;
    return CHILD(c, kid, p);
}

/* One value of SKIP node n read past, nothing stored: the structure is checked (lengths, block
 * counts, union indexes), not the values. Same order and errors as _decode._skip. */
static const uint8_t *skip_value(Ctx *c, const Node *n, const uint8_t *p, int depth) {
    if (depth > SKIP_DEPTH) return FAIL(c, E_TOO_DEEP, p, n, SKIP_DEPTH);
    int64_t v;
    switch (n->param) {
    case K_NULL: return p;
    case K_INT: case K_LONG: case K_ENUM:
        return rd_long(c, &p, n->index, &v) ? NULL : p;
    case K_BYTES: case K_STRING:
        return rd_len(c, n, &p, &v) ? NULL : p + v;
    case K_BOOL: case K_FLOAT: case K_DOUBLE: case K_FIXED: {
        int64_t size = n->param == K_BOOL ? 1 : n->size;
        if (size > c->end - p) return FAIL(c, E_TRUNCATED, p, n, 0);
        return p + size;
    }
    case K_RECORD:
        for (int k = 0; k < n->nchildren; k++)
            if (!(p = skip_value(c, n->kids[k], p, depth + 1))) return NULL;
        return p;
    case K_UNION: {
        const uint8_t *start = p;
        if (rd_long(c, &p, n->index, &v)) return NULL;
        if (v < 0 || v >= n->nchildren) return FAIL(c, E_UNION_INDEX, start, n, v);
        return skip_value(c, n->kids[v], p, depth + 1);
    }
    default: { /* K_ARRAY, K_MAP: blocks of items */
        uint64_t item_min = (uint64_t)n->item_min + (n->param == K_MAP);
        for (;;) {
            const uint8_t *start = p;
            if (rd_long(c, &p, n->index, &v)) return NULL;
            if (v == 0) return p;
            if (v < 0) { /* a count with the block's size in bytes: jump over it */
                const uint8_t *size_start = p;
                int64_t size;
                if (rd_long(c, &p, n->index, &size)) return NULL;
                if (size < 0) return FAIL(c, E_NEGATIVE, size_start, n, size);
                if (size > c->end - p) return FAIL(c, E_TRUNCATED, size_start, n, 0);
                p += size;
                continue;
            }
            uint64_t need;
            if (__builtin_mul_overflow((uint64_t)v, item_min, &need) ||
                need > (uint64_t)(c->end - p)) {
                fail(c, E_BLOCK_COUNT, start, n->index, 0);
                c->err_detail = v;
                return NULL;
            }
            if (item_min == 0) continue; /* items of no bytes: nothing to read */
            for (int64_t i = 0; i < v; i++) {
                if (n->param == K_MAP) {
                    int64_t len;
                    if (rd_len(c, n, &p, &len)) return NULL;
                    p += len;
                }
                if (!(p = skip_value(c, n->kids[0], p, depth + 1))) return NULL;
            }
        }
    }
    }
}

static const uint8_t *d_skip(Ctx *c, const Node *n, Col *col, const uint8_t *p) {
    return skip_value(c, n, p, 1);
}

static const DecFn KIND_FN[] = {
    [K_NULL] = d_null, [K_BOOL] = d_bool, [K_INT] = d_int, [K_LONG] = d_long,
    [K_FLOAT] = d_sized, [K_DOUBLE] = d_sized, [K_BYTES] = d_bytes, [K_STRING] = d_string,
    [K_FIXED] = d_sized, [K_ENUM] = d_enum, [K_UUID_STR] = d_uuid, [K_DEC_BYTES] = d_dec_bytes,
    [K_DEC_FIXED] = d_dec_fixed, [K_DURATION] = d_duration, [K_RECORD] = d_record,
    [K_ARRAY] = d_list, [K_MAP] = d_list, [K_UNION] = d_union, [K_SKIP] = d_skip,
};

static int all_ascii(const uint8_t *p, size_t n) {
    uint64_t acc = 0;
    size_t i = 0;
    for (; i + 32 <= n; i += 32) {
        uint64_t w[4];
        memcpy(w, p + i, 32);
        acc |= w[0] | w[1] | w[2] | w[3];
    }
    for (; i < n; i++) acc |= p[i];
    return !(acc & 0x8080808080808080ULL);
}

/* Without per-string checks: are the strings read since the last call valid UTF-8? Called
 * every UTF8_EVERY bytes of input, so that the strings are checked while still in the cache. */
#define UTF8_EVERY ((int64_t)32 << 10)
static int strings_valid(Ctx *c) {
    for (int i = 0; i < c->nnodes; i++) {
        if (c->nodes[i].kind != K_STRING) continue;
        Col *col = &c->cols[i];
        const int32_t *off = (const int32_t *)col->offs.p;
        int64_t from = col->checked;
        col->checked = col->length;
        if (all_ascii(col->data.p + off[from], (size_t)(off[col->length] - off[from]))) continue;
        for (int64_t k = from; k < col->length; k++)
            if (!utf8_ok(col->data.p + off[k], (size_t)(off[k + 1] - off[k]))) return 0;
    }
    return 1;
}

/* Empty buffers, offsets starting at 0: the state before a range is decoded. */
static int reset_cols(Ctx *c) {
    for (int i = 0; i < c->nnodes; i++) {
        Col *col = &c->cols[i];
        col->valid.len = col->data.len = col->offs.len = col->tids.len = 0;
        col->length = col->nulls = col->checked = 0;
        int k = c->nodes[i].kind;
        if ((k == K_BYTES || k == K_STRING || k == K_ARRAY || k == K_MAP) &&
            buf_i32(&col->offs, 0))
            return -1;
    }
    return 0;
}

/* After a sample of the input, grow every buffer once to what the whole range will likely
 * need, instead of doubling (and copying, and faulting in pages) many times. */
static void presize(Ctx *c, int64_t done_bytes, int64_t left_bytes) {
    if (done_bytes <= 0 || left_bytes <= 0) return;
    double f = (double)left_bytes / (double)done_bytes * 1.05;
    for (int i = 0; i < c->nnodes; i++) {
        Col *col = &c->cols[i];
        Buf *bufs[4] = {&col->valid, &col->data, &col->offs, &col->tids};
        for (int k = 0; k < 4; k++)
            if (bufs[k]->len) buf_reserve(bufs[k], (size_t)(bufs[k]->len * f) + 64);
    }
}

/* Decode segments [seg_begin, seg_end) into c->cols; stop at the first error. */
static void run_range(Ctx *c) {
    int64_t total = 0, done = 0;
    for (int64_t s = c->seg_begin; s < c->seg_end; s++)
        total += c->segs[s].len > 0 ? c->segs[s].len : 0;
    int64_t probe = c->seg_begin + (c->seg_end - c->seg_begin) / 32, checked = 0;
    int check = c->validate_utf8 && !c->strict_utf8;
    const Node *root = &c->nodes[0];
    for (int64_t s = c->seg_begin; s < c->seg_end; s++) {
        if (s == probe && s > c->seg_begin)
            presize(c, done, (c->all_bytes ? c->all_bytes : total) - done);
        if (check && done - checked >= UTF8_EVERY) {
            checked = done;
            if (!strings_valid(c)) {
                c->utf8_bad = 1;
                return;
            }
        }
        const Seg *seg = &c->segs[s];
        done += seg->len > 0 ? seg->len : 0;
        c->err_seg = s;
        c->err_datum = 0;
        if (seg->len < 0) {
            c->start = NULL;
            c->err = E_NULL_MESSAGE, c->err_off = 0, c->err_node = 0, c->err_detail = 0;
            return;
        }
        c->start = seg->ptr;
        c->end = seg->ptr + seg->len;
        const uint8_t *p = seg->ptr;
        if (c->confluent) {
            if (seg->len < 5) {
                fail(c, E_CONFLUENT_SHORT, p, 0, 0);
                return;
            }
            if (p[0] != 0) {
                fail(c, E_CONFLUENT_MAGIC, p, 0, p[0]);
                return;
            }
            c->ids[s] = (int32_t)((uint32_t)p[1] << 24 | (uint32_t)p[2] << 16 |
                                  (uint32_t)p[3] << 8 | (uint32_t)p[4]);
            p += 5;
        }
        for (int64_t datum = 0; datum < seg->count; datum++) {
            c->err_datum = datum;
            if (!(p = root->entry(c, root, &c->cols[0], p))) return;
        }
        if (p != c->end) {
            fail(c, E_TRAILING, p, 0, c->end - p);
            return;
        }
    }
}

/* A range with UTF-8 checked after the fact (every few kilobytes); on any error or bad
 * string, decode the range again checking each string as it is read, so the first error is the
 * one reported. */
static void run_segments(Ctx *c) {
    c->strict_utf8 = 0;
    c->utf8_bad = 0;
    run_range(c);
    if (!c->validate_utf8) return;
    if (!c->err && !c->utf8_bad && strings_valid(c)) return;
    c->err = 0;
    c->strict_utf8 = 1;
    if (reset_cols(c)) {
        c->err = E_NO_MEMORY;
        return;
    }
    run_range(c);
}


/* -- concatenating the threads' buffers ------------------------------------------------------ */

static int bits_append(Buf *dst, int64_t dst_bits, const Buf *src, int64_t nbits) {
    if (nbits == 0) return 0;
    size_t need = (size_t)((dst_bits + nbits + 7) >> 3);
    if (need > dst->len && buf_zeros(dst, need - dst->len)) return -1;
    uint8_t *d = dst->p + (dst_bits >> 3);
    int shift = (int)(dst_bits & 7);
    size_t nbytes = (size_t)((nbits + 7) >> 3);
    if (shift == 0) {
        memcpy(d, src->p, nbytes);
        return 0;
    }
    d[0] &= (uint8_t)((1u << shift) - 1); /* keep the bits before dst_bits */
    for (size_t i = 0; i < nbytes; i++) {
        d[i] |= (uint8_t)(src->p[i] << shift);
        if (i + 1 < need - (size_t)(dst_bits >> 3)) d[i + 1] = (uint8_t)(src->p[i] >> (8 - shift));
    }
    return 0;
}

/* The chunks after the first are appended to chunk 0's buffers (chunk order = row order), so
 * only their parts are copied. The merge is cut into tasks that run in parallel: one per node
 * and later chunk, copying that chunk's values, offsets (rebased) and type ids to the place
 * merge_prep computed for them, and one per node with bitmaps, appending every chunk's bits in
 * turn (neighbouring chunks share a byte there). pre holds chunk 0's columns from before the
 * merge. */

static int has_bitmaps(const Node *n) { return n->null_branch >= 0 || n->kind == K_BOOL; }

/* Node ni's totals: check the int32 offsets, reserve the buffers once and set their final
 * sizes (the bitmaps grow as their task appends). 0, -1 out of memory, -2 too large. */
static int merge_prep(const Node *nodes, int ni, Ctx *ctxs, int nt, const Col *pre) {
    const Node *n = &nodes[ni];
    Col *out = &ctxs[0].cols[ni];
    int64_t rows = out->length, nulls = out->nulls, child = 0;
    size_t data = 0, offs = 0, tids = 0;
    if (n->kind == K_ARRAY || n->kind == K_MAP) {
        child = pre[n->children[0]].length;
        for (int t = 1; t < nt; t++) child += ctxs[t].cols[n->children[0]].length;
    }
    for (int t = 1; t < nt; t++) {
        Col *col = &ctxs[t].cols[ni];
        rows += col->length, nulls += col->nulls;
        data += col->data.len, tids += col->tids.len;
        offs += (size_t)col->length * 4;
    }
    if (n->kind == K_BOOL) data = 0; /* a bitmap: its task appends it */
    if ((n->kind == K_BYTES || n->kind == K_STRING) && (int64_t)(out->data.len + data) > INT32_MAX)
        return -2;
    if (child > INT32_MAX) return -2;
    size_t bits = (size_t)((rows + 7) >> 3);
    if (buf_reserve(&out->data, data + (n->kind == K_BOOL ? bits : 0)) ||
        buf_reserve(&out->offs, offs) || buf_reserve(&out->tids, tids) ||
        (n->null_branch >= 0 && buf_reserve(&out->valid, bits)))
        return -1;
    out->data.len += data, out->offs.len += offs, out->tids.len += tids;
    out->length = rows, out->nulls = nulls;
    return 0;
}

/* Chunk t's part of node ni (t >= 1), or with t == 0 the node's bitmaps of every later chunk. */
static void merge_part(const Node *nodes, int ni, int t, Ctx *ctxs, int nt, const Col *pre) {
    const Node *n = &nodes[ni];
    Col *out = &ctxs[0].cols[ni];
    int64_t rows = pre[ni].length;
    if (t == 0) {
        for (int u = 1; u < nt; u++) {
            Col *col = &ctxs[u].cols[ni];
            /* reserved by merge_prep: these cannot fail */
            if (n->null_branch >= 0) bits_append(&out->valid, rows, &col->valid, col->length);
            if (n->kind == K_BOOL) bits_append(&out->data, rows, &col->data, col->length);
            rows += col->length;
        }
        return;
    }
    size_t data = pre[ni].data.len, tids = pre[ni].tids.len;
    for (int u = 1; u < t; u++) {
        Col *col = &ctxs[u].cols[ni];
        rows += col->length, data += col->data.len, tids += col->tids.len;
    }
    Col *col = &ctxs[t].cols[ni];
    switch (n->kind) {
    case K_NULL: case K_RECORD: case K_BOOL: return;
    case K_BYTES: case K_STRING: case K_ARRAY: case K_MAP: {
        int64_t base = (int64_t)data;
        if (n->kind == K_ARRAY || n->kind == K_MAP) {
            int c = n->children[0];
            base = pre[c].length;
            for (int u = 1; u < t; u++) base += ctxs[u].cols[c].length;
        } else if (col->data.len) {
            memcpy(out->data.p + data, col->data.p, col->data.len);
        }
        const int32_t *restrict src = (const int32_t *)col->offs.p + 1;
        int32_t *restrict dst = (int32_t *)out->offs.p + rows + 1;
        int32_t b = (int32_t)base;
        for (int64_t i = 0; i < col->length; i++) dst[i] = src[i] + b;
        return;
    }
    case K_UNION: {
        int32_t base[128];
        for (int k = 0; k < n->nchildren; k++) {
            int64_t v = pre[n->children[k]].length;
            for (int u = 1; u < t; u++) v += ctxs[u].cols[n->children[k]].length;
            base[k] = (int32_t)v;
        }
        if (col->tids.len) memcpy(out->tids.p + tids, col->tids.p, col->tids.len);
        const int32_t *src = (const int32_t *)col->offs.p;
        int32_t *dst = (int32_t *)out->offs.p + rows;
        for (int64_t i = 0; i < col->length; i++) dst[i] = src[i] + base[(int8_t)col->tids.p[i]];
        return;
    }
    default:
        if (col->data.len) memcpy(out->data.p + data, col->data.p, col->data.len);
    }
}

/* -- work sharing ---------------------------------------------------------------------------
 * The input is cut into chunks (contiguous ranges of segments), each decoded into its own
 * buffers; then the merge's tasks run. Threads claim chunks, then tasks, from shared counters,
 * and the calling thread claims them too: it never waits for a thread the system has not
 * scheduled yet, only for work items in progress. Helper threads are detached; the shared
 * state is freed by whoever leaves it last. */

typedef struct { int node, chunk; int64_t bytes; } Task;

typedef struct {
    atomic_int refs;
    atomic_long next_chunk, next_task;
    atomic_long chunks_done, tasks_done; /* changed under mu */
    atomic_int phase;                    /* changed under mu: 0 decoding, 1 merging, 2 done */
    int nchunks, nnodes, ntasks;
    Ctx *ctxs;
    const Node *nodes;
    Col *pre;    /* chunk 0's columns before the merge */
    Task *tasks; /* most bytes to copy first */
    pthread_mutex_t mu;
    pthread_cond_t cv;
} Shared;

static void shared_release(Shared *sh) {
    if (atomic_fetch_sub(&sh->refs, 1) != 1) return;
    pthread_mutex_destroy(&sh->mu);
    pthread_cond_destroy(&sh->cv);
    free(sh->pre);
    free(sh->tasks);
    free(sh);
}

/* Waiting for the other threads: they are usually about to finish, and a thread woken from a
 * condition variable took about a millisecond to run again on a busy VM (a tenth of a batch of
 * 100,000 records), so spin for up to SPIN_NS first, then sleep. */
#define SPIN_NS 500000

static int64_t elapsed_ns(const struct timespec *t0) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)(t.tv_sec - t0->tv_sec) * 1000000000 + (t.tv_nsec - t0->tv_nsec);
}

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

/* Until *value >= goal (value only grows, always under mu). */
static void wait_for(Shared *sh, atomic_long *value, long goal) {
    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (unsigned i = 1; atomic_load(value) < goal; i++) {
        if (i % 256 == 0 && elapsed_ns(&t0) > SPIN_NS) {
            pthread_mutex_lock(&sh->mu);
            while (atomic_load(value) < goal) pthread_cond_wait(&sh->cv, &sh->mu);
            pthread_mutex_unlock(&sh->mu);
            return;
        }
        cpu_relax();
    }
}

static void decode_chunks(Shared *sh) {
    for (;;) {
        long i = atomic_fetch_add(&sh->next_chunk, 1);
        if (i >= sh->nchunks) return;
        Ctx *c = &sh->ctxs[i];
        if (c->lazy) lz_fill(c->lazy, (Seg *)c->segs, c->seg_begin, c->seg_end);
        run_segments(c);
        pthread_mutex_lock(&sh->mu);
        sh->chunks_done++;
        pthread_cond_broadcast(&sh->cv);
        pthread_mutex_unlock(&sh->mu);
    }
}

static void merge_tasks(Shared *sh) {
    long done = 0;
    for (;;) {
        long j = atomic_fetch_add(&sh->next_task, 1);
        if (j >= sh->ntasks) break;
        merge_part(sh->nodes, sh->tasks[j].node, sh->tasks[j].chunk, sh->ctxs, sh->nchunks,
                   sh->pre);
        done++;
    }
    pthread_mutex_lock(&sh->mu);
    sh->tasks_done += done;
    pthread_cond_broadcast(&sh->cv);
    pthread_mutex_unlock(&sh->mu);
}

static void *helper_main(void *arg) {
    Shared *sh = arg;
    decode_chunks(sh);
    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (unsigned i = 1; atomic_load(&sh->phase) == 0; i++) { /* as in wait_for */
        if (i % 256 == 0 && elapsed_ns(&t0) > SPIN_NS) {
            pthread_mutex_lock(&sh->mu);
            while (atomic_load(&sh->phase) == 0) pthread_cond_wait(&sh->cv, &sh->mu);
            pthread_mutex_unlock(&sh->mu);
            break;
        }
        cpu_relax();
    }
    if (atomic_load(&sh->phase) == 1) merge_tasks(sh);
    shared_release(sh);
    return NULL;
}

static int by_bytes_down(const void *a, const void *b) {
    int64_t x = ((const Task *)a)->bytes, y = ((const Task *)b)->bytes;
    return (x < y) - (x > y);
}

/* Prepare every node and list the merge's tasks, largest first; 0, -1 out of memory, -2 too
 * large. */
static int plan_merge(Shared *sh) {
    int nn = sh->nnodes, nt = sh->nchunks;
    Ctx *ctxs = sh->ctxs;
    sh->pre = malloc((size_t)nn * sizeof(Col));
    sh->tasks = malloc((size_t)nn * (size_t)nt * sizeof(Task));
    if (!sh->pre || !sh->tasks) return -1;
    for (int i = 0; i < nn; i++) sh->pre[i] = ctxs[0].cols[i];
    for (int i = 0; i < nn; i++) {
        int err = merge_prep(sh->nodes, i, ctxs, nt, sh->pre);
        if (err) return err;
    }
    int ntasks = 0;
    for (int i = 0; i < nn; i++) {
        const Node *n = &sh->nodes[i];
        int64_t bits = 0;
        for (int t = 1; t < nt; t++) {
            Col *col = &ctxs[t].cols[i];
            bits += (int64_t)(col->valid.len + (n->kind == K_BOOL ? col->data.len : 0));
            int64_t b = (int64_t)(col->offs.len + col->tids.len) +
                        (n->kind == K_BOOL ? 0 : (int64_t)col->data.len);
            if (b == 0 || n->kind == K_RECORD || n->kind == K_NULL || n->kind == K_BOOL) continue;
            sh->tasks[ntasks++] = (Task){i, t, b};
        }
        if (has_bitmaps(n)) sh->tasks[ntasks++] = (Task){i, 0, bits};
    }
    qsort(sh->tasks, (size_t)ntasks, sizeof(Task), by_bytes_down);
    sh->ntasks = ntasks;
    return 0;
}

/* Decode all chunks and merge them into chunk 0, with nhelpers extra threads. Returns the merge
 * error (0, -1 out of memory, -2 too large); decoding errors stay in the chunks' contexts. */
static int decode_and_merge(Ctx *ctxs, int nchunks, const Node *nodes, int nnodes, int nhelpers) {
    Shared *sh = calloc(1, sizeof(Shared));
    if (!sh) return -1;
    atomic_init(&sh->refs, 1);
    atomic_init(&sh->next_chunk, 0);
    atomic_init(&sh->next_task, 0);
    atomic_init(&sh->chunks_done, 0);
    atomic_init(&sh->tasks_done, 0);
    atomic_init(&sh->phase, 0);
    sh->nchunks = nchunks, sh->nnodes = nnodes, sh->ctxs = ctxs, sh->nodes = nodes;
    pthread_mutex_init(&sh->mu, NULL);
    pthread_cond_init(&sh->cv, NULL);
    for (int h = 0; h < nhelpers; h++) {
        pthread_t tid;
        atomic_fetch_add(&sh->refs, 1);
        if (pthread_create(&tid, NULL, helper_main, sh) == 0) pthread_detach(tid);
        else atomic_fetch_sub(&sh->refs, 1);
    }
    decode_chunks(sh);
    wait_for(sh, &sh->chunks_done, nchunks);
    int any_err = 0, err = 0;
    for (int t = 0; t < nchunks; t++) any_err |= ctxs[t].err != 0;
    int merge = !any_err && nchunks > 1;
    if (merge && (err = plan_merge(sh)) != 0) merge = 0;
    pthread_mutex_lock(&sh->mu);
    sh->phase = merge ? 1 : 2;
    pthread_cond_broadcast(&sh->cv);
    pthread_mutex_unlock(&sh->mu);
    if (merge) {
        merge_tasks(sh);
        wait_for(sh, &sh->tasks_done, sh->ntasks);
        pthread_mutex_lock(&sh->mu);
        sh->phase = 2;
        pthread_cond_broadcast(&sh->cv);
        pthread_mutex_unlock(&sh->mu);
    }
    shared_release(sh);
    return err;
}

/* -- the Python side: plan, inputs, outputs ------------------------------------------------- */

typedef struct { PyObject_HEAD uint8_t *p; Py_ssize_t len; size_t cap; } CBuf;

static void cbuf_dealloc(CBuf *self) {
    blk_free(self->p, self->cap);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int cbuf_getbuffer(CBuf *self, Py_buffer *view, int flags) {
    return PyBuffer_FillInfo(view, (PyObject *)self, self->p, self->len, 0, flags);
}

static PyBufferProcs cbuf_as_buffer = {(getbufferproc)cbuf_getbuffer, NULL};

static PyTypeObject CBufType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "arrowstash.avro._cdecode.Buffer",
    .tp_basicsize = sizeof(CBuf),
    .tp_dealloc = (destructor)cbuf_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_as_buffer = &cbuf_as_buffer,
    .tp_doc = "Memory filled by the native Avro decoder, freed with this object.",
};

/* Hand a Buf's memory to a new Python buffer object (the Buf is emptied). */
static PyObject *take(Buf *b) {
    CBuf *o = PyObject_New(CBuf, &CBufType);
    if (!o) return NULL;
    if (!b->p) b->p = malloc(1), b->cap = 1;
    o->p = b->p;
    o->len = (Py_ssize_t)b->len;
    o->cap = b->cap;
    b->p = NULL;
    b->len = b->cap = 0;
    return (PyObject *)o;
}

static void free_cols(Col *cols, int n) {
    if (!cols) return;
    for (int i = 0; i < n; i++) {
        blk_free(cols[i].valid.p, cols[i].valid.cap);
        blk_free(cols[i].data.p, cols[i].data.cap);
        blk_free(cols[i].offs.p, cols[i].offs.cap);
        blk_free(cols[i].tids.p, cols[i].tids.cap);
    }
    free(cols);
}

static void free_nodes(Node *nodes, int n) {
    if (!nodes) return;
    for (int i = 0; i < n; i++) {
        free(nodes[i].children);
        free(nodes[i].kids);
        free(nodes[i].empties);
    }
    free(nodes);
}

/* The nodes an empty slot of node i appends to, in the order empty() must visit them. */
static void collect_empties(const Node *nodes, int i, int *out, int *count) {
    const Node *n = &nodes[i];
    out[(*count)++] = i;
    if (n->kind == K_RECORD) /* a skipped field has no slot (and its nodes may form cycles) */
        for (int k = 0; k < n->nchildren; k++) {
            if (nodes[n->children[k]].kind != K_SKIP)
                collect_empties(nodes, n->children[k], out, count);
        }
    else if (n->kind == K_UNION)
        collect_empties(nodes, n->children[n->null_child], out, count);
}

static Node *parse_plan(PyObject *plan, int *nnodes) {
    PyObject *seq = PySequence_Fast(plan, "plan must be a sequence");
    if (!seq) return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    Node *nodes = calloc((size_t)n + 1, sizeof(Node));
    if (!nodes) {
        Py_DECREF(seq);
        PyErr_NoMemory();
        return NULL;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *children, *limit;
        Node *nd = &nodes[i];
        long long param, size, min_size;
        if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(seq, i), "iiLLLO!O!", &nd->kind,
                              &nd->null_branch, &param, &size, &min_size, &PyTuple_Type,
                              &children, &PyBytes_Type, &limit))
            goto error;
        nd->param = param, nd->size = size, nd->min_size = min_size;
        if (nd->null_branch < -1 || nd->null_branch > 1 || param < 0 || size < 0 || min_size < 0) {
            PyErr_SetString(PyExc_ValueError, "bad plan");
            goto error;
        }
        nd->nchildren = (int)PyTuple_GET_SIZE(children);
        nd->children = calloc((size_t)nd->nchildren + 1, sizeof(int));
        if (!nd->children) {
            PyErr_NoMemory();
            goto error;
        }
        for (int k = 0; k < nd->nchildren; k++) {
            long ci = PyLong_AsLong(PyTuple_GET_ITEM(children, k));
            /* children come after their parent; a skipped type may refer back to itself */
            if (ci < 0 || ci >= n ||
                (ci <= i && nd->kind != K_SKIP && nodes[ci].kind != K_SKIP)) {
                if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "bad plan");
                goto error;
            }
            nd->children[k] = (int)ci;
        }
        Py_ssize_t lim = PyBytes_GET_SIZE(limit);
        if (lim > 32 || ((nd->kind == K_DEC_BYTES || nd->kind == K_DEC_FIXED) &&
                         (lim != nd->param || (nd->param != 16 && nd->param != 32)))) {
            PyErr_SetString(PyExc_ValueError, "bad decimal in plan");
            goto error;
        }
        memcpy(nd->limit, PyBytes_AS_STRING(limit), (size_t)lim);
        if ((nd->kind == K_ARRAY || nd->kind == K_MAP) && nd->nchildren < 1) {
            PyErr_SetString(PyExc_ValueError, "bad plan: list without items");
            goto error;
        }
        if (nd->kind == K_UNION && nd->nchildren > 127) {
            PyErr_SetString(PyExc_ValueError, "a union of more than 127 branches");
            goto error;
        }
    }
    for (Py_ssize_t i = 0; i < n; i++) { /* derived fields */
        Node *nd = &nodes[i];
        nd->index = (int)i;
        if (nd->kind < 0 || nd->kind > K_SKIP) {
            PyErr_SetString(PyExc_ValueError, "bad plan: unknown kind");
            goto error;
        }
        if (nd->kind == K_SKIP) { /* the kinds of an encoding; SKIP children only */
            int64_t k = nd->param;
            int ok = k <= K_ENUM || k == K_RECORD || k == K_ARRAY || k == K_MAP || k == K_UNION;
            if ((k == K_ARRAY || k == K_MAP) && nd->nchildren != 1) ok = 0;
            for (int j = 0; j < nd->nchildren; j++)
                if (nodes[nd->children[j]].kind != K_SKIP) ok = 0;
            if (!ok) {
                PyErr_SetString(PyExc_ValueError, "bad plan: bad skip node");
                goto error;
            }
        }
        nd->kids = calloc((size_t)nd->nchildren + 1, sizeof(Node *));
        if (!nd->kids) {
            PyErr_NoMemory();
            goto error;
        }
        for (int k = 0; k < nd->nchildren; k++) nd->kids[k] = &nodes[nd->children[k]];
        nd->fn = KIND_FN[nd->kind];
        nd->entry = nd->null_branch >= 0 ? d_nullable : nd->fn;
        nd->op = nd->null_branch >= 0 ? K_NULLABLE : nd->kind;
        nd->col_offset = (size_t)i * sizeof(Col);
        if (nd->kind == K_FLOAT) nd->size = 4;
        if (nd->kind == K_DOUBLE) nd->size = 8;
        if (nd->kind == K_FIXED) nd->size = nd->param;
        nd->item_min = 0;
        for (int k = 0; k < nd->nchildren; k++) nd->item_min += nodes[nd->children[k]].min_size;
        if (nd->kind == K_UNION) { /* the first null branch, else branch 0 */
            nd->null_child = 0;
            for (int k = 0; k < nd->nchildren; k++)
                if (nodes[nd->children[k]].kind == K_NULL) {
                    nd->null_child = k;
                    break;
                }
        }
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        nodes[i].empties = calloc((size_t)n, sizeof(int));
        if (!nodes[i].empties) {
            PyErr_NoMemory();
            goto error;
        }
        collect_empties(nodes, (int)i, nodes[i].empties, &nodes[i].nempties);
    }
    Py_DECREF(seq);
    *nnodes = (int)n;
    return nodes;
error:
    free_nodes(nodes, (int)n);
    Py_DECREF(seq);
    return NULL;
}

static PyObject *node_buffers(const Node *n, Col *col) {
    PyObject *validity = Py_None;
    Py_INCREF(Py_None);
    if (n->null_branch >= 0 && col->nulls) {
        Py_DECREF(Py_None);
        validity = take(&col->valid);
        if (!validity) return NULL;
    }
    PyObject *bufs = NULL;
    switch (n->kind) {
    case K_NULL: bufs = Py_BuildValue("[O]", Py_None); break;
    case K_BYTES: case K_STRING:
        bufs = Py_BuildValue("[ONN]", validity, take(&col->offs), take(&col->data));
        break;
    case K_ARRAY: case K_MAP: bufs = Py_BuildValue("[ON]", validity, take(&col->offs)); break;
    case K_RECORD: bufs = Py_BuildValue("[O]", validity); break;
    case K_UNION:
        bufs = Py_BuildValue("[ONN]", Py_None, take(&col->tids), take(&col->offs));
        break;
    default: bufs = Py_BuildValue("[ON]", validity, take(&col->data));
    }
    Py_DECREF(validity);
    if (!bufs) return NULL;
    int64_t nulls = n->kind == K_NULL ? col->length : col->nulls;
    return Py_BuildValue("LLN", (long long)col->length, (long long)nulls, bufs);
}

/* Decode segs with nthreads; returns (0, columns, ids) or (1, code, seg, datum, off, node, detail). */
/* Bytes of the messages before message s. */
static int64_t bytes_before(const Lazy *lz, int64_t s, int64_t nsegs, int64_t total) {
    return s < nsegs ? lz_off(lz, s) - lz_off(lz, 0) : total;
}

#define CHUNKS_PER_THREAD 8

/* `lazy`: non-NULL for one buffer and its offsets: the sizes of ranges are then differences of
 * offsets, so the calling thread finds the threads' ranges by bisection instead of a walk over
 * every message before any thread starts, and each thread fills its range's segments. */
static PyObject *run(PyObject *plan, Seg *segs, int64_t nsegs, int nthreads, int validate_utf8,
                     int confluent, int64_t min_bytes, const Lazy *lazy) {
    int nnodes = 0;
    Node *nodes = parse_plan(plan, &nnodes);
    if (!nodes) return NULL;
    if (nnodes < 1 || nodes[0].kind != K_RECORD) {
        free_nodes(nodes, nnodes);
        PyErr_SetString(PyExc_ValueError, "bad plan: no root record");
        return NULL;
    }
    int64_t total = 0;
    if (lazy)
        total = lz_off(lazy, nsegs) - lz_off(lazy, 0);
    else
        for (int64_t s = 0; s < nsegs; s++) total += segs[s].len > 0 ? segs[s].len : 0;
    if (nthreads < 1) nthreads = 1;
    if (nthreads > 64) nthreads = 64;
    /* a thread per min_bytes of input at most: starting one and merging its part costs more
     * than it saves on less */
    if (min_bytes > 0 && total / min_bytes < nthreads) nthreads = (int)(total / min_bytes);
    if (nthreads < 1 || nsegs < 2 * nthreads) nthreads = 1;
    /* The chunks after the first are merged into it (copied), so the first is a thread's fair
     * share; the rest is cut finer (CHUNKS_PER_THREAD each), so that a thread the system runs
     * late finds less left, and the threads reach the merge at nearly the same time: the
     * chunks shrink in turn (the k-th of K gets K - k + 1 parts of K (K + 1) / 2), so the last
     * ones, which decide how long the first thread to run out waits, are small. */
    int nchunks = nthreads == 1 ? 1 : 1 + (nthreads - 1) * CHUNKS_PER_THREAD;
    if (nchunks > nsegs) nchunks = nsegs > 0 ? (int)nsegs : 1;
    Ctx *ctxs = zalloc_lines((size_t)nchunks * sizeof(Ctx));
    Buf ids = {0};
    int failed_alloc = !ctxs || (confluent && buf_zeros(&ids, (size_t)(nsegs > 0 ? nsegs : 1) * 4));
    for (int t = 0; t < nchunks && !failed_alloc; t++) {
        ctxs[t].cols = zalloc_lines((size_t)nnodes * sizeof(Col));
        if (!ctxs[t].cols) failed_alloc = 1;
    }
    if (failed_alloc) {
        if (ctxs)
            for (int t = 0; t < nchunks; t++) free_cols(ctxs[t].cols, nnodes);
        free(ctxs);
        blk_free(ids.p, ids.cap);
        free_nodes(nodes, nnodes);
        return PyErr_NoMemory();
    }
    /* contiguous ranges: the first of total / nthreads bytes, the others equal */
    int64_t s = 0, acc = 0, first = nchunks > 1 ? total / nthreads : total;
    for (int t = 0; t < nchunks; t++) {
        Ctx *c = &ctxs[t];
        c->nodes = nodes, c->nnodes = nnodes, c->validate_utf8 = validate_utf8;
        c->confluent = confluent, c->segs = segs, c->lazy = lazy, c->ids = (int32_t *)ids.p;
        c->all_bytes = t == 0 && nchunks > 1 ? total : 0;
        c->seg_begin = s;
        int64_t k = nchunks - 1, parts = (int64_t)t * k - (int64_t)t * (t - 1) / 2;
        int64_t goal = first + (nchunks > 1
            ? (int64_t)((double)(total - first) * (double)parts / (double)(k * (k + 1) / 2)) : 0);
        if (t == nchunks - 1) {
            s = nsegs;
        } else if (lazy) { /* the first segment after seg_begin that starts at goal or later */
            int64_t lo = s + 1, hi = nsegs;
            while (lo < hi) {
                int64_t mid = lo + (hi - lo) / 2;
                if (bytes_before(lazy, mid, nsegs, total) >= goal) hi = mid;
                else lo = mid + 1;
            }
            s = lo < nsegs ? lo : nsegs;
        } else {
            while (s < nsegs && (acc < goal || s == c->seg_begin)) {
                acc += segs[s].len > 0 ? segs[s].len : 0;
                s++;
            }
        }
        c->seg_end = s;
        if (reset_cols(c)) failed_alloc = 1; /* offsets start at 0 */
    }
    int merge_err = failed_alloc;
    Py_BEGIN_ALLOW_THREADS
    if (!failed_alloc) merge_err = decode_and_merge(ctxs, nchunks, nodes, nnodes, nthreads - 1);
    Py_END_ALLOW_THREADS
    PyObject *result = NULL;
    for (int t = 0; t < nchunks; t++) {
        if (ctxs[t].err) { /* the first failing range holds the first bad segment */
            Ctx *c = &ctxs[t];
            if (c->err == E_NO_MEMORY) {
                PyErr_NoMemory();
                goto done;
            }
            PyObject *detail = c->err_unsigned
                ? PyLong_FromUnsignedLongLong((unsigned long long)c->err_detail)
                : PyLong_FromLongLong(c->err_detail);
            if (detail)
                result = Py_BuildValue("iiLLLiN", 1, c->err, (long long)c->err_seg,
                                       (long long)c->err_datum, (long long)c->err_off,
                                       c->err_node, detail);
            goto done;
        }
    }
    if (merge_err == -2) {
        result = Py_BuildValue("iiLLLiL", 1, E_TOO_LARGE, (long long)ctxs[nchunks - 1].seg_begin,
                               0LL, 0LL, 0, 0LL);
        goto done;
    }
    if (merge_err) {
        PyErr_NoMemory();
        goto done;
    }
    {
        Col *cols = ctxs[0].cols;
        PyObject *columns = PyList_New(nnodes);
        if (!columns) goto done;
        for (int i = 0; i < nnodes; i++) {
            PyObject *item = node_buffers(&nodes[i], &cols[i]);
            if (!item) {
                Py_DECREF(columns);
                goto done;
            }
            PyList_SET_ITEM(columns, i, item);
        }
        PyObject *idbuf = confluent ? take(&ids) : (Py_INCREF(Py_None), Py_None);
        result = idbuf ? Py_BuildValue("iNN", 0, columns, idbuf) : NULL;
        if (!idbuf) Py_DECREF(columns);
    }
done:
    for (int t = 0; t < nchunks; t++) free_cols(ctxs[t].cols, nnodes);
    free(ctxs);
    blk_free(ids.p, ids.cap);
    free_nodes(nodes, nnodes);
    return result;
}

/* -- a stream of blocks --------------------------------------------------------------------
 * BlockStream decodes blocks handed over one at a time into one set of buffers: a thread that
 * inflates a container file's blocks decodes each one while it is still in the cache and lets
 * it go, instead of holding every inflated block until all are decoded. It only says whether
 * the blocks were good: on a failure the caller decodes the blocks again in file order (with
 * decode_list) to report the first error exactly as the batch decoders do. */

typedef struct {
    PyObject_HEAD
    Node *nodes;
    int nnodes, busy, failed, finished, presized;
    Ctx *ctx;
    int64_t done;     /* bytes decoded */
} Stream;

static void stream_dealloc(Stream *self) {
    if (self->ctx) free_cols(self->ctx->cols, self->nnodes);
    free(self->ctx);
    free_nodes(self->nodes, self->nnodes);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int stream_init(Stream *self, PyObject *args, PyObject *kwds) {
    PyObject *plan;
    int validate_utf8;
    if (!PyArg_ParseTuple(args, "Op", &plan, &validate_utf8)) return -1;
    if (self->nodes) {
        PyErr_SetString(PyExc_RuntimeError, "BlockStream is already initialised");
        return -1;
    }
    int nnodes = 0;
    Node *nodes = parse_plan(plan, &nnodes);
    if (!nodes) return -1;
    self->nodes = nodes, self->nnodes = nnodes;
    if (nnodes < 1 || nodes[0].kind != K_RECORD) {
        PyErr_SetString(PyExc_ValueError, "bad plan: no root record");
        return -1;
    }
    self->ctx = zalloc_lines(sizeof(Ctx));
    if (!self->ctx) {
        PyErr_NoMemory();
        return -1;
    }
    Ctx *c = self->ctx;
    c->nodes = nodes, c->nnodes = nnodes, c->validate_utf8 = validate_utf8;
    c->cols = zalloc_lines((size_t)nnodes * sizeof(Col));
    if (!c->cols || reset_cols(c)) {
        PyErr_NoMemory();
        return -1;
    }
    return 0;
}

/* feed(blocks, counts, bytes_left): decode counts[i] datums that fill blocks[i] exactly, for
 * each block in turn; bytes_left guesses the decoded bytes of these blocks and the ones after
 * them (0: unknown), to size the buffers once. Several blocks per call: a call takes the GIL
 * back, which another thread of the caller may hold. Returns whether every block so far was
 * good. */
static PyObject *stream_feed(Stream *self, PyObject *args) {
    PyObject *blocks, *counts;
    long long left;
    if (!self->ctx || self->finished || self->busy) {
        PyErr_SetString(PyExc_RuntimeError, "BlockStream is not ready to feed");
        return NULL;
    }
    if (!PyArg_ParseTuple(args, "OOL", &blocks, &counts, &left)) return NULL;
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
            /* left counts these blocks: size once a 32nd of the guessed whole is decoded */
            if (!self->presized && left > 0 && self->done > 0 &&
                self->done * 32 >= self->done + left) {
                presize(c, self->done, left);
                self->presized = 1;
            }
            run_range(c);
            self->done += bytes;
            if (c->err || c->utf8_bad || (c->validate_utf8 && !strings_valid(c)))
                self->failed = 1;
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

/* finish(): the columns, as decode_list's result gives them; None if a block was bad. */
static PyObject *stream_finish(Stream *self, PyObject *unused) {
    if (!self->ctx || self->finished || self->busy) {
        PyErr_SetString(PyExc_RuntimeError, "BlockStream is not ready to finish");
        return NULL;
    }
    self->finished = 1;
    if (self->failed) Py_RETURN_NONE;
    PyObject *columns = PyList_New(self->nnodes);
    if (!columns) return NULL;
    for (int i = 0; i < self->nnodes; i++) {
        PyObject *item = node_buffers(&self->nodes[i], &self->ctx->cols[i]);
        if (!item) {
            Py_DECREF(columns);
            return NULL;
        }
        PyList_SET_ITEM(columns, i, item);
    }
    return columns;
}

static PyMethodDef stream_methods[] = {
    {"feed", (PyCFunction)stream_feed, METH_VARARGS,
     "feed(blocks, counts, bytes_left) -> whether every block so far was good"},
    {"finish", (PyCFunction)stream_finish, METH_NOARGS,
     "finish() -> the columns, or None if a block was bad"},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject StreamType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "arrowstash.avro._cdecode.BlockStream",
    .tp_basicsize = sizeof(Stream),
    .tp_dealloc = (destructor)stream_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "BlockStream(plan, validate_utf8): blocks decoded one by one into one batch.",
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

/* scan_blocks(data, pos, sync) -> (table, pos): the well-formed blocks from pos on, as int64
 * quadruples (block start, datum count, payload start, payload size), and where the scan
 * stopped: at the end, or at a block it did not accept (the caller's scanner says why). */
static PyObject *scan_blocks(PyObject *self, PyObject *args) {
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
    blk_free(out.p, out.cap);
    PyBuffer_Release(&data);
    PyBuffer_Release(&sync);
    return result;
}

/* decode_list(plan, messages, counts_or_None, nthreads, validate_utf8, confluent, min_bytes) */
static PyObject *decode_list(PyObject *self, PyObject *args) {
    PyObject *plan, *messages, *counts;
    int nthreads, validate_utf8, confluent;
    long long min_bytes;
    if (!PyArg_ParseTuple(args, "OOOippL", &plan, &messages, &counts, &nthreads, &validate_utf8,
                          &confluent, &min_bytes))
        return NULL;
    /* a tuple holds the messages alive even if the caller's list changes meanwhile */
    PyObject *items = PySequence_Tuple(messages);
    if (!items) return NULL;
    Py_ssize_t n = PyTuple_GET_SIZE(items);
    if (counts != Py_None && PySequence_Size(counts) != n) {
        Py_DECREF(items);
        PyErr_SetString(PyExc_ValueError, "one count per block");
        return NULL;
    }
    size_t segs_cap = ((size_t)n + 1) * sizeof(Seg);
    Seg *segs = blk_alloc(&segs_cap);
    if (segs) memset(segs, 0, ((size_t)n + 1) * sizeof(Seg));
    Py_buffer *views = calloc((size_t)n + 1, sizeof(Py_buffer));
    char *held = calloc((size_t)n + 1, 1);
    PyObject *result = NULL;
    if (!segs || !views || !held) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *m = PyTuple_GET_ITEM(items, i);
        segs[i].count = 1;
        if (counts != Py_None) {
            PyObject *ci = PySequence_GetItem(counts, i);
            if (!ci) goto done;
            segs[i].count = PyLong_AsLongLong(ci);
            Py_DECREF(ci);
            if (segs[i].count < 0) {
                if (!PyErr_Occurred())
                    PyErr_SetString(PyExc_ValueError, "block counts must not be negative");
                goto done;
            }
        }
        if (m == Py_None) {
            segs[i].len = -1;
        } else if (PyBytes_CheckExact(m)) {
            segs[i].ptr = (const uint8_t *)PyBytes_AS_STRING(m);
            segs[i].len = PyBytes_GET_SIZE(m);
        } else {
            if (PyObject_GetBuffer(m, &views[i], PyBUF_C_CONTIGUOUS) < 0) goto done;
            held[i] = 1;
            segs[i].ptr = views[i].buf;
            segs[i].len = views[i].len;
        }
    }
    result = run(plan, segs, n, nthreads, validate_utf8, confluent, min_bytes, NULL);
done:
    if (views && held)
        for (Py_ssize_t i = 0; i < n; i++)
            if (held[i]) PyBuffer_Release(&views[i]);
    blk_free(segs, segs_cap);
    free(views);
    free(held);
    Py_DECREF(items);
    return result;
}

/* decode_concat(plan, data, offsets, offset_width, first, n, validity_or_None, nthreads,
 *               validate_utf8, confluent, min_bytes): message i is
 * data[offsets[first+i]:offsets[first+i+1]], null where bit (first + i) of validity is clear. */
static PyObject *decode_concat(PyObject *self, PyObject *args) {
    PyObject *plan, *data, *offsets, *validity;
    int width, nthreads, validate_utf8, confluent;
    long long first, n, min_bytes;
    if (!PyArg_ParseTuple(args, "OOOiLLOippL", &plan, &data, &offsets, &width, &first, &n,
                          &validity, &nthreads, &validate_utf8, &confluent, &min_bytes))
        return NULL;
    if ((width != 4 && width != 8) || first < 0 || n < 0) {
        PyErr_SetString(PyExc_ValueError, "bad offsets");
        return NULL;
    }
    Py_buffer dv = {0}, ov = {0}, vv = {0};
    int have_v = 0;
    PyObject *result = NULL;
    Seg *segs = NULL;
    size_t segs_cap = ((size_t)n + 1) * sizeof(Seg);
    if (PyObject_GetBuffer(data, &dv, PyBUF_C_CONTIGUOUS) < 0) return NULL;
    if (PyObject_GetBuffer(offsets, &ov, PyBUF_C_CONTIGUOUS) < 0) {
        PyBuffer_Release(&dv);
        return NULL;
    }
    if (validity != Py_None) {
        if (PyObject_GetBuffer(validity, &vv, PyBUF_C_CONTIGUOUS) < 0) goto done;
        have_v = 1;
        if (vv.len * 8 < first + n) {
            PyErr_SetString(PyExc_ValueError, "validity bitmap too short");
            goto done;
        }
    }
    if (ov.len < (first + n + 1) * width) {
        PyErr_SetString(PyExc_ValueError, "offsets too short");
        goto done;
    }
    segs = blk_alloc(&segs_cap);
    if (!segs) {
        PyErr_NoMemory();
        goto done;
    }
    Lazy lazy = {dv.buf, ov.buf, have_v ? vv.buf : NULL, width, first};
    int64_t a = n > 0 ? lz_off(&lazy, 0) : 0;
    for (long long i = 0; i < n; i++) { /* checked here; the segments are filled by the threads */
        int64_t b = lz_off(&lazy, i + 1);
        if (a < 0 || b < a || b > dv.len) {
            PyErr_Format(PyExc_ValueError,
                         "offsets of message %lld (%lld, %lld) are outside the data buffer", i,
                         (long long)a, (long long)b);
            goto done;
        }
        a = b;
    }
    result = run(plan, segs, n, nthreads, validate_utf8, confluent, min_bytes, &lazy);
done:
    blk_free(segs, segs_cap);
    if (have_v) PyBuffer_Release(&vv);
    PyBuffer_Release(&ov);
    PyBuffer_Release(&dv);
    return result;
}

static PyMethodDef methods[] = {
    {"decode_list", decode_list, METH_VARARGS,
     "decode_list(plan, messages, counts, nthreads, validate_utf8, confluent, min_bytes)"},
    {"decode_concat", decode_concat, METH_VARARGS,
     "decode_concat(plan, data, offsets, width, first, n, validity, nthreads, validate_utf8, "
     "confluent, min_bytes)"},
    {"scan_blocks", scan_blocks, METH_VARARGS, "scan_blocks(data, pos, sync) -> (table, pos)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_cdecode", "The native Avro decoder (see codec.py).", -1, methods,
};

PyMODINIT_FUNC PyInit__cdecode(void) {
    for (const char *d = "0123456789abcdefABCDEF"; *d; d++) hex_ok[(uint8_t)*d] = 1;
    if (PyType_Ready(&CBufType) < 0 || PyType_Ready(&StreamType) < 0) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m && PyModule_AddObjectRef(m, "BlockStream", (PyObject *)&StreamType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
