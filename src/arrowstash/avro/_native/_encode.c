/* Native Avro encoder: Arrow arrays (through the Arrow C Data Interface) -> Avro binary datums.
 *
 * Python (encoder.py) compiles the Avro schema against the input's Arrow types into a plan (a
 * tuple tree of nodes) and normalises every column to the one physical layout each node reads,
 * so this extension only walks buffers: validity bitmaps, offsets, values and children. The GIL is
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
 *
 * This unit holds the reused memory, the threads and the Python entry point; _encode.h lists
 * the others.
 */
#include "_encode.h"
#include "_pool.h"
#include "_reuse.h"

/* ---------------------------------------------------------------- reused memory */

/* Reused memory (see _reuse.h): up to 64 MiB in 32 blocks. */
#define KEEP_BYTES ((size_t)64 << 20)
static Reuse kept = REUSE_INIT(KEEP_BYTES, 32);

/* A block of at least *cap bytes (*cap becomes its size), or NULL. */
void *ce_blk_alloc(size_t *cap) {
    if (*cap < 64) *cap = 64;
    return reuse_alloc(&kept, cap);
}

void ce_blk_free(void *p, size_t cap) { reuse_free(&kept, p, cap); }


/* ---------------------------------------------------------------- threads */

/* Memory: every buffer is a block (ce_blk_alloc). Each thread writes its rows into its own scratch
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
        if (ce_encode_rows(&t->w, sg->cols, sg->n_cols, sg->bound, r - lo, hi - lo, r,
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

/* One task on a kept helper thread, counted in `done` when it returns. */
typedef struct {
    void *(*fn)(void *);
    Task *task;
    atomic_long *done;
    pthread_mutex_t *mu;
    pthread_cond_t *cv;
} Job;

static void run_job(void *arg) {
    Job *job = arg;
    job->fn(job->task);
    pthread_mutex_lock(job->mu);
    atomic_fetch_add(job->done, 1);
    pthread_cond_broadcast(job->cv);
    pthread_mutex_unlock(job->mu);
}

/* Run fn over every task: tasks 1.. on kept helper threads (inline if none can start), task 0
 * on the calling thread, which then waits for the others. */
static void parallel(void *(*fn)(void *), Task *tasks, int n) {
    Job jobs[256];
    atomic_long done = 0;
    pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
    pthread_cond_t cv = PTHREAD_COND_INITIALIZER;
    long handed = 0;
    PoolPlace pl;
    if (n > 1) pool_place(&pl, n - 1);
    for (int k = 1; k < n; k++) {
        jobs[k] = (Job){fn, &tasks[k], &done, &mu, &cv};
        if (pool_run(run_job, &jobs[k], &pl) == 0) handed++;
        else fn(&tasks[k]);
    }
    fn(&tasks[0]);
    pool_wait(&done, handed, &mu, &cv);
    pthread_cond_destroy(&cv);
    pthread_mutex_destroy(&mu);
}

/* ---------------------------------------------------------------- the Python entry point */

typedef struct {
    PyObject_HEAD
    uint8_t *p;
    Py_ssize_t len;
    size_t cap;
} Block;

static void block_dealloc(Block *self) {
    ce_blk_free(self->p, self->cap);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int block_getbuffer(Block *self, Py_buffer *view, int flags) {
    return PyBuffer_FillInfo(view, (PyObject *)self, self->p, self->len, 1, flags);
}

static PyBufferProcs block_as_buffer = {(getbufferproc)block_getbuffer, NULL};

static PyTypeObject BlockType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "arrowstash.avro._native._cencode.Block",
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

/* ---------------------------------------------------------------- the parsed plan */

/* Plan(plan_tuple): a plan parsed once, for every call (each call parsed it again: a node
 * allocated per node and a string per enum symbol, every time). Read-only once made. */
typedef struct {
    PyObject_HEAD
    Node root;
    int parsed;
} EPlan;

static PyObject *eplan_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    PyObject *plan;
    if ((kwds && PyDict_GET_SIZE(kwds)) || !PyArg_ParseTuple(args, "O!", &PyTuple_Type, &plan)) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "Plan(plan) takes one tuple");
        return NULL;
    }
    EPlan *self = (EPlan *)type->tp_alloc(type, 0);
    if (!self) return NULL;
    self->parsed = 1; /* freed even if half parsed: ce_free_node takes what was allocated */
    if (ce_parse_node(plan, &self->root) < 0) {
        Py_DECREF(self);
        return NULL;
    }
    return (PyObject *)self;
}

static void eplan_dealloc(EPlan *self) {
    if (self->parsed) ce_free_node(&self->root);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyTypeObject EPlanType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "arrowstash.avro._native._cencode.Plan",
    .tp_basicsize = sizeof(EPlan),
    .tp_dealloc = (destructor)eplan_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = eplan_new,
    .tp_doc = "Plan(plan): an encode plan (encode_plan.Plan.native) parsed once, for every call.",
};

/* encode(plan, capsules, threads, guess)
 *   -> (data, offsets, large, size, None) or (None, None, 0, 0, (row, node, code, value)):
 * thread 0's scratch has `guess` bytes, the others' guess / threads. */
static PyObject *py_encode(PyObject *self, PyObject *args) {
    EPlan *plan;
    PyObject *caps;
    int n_threads;
    long long guess;
    (void)self;
    if (!PyArg_ParseTuple(args, "O!O!iL", &EPlanType, &plan, &PyList_Type, &caps, &n_threads,
                          &guess))
        return NULL;
    int n_segs = (int)PyList_GET_SIZE(caps);
    if (n_threads < 1 || n_threads > 256 || guess < 0) {
        PyErr_SetString(PyExc_ValueError, "between 1 and 256 threads, and a guess >= 0");
        return NULL;
    }
    const Node *root = &plan->root;
    Segment *segs = NULL;
    Task *tasks = NULL;
    Shared sh;
    size_t ends_cap = 0, offs_cap = 0, data_cap = 0;
    uint8_t *ends = NULL, *offs = NULL, *data = NULL;
    PyObject *data_obj = NULL, *offs_obj = NULL, *result = NULL;
    memset(&sh, 0, sizeof(sh));
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
        if (ce_bind(segs[s].root, root, a, 0) < 0) goto done;
        segs[s].n_cols = ce_flatten(segs[s].root, 0, NULL);
        segs[s].cols = calloc((size_t)segs[s].n_cols, sizeof(Column));
        if (segs[s].cols == NULL) {
            PyErr_NoMemory();
            goto done;
        }
        ce_flatten(segs[s].root, 0, segs[s].cols);
        for (int k = 0; k < segs[s].n_cols; k++)
            segs[s].bound += ce_column_bound(segs[s].cols[k].shape);
        segs[s].length = a->length;
        segs[s].first_row = sh.total;
        sh.total += a->length;
    }
    sh.segs = segs;
    sh.n_segs = n_segs;
    sh.n_threads = n_threads;
    ends_cap = (size_t)(sh.total + 1) * 8;
    ends = ce_blk_alloc(&ends_cap);
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
        tasks[k].w.base = tasks[k].w.p = ce_blk_alloc(&cap);
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
        offs = ce_blk_alloc(&offs_cap);
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
        data = ce_blk_alloc(&data_cap);
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
    if (data_cap > KEEP_BYTES && (size_t)pos < data_cap) {
        /* too large to be kept for reuse: give the scratch's unused end back to the system */
        uint8_t *fit = reuse_sys_shrink(data, &data_cap, (size_t)pos);
        if (fit != NULL) data = fit;
    }
    data_obj = block_take(&data, pos, data_cap);
    offs_obj = sh.large ? block_take(&ends, (sh.total + 1) * 8, ends_cap)
                        : block_take(&offs, (sh.total + 1) * 4, offs_cap);
    if (data_obj != NULL && offs_obj != NULL)
        result = Py_BuildValue("(OOiLO)", data_obj, offs_obj, sh.large, (long long)pos, Py_None);
done:
    Py_XDECREF(data_obj);
    Py_XDECREF(offs_obj);
    ce_blk_free(data, data_cap);
    ce_blk_free(offs, offs_cap);
    ce_blk_free(ends, ends_cap);
    if (tasks)
        for (int k = 0; k < n_threads; k++)
            ce_blk_free(tasks[k].w.base, (size_t)(tasks[k].w.end - tasks[k].w.base));
    if (segs)
        for (int s = 0; s < n_segs; s++)
            if (segs[s].root) {
                ce_free_bound(segs[s].root);
                free(segs[s].root);
                free(segs[s].cols);
            }
    free(tasks);
    free(segs);
    return result;
}

static PyObject *same_core(PyObject *self, PyObject *unused) {
    return PyLong_FromLong(atomic_load(&pool_same_core));
}

static PyMethodDef methods[] = {
    {"same_core", same_core, METH_NOARGS,
     "same_core() -> helper jobs that began on the core of the thread that woke them, in this "
     "process"},
    {"encode", py_encode, METH_VARARGS,
     "encode(plan, arrays, threads, guess) -> (data, offsets, large, size, error): the Avro "
     "datums of the rows of the Arrow arrays (C Data Interface capsules), one per row, back to "
     "back, as buffer objects; `guess`: the expected output size."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_cencode",
                                    "Native Avro encoder over Arrow buffers.", -1, methods};

PyMODINIT_FUNC PyInit__cencode(void) {
    pool_init();
    if (PyType_Ready(&BlockType) < 0 || PyType_Ready(&EPlanType) < 0) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m && PyModule_AddObjectRef(m, "Plan", (PyObject *)&EPlanType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
