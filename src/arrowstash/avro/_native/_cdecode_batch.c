/* The native Avro decoder's batch: reused memory, the threads that decode the chunks of a
 * batch, and the merge of their buffers into one set of columns (see _cdecode.h). */
#include "_cdecode.h"
#include "_pool.h"
#include "_reuse.h"


/* -- reused memory (see _reuse.h): up to 128 MiB in 256 blocks ---------------------------- */
static Reuse kept = REUSE_INIT((size_t)128 << 20, 256);

void *cd_blk_alloc(size_t *cap) { return reuse_alloc(&kept, cap); }

void cd_blk_free(void *p, size_t cap) { reuse_free(&kept, p, cap); }

int cd_buf_grow(Buf *b, size_t extra) {
    size_t cap = b->cap ? b->cap : 64;
    while (cap < b->len + extra) cap *= 2;
    if (cap < REUSE_MIN) { /* small: the C heap reuses its own memory */
        uint8_t *p = realloc(b->p, cap);
        if (!p) return -1;
        b->p = p;
        b->cap = cap;
        return 0;
    }
    uint8_t *p = cd_blk_alloc(&cap);
    if (!p) return -1;
    if (b->len) memcpy(p, b->p, b->len);
    cd_blk_free(b->p, b->cap);
    b->p = p;
    b->cap = cap;
    return 0;
}

/* Zeroed memory on cache lines of its own (threads write their contexts and columns all the
 * time: sharing a line with another thread's would move it between the cores), or NULL. */
void *cd_zalloc_lines(size_t size) {
    size = (size + 63) / 64 * 64;
    void *p = aligned_alloc(64, size ? size : 64);
    if (p) memset(p, 0, size ? size : 64);
    return p;
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
/* -- placed columns ---------------------------------------------------------------------------
 * A fixed-width field of the root (Node.place) has one value per message, so message i's is
 * at i * width whichever chunk decodes it: chunk 0 holds the whole batch's column from the
 * start and the other chunks write theirs into it, leaving the merge nothing to copy there
 * (40% of its bytes on the flat benchmark schema). */

/* Lay out chunk t's placed columns (chunk 0 first: it allocates them): 0, or -1 out of memory. */
int cd_place(Ctx *ctxs, int t, int64_t nsegs) {
    Ctx *c = &ctxs[t];
    for (int i = 0; i < c->nnodes; i++) {
        size_t w = (size_t)c->nodes[i].place;
        if (!w) continue;
        Buf *b = &c->cols[i].data;
        if (t > 0) {
            size_t rows = (size_t)(c->seg_end - c->seg_begin);
            *b = (Buf){ctxs[0].cols[i].data.p + (size_t)c->seg_begin * w, 0, rows * w};
            continue;
        }
        size_t cap = (size_t)nsegs * w;
        uint8_t *p = cd_blk_alloc(&cap);
        if (!p) return -1;
        *b = (Buf){p, 0, cap};
    }
    c->placed = 1;
    return 0;
}

/* Forget the memory chunks after the first write into (chunk 0 frees it). */
void cd_unplace(Ctx *ctxs, int nchunks) {
    for (int t = 1; t < nchunks; t++)
        for (int i = 0; ctxs[t].placed && i < ctxs[t].nnodes; i++)
            if (ctxs[t].nodes[i].place) ctxs[t].cols[i].data = (Buf){0};
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

/* Large parts are copied around the cache (non-temporal stores, SSE2 being part of x86-64):
 * their place, the merged buffers' far end, is memory this call has not touched, and an
 * ordinary store to a line that is not in the cache first reads it from memory. On this
 * machine's VM that made a cold 8 MB copy 1.2 ms with memcpy and 0.75 ms around the cache. */
#define AROUND_CACHE ((size_t)64 << 10)

#if defined(__x86_64__)
#include <emmintrin.h>

static void copy_part(uint8_t *restrict d, const uint8_t *restrict s, size_t n) {
    if (n < AROUND_CACHE) {
        memcpy(d, s, n);
        return;
    }
    size_t head = (16 - ((uintptr_t)d & 15)) & 15;
    memcpy(d, s, head);
    size_t i = head;
    for (; i + 64 <= n; i += 64) {
        __m128i a = _mm_loadu_si128((const __m128i *)(s + i));
        __m128i b = _mm_loadu_si128((const __m128i *)(s + i + 16));
        __m128i c = _mm_loadu_si128((const __m128i *)(s + i + 32));
        __m128i e = _mm_loadu_si128((const __m128i *)(s + i + 48));
        _mm_stream_si128((__m128i *)(d + i), a);
        _mm_stream_si128((__m128i *)(d + i + 16), b);
        _mm_stream_si128((__m128i *)(d + i + 32), c);
        _mm_stream_si128((__m128i *)(d + i + 48), e);
    }
    memcpy(d + i, s + i, n - i);
    _mm_sfence(); /* before the task counts as done: the stores are weakly ordered */
}

/* d[i] = s[i] + base for n offsets. */
static void rebase_part(int32_t *restrict d, const int32_t *restrict s, int64_t n, int32_t base) {
    int64_t i = 0;
    if ((size_t)n * 4 >= AROUND_CACHE) {
        for (; i < n && ((uintptr_t)(d + i) & 15); i++) d[i] = s[i] + base;
        __m128i b = _mm_set1_epi32(base);
        for (; i + 4 <= n; i += 4)
            _mm_stream_si128((__m128i *)(d + i),
                             _mm_add_epi32(_mm_loadu_si128((const __m128i *)(s + i)), b));
        _mm_sfence();
    }
    for (; i < n; i++) d[i] = s[i] + base;
}
#else
static void copy_part(uint8_t *restrict d, const uint8_t *restrict s, size_t n) {
    memcpy(d, s, n);
}

static void rebase_part(int32_t *restrict d, const int32_t *restrict s, int64_t n, int32_t base) {
    for (int64_t i = 0; i < n; i++) d[i] = s[i] + base;
}
#endif

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
    if (n->kind == K_RAW && (int64_t)(out->data.len + data) > INT32_MAX) return -2;
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
    case K_RAW: /* a binary column */
    case K_BYTES: case K_STRING: case K_ARRAY: case K_MAP: {
        int64_t base = (int64_t)data;
        if (n->kind == K_ARRAY || n->kind == K_MAP) {
            int c = n->children[0];
            base = pre[c].length;
            for (int u = 1; u < t; u++) base += ctxs[u].cols[c].length;
        } else if (col->data.len) {
            copy_part(out->data.p + data, col->data.p, col->data.len);
        }
        rebase_part((int32_t *)out->offs.p + rows + 1, (const int32_t *)col->offs.p + 1,
                    col->length, (int32_t)base);
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
        if (col->data.len) copy_part(out->data.p + data, col->data.p, col->data.len);
    }
}

/* -- work sharing ---------------------------------------------------------------------------
 * The input is cut into chunks (contiguous ranges of segments), each decoded into its own
 * buffers; then the merge's tasks run. Threads claim chunks, then tasks, from shared counters,
 * and the calling thread claims them too: it never waits for a thread the system has not
 * scheduled yet, only for work items in progress. Helpers are kept threads (_pool.h) that
 * may still be leaving when the call returns: the shared state is freed by whoever leaves it
 * last. */

typedef struct { int node, chunk; int64_t bytes; } Task;

typedef struct {
    atomic_int refs;
    atomic_long next_chunk, next_task;
    atomic_long segs_done, tasks_done; /* changed under mu */
    atomic_int phase;                  /* changed under mu: 0 decoding, 1 merging, 2 done */
    int nchunks, nnodes, ntasks;
    int nqueued, cap; /* chunks laid out before the call; room for the ones cut off them */
    int64_t nsegs;
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

/* Until *value >= goal (value only grows, always under mu): see pool_wait. */
static void wait_for(Shared *sh, atomic_long *value, long goal) {
    pool_wait(value, goal, &sh->mu, &sh->cv);
}

/* -- cutting ranges ---------------------------------------------------------------------------
 * However the chunks are laid out, a thread the system runs slower leaves the others waiting at
 * the end for its last chunk (0.3 ms of 6.5, the median of 30 calls decoding 100,000 records with
 * two threads). So a thread out of chunks takes the far half of the range with the most left,
 * as a new chunk after it, until what is left is small. The decoding thread claims `step`
 * segments at a time (an atomic add per few kilobytes of input); the cut moves the range's end
 * past what is claimed with a compare-and-swap, so a segment is decoded once. */

#define CUT_MIN_BYTES ((int64_t)32 << 10) /* the least a cut takes */

static atomic_long cuts_made; /* in this process: the tests see cuts happen */

PyObject *cd_cuts(PyObject *self, PyObject *unused) {
    return PyLong_FromLong(atomic_load(&cuts_made));
}

PyObject *cd_same_core(PyObject *self, PyObject *unused) {
    return PyLong_FromLong(atomic_load(&pool_same_core));
}

static uint64_t pack(int64_t next, int64_t end) { return (uint64_t)next << 32 | (uint64_t)end; }
static int64_t next_of(uint64_t w) { return (int64_t)(w >> 32); }
static int64_t end_of(uint64_t w) { return (int64_t)(w & 0xffffffffu); }

/* -- a list of bytes --------------------------------------------------------------------------
 * Its items are read where they are decoded, a claim at a time: the claim's objects are read
 * (type, size, address) into its segments and decoded at once, while they are in the cache,
 * and the next claim's objects are prefetched. Gathering every item first, then decoding, read
 * each of 100,000 objects allocated apart from memory twice (1.17-1.35x the CPU time of a
 * BinaryArray). No reference is taken: the calling thread keeps the GIL until every thread is
 * done, so nothing can change the list or free an item. An item that is not bytes (or None)
 * stops the batch, and so does any error: the caller then decodes the list the general way
 * (references, the buffer protocol), which reports the first error as it always did. */

static int list_fill(Ctx *c, int64_t a, int64_t b) {
    ListIn *in = c->list;
    Seg *segs = (Seg *)c->segs;
    if (atomic_load_explicit(&in->again, memory_order_relaxed)) return 0;
    for (int64_t i = b + (b - a), ahead = b + 2 * (b - a); i < ahead && i < in->n; i++) {
        const char *o = (const char *)in->items[i];
        __builtin_prefetch(o);
        __builtin_prefetch(o + 64);
        __builtin_prefetch(o + 128);
    }
    int64_t bytes = 0;
    for (int64_t i = a; i < b; i++) {
        PyObject *m = in->items[i];
        if (PyBytes_CheckExact(m)) {
            segs[i] = (Seg){(const uint8_t *)PyBytes_AS_STRING(m), PyBytes_GET_SIZE(m), 1};
            bytes += segs[i].len;
        } else if (m == Py_None) {
            segs[i] = (Seg){NULL, -1, 1};
        } else {
            atomic_store(&in->again, 1);
            return 0;
        }
    }
    /* the budget of items that take no bytes grows with the bytes read (not the range's
     * total, unknown here); running out sends the list the general way, with its total */
    c->free_left += bytes;
    return 1;
}

/* Bytes per message, guessed from up to 64 items spread over the list (at least 1): it sizes
 * the threads' ranges and their buffers, as the total does for other inputs. */
int64_t cd_list_mean(const ListIn *in) {
    int64_t k = in->n < 64 ? in->n : 64, sum = 0;
    for (int64_t j = 0; j < k; j++) {
        PyObject *m = in->items[j * in->n / k];
        if (PyBytes_CheckExact(m)) sum += PyBytes_GET_SIZE(m);
    }
    return k && sum >= k ? sum / k : 1;
}

/* A list's range: any error or bad string sends the batch the general way. */
static void run_list_range(Ctx *c) {
    c->strict_utf8 = 0;
    c->utf8_bad = 0;
    cd_run_range(c);
    cd_close_range(c);
    if (c->err || c->utf8_bad || (c->validate_utf8 && !cd_strings_valid(c)))
        atomic_store(&c->list->again, 1);
}

int cd_claim(Ctx *c, int64_t *stop) {
    uint64_t old = atomic_fetch_add(&c->work, (uint64_t)c->step << 32);
    int64_t next = next_of(old), end = end_of(old);
    if (next >= end) {
        c->seg_end = c->seg_begin + end;
        return 0;
    }
    *stop = c->seg_begin + (next + c->step < end ? next + c->step : end);
    return !c->list || list_fill(c, c->seg_begin + next, *stop);
}

/* Keep the rest of c's range (none of it is cut off from here) and set its final end. */
void cd_close_range(Ctx *c) {
    uint64_t w = atomic_load(&c->work);
    while (!atomic_compare_exchange_weak(&c->work, &w, pack(end_of(w), end_of(w)))) {}
    c->seg_end = c->seg_begin + end_of(w);
    c->cuttable = 0;
}

/* Let c's range be cut, if other threads may (its segments are filled); ranges of 2**31
 * segments or more never are. */
static void open_range(Ctx *c, int others) {
    int64_t n = c->seg_end - c->seg_begin;
    c->cuttable = (others || c->list) && n < ((int64_t)1 << 31); /* a list's: filled by claims */
    atomic_store(&c->work, c->cuttable ? pack(0, n) : 0);
    atomic_store_explicit(&c->started, 1, memory_order_release);
}

/* A new chunk cut off the range with the most left, or NULL. Under mu: one cut at a time, and
 * none once every segment is decoded (the calling thread may then free the contexts: a helper
 * the system ran late must not touch them). */
static Ctx *cut(Shared *sh) {
    Ctx *got = NULL;
    pthread_mutex_lock(&sh->mu);
    if (sh->nchunks < sh->cap && sh->segs_done < sh->nsegs) {
        got = &sh->ctxs[sh->nchunks];
        got->cols = cd_zalloc_lines((size_t)sh->nnodes * sizeof(Col));
        got->nodes = sh->nodes, got->nnodes = sh->nnodes;
        if (!got->cols || cd_reset_cols(got)) goto none;
        for (;;) {
            Ctx *victim = NULL;
            uint64_t w = 0;
            int64_t best = 0;
            for (int i = 0; i < sh->nchunks; i++) {
                Ctx *c = &sh->ctxs[i];
                if (!atomic_load_explicit(&c->started, memory_order_acquire)) continue;
                uint64_t v = atomic_load(&c->work);
                int64_t left = end_of(v) - next_of(v);
                if (left * c->seg_bytes > best * (victim ? victim->seg_bytes : 0)) {
                    victim = c, w = v, best = left;
                }
            }
            if (!victim || best < 2 || best / 2 * victim->seg_bytes < CUT_MIN_BYTES) goto none;
            int64_t next = next_of(w), end = end_of(w);
            int64_t mid = next + (end - next) / 2;
            if (!atomic_compare_exchange_strong(&victim->work, &w, pack(next, mid))) continue;
            got->validate_utf8 = victim->validate_utf8, got->confluent = victim->confluent;
            got->segs = victim->segs, got->ids = victim->ids, got->list = victim->list;
            got->seg_begin = victim->seg_begin + mid, got->seg_end = victim->seg_begin + end;
            got->step = victim->step, got->seg_bytes = victim->seg_bytes;
            if (sh->ctxs[0].placed) cd_place(sh->ctxs, sh->nchunks, 0); /* cannot fail */
            open_range(got, 1);
            sh->nchunks++;
            atomic_fetch_add(&cuts_made, 1);
            goto done;
        }
    none:
        cd_free_cols(got->cols, sh->nnodes);
        memset(got, 0, sizeof(Ctx));
        got = NULL;
    }
done:
    pthread_mutex_unlock(&sh->mu);
    return got;
}

static void decode_chunks(Shared *sh) {
    for (;;) {
        long i = atomic_fetch_add(&sh->next_chunk, 1);
        Ctx *c = i < sh->nqueued ? &sh->ctxs[i] : cut(sh);
        if (!c) return;
        if (i < sh->nqueued) {
            if (c->lazy) lz_fill(c->lazy, (Seg *)c->segs, c->seg_begin, c->seg_end);
            open_range(c, sh->cap > sh->nqueued);
        }
        if (c->list)
            run_list_range(c);
        else
            cd_run_segments(c);
        pthread_mutex_lock(&sh->mu);
        sh->segs_done += c->seg_end - c->seg_begin;
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

/* A helper's share of one batch: chunks, then merge tasks, then it lets the batch go. */
static void help(void *arg) {
    Shared *sh = arg;
    decode_chunks(sh);
    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (unsigned i = 1; atomic_load(&sh->phase) == 0; i++) { /* as in pool_wait */
        if (i % 256 == 0 && pool_elapsed_ns(&t0) > POOL_SPIN_NS) {
            pthread_mutex_lock(&sh->mu);
            while (atomic_load(&sh->phase) == 0) pthread_cond_wait(&sh->cv, &sh->mu);
            pthread_mutex_unlock(&sh->mu);
            break;
        }
        pool_relax();
    }
    if (atomic_load(&sh->phase) == 1) merge_tasks(sh);
    shared_release(sh);
}

/* Hand sh to n kept helpers (each holds a reference); fewer if threads cannot be started. */
static void start_helpers(Shared *sh, int n) {
    PoolPlace pl;
    if (n > 0) pool_place(&pl, n);
    for (int h = 0; h < n; h++) {
        atomic_fetch_add(&sh->refs, 1);
        if (pool_run(help, sh, &pl) != 0) {
            atomic_fetch_sub(&sh->refs, 1);
            break;
        }
    }
}

void cd_pool_init(void) { pool_init(); }

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
            if (b == 0 || n->kind == K_RECORD || n->kind == K_NULL || n->kind == K_BOOL ||
                (n->place && ctxs[0].placed)) /* written in place */
                continue;
            sh->tasks[ntasks++] = (Task){i, t, b};
        }
        if (has_bitmaps(n)) sh->tasks[ntasks++] = (Task){i, 0, bits};
    }
    qsort(sh->tasks, (size_t)ntasks, sizeof(Task), by_bytes_down);
    sh->ntasks = ntasks;
    return 0;
}

static int by_first_segment(const void *a, const void *b) {
    int64_t x = ((const Ctx *)a)->seg_begin, y = ((const Ctx *)b)->seg_begin;
    return (x > y) - (x < y);
}

/* Decode the *nchunks chunks (ranges in order, from segment 0) and merge them into chunk 0, with
 * nhelpers extra threads; ctxs has room for cap chunks, and *nchunks becomes how many there are
 * once some are cut in two, in order. Returns the merge error (0, -1 out of memory, -2 too
 * large); decoding errors stay in the chunks' contexts. */
int cd_decode_and_merge(Ctx *ctxs, int *nchunks, int cap, const Node *nodes, int nnodes,
                        int nhelpers) {
    Shared *sh = calloc(1, sizeof(Shared));
    if (!sh) return -1;
    atomic_init(&sh->refs, 1);
    atomic_init(&sh->next_chunk, 0);
    atomic_init(&sh->next_task, 0);
    atomic_init(&sh->segs_done, 0);
    atomic_init(&sh->tasks_done, 0);
    atomic_init(&sh->phase, 0);
    sh->nchunks = sh->nqueued = *nchunks, sh->cap = nhelpers > 0 ? cap : *nchunks;
    sh->nsegs = ctxs[*nchunks - 1].seg_end - ctxs[0].seg_begin;
    sh->nnodes = nnodes, sh->ctxs = ctxs, sh->nodes = nodes;
    pthread_mutex_init(&sh->mu, NULL);
    pthread_cond_init(&sh->cv, NULL);
    start_helpers(sh, nhelpers);
    decode_chunks(sh);
    wait_for(sh, &sh->segs_done, sh->nsegs);
    pthread_mutex_lock(&sh->mu); /* no cut is under way: each is made under mu */
    int n = *nchunks = sh->nchunks;
    qsort(ctxs + 1, (size_t)(n - 1), sizeof(Ctx), by_first_segment);
    pthread_mutex_unlock(&sh->mu);
    int any_err = 0, err = 0;
    for (int t = 0; t < n; t++) any_err |= ctxs[t].err != 0;
    int merge = !any_err && n > 1;
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

