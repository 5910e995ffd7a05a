/* The native Avro encoder's values: the row loop (code per common column shape) and the
 * generic size and write walks for the rest (see _encode.h). */
#include "_encode.h"

static const char HEX[] = "0123456789abcdef";

static __attribute__((noinline, cold)) int grow(Writer *w, size_t need) {
    size_t used = (size_t)(w->p - w->base);
    size_t want = (size_t)(w->end - w->base) * 2;
    while (want - used < need) want *= 2;
    uint8_t *nb = ce_blk_alloc(&want);
    if (nb == NULL) {
        w->failed = 1;
        w->err_row = w->row;
        w->err_node = -1;
        w->err_code = E_NOMEM;
        return -1;
    }
    if (used) memcpy(nb, w->base, used);
    ce_blk_free(w->base, (size_t)(w->end - w->base));
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

/* The index of the symbol at p, or -1. A symbol of up to 8 bytes is matched as one word
 * (and its length) when the string has 8 bytes to read: enums are short. */
INLINE int64_t enum_symbol(const Bound *b, int64_t p) {
    const Node *n = b->n;
    const int32_t *o = (const int32_t *)b->b1 + p;
    const uint8_t *s = b->b2 + o[0];
    Py_ssize_t len = o[1] - o[0];
    if (len <= 8 && s + 8 <= b->data_end) {
        uint64_t word;
        memcpy(&word, s, 8);
        word &= len == 8 ? ~0ull : (1ull << (8 * len)) - 1;
        for (int64_t k = 0; k < n->p1; k++)
            if (n->sym_word[k] == word && n->sym_len[k] == len) return k;
        return -1;
    }
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
    case K_RAW: {
        const int32_t *o = (const int32_t *)b->b1 + p;
        return (int64_t)o[1] - o[0];
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
    case K_RAW: {
        const int32_t *o = (const int32_t *)b->b1 + p;
        memcpy(d, b->b2 + o[0], (size_t)(o[1] - o[0]));
        return d + (o[1] - o[0]);
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

int ce_column_shape(const Bound *b) {
    int leaf = leaf_index(b);
    if (leaf >= 0) return (b->optional ? S_OPTIONAL : S_LEAF) + leaf;
    if (b->optional) return S_GENERIC;
    if (b->kind == K_ENUM || b->kind == K_ENUM_STRING) return S_ENUM;
    if (b->kind == K_UNION) {
        for (int k = 0; k < b->n_kids; k++) {
            const Bound *kid = &b->kids[k];
            if (kid->value_byte >= 0 || (kid->kind != K_NULL && leaf_index(kid) < 0))
                return S_GENERIC;
        }
        return S_UNION;
    }
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
int64_t ce_column_bound(int shape) {
    static const int64_t leaf[N_LEAF] = {1, 10, 10, 4, 8, 65};
    if (shape < S_LIST) return 1 + leaf[shape % N_LEAF];
    if (shape == S_ENUM) return 10;
    if (shape == S_UNION) return 1 + leaf[L_BINARY];
    return shape != S_GENERIC ? 1 : 0;
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
            case S_OPT_RECORD:
                if (c->valid != NULL && !BIT(c->valid, p)) {
                    if (c->null_byte < 0) FAIL_ROW(c->b->n, E_NULL, p - c->b->off, 0);
                    *d++ = (uint8_t)c->null_byte;
                    c += c->skip; /* its fields: nothing to write */
                    break;
                }
                if (c->value_byte >= 0) *d++ = (uint8_t)c->value_byte;
                break;
            case S_ENUM: {
                const Bound *b = c->b;
                int64_t k = b->kind == K_ENUM ? ((const int32_t *)c->b1)[p] : enum_symbol(b, p);
                if (k < 0 || k >= b->n->p1) {
                    if (b->kind == K_ENUM) FAIL_ROW(b->n, E_ENUM_INDEX, p - b->off, k);
                    FAIL_ROW(b->n, E_ENUM_SYMBOL, p - b->off, 0);
                }
                d = put_varint_fast(d, (uint64_t)k << 1);
                break;
            }
            case S_UNION: { /* branches that are leaves or null, checked as size_node does */
                const Bound *u = c->b;
                int8_t t = ((const int8_t *)c->b1)[p];
                if (t < 0 || t >= u->n_kids) FAIL_ROW(u->n, E_UNION, p - u->off, t);
                const Bound *kid = &u->kids[t];
                int64_t q = kid->off + (c->b2 ? ((const int32_t *)c->b2)[p] : p);
                if (kid->valid != NULL && !BIT(kid->valid, q)) goto generic; /* a null value */
                *d++ = (uint8_t)(t << 1);
                if (kid->kind == K_NULL) break;
                int leaf = leaf_index(kid);
                if (leaf == L_BINARY) {
                    const int32_t *o = (const int32_t *)kid->b1 + q;
                    int64_t n = (int64_t)o[1] - o[0];
                    if (__builtin_expect(n >= 64, 0)) {
                        RESERVE(n + 10);
                        d = put_bytes(d, kid->b2 + o[0], n);
                        break;
                    }
                }
                d = put_leaf(d, leaf, kid->b1, kid->b2, kid->data_end, q);
                break;
            }
            default: /* no other shape: no bounds check before the jump table */
                __builtin_unreachable();
            case S_GENERIC:
            generic: {
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


/* The row loop for the threads in _encode.c: a call into a function compiled twice goes through
 * its ifunc, and a non-static one would export the ifunc's resolver. */
int ce_encode_rows(Writer *w, const Column *cols, int n_cols, int64_t bound, int64_t lo,
                   int64_t hi, int64_t row0, int64_t *ends) {
    return encode_rows(w, cols, n_cols, bound, lo, hi, row0, ends);
}
