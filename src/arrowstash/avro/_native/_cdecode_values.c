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
 * the recursion flattened into the node's precomputed list (the node, then what it holds). */
static int empty(Ctx *c, int ni) {
    /* in locals: the stores below (through byte pointers) could alias c and the nodes, so
     * values read through them would be read again after each store */
    const Node *nodes = c->nodes;
    char *cols = (char *)c->cols;
    const int *e = nodes[ni].empties, *last = e + nodes[ni].nempties;
    for (; e < last; e++) {
        const Node *n = &nodes[*e];
        Col *col = (Col *)(cols + n->col_offset);
        int64_t len = col->length;
        int r = 0;
        if (n->null_branch >= 0) {
            if (bit_put(&col->valid, len, 0)) return -1;
            col->nulls++;
        }
        switch (n->kind) {
        case K_NULL: case K_RECORD: break;
        case K_BOOL: r = bit_put(&col->data, len, 0); break;
        case K_INT: case K_ENUM: case K_FLOAT: r = buf_i32(&col->data, 0); break;
        case K_LONG: case K_DOUBLE: r = buf_zeros(&col->data, 8); break;
        case K_FIXED: case K_DEC_BYTES: case K_DEC_FIXED:
            r = buf_zeros(&col->data, (size_t)n->param);
            break;
        case K_UUID_STR: case K_DURATION: r = buf_zeros(&col->data, 16); break;
        case K_RAW: /* a binary column */
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
        col->length = len + 1;
    }
    return 0;
}

#define FAIL(c, code, at, n, detail) (fail((c), (code), (at), (n)->index, (detail)), NULL)
#define OOM(c, at, n) (oom((c), (at), (n)->index), NULL)

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

/* -- strings and bytes --------------------------------------------------------------------- */

/* The v bytes at p appended to a string or bytes column that has room for v + 64 bytes and one
 * offset. Short values (the common case) are copied in fixed-size moves, without a call into
 * memcpy, when the message has that many bytes left (the output has them: the 64). */
static inline __attribute__((always_inline)) void put_value(Ctx *c, Col *col, const uint8_t *p,
                                                            int64_t v) {
    uint8_t *to = col->data.p + col->data.len;
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
    col->data.len += (size_t)v;
    int32_t end = (int32_t)col->data.len;
    memcpy(col->offs.p + col->offs.len, &end, 4);
    col->offs.len += 4;
    col->length++;
}

/* String and bytes values are copied without a capacity check when they end within the room:
 * every string and bytes column can take as many bytes (and offsets) as the input holds from
 * the position where the room was made to c->start + c->room_to, since a value's bytes come
 * from the input and each value, or null, takes at least one byte of it. A check per stretch
 * of input (STRING_ROOM bytes or more) instead of one per value. c->room_to carries over from
 * segment to segment (cd_run_range). */
#define STRING_ROOM 2048

static void string_room(Ctx *c, const uint8_t *p) {
    int64_t room = INT32_MAX;
    for (int i = 0; i < c->nnodes; i++) {
        int k = c->nodes[i].kind;
        if (k != K_STRING && k != K_BYTES) continue;
        Col *col = &c->cols[i];
        if (buf_reserve(&col->data, STRING_ROOM + 64) ||
            buf_reserve(&col->offs, 4 * STRING_ROOM + 4)) {
            room = 0; /* the values take the checked path, which reports it */
            break;
        }
        int64_t data = (int64_t)(col->data.cap - col->data.len) - 64;
        int64_t offs = ((int64_t)(col->offs.cap - col->offs.len) - 4) / 4;
        int64_t below = INT32_MAX - (int64_t)col->data.len; /* offsets are int32 */
        if (data < room) room = data;
        if (offs < room) room = offs;
        if (below < room) room = below;
    }
    c->room_to = (p - c->start) + (room > 0 ? room : 0);
}

/* Where values must end to be copied unchecked; at c->start (none can) in strict mode, so that
 * each string is checked as it is read. */
static inline const uint8_t *room_limit(const Ctx *c) {
    int64_t len = c->end - c->start, to = c->room_to;
    if (c->strict_utf8 || to < 0) return c->start;
    return c->start + (to < len ? to : len);
}

/* A value the fast path leaves (negative, truncated, strict UTF-8 or past the room): the room
 * made again, or checks of its own if it is larger. start: its length's first byte. */
static const uint8_t *string_slow(Ctx *c, const Node *n, Col *col, const uint8_t *start,
                                  const uint8_t *p, int64_t v) {
    if (v < 0) return FAIL(c, E_NEGATIVE, start, n, v);
    if (v > c->end - p) return FAIL(c, E_TRUNCATED, start, n, 0);
    if (n->kind == K_STRING && c->strict_utf8 && !utf8_valid(p, (size_t)v))
        return FAIL(c, E_UTF8, start, n, 0);
    if (v > c->room_to - (p - c->start)) string_room(c, p);
    if (v > c->room_to - (p - c->start)) {
        if (buf_reserve(&col->data, (size_t)v + 64) || buf_reserve(&col->offs, 4))
            return OOM(c, start, n);
        if ((int64_t)col->data.len + v > INT32_MAX) return FAIL(c, E_TOO_LARGE, start, n, 0);
    }
    put_value(c, col, p, v);
    return p + v;
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

/* -- the walk ------------------------------------------------------------------------------ */

/* What the walk does at a node (Node.dop, chosen once by cd_bind_node): its kind folded into the
 * cases below, with OP_NULLABLE set when a ["null", T] branch index comes first. */
enum { OP_NULL, OP_STR, OP_INT, OP_LONG, OP_BOOL, OP_ENUM, OP_SIZED, OP_CALL, OP_RECORD,
       OP_LIST, OP_UNION, OP_NULLABLE = 16 };

static const int8_t KIND_OP[] = {
    [K_NULL] = OP_NULL, [K_BOOL] = OP_BOOL, [K_INT] = OP_INT, [K_LONG] = OP_LONG,
    [K_FLOAT] = OP_SIZED, [K_DOUBLE] = OP_SIZED, [K_BYTES] = OP_STR, [K_STRING] = OP_STR,
    [K_FIXED] = OP_SIZED, [K_ENUM] = OP_ENUM, [K_UUID_STR] = OP_CALL, [K_DEC_BYTES] = OP_CALL,
    [K_DEC_FIXED] = OP_CALL, [K_DURATION] = OP_CALL, [K_RECORD] = OP_RECORD,
    [K_ARRAY] = OP_LIST, [K_MAP] = OP_LIST, [K_UNION] = OP_UNION, [K_SKIP] = OP_CALL,
    [K_RAW] = OP_CALL,
};

/* the kinds decoded by a call (OP_CALL): rare enough in data not to be worth the inlining */
static const DecFn KIND_FN[] = {
    [K_UUID_STR] = d_uuid, [K_DEC_BYTES] = d_dec_bytes, [K_DEC_FIXED] = d_dec_fixed,
    [K_DURATION] = d_duration, [K_SKIP] = d_skip, [K_RAW] = d_raw,
};

/* Node nd's op code, and its function if it is decoded by a call. (cd_parse_plan refuses a
 * ["null", T] node of kind null, union or skip: they have no OP_NULLABLE case.) */
void cd_bind_node(Node *nd) {
    nd->fn = KIND_FN[nd->kind];
    nd->dop = KIND_OP[nd->kind] | (nd->null_branch >= 0 ? OP_NULLABLE : 0);
}

/* The header of a block of an array's or map's items: *count is its number of items, 0 for the
 * end of the list; -1 on an error. */
static inline __attribute__((always_inline)) int list_block(Ctx *c, const Node *n,
                                                            const uint8_t **pp, uint64_t *count) {
    const uint8_t *p = *pp, *start = p;
    int64_t v;
    if (rd_long(c, &p, n->index, &v)) return -1;
    *pp = p;
    *count = 0;
    if (v == 0) return 0;
    uint64_t k = (uint64_t)v, need;
    if (v < 0) {
        k = 0 - (uint64_t)v;
        const uint8_t *size_start = p;
        int64_t size;
        if (rd_long(c, &p, n->index, &size)) return -1;
        if (size < 0) return fail(c, E_NEGATIVE, size_start, n->index, size);
        *pp = p;
    }
    if (__builtin_mul_overflow(k, (uint64_t)n->item_min, &need) ||
        need > (uint64_t)(c->end - p)) {
        fail(c, E_BLOCK_COUNT, start, n->index, 0);
        c->err_detail = (int64_t)k;
        c->err_unsigned = 1;
        return -1;
    }
    const Col *first = &c->cols[n->children[0]];
    if (k > (uint64_t)(INT32_MAX - first->length)) return fail(c, E_TOO_LARGE, start, n->index, 0);
    if (n->item_min == 0) { /* items of no bytes: bounded by the budget, not the input */
        if (k > (uint64_t)c->free_left) return fail(c, E_FREE_ITEMS, start, n->index, cd_free_items);
        c->free_left -= (int64_t)k;
    }
    *count = k;
    return 0;
}

/* The end of list n: its offset. */
static inline int list_end(Ctx *c, const Node *n, const uint8_t *p) {
    Col *col = &c->cols[n->index];
    if (buf_i32(&col->offs, (int32_t)c->cols[n->children[0]].length)) return oom(c, p, n->index);
    col->length++;
    return 0;
}

/* A ["null", T] node's branch index: a null fills the slot (on_null) and ends the value; T's
 * branch marks the slot valid and falls through to T's case. */
#define NULLABLE(on_null)                                                                    \
    {                                                                                        \
        const uint8_t *at = p;                                                               \
        int64_t idx;                                                                         \
        if (rd_long(c, &p, n->index, &idx)) return NULL;                                     \
        if (idx == n->null_branch) {                                                         \
            on_null;                                                                         \
            break;                                                                           \
        }                                                                                    \
        if (idx != 1 - n->null_branch) return FAIL(c, E_UNION_INDEX, at, n, idx);           \
        if (bit_put(&col->valid, col->length, 1)) return OOM(c, at, n);                      \
    }
/* a leaf's null: its zero value, a clear validity bit */
#define LEAF_NULL(fill)                                                                      \
    if ((fill) || bit_put(&col->valid, col->length, 0)) return OOM(c, at, n);                \
    col->nulls++;                                                                            \
    col->length++
/* anything else's: empty() fills every column below it too */
#define EMPTY_NULL                                                                           \
    if (empty(c, n->index)) return OOM(c, at, n)

/* Records and lists the walk is inside of: the children still to decode (a map's key, then its
 * value) and, for a list, the items left in the block (0 for a record). */
typedef struct { const Node *n; Node *const *kid, *const *last; uint64_t left; } Frame;
#define STACK 16 /* deeper nesting goes on in a call of walk() */

/* One value of node n (op: n->dop, or n's kind without the nullable's branch index) at p into
 * the columns; the position after it, or NULL after recording an error in c. Records, arrays,
 * maps and unions are gone through in this loop, on a stack of frames, not in calls: one
 * switch per node. */
static const uint8_t *walk(Ctx *c, const Node *n, const uint8_t *p, int op) {
    Frame stack[STACK];
    int top = 0;
    char *const cols = (char *)c->cols;
    const uint8_t *lim = room_limit(c);
    for (;;) {
        Col *col = (Col *)(cols + n->col_offset);
        switch (op) {
        case OP_NULL: col->length++; break;
        case OP_STR | OP_NULLABLE: NULLABLE(LEAF_NULL(buf_i32(&col->offs, (int32_t)col->data.len)))
        /* fallthrough */
        case OP_STR: {
            const uint8_t *start = p;
            int64_t v;
            if (rd_long(c, &p, n->index, &v)) return NULL;
            if (__builtin_expect(v < 0 || v > lim - p, 0)) {
                if (!(p = string_slow(c, n, col, start, p, v))) return NULL;
                lim = room_limit(c);
                break;
            }
            put_value(c, col, p, v);
            p += v;
            break;
        }
        case OP_INT | OP_NULLABLE: NULLABLE(LEAF_NULL(buf_i32(&col->data, 0)))
        /* fallthrough */
        case OP_INT:
            if (!(p = d_int(c, n, col, p))) return NULL;
            break;
        case OP_LONG | OP_NULLABLE: NULLABLE(LEAF_NULL(buf_zeros(&col->data, 8)))
        /* fallthrough */
        case OP_LONG:
            if (!(p = d_long(c, n, col, p))) return NULL;
            break;
        case OP_BOOL | OP_NULLABLE: NULLABLE(LEAF_NULL(bit_put(&col->data, col->length, 0)))
        /* fallthrough */
        case OP_BOOL:
            if (!(p = d_bool(c, n, col, p))) return NULL;
            break;
        case OP_ENUM | OP_NULLABLE: NULLABLE(LEAF_NULL(buf_i32(&col->data, 0)))
        /* fallthrough */
        case OP_ENUM:
            if (!(p = d_enum(c, n, col, p))) return NULL;
            break;
        case OP_SIZED | OP_NULLABLE: NULLABLE(LEAF_NULL(buf_zeros(&col->data, (size_t)n->size)))
        /* fallthrough */
        case OP_SIZED:
            if (!(p = d_sized(c, n, col, p))) return NULL;
            break;
        case OP_CALL | OP_NULLABLE: NULLABLE(EMPTY_NULL)
        /* fallthrough */
        case OP_CALL:
            if (!(p = n->fn(c, n, col, p))) return NULL;
            break;
        case OP_RECORD | OP_NULLABLE: NULLABLE(EMPTY_NULL)
        /* fallthrough */
        case OP_RECORD:
            if (n->nchildren == 0) {
                col->length++;
                break;
            }
            if (top == STACK) {
                if (!(p = walk(c, n, p, OP_RECORD))) return NULL;
                lim = room_limit(c);
                break;
            }
            stack[top++] = (Frame){n, n->kids + 1, n->kids + n->nchildren, 0};
            n = n->kids[0];
            op = n->dop;
            continue;
        case OP_LIST | OP_NULLABLE: NULLABLE(EMPTY_NULL)
        /* fallthrough */
        case OP_LIST: {
            if (top == STACK) {
                if (!(p = walk(c, n, p, OP_LIST))) return NULL;
                lim = room_limit(c);
                break;
            }
            uint64_t count;
            if (list_block(c, n, &p, &count)) return NULL;
            if (count == 0) {
                if (list_end(c, n, p)) return NULL;
                break;
            }
            stack[top++] = (Frame){n, n->kids + 1, n->kids + n->nchildren, count};
            n = n->kids[0];
            op = n->dop;
            continue;
        }
        case OP_UNION: {
            const uint8_t *start = p;
            int64_t v;
            if (rd_long(c, &p, n->index, &v)) return NULL;
            if (v < 0 || v >= n->nchildren) return FAIL(c, E_UNION_INDEX, start, n, v);
            int8_t tid = (int8_t)v;
            const Node *kid = n->kids[v];
            if (buf_put(&col->tids, &tid, 1) ||
                buf_i32(&col->offs, (int32_t)((Col *)(cols + kid->col_offset))->length))
                return OOM(c, start, n);
            col->length++;
            n = kid;
            op = n->dop;
            continue;
        }
        default: __builtin_unreachable();
        }
        /* n's value is complete: on to the next child, item or block of the frames above */
        for (;;) {
            if (top == 0) return p;
            Frame *f = &stack[top - 1];
            if (f->kid < f->last) {
                n = *f->kid++;
                break;
            }
            const Node *up = f->n;
            if (f->left == 0) { /* a record */
                ((Col *)(cols + up->col_offset))->length++;
                top--;
                continue;
            }
            if (--f->left == 0) {
                if (list_block(c, up, &p, &f->left)) return NULL;
                if (f->left == 0) {
                    if (list_end(c, up, p)) return NULL;
                    top--;
                    continue;
                }
            }
            f->kid = up->kids + 1;
            n = up->kids[0];
            break;
        }
        op = n->dop;
    }
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
            if (bufs[k]->len) buf_reserve(bufs[k], (size_t)(bufs[k]->len * f) + 64);
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
    for (int64_t s = c->seg_begin; s < c->seg_end; s++)
        total += c->segs[s].len > 0 ? c->segs[s].len : 0;
    c->free_left = cd_free_items + total; /* (a range run again, for UTF-8, starts over) */
    c->room_to = 0;
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
        if (s + PREFETCH_AHEAD < c->seg_end) {
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
            if (!(p = walk(c, root, p, root->dop))) return;
        } else {
            for (int64_t datum = 0; datum < seg->count; datum++) {
                c->err_datum = datum;
                if (!(p = walk(c, root, p, root->dop))) return;
            }
        }
        if (p != c->end) {
            fail(c, E_TRAILING, p, 0, c->end - p);
            return;
        }
        /* the next segment's input follows this one's, as far as the room goes */
        c->room_to = c->room_to > seg->len ? c->room_to - seg->len : 0;
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


