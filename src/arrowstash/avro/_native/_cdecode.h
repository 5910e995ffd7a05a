/* The native Avro decoder's shared definitions: the plan's nodes, the columns and contexts the
 * decoders fill, the inline buffer helpers of the hot loops, and the functions one translation
 * unit of the _cdecode extension calls in another (prefix cd_, hidden: not exported).
 *
 * The units: _cdecode_values.c decodes values along the plan (the hot loops);
 * _cdecode_batch.c holds the reused memory, the threads and the merge of their buffers into
 * one batch; _cdecode_blocks.c the container file block scanner and BlockStream; _cdecode.c the
 * Python entry points (plan parsing, decode_list, decode_concat, the module).
 */
#ifndef ARROWSTASH_CDECODE_H
#define ARROWSTASH_CDECODE_H
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "_arrow_c.h"

enum { K_NULL, K_BOOL, K_INT, K_LONG, K_FLOAT, K_DOUBLE, K_BYTES, K_STRING, K_FIXED, K_ENUM,
       K_UUID_STR, K_DEC_BYTES, K_DEC_FIXED, K_DURATION, K_RECORD, K_ARRAY, K_MAP, K_UNION,
       K_SKIP /* read past a value of kind param (a field the reader drops) */,
       K_RAW /* a value read past through its one SKIP child, its bytes kept as a binary value */,
       K_NULLABLE /* not a plan kind: Node.op of a ["null", T] node is K_NULLABLE + T's kind */ };
#define K_OPS (K_NULLABLE + K_RAW + 1)
/* How deep skipped values may nest: _plan.SKIP_DEPTH. */
#define SKIP_DEPTH 10000

enum { E_TRUNCATED = 1, E_VARINT, E_INT_RANGE, E_UNION_INDEX, E_NEGATIVE, E_UTF8, E_TRAILING,
       E_BOOL, E_ENUM, E_UUID, E_DECIMAL, E_DURATION, E_BLOCK_COUNT, E_TOO_LARGE,
       E_CONFLUENT_SHORT, E_CONFLUENT_MAGIC, E_NULL_MESSAGE, E_NO_MEMORY, E_TIME, E_TOO_DEEP,
       E_FREE_ITEMS };

struct Ctx;
struct Col;
struct Node;
/* Decodes one value of node n at p into its column and returns the position after it, or NULL
 * after recording an error in c; a function per kind keeps each one small. */
typedef const uint8_t *(*DecFn)(struct Ctx *c, const struct Node *n, struct Col *col,
                                const uint8_t *p);

/* A column that an empty slot of a node appends to (empty(), _cdecode_values.c): what empty()
 * needs of that column's node, so that it reads no node. */
typedef struct {
    size_t col;   /* the column's offset in a context's array */
    size_t of;    /* arrays, maps, unions: the offset of the column whose length is the offset */
    size_t zeros; /* fixed and decimals: the value's bytes */
    int8_t kind, nullable, tid; /* tid: a union's branch (its first null, else 0) */
} Empty;

typedef struct Node {
    int kind, null_branch, nchildren, null_child, index;
    int op;             /* kind, or K_NULLABLE + kind */
    size_t col_offset;  /* index * sizeof(Col): where its column is in a context's array */
    int64_t param, size, min_size, item_min;
    int *children;
    struct Node **kids; /* the children as pointers */
    Empty *empties;     /* the columns an empty slot of this one appends to, in order */
    int nempties;
    int place;          /* a fixed-width field of the root (its only parent): the width, else 0 */
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

/* A list of bytes read in place (_cdecode_batch.c): the calling thread keeps the GIL for the
 * whole decode, so no item can be freed or replaced while any thread reads it; each claim fills
 * its segments from the items just before they are decoded. */
typedef struct {
    PyObject *const *items;
    int64_t n;
    atomic_int again; /* decode the list again the general way (see cd_list_fill) */
} ListIn;

typedef struct Ctx {
    const Node *nodes;
    int nnodes, validate_utf8, confluent;
    int strict_utf8; /* check each string as it is read (else whole columns after the range) */
    int utf8_bad;    /* a check of the strings read so far found invalid UTF-8 */
    /* the columns of placed nodes (Node.place) are laid out in chunk 0's, a row at its
     * segment's index: chunk 0 owns that memory, the others write their rows in place */
    int placed;
    Col *cols;
    const uint8_t *start, *end;
    const Seg *segs;
    const Lazy *lazy; /* set: fill segs[seg_begin, seg_end) from it first */
    ListIn *list;     /* set: segs are filled a claim at a time from it */
    int64_t seg_begin, seg_end;
    int64_t all_bytes; /* the first of several threads sizes its buffers for all of them */
    /* With several threads, the segments still to decode: seg_begin + [next, end), packed as
     * next << 32 | end. The decoding thread claims `step` at a time from next; a thread out of
     * work may move end down and take the far half (see _cdecode_batch.c). */
    _Atomic uint64_t work;
    atomic_int started; /* segs are filled: the range may be cut */
    int cuttable;
    int64_t step, seg_bytes; /* segments claimed at once; bytes per segment, on average */
    int32_t *ids;
    /* Items that take no bytes (nulls, empty records) this range may still decode: the limit
     * plus the range's bytes, so that no input costs more than its size plus the limit. */
    int64_t free_left;
    /* the first error */
    int err;
    int64_t err_seg, err_datum, err_off, err_detail;
    int err_node, err_unsigned;
} __attribute__((aligned(64))) Ctx; /* own cache lines: each chunk's thread writes its Ctx */

#pragma GCC visibility push(hidden)
/* _cdecode_batch.c: reused memory */
void *cd_blk_alloc(size_t *cap);
void cd_blk_free(void *p, size_t cap);
int cd_buf_grow(Buf *b, size_t extra);
void *cd_zalloc_lines(size_t size);
/* _cdecode_batch.c: chunks decoded by threads, then merged into chunk 0's columns */
int cd_decode_and_merge(Ctx *ctxs, int *nchunks, int cap, const Node *nodes, int nnodes,
                        int nhelpers);
int cd_place(Ctx *ctxs, int t, int64_t nsegs);
void cd_unplace(Ctx *ctxs, int nchunks);
int cd_claim(Ctx *c, int64_t *stop);
int64_t cd_list_mean(const ListIn *in);
void cd_close_range(Ctx *c);
void cd_pool_init(void); /* once, at import: fork handlers for the kept helper threads */
PyObject *cd_cuts(PyObject *self, PyObject *unused);
PyObject *cd_same_core(PyObject *self, PyObject *unused);
/* _cdecode_values.c */
extern int64_t cd_free_items; /* see Ctx.free_left; set by set_free_items() */
void cd_values_init(void);
void cd_bind_node(Node *nd);
int cd_strings_valid(Ctx *c);
int cd_reset_cols(Ctx *c);
void cd_presize(Ctx *c, int64_t done_bytes, int64_t left_bytes, double margin);
#define PRESIZE_MARGIN 1.05 /* over a guess from a 32nd of the input */
void cd_run_range(Ctx *c);
void cd_run_segments(Ctx *c);
/* _cdecode.c */
void cd_free_cols(Col *cols, int n);
/* An enum's symbols as an Arrow string array's offsets and data. */
typedef struct { int32_t *offs; uint8_t *data; size_t len; } Symbols;
/* A plan parsed once (Plan(plan_tuple, symbols)), its root a record; read-only after. */
typedef struct {
    PyObject_HEAD
    Node *nodes;
    int nnodes;
    int export_depth;               /* the ArrowArray tree below the root (cd_export_shape): */
    int export_arrays, export_kids; /* its levels, arrays and child slots */
    Symbols *symbols;
} CPlan;
extern PyTypeObject cd_PlanType;
PyObject *cd_result(const CPlan *plan, Col *cols);
/* _cdecode_export.c */
int cd_export_shape(const Node *nodes, int i, int *arrays, int *kids);
PyObject *cd_export(const CPlan *plan, Col *cols);
/* _cdecode_blocks.c */
extern PyTypeObject cd_StreamType;
PyObject *cd_scan_blocks(PyObject *self, PyObject *args);
PyObject *cd_native_inflate(PyObject *self, PyObject *unused);
#pragma GCC visibility pop

/* -- buffers ------------------------------------------------------------------------------- */
static inline int buf_reserve(Buf *b, size_t extra) {
    if (__builtin_expect(b->len + extra <= b->cap, 1)) return 0;
    return cd_buf_grow(b, extra);
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

#endif
