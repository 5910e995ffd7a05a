/* The native Avro decoder's values: one decoder per kind, the walk of a range of segments
 * along the plan, and the UTF-8, UUID and decimal checks (the hot loops; see _cdecode.h). */
#include "_cdecode.h"
#include "_utf8.h"

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

static inline __attribute__((always_inline)) int rd_long(Ctx *c, const uint8_t **pp, int node,
                                                         int64_t *out) {
    const uint8_t *p = *pp, *end = c->end;
    uint64_t v;
    if (__builtin_expect(p < end && *p < 0x80, 1)) { /* one byte: most lengths, indexes, counts */
        v = *p;
        *pp = p + 1;
        *out = (int64_t)((v >> 1) ^ (0 - (v & 1)));
        return 0;
    }
    v = 0;
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
 * the recursion flattened into the node's precomputed list of columns (the node's, then those
 * of what it holds). */
static int empty(Ctx *c, const Node *node) {
    /* in a local: the stores below (through byte pointers) could alias c */
    char *cols = (char *)c->cols;
    for (const Empty *e = node->empties, *last = e + node->nempties; e < last; e++) {
        Col *col = (Col *)(cols + e->col);
        int64_t len = col->length;
        int r = 0;
        if (e->nullable) {
            if (bit_put(&col->valid, len, 0)) return -1;
            col->nulls++;
        }
        switch (e->kind) {
        case K_NULL: case K_RECORD: break;
        case K_BOOL: r = bit_put(&col->data, len, 0); break;
        case K_INT: case K_ENUM: case K_FLOAT: r = buf_i32(&col->data, 0); break;
        case K_LONG: case K_DOUBLE: r = buf_zeros(&col->data, 8); break;
        case K_FIXED: case K_DEC_BYTES: case K_DEC_FIXED: r = buf_zeros(&col->data, e->zeros); break;
        case K_UUID_STR: case K_DURATION: r = buf_zeros(&col->data, 16); break;
        case K_RAW: /* a binary column */
        case K_BYTES: case K_STRING: r = buf_i32(&col->offs, (int32_t)col->data.len); break;
        case K_UNION: /* the null branch (or branch 0) gets the empty value, next in the list */
            if (buf_put(&col->tids, &e->tid, 1)) return -1;
            /* fall through: the offset, as an array's */
        case K_ARRAY: case K_MAP:
            r = buf_i32(&col->offs, (int32_t)((Col *)(cols + e->of))->length);
            break;
        }
        if (r) return -1;
        col->length = len + 1;
    }
    return 0;
}

/* One value of kid: the common leaf kinds inline (no call), the rest through its function. */
#define CHILD(c, kid, p) dec_any((c), (kid), (p))
#define COL(c, n) ((Col *)((char *)(c)->cols + (n)->col_offset))
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

static inline __attribute__((always_inline)) const uint8_t *d_enum(Ctx *c, const Node *n,
                                                                   Col *col, const uint8_t *p) {
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
    if (is_string && c->strict_utf8 && !utf8_valid(p, (size_t)v))
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

/* A value of kind `kind` (n's, or a constant where the caller knows it, so that the switch
 * folds away): the common leaf kinds inline, the rest through n's function. */
static inline __attribute__((always_inline)) const uint8_t *dec_kind(
    Ctx *c, const Node *n, Col *col, const uint8_t *p, int kind) {
    switch (kind) {
    case K_STRING: return d_string(c, n, col, p);
    case K_BYTES: return d_bytes(c, n, col, p);
    case K_INT: return d_int(c, n, col, p);
    case K_LONG: return d_long(c, n, col, p);
    case K_BOOL: return d_bool(c, n, col, p);
    case K_ENUM: return d_enum(c, n, col, p);
    case K_FLOAT: case K_DOUBLE: case K_FIXED: return d_sized(c, n, col, p);
    default: return n->fn(c, n, col, p);
    }
}

/* ["null", T] or [T, "null"] with T of kind `kind` (as for dec_kind): the branch index, then
 * T's value or an empty slot. */
static inline __attribute__((always_inline)) const uint8_t *d_nullable_of(
    Ctx *c, const Node *n, Col *col, const uint8_t *p, int kind) {
    const uint8_t *start = p;
    int64_t idx;
    if (rd_long(c, &p, n->index, &idx)) return NULL;
    if (idx == n->null_branch) {
        /* a null leaf (the common case: a nullable string, int or long) in place; a record or
         * anything with children through empty(), which fills every column below it */
        int r;
        switch (kind) {
        case K_STRING: case K_BYTES: r = buf_i32(&col->offs, (int32_t)col->data.len); break;
        case K_INT: case K_ENUM: r = buf_i32(&col->data, 0); break;
        case K_LONG: case K_DOUBLE: r = buf_zeros(&col->data, 8); break;
        default: return empty(c, n) ? OOM(c, start, n) : p;
        }
        if (r || bit_put(&col->valid, col->length, 0)) return OOM(c, start, n);
        col->nulls++;
        col->length++;
        return p;
    }
    if (idx != 1 - n->null_branch) return FAIL(c, E_UNION_INDEX, start, n, idx);
    if (bit_put(&col->valid, col->length, 1)) return OOM(c, start, n);
    return dec_kind(c, n, col, p, kind);
}

static inline __attribute__((always_inline)) const uint8_t *d_nullable(Ctx *c, const Node *n,
                                                                       Col *col, const uint8_t *p) {
    return d_nullable_of(c, n, col, p, n->kind);
}

static inline __attribute__((always_inline)) const uint8_t *dec_any(Ctx *c, const Node *n,
                                                                    const uint8_t *p) {
    Col *col = COL(c, n);
    switch (n->op) { /* the kind, or ["null", kind]: one jump for both questions */
    case K_NULLABLE ... K_OPS - 1: return d_nullable(c, n, col, p);
    case K_STRING: return d_string(c, n, col, p);
    case K_BYTES: return d_bytes(c, n, col, p);
    case K_INT: return d_int(c, n, col, p);
    case K_LONG: return d_long(c, n, col, p);
    case K_BOOL: return d_bool(c, n, col, p);
    case K_ENUM: return d_enum(c, n, col, p);
    case K_FLOAT: case K_DOUBLE: case K_FIXED: return d_sized(c, n, col, p);
    default: return n->fn(c, n, col, p);
    }
}

/* A record's fields in order, the next one's decoder found at the end of each (threaded code, a
 * GCC and Clang extension): each kind has its own indirect jump, which the branch predictor
 * learns far better than one jump shared by every field of every record, since a field's
 * kind mostly says which kind comes next. The common optional leaves have code of their own,
 * so that a value of one takes no second jump on its kind. */
static const uint8_t *d_record(Ctx *c, const Node *n, Col *col, const uint8_t *p) {
    static const void *const at[K_OPS] = {
        [K_NULL] = &&call, [K_BOOL] = &&bool_, [K_INT] = &&int_, [K_LONG] = &&long_,
        [K_FLOAT] = &&sized, [K_DOUBLE] = &&sized, [K_BYTES] = &&bytes, [K_STRING] = &&string,
        [K_FIXED] = &&sized, [K_ENUM] = &&enum_, [K_UUID_STR] = &&call, [K_DEC_BYTES] = &&call,
        [K_DEC_FIXED] = &&call, [K_DURATION] = &&call, [K_RECORD] = &&call, [K_ARRAY] = &&call,
        [K_MAP] = &&call, [K_UNION] = &&call, [K_SKIP] = &&call, [K_RAW] = &&call,
        [K_NULLABLE ... K_OPS - 1] = &&nullable, [K_NULLABLE + K_STRING] = &&opt_string,
        [K_NULLABLE + K_INT] = &&opt_int, [K_NULLABLE + K_LONG] = &&opt_long,
    };
    Node *const *kid = n->kids, *const *last = n->kids + n->nchildren;
    const Node *k;
    Col *kc;
#define NEXT_FIELD(value)                                                                        \
    do {                                                                                         \
        if (!(p = (value))) return NULL;                                                         \
        if (++kid == last) goto done;                                                            \
        k = *kid, kc = COL(c, k);                                                                \
        goto *at[k->op];                                                                         \
    } while (0)
    if (kid == last) goto done;
    k = *kid, kc = COL(c, k);
    goto *at[k->op];
nullable: NEXT_FIELD(d_nullable(c, k, kc, p));
opt_string: NEXT_FIELD(d_nullable_of(c, k, kc, p, K_STRING));
opt_int: NEXT_FIELD(d_nullable_of(c, k, kc, p, K_INT));
opt_long: NEXT_FIELD(d_nullable_of(c, k, kc, p, K_LONG));
string: NEXT_FIELD(d_string(c, k, kc, p));
bytes: NEXT_FIELD(d_bytes(c, k, kc, p));
int_: NEXT_FIELD(d_int(c, k, kc, p));
long_: NEXT_FIELD(d_long(c, k, kc, p));
bool_: NEXT_FIELD(d_bool(c, k, kc, p));
enum_: NEXT_FIELD(d_enum(c, k, kc, p));
sized: NEXT_FIELD(d_sized(c, k, kc, p));
call: NEXT_FIELD(k->fn(c, k, kc, p));
#undef NEXT_FIELD
done:
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
        if (n->item_min == 0) { /* items of no bytes: bounded by the budget, not the input */
            if (count > (uint64_t)c->free_left) return FAIL(c, E_FREE_ITEMS, start, n, cd_free_items);
            c->free_left -= (int64_t)count;
        }
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

/* One value of a recursive type kept as its own encoding: read past through its SKIP child
 * (checking the structure, bounded by SKIP_DEPTH), then its bytes stored as a binary value. */
static const uint8_t *d_raw(Ctx *c, const Node *n, Col *col, const uint8_t *p) {
    const uint8_t *start = p;
    if (!(p = skip_value(c, n->kids[0], p, 1))) return NULL;
    size_t len = (size_t)(p - start);
    if (col->data.len + len > INT32_MAX) return FAIL(c, E_TOO_LARGE, start, n, 0);
    if (buf_put(&col->data, start, len) || buf_i32(&col->offs, (int32_t)col->data.len))
        return OOM(c, start, n);
    col->length++;
    return p;
}

static const DecFn KIND_FN[] = {
    [K_NULL] = d_null, [K_BOOL] = d_bool, [K_INT] = d_int, [K_LONG] = d_long,
    [K_FLOAT] = d_sized, [K_DOUBLE] = d_sized, [K_BYTES] = d_bytes, [K_STRING] = d_string,
    [K_FIXED] = d_sized, [K_ENUM] = d_enum, [K_UUID_STR] = d_uuid, [K_DEC_BYTES] = d_dec_bytes,
    [K_DEC_FIXED] = d_dec_fixed, [K_DURATION] = d_duration, [K_RECORD] = d_record,
    [K_ARRAY] = d_list, [K_MAP] = d_list, [K_UNION] = d_union, [K_SKIP] = d_skip,
    [K_RAW] = d_raw,
};

/* Node nd's decoders: its kind's function, and the entry point (the ["null", T] wrapper). */
void cd_bind_node(Node *nd) {
    nd->fn = KIND_FN[nd->kind];
    nd->entry = nd->null_branch >= 0 ? d_nullable : nd->fn;
}

void cd_values_init(void) {
    for (const char *d = "0123456789abcdefABCDEF"; *d; d++) hex_ok[(uint8_t)*d] = 1;
}

/* Without per-string checks: are the strings read since the last call valid UTF-8? Called
 * every UTF8_EVERY bytes of input, so that the strings are checked while still in the cache. */
#define UTF8_EVERY ((int64_t)32 << 10)
int cd_strings_valid(Ctx *c) {
    for (int i = 0; i < c->nnodes; i++) {
        if (c->nodes[i].kind != K_STRING) continue;
        Col *col = &c->cols[i];
        const int32_t *off = (const int32_t *)col->offs.p;
        int64_t from = col->checked;
        col->checked = col->length;
        if (utf8_ascii(col->data.p + off[from], (size_t)(off[col->length] - off[from]))) continue;
        if (!utf8_strings_valid(col->data.p, off, from, col->length)) return 0;
    }
    return 1;
}

/* Empty buffers, offsets starting at 0: the state before a range is decoded. */
int cd_reset_cols(Ctx *c) {
    for (int i = 0; i < c->nnodes; i++) {
        Col *col = &c->cols[i];
        col->valid.len = col->data.len = col->offs.len = col->tids.len = 0;
        col->length = col->nulls = col->checked = 0;
        int k = c->nodes[i].kind;
        if ((k == K_BYTES || k == K_STRING || k == K_ARRAY || k == K_MAP || k == K_RAW) &&
            buf_i32(&col->offs, 0))
            return -1;
    }
    return 0;
}

/* After a sample of the input, grow every buffer once to what the whole range will likely need
 * (the sample's share, times margin), instead of doubling (and copying, and faulting in pages)
 * many times. */
void cd_presize(Ctx *c, int64_t done_bytes, int64_t left_bytes, double margin) {
    if (done_bytes <= 0 || left_bytes <= 0) return;
    double f = (double)left_bytes / (double)done_bytes * margin;
    for (int i = 0; i < c->nnodes; i++) {
        Col *col = &c->cols[i];
        Buf *bufs[4] = {&col->valid, &col->data, &col->offs, &col->tids};
        for (int k = 0; k < 4; k++)
            if (bufs[k]->len && !(k == 1 && c->placed && c->nodes[i].place)) /* sized exactly */
                buf_reserve(bufs[k], (size_t)(bufs[k]->len * f) + 64);
    }
}


/* Buffers are sized after a 32nd of a range, and in a range of over 32 * EARLY_SAMPLE segments
 * roughly after EARLY_SAMPLE segments first (they only grow: the early guess, if larger, stays).
 * Growing through the C heap up to the 32nd cost 0.4-0.8 ms of a 6 ms range of 50,000 records
 * (a page fault in most steps); the early guess leaves few steps. */
#define EARLY_SAMPLE 64
#define EARLY_MARGIN 1.25

/* Decode segments [seg_begin, seg_end) into c->cols, a claim at a time if other threads may cut
 * the range; stop at the first error. */
int64_t cd_free_items = 1 << 20;

/* Segments ahead of the one decoded whose first bytes are fetched into the cache: a list's
 * bytes objects lie apart in memory, where the hardware prefetcher does not look. */
#define PREFETCH_AHEAD 8

void cd_run_range(Ctx *c) {
    int64_t total = 0, done = 0;
    if (!c->list) /* a list's segments are not filled yet: see ListIn */
        for (int64_t s = c->seg_begin; s < c->seg_end; s++)
            total += c->segs[s].len > 0 ? c->segs[s].len : 0;
    c->free_left = cd_free_items + total; /* (a range run again, for UTF-8, starts over) */
    int64_t probe = c->seg_begin + (c->seg_end - c->seg_begin) / 32;
    int64_t early = c->seg_begin + EARLY_SAMPLE;
    /* the next segment that sizes the buffers, and the input done at the next UTF-8 check:
     * one comparison each per segment */
    int64_t event = early < probe ? early : probe;
    int64_t utf8_at = c->validate_utf8 && !c->strict_utf8 ? UTF8_EVERY : INT64_MAX;
    const Node *root = &c->nodes[0];
    int64_t stop = c->cuttable ? c->seg_begin : c->seg_end;
    for (int64_t s = c->seg_begin;; s++) {
        if (s == stop && (!c->cuttable || !cd_claim(c, &stop))) break;
        if (__builtin_expect(s == event, 0)) {
            int first = s == early && early < probe;
            if (first || s > c->seg_begin)
                cd_presize(c, done, (c->all_bytes ? c->all_bytes : total) - done,
                           first ? EARLY_MARGIN : PRESIZE_MARGIN);
            event = first ? probe : -1;
        }
        if (__builtin_expect(done >= utf8_at, 0)) {
            utf8_at = done + UTF8_EVERY;
            if (!cd_strings_valid(c)) {
                c->utf8_bad = 1;
                return;
            }
        }
        if (!c->list && s + PREFETCH_AHEAD < c->seg_end) { /* a list's claims prefetch */
            const Seg *ahead = &c->segs[s + PREFETCH_AHEAD];
            __builtin_prefetch(ahead->ptr);
            if (ahead->len > 64) __builtin_prefetch(ahead->ptr + 64);
        }
        const Seg *seg = &c->segs[s];
        done += seg->len > 0 ? seg->len : 0;
        /* where an error is, set when there is one (the decoders return NULL) */
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
        if (__builtin_expect(seg->count == 1, 1)) {
            if (!(p = root->entry(c, root, &c->cols[0], p))) return;
        } else {
            for (int64_t datum = 0; datum < seg->count; datum++) {
                c->err_datum = datum;
                if (!(p = root->entry(c, root, &c->cols[0], p))) return;
            }
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
void cd_run_segments(Ctx *c) {
    c->strict_utf8 = 0;
    c->utf8_bad = 0;
    cd_run_range(c);
    if (c->cuttable) cd_close_range(c); /* c->seg_end is final from here */
    if (!c->validate_utf8) return;
    if (!c->err && !c->utf8_bad && cd_strings_valid(c)) return;
    c->err = 0;
    c->strict_utf8 = 1;
    if (cd_reset_cols(c)) {
        c->err = E_NO_MEMORY;
        return;
    }
    cd_run_range(c);
}


