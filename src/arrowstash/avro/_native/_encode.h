/* The native Avro encoder's shared definitions: the plan's nodes bound to Arrow arrays, the
 * writer, the primitive writes every unit inlines, and the functions one translation unit of the
 * _cencode extension calls in another (prefix ce_, hidden: not exported).
 *
 * The units: _encode_rows.c writes values (the row loop and the generic size and write walks:
 * the hot code); _encode_bind.c parses a plan and binds it to the input's arrays; _encode.c holds
 * the reused memory, the threads and the Python entry point.
 */
#ifndef ARROWSTASH_ENCODE_H
#define ARROWSTASH_ENCODE_H
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the Avro encoder copies little-endian Arrow values as Avro's little-endian floats"
#endif

#include "_arrow_c.h"

/* Node kinds: keep in step with KIND_* in _encode.py. */
enum {
    K_NULL = 0, K_BOOL, K_INT32, K_INT64, K_INT64_AS_INT, K_FLOAT, K_DOUBLE, K_BINARY,
    K_LARGE_BINARY, K_FIXED, K_ENUM, K_ENUM_STRING, K_RECORD, K_ARRAY, K_MAP, K_UNION,
    K_DECIMAL_BYTES, K_DECIMAL_FIXED, K_UUID_STRING, K_DURATION,
    K_RAW /* binary written as it is: a value's own encoding */, K_COUNT
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
    uint64_t *sym_word;    /* their first 8 bytes, zero-padded: one compare for short ones */
} Node;

typedef struct Bound {
    int kind;              /* n->kind */
    int optional;          /* may be null, or writes a union index first */
    int null_byte, value_byte; /* zigzag union index of a null / before a value; -1: none */
    const Node *n;
    const uint8_t *valid;  /* NULL when no element is null */
    const uint8_t *b1;     /* values, offsets or type ids */
    const uint8_t *b2;     /* string data or union offsets */
    const uint8_t *data_end; /* K_BINARY, K_ENUM_STRING: the end of its last string */
    int64_t off;
    int n_kids;
    struct Bound *kids;
} Bound;

/* A node that occurs once per row: element `at + r` (in its buffers' coordinates: the offset
 * is in) of `b` is row r's value. Its buffers are copied here, next to each other. */
typedef struct {
    int shape;             /* which code encodes it: see ce_column_shape */
    int optional, null_byte, value_byte;
    int64_t at;
    const uint8_t *valid, *b1, *b2;
    const uint8_t *b2_end;
    int64_t item_off, key_off; /* arrays and maps: their items' (values') and keys' offsets */
    const uint8_t *item_b1, *item_b2, *item_b2_end, *key_b1, *key_b2, *key_b2_end;
    const Bound *b;
    int skip;              /* S_OPT_RECORD: the columns of its fields, which follow it */
} Column;

typedef struct {
    Bound *root;
    Column *cols;
    int n_cols;
    int64_t bound;         /* the sum of the columns' ce_column_bound */
    int64_t length;
    int64_t first_row;
} Segment;

typedef struct Writer {
    uint8_t *base, *p, *end; /* a block from ce_blk_alloc, `end - base` bytes */
    int64_t row;
    int failed;
    int64_t err_row, err_node, err_code, err_index, err_value;
} Writer;


/* The common leaves, and the shapes of columns with code of their own in encode_rows: a leaf,
 * a leaf that may be null or comes with a union index, an array or a map (string keys) of
 * non-null leaves, a record that may be null or comes with a union index (its union index
 * only: its fields are the columns after it, skipped when it is null), an enum (index or
 * symbol), a union of leaves and nulls; every other column is S_GENERIC (sized, then written,
 * by the generic functions in _encode_rows.c). Dense numbers: one jump table. */
enum { L_BOOL, L_INT32, L_INT64, L_FLOAT, L_DOUBLE, L_BINARY, N_LEAF };
enum { S_LEAF = 0, S_OPTIONAL = N_LEAF, S_LIST = 2 * N_LEAF, S_MAP = 3 * N_LEAF,
       S_GENERIC = 4 * N_LEAF, S_OPT_RECORD, S_ENUM, S_UNION };

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

#pragma GCC visibility push(hidden)
/* _encode.c: reused memory */
void *ce_blk_alloc(size_t *cap);
void ce_blk_free(void *p, size_t cap);
/* _encode_rows.c */
int ce_column_shape(const Bound *b);
int64_t ce_column_bound(int shape);
/* Rows [lo, hi) of the columns into w (row0: the first row's number); 0, or -1 with w->failed. */
int ce_encode_rows(Writer *w, const Column *cols, int n_cols, int64_t bound, int64_t lo,
                   int64_t hi, int64_t row0, int64_t *ends);
/* _encode_bind.c */
void ce_free_node(Node *n);
int ce_parse_node(PyObject *t, Node *n);
void ce_free_bound(Bound *b);
int ce_bind(Bound *b, const Node *n, const struct ArrowArray *a, int64_t extra_off);
int ce_flatten(const Bound *b, int64_t base, Column *out);
#pragma GCC visibility pop

#endif
