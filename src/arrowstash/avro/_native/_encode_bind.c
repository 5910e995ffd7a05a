/* The native Avro encoder's plans: parsed from Python's tuples and bound to the Arrow arrays
 * of the input (see _encode.h). */
#include "_encode.h"

/* ---------------------------------------------------------------- plans and binding */

void ce_free_node(Node *n) {
    for (int k = 0; k < n->n_kids; k++) ce_free_node(&n->kids[k]);
    free(n->kids);
    if (n->sym) {
        for (int64_t k = 0; k < n->p1; k++) free((void *)n->sym[k]);
        free(n->sym);
        free(n->sym_len);
        free(n->sym_word);
    }
}

/* plan node = (kind, id, null_branch, value_branch, p1, p2, (kids...), (symbols...)) */
int ce_parse_node(PyObject *t, Node *n) {
    PyObject *kids, *syms;
    memset(n, 0, sizeof(*n));
    if (!PyArg_ParseTuple(t, "iLLLLLO!O!", &n->kind, &n->id, &n->null_branch, &n->value_branch,
                          &n->p1, &n->p2, &PyTuple_Type, &kids, &PyTuple_Type, &syms))
        return -1;
    if (n->kind < 0 || n->kind >= K_COUNT) {
        PyErr_Format(PyExc_ValueError, "unknown plan node kind %d", n->kind);
        return -1;
    }
    int n_kids = (int)PyTuple_GET_SIZE(kids);
    if (n_kids) {
        n->kids = calloc((size_t)n_kids, sizeof(Node));
        if (n->kids == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        n->n_kids = n_kids; /* only now: ce_free_node walks the kids */
        for (int k = 0; k < n->n_kids; k++)
            if (ce_parse_node(PyTuple_GET_ITEM(kids, k), &n->kids[k]) < 0) return -1;
    }
    if (n->kind == K_ENUM_STRING) {
        if (PyTuple_GET_SIZE(syms) != n->p1) {
            PyErr_SetString(PyExc_ValueError, "enum plan: symbol count mismatch");
            return -1;
        }
        n->sym = calloc((size_t)n->p1 + 1, sizeof(char *));
        n->sym_len = calloc((size_t)n->p1 + 1, sizeof(Py_ssize_t));
        n->sym_word = calloc((size_t)n->p1 + 1, sizeof(uint64_t));
        if (n->sym == NULL || n->sym_len == NULL || n->sym_word == NULL) {
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
            memcpy(&n->sym_word[k], s, (size_t)(len < 8 ? len : 8));
        }
    }
    return 0;
}

void ce_free_bound(Bound *b) {
    for (int k = 0; k < b->n_kids; k++) ce_free_bound(&b->kids[k]);
    free(b->kids);
}

static int layout_error(const Node *n, const char *what) {
    PyErr_Format(PyExc_ValueError, "plan node %lld: array layout does not match (%s)",
                 (long long)n->id, what);
    return -1;
}

/* Expected (buffers, children) of the normalised Arrow array each kind reads. */
int ce_bind(Bound *b, const Node *n, const struct ArrowArray *a, int64_t extra_off) {
    static const int nbuf[K_COUNT] = {0, 2, 2, 2, 2, 2, 2, 3, 3, 2, 2, 3, 1, 2, 2, 2, 2, 2, 2, 2, 3};
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
        if ((n->kind == K_BINARY || n->kind == K_ENUM_STRING || n->kind == K_RAW) && a->length > 0)
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
            if (ce_bind(&b->kids[k], &n->kids[k], src->children[k], kid_off) < 0) return -1;
    }
    return 0;
}

/* The nodes that occur once per row: the fields of the top-level record, and of the records
 * nested in them, a record that may be null (or has a union index) first as a column of its
 * own; `base` is where row 0 lies in b's coordinates. */
int ce_flatten(const Bound *b, int64_t base, Column *out) {
    if (b->kind != K_RECORD || b->optional) {
        if (out) {
            memset(out, 0, sizeof(*out));
            out->b = b;
            out->shape = b->kind == K_RECORD ? S_OPT_RECORD : ce_column_shape(b);
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
        if (b->kind != K_RECORD) return 1;
    }
    int own = b->kind == K_RECORD && b->optional, count = own;
    for (int k = 0; k < b->n_kids; k++)
        count += ce_flatten(&b->kids[k], base + b->off, out ? out + count : NULL);
    if (own && out) out->skip = count - 1;
    return count;
}
