/* The lengths of a string or binary chunk's values, from its offsets, for cache keys.
 *
 * NumPy needs a 64-bit temporary and two passes for what is one subtraction per value here, and
 * the lengths come out as 32-bit numbers whatever the offsets' width (half the bytes to hash).
 * A null slot's length is written as zero; the bytes null slots span are counted so that the
 * caller can drop them from the data it hashes. Twin of caching.columns._lengths_numpy.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

/* Where the compiler can, an AVX2 clone of the subtraction loops, picked at load time on CPUs
 * that have it (four 64-bit offsets a step instead of one). */
#if defined(__GNUC__) && defined(__x86_64__) && defined(__linux__)
#define CLONES __attribute__((target_clones("avx2", "default")))
#else
#define CLONES
#endif

/* A length is the difference of the offsets' low 32 bits (modulo 2**32, like the truncation of
 * the 64-bit difference), which vectorises without a 64-to-32-bit narrowing. */
CLONES static void lengths64(uint32_t *restrict dst, const int64_t *restrict o, Py_ssize_t n) {
    for (Py_ssize_t i = 0; i < n; i++) dst[i] = (uint32_t)o[i + 1] - (uint32_t)o[i];
}

CLONES static void lengths32(uint32_t *restrict dst, const int32_t *restrict o, Py_ssize_t n) {
    for (Py_ssize_t i = 0; i < n; i++) dst[i] = (uint32_t)o[i + 1] - (uint32_t)o[i];
}

static int get_buffer(PyObject *obj, Py_buffer *view, int flags, const char *what) {
    if (PyObject_GetBuffer(obj, view, flags) < 0) {
        PyErr_Format(PyExc_TypeError, "lengths: %s must be a contiguous buffer", what);
        return -1;
    }
    return 0;
}

/* Zero the lengths of null slots (a clear validity bit); return the bytes they spanned. */
static int64_t clear_nulls(uint32_t *out, const uint8_t *bits, Py_ssize_t first, Py_ssize_t count) {
    int64_t spanned = 0;
    for (Py_ssize_t i = 0; i < count; i++) {
        Py_ssize_t bit = first + i;
        if ((bit & 7) == 0 && i + 8 <= count && bits[bit >> 3] == 0xFF) {
            i += 7;  /* eight valid slots */
            continue;
        }
        if (!(bits[bit >> 3] >> (bit & 7) & 1)) {
            spanned += out[i];
            out[i] = 0;
        }
    }
    return spanned;
}

/* lengths(offsets, first, count, wide, validity, out) -> (start, stop, null_bytes)
 *
 * offsets: the chunk's offsets buffer (int32, or int64 if wide); first: the chunk's offset;
 * count: its length; validity: its validity bitmap or None; out: a writable buffer of at least
 * count * 4 bytes, given the lengths (little-endian uint32, each truncated to 32 bits: the
 * caller checks stop - start). start and stop: the chunk's first and last offsets. */
static PyObject *lengths(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 6) {
        PyErr_SetString(PyExc_TypeError, "lengths takes 6 arguments");
        return NULL;
    }
    Py_ssize_t first = PyLong_AsSsize_t(args[1]), count = PyLong_AsSsize_t(args[2]);
    int wide = PyObject_IsTrue(args[3]);
    if ((first == -1 || count == -1 || wide == -1) && PyErr_Occurred()) return NULL;
    if (first < 0 || count < 0) {
        PyErr_SetString(PyExc_ValueError, "lengths: negative first or count");
        return NULL;
    }
    Py_buffer offsets, out, validity = {0};
    if (get_buffer(args[0], &offsets, PyBUF_SIMPLE, "offsets") < 0) return NULL;
    if (get_buffer(args[5], &out, PyBUF_WRITABLE, "out") < 0) {
        PyBuffer_Release(&offsets);
        return NULL;
    }
    int has_validity = args[4] != Py_None;
    if (has_validity && get_buffer(args[4], &validity, PyBUF_SIMPLE, "validity") < 0) {
        PyBuffer_Release(&offsets);
        PyBuffer_Release(&out);
        return NULL;
    }
    PyObject *result = NULL;
    Py_ssize_t width = wide ? 8 : 4;
    if (offsets.len / width < first + count + 1 || out.len / 4 < count
            || (has_validity && validity.len < (first + count + 7) / 8)) {
        PyErr_SetString(PyExc_ValueError, "lengths: a buffer is shorter than the chunk");
        goto done;
    }
    uint32_t *dst = out.buf;
    int64_t start, stop;
    if (wide) {
        const int64_t *o = (const int64_t *)offsets.buf + first;
        lengths64(dst, o, count);
        start = o[0], stop = o[count];
    } else {
        const int32_t *o = (const int32_t *)offsets.buf + first;
        lengths32(dst, o, count);
        start = o[0], stop = o[count];
    }
    int64_t spanned = has_validity ? clear_nulls(dst, validity.buf, first, count) : 0;
    result = Py_BuildValue("(LLL)", (long long)start, (long long)stop, (long long)spanned);
done:
    PyBuffer_Release(&offsets);
    PyBuffer_Release(&out);
    if (has_validity) PyBuffer_Release(&validity);
    return result;
}

static PyMethodDef methods[] = {
    {"lengths", (PyCFunction)(void (*)(void))lengths, METH_FASTCALL,
     "lengths(offsets, first, count, wide, validity, out) -> (start, stop, null_bytes)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_lengths",
                                    "String lengths from Arrow offsets, for cache keys.", -1,
                                    methods};

PyMODINIT_FUNC PyInit__lengths(void) { return PyModule_Create(&module); }
