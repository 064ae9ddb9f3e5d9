/* _numjson: read a REST predict body whose tensor is all JSON numbers in one pass, in C.
 *
 * Images, features and token ids arrive as nested lists of numbers. Parsing them into Python
 * lists and then into an array cost most of a request's time on the event loop, so bodies of
 * the shape
 *
 *     { "instances" | "inputs": <regular nested arrays of numbers>, ["signature_name": "..."] }
 *
 * are read here straight into int64 values, or into float64 values once a number has a
 * fraction or an exponent (the integers before it are converted then, exactly). A fraction is
 * read only when its value is exact to compute with one rounding: a significand of at most
 * 2^53 and a power of ten of at most 22 (Clinger's fast path; both are exact doubles, so one
 * multiplication or division gives the correctly rounded double, the one Python's parsers
 * give). A number past that (a 17-digit double repr, 1e23, 1e-30), or an integer beyond
 * 2^53 among fractions, sends the whole body to the general path: there a correctly
 * rounding parser (orjson) is faster than a strtod call per number here.
 *
 * Anything else, including every malformed body, returns None and the general parser
 * (rest_json) decides what it is and words the error: this module never raises for bad
 * input, so TF Serving's error messages stay in one place.
 *
 * For dtypes' vertex rule (integral numbers are integers for an integer input), the reader also
 * says whether every float64 value is whole and within 2^53 (exact), and then their extremes:
 * such a body reaches an integer input with a range check and a cast, no pass over the values.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <float.h>
#include <stdint.h>
#include <string.h>

#define MAX_DEPTH 32   /* deeper tensors take the general path */
#define MAX_DIGITS 18  /* so an integer always fits in int64; longer numbers take the general path */
#define MAX_EXACT_INT ((int64_t)1 << 53) /* integers a double holds exactly */
#define RELEASE_GIL_BYTES (64 * 1024)

typedef struct {
    const char *p;
    const char *end;
} Cursor;

typedef struct {
    int64_t *values; /* int64 until the first fraction, then float64 in the same 8-byte slots */
    Py_ssize_t count;
    int ndim;
    Py_ssize_t shape[MAX_DEPTH];
    int64_t lo, hi; /* the extremes while the values are integers (or, floating, integral) */
    int floating;
    int integral; /* every value is a whole number within +-2^53 (always so until floating) */
} Tensor;

static void skip_ws(Cursor *c)
{
    while (c->p < c->end && (*c->p == ' ' || *c->p == '\t' || *c->p == '\n' || *c->p == '\r'))
        c->p++;
}

static int is_digit(char ch) { return ch >= '0' && ch <= '9'; }

static void store_double(Tensor *t, double d) { memcpy(&t->values[t->count++], &d, sizeof d); }

/* The extremes of whole values, kept while every value is whole (the vertex rule's integers). */
static inline void note_whole(Tensor *t, int64_t v)
{
    if (v < t->lo)
        t->lo = v;
    if (v > t->hi)
        t->hi = v;
}

/* A double read from a fraction or exponent: still whole (3.0, 1e2) and exact as int64? */
static inline void note_double(Tensor *t, double d)
{
    if (!t->integral)
        return;
    if (d > (double)MAX_EXACT_INT || d < -(double)MAX_EXACT_INT || d != (double)(int64_t)d)
        t->integral = 0; /* a fraction: the vertex rule refuses it for an integer input */
    else
        note_whole(t, (int64_t)d);
}

/* Turn the integers read so far into doubles, in place; -1 if one would not be exact. */
static int to_floating(Tensor *t)
{
    Py_ssize_t i;
    for (i = 0; i < t->count; i++)
        if (t->values[i] > MAX_EXACT_INT || t->values[i] < -MAX_EXACT_INT)
            return -1;
    for (i = 0; i < t->count; i++) {
        double d = (double)t->values[i];
        memcpy(&t->values[i], &d, sizeof d);
    }
    t->floating = 1;
    return 0;
}

/* 10^0 .. 10^22: every one exact as a double. */
static const double POW10[] = {1e0,  1e1,  1e2,  1e3,  1e4,  1e5,  1e6,  1e7,  1e8,  1e9,  1e10, 1e11,
                               1e12, 1e13, 1e14, 1e15, 1e16, 1e17, 1e18, 1e19, 1e20, 1e21, 1e22};

/* One JSON number, -?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)?, appended to the tensor in one pass:
 * its significant digits gather in ``significand`` (at most 18, so an integer fits in int64) and
 * the fraction's digits and the exponent in ``exponent``, a power of ten. */
static int read_number(Cursor *c, Tensor *t)
{
    int negative = 0, fraction = 0, digits = 0;
    uint64_t significand = 0;
    long exponent = 0;
    if (*c->p == '-') {
        negative = 1;
        c->p++;
    }
    if (c->p >= c->end || !is_digit(*c->p))
        return -1;
    if (*c->p == '0') {
        c->p++;
        if (c->p < c->end && is_digit(*c->p))
            return -1; /* a leading zero is not JSON */
    } else {
        while (c->p < c->end && is_digit(*c->p)) {
            if (++digits > MAX_DIGITS)
                return -1;
            significand = significand * 10 + (uint64_t)(*c->p++ - '0');
        }
    }
    if (c->p < c->end && *c->p == '.') {
        fraction = 1;
        c->p++;
        if (c->p >= c->end || !is_digit(*c->p))
            return -1;
        for (; c->p < c->end && is_digit(*c->p); c->p++) {
            exponent--;
            if (significand == 0 && *c->p == '0') /* the leading zeros of 0.00123 */
                continue;
            if (++digits > MAX_DIGITS)
                return -1;
            significand = significand * 10 + (uint64_t)(*c->p - '0');
        }
    }
    if (c->p < c->end && (*c->p == 'e' || *c->p == 'E')) {
        long written = 0;
        int written_negative = 0;
        fraction = 1;
        c->p++;
        if (c->p < c->end && (*c->p == '+' || *c->p == '-'))
            written_negative = *c->p++ == '-';
        if (c->p >= c->end || !is_digit(*c->p))
            return -1;
        for (; c->p < c->end && is_digit(*c->p); c->p++) {
            if (written > 100000)
                return -1;
            written = written * 10 + (*c->p - '0');
        }
        exponent += written_negative ? -written : written;
    }
    if (!fraction) {
        int64_t value = negative ? -(int64_t)significand : (int64_t)significand;
        if (t->floating) {
            if (value > MAX_EXACT_INT || value < -MAX_EXACT_INT)
                return -1;
            if (t->integral)
                note_whole(t, value);
            store_double(t, (double)value);
            return 0;
        }
        t->values[t->count++] = value;
        if (value < t->lo)
            t->lo = value;
        if (value > t->hi)
            t->hi = value;
        return 0;
    }
    if (!t->floating && to_floating(t) < 0)
        return -1;
    if (significand == 0) {
        if (t->integral)
            note_whole(t, 0);
        store_double(t, negative ? -0.0 : 0.0);
        return 0;
    }
#if FLT_EVAL_METHOD != 0 || defined(__FAST_MATH__)
    /* Wider intermediates (x87) round twice and fast-math reorders: neither gives the exact
     * rounding the fast path relies on, so such builds leave every fraction to the general path. */
    return -1;
#endif
    /* Clinger's fast path: at most 16 digits (10^16 > 2^53) with the significand and the power of
     * ten both exact doubles, so one multiplication or division rounds once, correctly. */
    if (digits > 16 || significand > ((uint64_t)1 << 53) || exponent < -22 || exponent > 22)
        return -1;
    {
        double d = (double)significand;
        d = exponent < 0 ? d / POW10[-exponent] : d * POW10[exponent];
        d = negative ? -d : d;
        note_double(t, d);
        store_double(t, d);
    }
    return 0;
}

/* After a value: 1 for a comma (another value follows), 0 for ``closer`` (consumed), -1 otherwise. */
static int after_value(Cursor *c, char closer)
{
    skip_ws(c);
    if (c->p >= c->end)
        return -1;
    if (*c->p == ',') {
        c->p++;
        return 1;
    }
    if (*c->p != closer)
        return -1;
    c->p++;
    return 0;
}

/* Nested arrays of numbers at c->p, every list at one depth the same length, none empty,
 * numbers only at the innermost depth. 0 on success, -1 for anything else. */
static int read_tensor(Cursor *c, Tensor *t, Py_ssize_t capacity)
{
    Py_ssize_t seen[MAX_DEPTH]; /* elements so far in the open list at each depth */
    int depth = 0;              /* lists open */
    int leaf_depth = -1;        /* where the numbers sit, from the first one */
    int i;
    for (i = 0; i < MAX_DEPTH; i++)
        t->shape[i] = 0;
    t->count = 0;
    t->lo = INT64_MAX;
    t->hi = INT64_MIN;
    t->floating = 0;
    t->integral = 1;
    if (c->p >= c->end || *c->p != '[')
        return -1;
    for (;;) {
        /* a value is expected */
        skip_ws(c);
        if (c->p >= c->end)
            return -1;
        if (*c->p == '[') {
            if (depth == MAX_DEPTH || (leaf_depth >= 0 && depth >= leaf_depth))
                return -1;
            seen[depth++] = 0;
            c->p++;
            continue; /* a list opened: a value must follow (empty lists take the general path) */
        }
        if (*c->p != '-' && !is_digit(*c->p))
            return -1;
        if (leaf_depth < 0)
            leaf_depth = depth;
        else if (depth != leaf_depth)
            return -1;
        if (t->count == capacity)
            return -1;
        if (read_number(c, t) < 0)
            return -1;
        seen[depth - 1]++;
        /* after a value: a comma, or the end of one or more lists */
        for (;;) {
            int next = after_value(c, ']');
            if (next < 0)
                return -1;
            if (next == 1)
                break;
            {
                int level = depth - 1;
                if (t->shape[level] == 0)
                    t->shape[level] = seen[level];
                else if (t->shape[level] != seen[level])
                    return -1; /* ragged */
            }
            if (--depth == 0) {
                t->ndim = leaf_depth;
                return 0;
            }
            seen[depth - 1]++;
        }
    }
}

/* A JSON string with no escapes or control characters: [start, stop) of its contents. */
static int read_plain_string(Cursor *c, const char **start, const char **stop)
{
    if (c->p >= c->end || *c->p != '"')
        return -1;
    c->p++;
    *start = c->p;
    while (c->p < c->end && *c->p != '"') {
        if (*c->p == '\\' || (unsigned char)*c->p < 0x20)
            return -1;
        c->p++;
    }
    if (c->p >= c->end)
        return -1;
    *stop = c->p++;
    return 0;
}

static int key_is(const char *start, const char *stop, const char *word)
{
    size_t n = strlen(word);
    return (size_t)(stop - start) == n && memcmp(start, word, n) == 0;
}

/* The whole body: an object of the tensor's key and, optionally, "signature_name". */
static int read_body(Cursor *c, Tensor *t, Py_ssize_t capacity, const char **tensor_key,
                     const char **name_start, const char **name_stop)
{
    *tensor_key = NULL;
    *name_start = *name_stop = NULL;
    skip_ws(c);
    if (c->p >= c->end || *c->p != '{')
        return -1;
    c->p++;
    for (;;) {
        const char *ks, *ke;
        skip_ws(c);
        if (read_plain_string(c, &ks, &ke) < 0)
            return -1;
        skip_ws(c);
        if (c->p >= c->end || *c->p != ':')
            return -1;
        c->p++;
        skip_ws(c);
        if (key_is(ks, ke, "instances") || key_is(ks, ke, "inputs")) {
            if (*tensor_key != NULL) /* both keys, or one twice: the general path answers */
                return -1;
            *tensor_key = key_is(ks, ke, "inputs") ? "inputs" : "instances";
            if (read_tensor(c, t, capacity) < 0)
                return -1;
        } else if (key_is(ks, ke, "signature_name")) {
            if (*name_start != NULL)
                return -1;
            if (read_plain_string(c, name_start, name_stop) < 0)
                return -1;
        } else {
            return -1;
        }
        {
            int next = after_value(c, '}');
            if (next < 0)
                return -1;
            if (next == 0)
                break;
        }
    }
    skip_ws(c);
    return (c->p == c->end && *tensor_key != NULL) ? 0 : -1;
}

PyDoc_STRVAR(read_number_body_doc,
"read_number_body(body: bytes) -> tuple | None\n\n"
"(key, signature_name or None, values as a bytearray, shape, min, max, floating, integral) when\n"
"``body`` is a predict request whose only tensor is regular nested arrays of JSON numbers. The\n"
"values are int64 (min and max their extremes) or, when ``floating``, float64 (min and max their\n"
"extremes when ``integral``: every value whole, within 2^53). None for any other body, valid or not.");

static PyObject *read_number_body(PyObject *module, PyObject *arg)
{
    Py_buffer view;
    Tensor t;
    Cursor c;
    const char *key, *name_start, *name_stop;
    Py_ssize_t capacity;
    int status, i;
    PyObject *values, *shape = NULL, *name = NULL, *result = NULL;

    if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) < 0)
        return NULL;
    /* Every number takes at least one character and one separator. The values are written
     * straight into the bytearray returned (trimmed to size after), so they are copied once. */
    capacity = view.len / 2 + 1;
    values = PyByteArray_FromStringAndSize(NULL, capacity * (Py_ssize_t)sizeof(int64_t));
    if (values == NULL) {
        PyBuffer_Release(&view);
        return NULL;
    }
    t.values = (int64_t *)PyByteArray_AS_STRING(values);
    c.p = (const char *)view.buf;
    c.end = c.p + view.len;
    if (view.len >= RELEASE_GIL_BYTES) { /* nothing else can see either buffer meanwhile */
        Py_BEGIN_ALLOW_THREADS
        status = read_body(&c, &t, capacity, &key, &name_start, &name_stop);
        Py_END_ALLOW_THREADS
    } else {
        status = read_body(&c, &t, capacity, &key, &name_start, &name_stop);
    }
    if (status == 0 && name_start != NULL) {
        name = PyUnicode_DecodeUTF8(name_start, name_stop - name_start, "strict");
        if (name == NULL) { /* not UTF-8: the general path says so */
            PyErr_Clear();
            status = -1;
        }
    }
    PyBuffer_Release(&view);
    if (status < 0) {
        Py_DECREF(values);
        Py_RETURN_NONE;
    }
    if (name == NULL)
        name = Py_NewRef(Py_None);
    if (PyByteArray_Resize(values, t.count * (Py_ssize_t)sizeof(int64_t)) < 0)
        goto done;
    shape = PyTuple_New(t.ndim);
    if (shape == NULL)
        goto done;
    for (i = 0; i < t.ndim; i++) {
        PyObject *n = PyLong_FromSsize_t(t.shape[i]);
        if (n == NULL)
            goto done;
        PyTuple_SET_ITEM(shape, i, n);
    }
    result = Py_BuildValue("(sOOOLLOO)", key, name, values, shape, (long long)t.lo, (long long)t.hi,
                           t.floating ? Py_True : Py_False, t.integral ? Py_True : Py_False);
done:
    Py_DECREF(values);
    Py_XDECREF(shape);
    Py_DECREF(name);
    return result;
}

static PyMethodDef methods[] = {
    {"read_number_body", read_number_body, METH_O, read_number_body_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_numjson",
    "Numeric REST predict bodies read in one pass (see rest_json.read_number_body).", -1, methods,
};

PyMODINIT_FUNC PyInit__numjson(void) { return PyModule_Create(&module); }
