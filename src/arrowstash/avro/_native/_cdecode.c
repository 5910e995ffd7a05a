/* The native Avro decoder: Avro datums straight into Arrow buffers.
 *
 * It walks the plan compiled by _plan.py (one node per Arrow array) exactly like the
 * pure-Python decoder in _decode.py, fills the same buffers in Arrow's layouts and reports
 * errors as the same (code, segment, datum, offset, node, detail) tuples. No Python object is
 * made per value; the GIL is released for the whole batch; segments (messages or blocks) are
 * split across pthreads, each filling its own buffers, which are then concatenated. Every read
 * is bounds-checked against the end of its segment.
 *
 * This unit holds the Python entry points; _cdecode.h lists the others.
 */
#include "_cdecode.h"

/* -- the Python side: plan, inputs, outputs ------------------------------------------------- */

typedef struct { PyObject_HEAD uint8_t *p; Py_ssize_t len; size_t cap; } CBuf;

static void cbuf_dealloc(CBuf *self) {
    cd_blk_free(self->p, self->cap);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int cbuf_getbuffer(CBuf *self, Py_buffer *view, int flags) {
    return PyBuffer_FillInfo(view, (PyObject *)self, self->p, self->len, 0, flags);
}

static PyBufferProcs cbuf_as_buffer = {(getbufferproc)cbuf_getbuffer, NULL};

static PyTypeObject CBufType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "arrowstash.avro._native._cdecode.Buffer",
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

void cd_free_cols(Col *cols, int n) {
    if (!cols) return;
    for (int i = 0; i < n; i++) {
        cd_blk_free(cols[i].valid.p, cols[i].valid.cap);
        cd_blk_free(cols[i].data.p, cols[i].data.cap);
        cd_blk_free(cols[i].offs.p, cols[i].offs.cap);
        cd_blk_free(cols[i].tids.p, cols[i].tids.cap);
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

/* How many columns an empty slot of node i appends to (collect_empties' count). */
static int count_empties(const Node *nodes, int i) {
    const Node *n = &nodes[i];
    int count = 1;
    if (n->kind == K_RECORD)
        for (int k = 0; k < n->nchildren; k++) {
            if (nodes[n->children[k]].kind != K_SKIP) count += count_empties(nodes, n->children[k]);
        }
    else if (n->kind == K_UNION)
        count += count_empties(nodes, n->children[n->null_child]);
    return count;
}

/* The columns an empty slot of node i appends to, in the order empty() must visit them. */
static void collect_empties(const Node *nodes, int i, Empty *out, int *count) {
    const Node *n = &nodes[i];
    Empty *e = &out[(*count)++];
    e->col = n->col_offset;
    e->kind = (int8_t)n->kind;
    e->nullable = n->null_branch >= 0;
    e->zeros = (size_t)n->param;
    if (n->kind == K_ARRAY || n->kind == K_MAP) e->of = nodes[n->children[0]].col_offset;
    if (n->kind == K_UNION) {
        e->tid = (int8_t)n->null_child;
        e->of = nodes[n->children[n->null_child]].col_offset;
    }
    if (n->kind == K_RECORD) /* a skipped field has no slot (and its nodes may form cycles) */
        for (int k = 0; k < n->nchildren; k++) {
            if (nodes[n->children[k]].kind != K_SKIP)
                collect_empties(nodes, n->children[k], out, count);
        }
    else if (n->kind == K_UNION)
        collect_empties(nodes, n->children[n->null_child], out, count);
}

/* Set Node.place: a field of the root with one value of a fixed width per record, and no other
 * parent (so one value per message). 0, or -1 out of memory. */
static int place_fields(Node *nodes, int n) {
    int *parents = calloc((size_t)n + 1, sizeof(int));
    if (!parents) return -1;
    for (int i = 0; i < n; i++)
        for (int k = 0; k < nodes[i].nchildren; k++) parents[nodes[i].children[k]]++;
    for (int k = 0; n > 0 && nodes[0].kind == K_RECORD && k < nodes[0].nchildren; k++) {
        Node *f = &nodes[nodes[0].children[k]];
        if (parents[f->index] != 1) continue;
        switch (f->kind) {
        case K_INT: case K_ENUM: case K_FLOAT: f->place = 4; break;
        case K_LONG: case K_DOUBLE: f->place = 8; break;
        case K_FIXED: f->place = f->size <= 1 << 16 ? (int)f->size : 0; break;
        }
    }
    free(parents);
    return 0;
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
            /* children come after their parent; a skipped type may refer back to itself, and
             * a kept value (RAW) to the SKIP nodes of its type made for an earlier one */
            if (ci < 0 || ci >= n ||
                (ci <= i && nd->kind != K_SKIP && nd->kind != K_RAW && nodes[ci].kind != K_SKIP)) {
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
        if (nd->kind < 0 || nd->kind > K_RAW) {
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
        if (nd->kind == K_RAW && (nd->nchildren != 1 || nodes[nd->children[0]].kind != K_SKIP)) {
            PyErr_SetString(PyExc_ValueError, "bad plan: bad raw node");
            goto error;
        }
        nd->kids = calloc((size_t)nd->nchildren + 1, sizeof(Node *));
        if (!nd->kids) {
            PyErr_NoMemory();
            goto error;
        }
        for (int k = 0; k < nd->nchildren; k++) nd->kids[k] = &nodes[nd->children[k]];
        cd_bind_node(nd);
        nd->op = nd->null_branch >= 0 ? K_NULLABLE + nd->kind : nd->kind;
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
    if (place_fields(nodes, (int)n)) {
        PyErr_NoMemory();
        goto error;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        /* its own subtree's, not the plan's: n of them each made a 300-field plan allocate
         * and zero 2.9 MB */
        nodes[i].empties = calloc((size_t)count_empties(nodes, (int)i), sizeof(Empty));
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

/* -- the parsed plan: each call reading the plan's tuples again took 146 us on a 300-field
 * record (of 1.3 ms for 500 messages) */

/* An enum's symbols (a tuple of `count` str) as an Arrow string array's buffers: 0, or -1 with
 * an exception. */
static int set_symbols(Symbols *s, PyObject *names, int64_t count) {
    if (!PyTuple_Check(names) || PyTuple_GET_SIZE(names) != count) {
        PyErr_SetString(PyExc_ValueError, "bad plan: an enum's symbols");
        return -1;
    }
    if (!(s->offs = malloc((size_t)(count + 1) * sizeof(int32_t)))) goto no_memory;
    s->offs[0] = 0;
    for (int64_t k = 0; k < count; k++) {
        Py_ssize_t len;
        const char *text = PyUnicode_AsUTF8AndSize(PyTuple_GET_ITEM(names, k), &len);
        if (!text) return -1;
        uint8_t *data = realloc(s->data, s->len + (size_t)len + 1);
        if (!data) goto no_memory;
        s->data = data;
        memcpy(s->data + s->len, text, (size_t)len);
        s->len += (size_t)len;
        if (s->len > INT32_MAX) {
            PyErr_SetString(PyExc_ValueError, "an enum's symbols take more than 2 GiB");
            return -1;
        }
        s->offs[k + 1] = (int32_t)s->len;
    }
    return 0;
no_memory:
    PyErr_NoMemory();
    return -1;
}

static PyObject *cplan_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    PyObject *plan;
    if (kwds && PyDict_GET_SIZE(kwds)) {
        PyErr_SetString(PyExc_TypeError, "Plan() takes no keyword arguments");
        return NULL;
    }
    PyObject *symbols;
    if (!PyArg_ParseTuple(args, "OO!", &plan, &PyTuple_Type, &symbols)) return NULL;
    CPlan *self = (CPlan *)type->tp_alloc(type, 0);
    if (!self) return NULL;
    self->nodes = parse_plan(plan, &self->nnodes);
    if (!self->nodes) goto error;
    if (self->nnodes < 1 || self->nodes[0].kind != K_RECORD) {
        PyErr_SetString(PyExc_ValueError, "bad plan: no root record");
        goto error;
    }
    if (PyTuple_GET_SIZE(symbols) != self->nnodes) {
        PyErr_SetString(PyExc_ValueError, "bad plan: one tuple of symbols per node");
        goto error;
    }
    if (!(self->symbols = calloc((size_t)self->nnodes, sizeof(Symbols)))) {
        PyErr_NoMemory();
        goto error;
    }
    self->export_depth = cd_export_shape(self->nodes, 0, &self->export_arrays, &self->export_kids);
    for (int i = 0; i < self->nnodes; i++)
        if (self->nodes[i].kind == K_ENUM &&
            set_symbols(&self->symbols[i], PyTuple_GET_ITEM(symbols, i), self->nodes[i].param))
            goto error;
    return (PyObject *)self;
error:
    Py_DECREF(self);
    return NULL;
}

static void cplan_dealloc(CPlan *self) {
    if (self->nodes) free_nodes(self->nodes, self->nnodes);
    for (int i = 0; self->symbols && i < self->nnodes; i++) {
        free(self->symbols[i].offs);
        free(self->symbols[i].data);
    }
    free(self->symbols);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

PyTypeObject cd_PlanType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "arrowstash.avro._native._cdecode.Plan",
    .tp_basicsize = sizeof(CPlan),
    .tp_dealloc = (destructor)cplan_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = cplan_new,
    .tp_doc = "Plan(plan, symbols): a decode plan (decode_plan.Plan.native, and each node's enum "
              "symbols) parsed once, for every call.",
};


/* -- the result ------------------------------------------------------------------------------
 * Arrow's C import refuses trees nested 64 levels deep (pyarrow's kMaxImportRecursionLevel),
 * and a schema may nest 128 (schema.MAX_DEPTH): a deeper plan hands its columns over as the
 * pure-Python decoder does, per node, for decode_plan.assemble(). */
#define IMPORT_MAX_DEPTH 63

/* (length, nulls, [buffers]) of node n, in Arrow's layouts; the column's memory goes with it. */
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
    case K_RAW: /* a binary column */
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

/* The batch: cd_export's (capsule, address), or for a deeper plan a list of node_buffers'. */
PyObject *cd_result(const CPlan *plan, Col *cols) {
    if (plan->export_depth <= IMPORT_MAX_DEPTH) return cd_export(plan, cols);
    PyObject *columns = PyList_New(plan->nnodes);
    if (!columns) return NULL;
    for (int i = 0; i < plan->nnodes; i++) {
        PyObject *item = node_buffers(&plan->nodes[i], &cols[i]);
        if (!item) {
            Py_DECREF(columns);
            return NULL;
        }
        PyList_SET_ITEM(columns, i, item);
    }
    return columns;
}

/* Decode segs with nthreads; returns (0, batch, ids) (cd_result) or (1, code, seg, datum, off,
 * node, detail). */
/* Bytes of the messages before message s. */
static int64_t bytes_before(const Lazy *lz, int64_t s, int64_t nsegs, int64_t total) {
    return s < nsegs ? lz_off(lz, s) - lz_off(lz, 0) : total;
}

#define CHUNKS_PER_THREAD 4
#define FIRST_SHARE 0.9
#define CUTS_PER_THREAD 4  /* chunks a thread out of work may cut off others' (_cdecode_batch.c) */
#define CLAIM_BYTES 4096   /* a decoding thread claims about this much input at a time */

/* `lazy`: non-NULL for one buffer and its offsets: the sizes of ranges are then differences of
 * offsets, so the calling thread finds the threads' ranges by bisection instead of a walk over
 * every message before any thread starts, and each thread fills its range's segments.
 * `list`: non-NULL for a list of bytes read in place with the GIL kept (see ListIn): its size
 * is guessed from a sample (reading every item here would bring each into the cache once more),
 * the ranges are cut by message count; NULL with *again set: decode it the general way. */
static PyObject *run(const CPlan *plan, Seg *segs, int64_t nsegs, int nthreads,
                     int validate_utf8, int confluent, int64_t min_bytes, const Lazy *lazy,
                     ListIn *list, int *again) {
    int nnodes = plan->nnodes;
    const Node *nodes = plan->nodes;
    int64_t total = 0, mean = 0;
    if (list)
        total = (mean = cd_list_mean(list)) * nsegs;
    else if (lazy)
        total = lz_off(lazy, nsegs) - lz_off(lazy, 0);
    else
        for (int64_t s = 0; s < nsegs; s++) total += segs[s].len > 0 ? segs[s].len : 0;
    if (nthreads < 1) nthreads = 1;
    if (nthreads > 64) nthreads = 64;
    /* a thread per min_bytes of input at most: starting one and merging its part costs more
     * than it saves on less */
    if (min_bytes > 0 && total / min_bytes < nthreads) nthreads = (int)(total / min_bytes);
    if (nthreads < 1 || nsegs < 2 * nthreads) nthreads = 1;
    /* The chunks after the first are merged into it (copied), so the first is most of a
     * thread's fair share (FIRST_SHARE); the rest is cut finer (CHUNKS_PER_THREAD each), so
     * that a thread the system runs late or slow finds less left, and the threads reach the
     * merge at nearly the same time: the chunks shrink in turn (the k-th of K gets K - k + 1
     * parts of K (K + 1) / 2), so the last ones, which decide how long the first thread to run
     * out waits, are small. A whole fair share for the first left its thread (usually the
     * calling one) waiting for a helper the VM ran slower: two threads decoded 100,000 records
     * 1.67x as fast as one, against 1.74x with 90% (medians of six runs of the benchmark's
     * rotation), for 5% more bytes to copy. A thread out of chunks then cuts what is left of
     * the others' (_cdecode_batch.c). */
    int nchunks = nthreads == 1 ? 1 : 1 + (nthreads - 1) * CHUNKS_PER_THREAD;
    if (nchunks > nsegs) nchunks = nsegs > 0 ? (int)nsegs : 1;
    int cap = nthreads == 1 ? 1 : nchunks + CUTS_PER_THREAD * nthreads;
    Ctx *ctxs = cd_zalloc_lines((size_t)cap * sizeof(Ctx));
    Buf ids = {0};
    int failed_alloc = !ctxs || (confluent && buf_zeros(&ids, (size_t)(nsegs > 0 ? nsegs : 1) * 4));
    for (int t = 0; t < nchunks && !failed_alloc; t++) {
        ctxs[t].cols = cd_zalloc_lines((size_t)nnodes * sizeof(Col));
        if (!ctxs[t].cols) failed_alloc = 1;
    }
    if (failed_alloc) {
        if (ctxs)
            for (int t = 0; t < nchunks; t++) cd_free_cols(ctxs[t].cols, nnodes);
        free(ctxs);
        cd_blk_free(ids.p, ids.cap);
        return PyErr_NoMemory();
    }
    /* contiguous ranges: the first of FIRST_SHARE * total / nthreads bytes, the others
     * shrinking */
    int64_t s = 0, acc = 0, start = 0;
    int64_t first = nchunks > 1 ? (int64_t)((double)total * FIRST_SHARE / nthreads) : total;
    for (int t = 0; t < nchunks; t++) {
        Ctx *c = &ctxs[t];
        c->nodes = nodes, c->nnodes = nnodes, c->validate_utf8 = validate_utf8;
        c->confluent = confluent, c->segs = segs, c->lazy = lazy, c->ids = (int32_t *)ids.p;
        c->list = list;
        c->all_bytes = t == 0 && nchunks > 1 ? total : 0;
        c->seg_begin = s;
        int64_t k = nchunks - 1, parts = (int64_t)t * k - (int64_t)t * (t - 1) / 2;
        int64_t goal = first + (nchunks > 1
            ? (int64_t)((double)(total - first) * (double)parts / (double)(k * (k + 1) / 2)) : 0);
        if (t == nchunks - 1) {
            s = nsegs;
        } else if (list) {
            s = goal / (mean ? mean : 1);
            s = s <= c->seg_begin ? c->seg_begin + 1 : s < nsegs ? s : nsegs;
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
        int64_t bytes = list ? (s - c->seg_begin) * mean
                        : lazy ? bytes_before(lazy, s, nsegs, total) - start : acc - start;
        if (list && !c->all_bytes) c->all_bytes = bytes; /* the range's guess: see cd_presize */
        c->seg_bytes = s > c->seg_begin ? bytes / (s - c->seg_begin) + 1 : 1;
        c->step = CLAIM_BYTES / c->seg_bytes;
        c->step = c->step < 1 ? 1 : c->step > 64 ? 64 : c->step;
        start += bytes;
        if (cd_reset_cols(c)) failed_alloc = 1; /* offsets start at 0 */
        /* one row per segment (no block counts): fixed-width fields need no merge */
        if (nchunks > 1 && (list || lazy) && !failed_alloc && cd_place(ctxs, t, nsegs))
            failed_alloc = 1;
    }
    int merge_err = failed_alloc;
    if (list) { /* the GIL kept: see ListIn */
        if (!failed_alloc)
            merge_err = cd_decode_and_merge(ctxs, &nchunks, cap, nodes, nnodes, nthreads - 1);
    } else {
        Py_BEGIN_ALLOW_THREADS
        if (!failed_alloc)
            merge_err = cd_decode_and_merge(ctxs, &nchunks, cap, nodes, nnodes, nthreads - 1);
        Py_END_ALLOW_THREADS
    }
    PyObject *result = NULL;
    if (list && atomic_load(&list->again)) {
        *again = 1;
        goto done;
    }
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
        PyObject *batch = cd_result(plan, ctxs[0].cols);
        if (!batch) goto done;
        PyObject *idbuf = confluent ? take(&ids) : (Py_INCREF(Py_None), Py_None);
        result = idbuf ? Py_BuildValue("iNN", 0, batch, idbuf) : NULL;
        if (!idbuf) Py_DECREF(batch);
    }
done:
    cd_unplace(ctxs, nchunks);
    for (int t = 0; t < nchunks; t++) cd_free_cols(ctxs[t].cols, nnodes);
    free(ctxs);
    cd_blk_free(ids.p, ids.cap);
    return result;
}
/* The messages that are not bytes (bytearray, memoryview, ...): their buffers, held until the
 * decode is done. Few or none in the usual list, so grown on demand rather than one per item
 * (a zeroed Py_buffer per message was 8 MB of memset per 100,000 messages). */
typedef struct { Py_buffer *views; Py_ssize_t n, cap; } Views;

static int hold_view(Views *v, PyObject *m, Py_ssize_t index, Seg *seg) {
    if (v->n == v->cap) {
        Py_ssize_t cap = v->cap ? 2 * v->cap : 16;
        Py_buffer *grown = realloc(v->views, (size_t)cap * sizeof(Py_buffer));
        if (!grown) {
            PyErr_NoMemory();
            return -1;
        }
        v->views = grown, v->cap = cap;
    }
    if (PyObject_GetBuffer(m, &v->views[v->n], PyBUF_C_CONTIGUOUS) < 0) {
        if (PyErr_ExceptionMatches(PyExc_TypeError)) {
            PyErr_Clear();
            PyErr_Format(PyExc_TypeError,
                         "message %zd is a %.200s, not bytes, bytearray or memoryview (or None "
                         "for a null message)", index, Py_TYPE(m)->tp_name);
        } else { /* e.g. BufferError: not contiguous; the same error, naming the message */
            PyObject *type, *value, *tb;
            PyErr_Fetch(&type, &value, &tb);
            PyErr_NormalizeException(&type, &value, &tb);
            PyErr_Format(type, "message %zd: %S", index, value);
            Py_XDECREF(type);
            Py_XDECREF(value);
            Py_XDECREF(tb);
        }
        return -1;
    }
    seg->ptr = v->views[v->n].buf;
    seg->len = v->views[v->n].len;
    v->n++;
    return 0;
}

static void release_views(Views *v) {
    for (Py_ssize_t i = 0; i < v->n; i++) PyBuffer_Release(&v->views[i]);
    free(v->views);
}

/* decode_list(plan, messages, counts_or_None, nthreads, validate_utf8, confluent, min_bytes):
 * messages (no counts) are first read in place with the GIL kept (see ListIn). When that stops
 * (an item that is not bytes, an error), the general way: each bytes message is read in place
 * (its address and size taken under the GIL, the object held by a reference of ours until the
 * decode is done, the GIL released); other bytes-like messages through the buffer protocol.
 * One pass over the messages takes the reference, the address and the size:
 * 100,000 objects allocated apart cost a cache miss each per pass (a tuple of them first, then
 * a walk over the tuple, made two). */
static PyObject *decode_list(PyObject *self, PyObject *args) {
    PyObject *messages, *counts;
    CPlan *plan;
    int nthreads, validate_utf8, confluent;
    long long min_bytes;
    if (!PyArg_ParseTuple(args, "O!OOippL", &cd_PlanType, &plan, &messages, &counts, &nthreads, &validate_utf8,
                          &confluent, &min_bytes))
        return NULL;
    /* a list or tuple as it is, anything else as a list */
    PyObject *seq = PySequence_Fast(messages, "messages must be a sequence");
    if (!seq) return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    if (counts != Py_None && PySequence_Size(counts) != n) {
        Py_DECREF(seq);
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "one count per block");
        return NULL;
    }
    size_t segs_cap = ((size_t)n + 1) * sizeof(Seg), held_cap = ((size_t)n + 1) * sizeof(PyObject *);
    Seg *segs = cd_blk_alloc(&segs_cap);
    PyObject **held = cd_blk_alloc(&held_cap);
    Py_ssize_t nheld = 0;
    Views views = {0};
    PyObject *result = NULL;
    if (!segs || !held) {
        PyErr_NoMemory();
        goto done;
    }
    segs[n] = (Seg){0};
#ifndef Py_GIL_DISABLED /* without a GIL, nothing keeps the items alive: references it is */
    if (counts == Py_None && n < INT32_MAX) {
        ListIn list = {(PyObject *const *)PySequence_Fast_ITEMS(seq), n, 0};
        int again = 0;
        result = run(plan, segs, n, nthreads, validate_utf8, confluent, min_bytes, NULL, &list,
                     &again);
        if (result || !again) goto done;
    }
#endif
    for (Py_ssize_t i = 0; i < n; i++) {
        /* read again each time: the buffer protocol and counts' items may run Python code
         * that changes the list (what was taken stays alive: it is held) */
        if (i >= PySequence_Fast_GET_SIZE(seq)) {
            PyErr_SetString(PyExc_RuntimeError, "the list of messages changed during decode");
            goto done;
        }
        PyObject **items = PySequence_Fast_ITEMS(seq);
        if (i + 8 < n && i + 8 < PySequence_Fast_GET_SIZE(seq)) __builtin_prefetch(items[i + 8]);
        PyObject *m = items[i];
        Py_INCREF(m);
        held[nheld++] = m;
        Seg *seg = &segs[i];
        seg->count = 1;
        if (counts != Py_None) {
            PyObject *ci = PySequence_GetItem(counts, i);
            if (!ci) goto done;
            seg->count = PyLong_AsLongLong(ci);
            Py_DECREF(ci);
            if (seg->count < 0) {
                if (!PyErr_Occurred())
                    PyErr_SetString(PyExc_ValueError, "block counts must not be negative");
                goto done;
            }
        }
        if (PyBytes_CheckExact(m)) {
            seg->ptr = (const uint8_t *)PyBytes_AS_STRING(m);
            seg->len = PyBytes_GET_SIZE(m);
        } else if (m == Py_None) {
            seg->ptr = NULL, seg->len = -1;
        } else if (hold_view(&views, m, i, seg)) {
            goto done;
        }
    }
    result = run(plan, segs, n, nthreads, validate_utf8, confluent, min_bytes, NULL, NULL, NULL);
done:
    release_views(&views);
    for (Py_ssize_t i = 0; i < nheld; i++) Py_DECREF(held[i]);
    cd_blk_free(held, held_cap);
    cd_blk_free(segs, segs_cap);
    Py_DECREF(seq);
    return result;
}

/* decode_concat(plan, data, offsets, offset_width, first, n, validity_or_None, nthreads,
 *               validate_utf8, confluent, min_bytes): message i is
 * data[offsets[first+i]:offsets[first+i+1]], null where bit (first + i) of validity is clear. */
static PyObject *decode_concat(PyObject *self, PyObject *args) {
    PyObject *data, *offsets, *validity;
    CPlan *plan;
    int width, nthreads, validate_utf8, confluent;
    long long first, n, min_bytes;
    if (!PyArg_ParseTuple(args, "O!OOiLLOippL", &cd_PlanType, &plan, &data, &offsets, &width, &first, &n,
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
    segs = cd_blk_alloc(&segs_cap);
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
    result = run(plan, segs, n, nthreads, validate_utf8, confluent, min_bytes, &lazy, NULL, NULL);
done:
    cd_blk_free(segs, segs_cap);
    if (have_v) PyBuffer_Release(&vv);
    PyBuffer_Release(&ov);
    PyBuffer_Release(&dv);
    return result;
}

static PyObject *set_free_items(PyObject *self, PyObject *args) {
    long long n;
    if (!PyArg_ParseTuple(args, "L", &n)) return NULL;
    if (n < 0) {
        PyErr_SetString(PyExc_ValueError, "the limit of items that take no bytes must be >= 0");
        return NULL;
    }
    cd_free_items = (int64_t)n;
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"set_free_items", set_free_items, METH_VARARGS,
     "set_free_items(n): items that take no bytes a batch may hold beyond its size in bytes"},
    {"decode_list", decode_list, METH_VARARGS,
     "decode_list(plan, messages, counts, nthreads, validate_utf8, confluent, min_bytes)"},
    {"decode_concat", decode_concat, METH_VARARGS,
     "decode_concat(plan, data, offsets, width, first, n, validity, nthreads, validate_utf8, "
     "confluent, min_bytes)"},
    {"scan_blocks", cd_scan_blocks, METH_VARARGS, "scan_blocks(data, pos, sync) -> (table, pos)"},
    {"cuts", cd_cuts, METH_NOARGS,
     "cuts() -> how many times a thread out of work has cut another's range, in this process"},
    {"same_core", cd_same_core, METH_NOARGS,
     "same_core() -> helper jobs that began on the core of the thread that woke them, in this "
     "process"},
    {"native_inflate", cd_native_inflate, METH_NOARGS,
     "native_inflate() -> whether BlockStream can take deflated blocks (libdeflate is there)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_cdecode", "The native Avro decoder (see writer_decoder.py).", -1, methods,
};

PyMODINIT_FUNC PyInit__cdecode(void) {
    cd_values_init();
    cd_pool_init();
    if (PyType_Ready(&CBufType) < 0 || PyType_Ready(&cd_StreamType) < 0 ||
        PyType_Ready(&cd_PlanType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m && (PyModule_AddObjectRef(m, "BlockStream", (PyObject *)&cd_StreamType) < 0 ||
              PyModule_AddObjectRef(m, "Plan", (PyObject *)&cd_PlanType) < 0)) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
