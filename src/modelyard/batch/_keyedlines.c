/* _keyedlines: JSON lines that are objects naming the model's one input, with or without a key.
 *
 * Vertex AI's instances are often objects, ``{"id": 7, "image": [[...]]}`` with ``key_field``
 * "id", or ``{"image": [[...]]}``. ``pluck`` takes a batch of such lines apart: each line's input
 * array is copied, followed by a newline, into a caller-owned buffer (which the dense readers of
 * ``_denselines`` then parse as they parse array lines), and each line's echo span is recorded:
 * the key's value with a key, else the whole stripped line (``_denselines.assemble`` writes
 * ``{"key":<span>,...`` or ``{"instance":<span>,...`` from them).
 *
 * Strict on purpose, like ``_denselines``: a key is taken only when its bytes are what the
 * general path would write for it (a canonical integer of at most 18 digits, or a string of
 * printable ASCII without escapes); any other member, a duplicate, an escaped name, or anything
 * else fails the whole batch, which then goes through the general path unchanged.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#define MAX_KEY_DIGITS 18

static inline const char *blanks(const char *p, const char *end)
{
    while (p < end && (*p == ' ' || *p == '\t' || *p == '\r'))
        p++;
    return p;
}

/* A JSON string without escapes from p (at its opening quote): its end past the closing quote,
 * or NULL. ``printable``: every byte must be printable ASCII (a key echoed byte for byte). */
static const char *plain_string(const char *p, const char *end, int printable)
{
    for (p++; p < end; p++) {
        unsigned char ch = (unsigned char)*p;
        if (ch == '"')
            return p + 1;
        if (ch == '\\' || ch < 0x20 || (printable && ch > 0x7e))
            return NULL;
    }
    return NULL;
}

/* A canonical integer (-?(0|[1-9][0-9]*), at most MAX_KEY_DIGITS digits): its end, or NULL. */
static const char *canonical_integer(const char *p, const char *end)
{
    const char *start = p, *digits;
    if (p < end && *p == '-')
        p++;
    digits = p;
    while (p < end && *p >= '0' && *p <= '9')
        p++;
    if (p == digits || p - digits > MAX_KEY_DIGITS || (*digits == '0' && p - digits > 1))
        return NULL;
    if (*digits == '0' && digits > start)
        return NULL; /* -0 reads back as 0 */
    if (p < end && (*p == '.' || *p == 'e' || *p == 'E'))
        return NULL; /* a float: the general path decides how it is written back */
    return p;
}

/* The nested array of numbers from p (at its '['): its end past the closing ']', or NULL. The
 * dense readers check its shape and numbers; here only its bytes are bounded. */
static const char *number_array(const char *p, const char *end)
{
    int depth = 0;
    for (; p < end; p++) {
        switch (*p) {
        case '[':
            depth++;
            break;
        case ']':
            if (--depth == 0)
                return p + 1;
            break;
        case '-':
            /* -0 as an integer: the general loop reads the int 0 (+0.0 for a float input), the
             * dense readers -0.0; -0.0 and -0e0 are floats to both */
            if (p + 1 < end && p[1] == '0' && (p + 2 >= end || (p[2] != '.' && p[2] != 'e' && p[2] != 'E')))
                return NULL;
            break;
        case '0': case '1': case '2': case '3': case '4': case '5': case '6': case '7': case '8': case '9':
        case '+': case '.': case 'e': case 'E': case ',': case ' ': case '\t': case '\r':
            break;
        default:
            return NULL;
        }
    }
    return NULL;
}

/* One line [p, end): 1 with the array's span and the echo span, else 0. */
static int one_line(const char *p, const char *end, const char *key, Py_ssize_t key_len, const char *name,
                    Py_ssize_t name_len, const char **array, const char **array_end, const char **echo,
                    const char **echo_end)
{
    const char *line = blanks(p, end), *stop = end;
    int seen_key = 0, seen_array = 0;
    while (stop > line && (stop[-1] == ' ' || stop[-1] == '\t' || stop[-1] == '\r'))
        stop--;
    p = line;
    if (p >= stop || *p != '{')
        return 0;
    p = blanks(p + 1, stop);
    for (;;) {
        const char *field, *field_end, *value_end;
        if (p >= stop || *p != '"')
            return 0;
        field = p + 1;
        field_end = plain_string(p, stop, 0);
        if (field_end == NULL)
            return 0;
        p = blanks(field_end, stop);
        field_end--; /* at the closing quote */
        if (p >= stop || *p != ':')
            return 0;
        p = blanks(p + 1, stop);
        if (field_end - field == name_len && memcmp(field, name, (size_t)name_len) == 0) {
            if (seen_array || p >= stop || *p != '[')
                return 0;
            value_end = number_array(p, stop);
            if (value_end == NULL)
                return 0;
            *array = p;
            *array_end = value_end;
            seen_array = 1;
        } else if (key != NULL && field_end - field == key_len && memcmp(field, key, (size_t)key_len) == 0) {
            if (seen_key || p >= stop)
                return 0;
            value_end = *p == '"' ? plain_string(p, stop, 1) : canonical_integer(p, stop);
            if (value_end == NULL)
                return 0;
            *echo = p;
            *echo_end = value_end;
            seen_key = 1;
        } else {
            return 0; /* another member: the general path shapes it (or refuses it) */
        }
        p = blanks(value_end, stop);
        if (p < stop && *p == ',') {
            p = blanks(p + 1, stop);
            continue;
        }
        if (p < stop && *p == '}' && p + 1 == stop)
            break;
        return 0;
    }
    if (!seen_array || (key != NULL && !seen_key))
        return 0;
    if (key == NULL) {
        *echo = line;
        *echo_end = stop;
    }
    return 1;
}

PyDoc_STRVAR(pluck_doc,
"pluck(data, pos, end, n, key, name, out, spans) -> (ok, lines, after, used)\n\n"
"Up to n lines of data[pos:end], each an object whose member ``name`` is an array of numbers\n"
"and, when ``key`` (bytes) is not None, whose member ``key`` is a canonical integer or a plain\n"
"ASCII string, and nothing else. Writes each array and a newline to ``out`` and each line's\n"
"echo span (the key's value, or the stripped line) as int64 pairs into ``spans``. ``after``:\n"
"the offset past the lines counted; ``used``: bytes written to ``out``. ok is False when any\n"
"line does not qualify (lines and after still count the batch); when ``out`` ran out of room\n"
"first, ``used`` is -(the size that holds the batch): grow ``out`` and call again.");

static PyObject *pluck(PyObject *self, PyObject *args)
{
    Py_buffer data, out, spans;
    Py_ssize_t pos, end, n, i = 0, used = 0;
    PyObject *key_obj, *name_obj, *result = NULL;
    const char *key = NULL, *name;
    Py_ssize_t key_len = 0, name_len;
    int ok = 1, full = 0;
    if (!PyArg_ParseTuple(args, "y*nnnOSw*w*", &data, &pos, &end, &n, &key_obj, &name_obj, &out, &spans))
        return NULL;
    if (key_obj != Py_None) {
        if (!PyBytes_Check(key_obj)) {
            PyErr_SetString(PyExc_TypeError, "key must be bytes or None");
            goto done;
        }
        key = PyBytes_AS_STRING(key_obj);
        key_len = PyBytes_GET_SIZE(key_obj);
    }
    name = PyBytes_AS_STRING(name_obj);
    name_len = PyBytes_GET_SIZE(name_obj);
    if (pos < 0 || end < pos || end > data.len || n < 0 || spans.len / 16 < n) {
        PyErr_SetString(PyExc_ValueError, "pos/end outside data, or spans holds fewer than n pairs");
        goto done;
    }
    {
        const char *base = (const char *)data.buf, *p = base + pos, *stop = base + end;
        char *w = (char *)out.buf;
        int64_t *span = (int64_t *)spans.buf;
        Py_BEGIN_ALLOW_THREADS
        for (; i < n && p < stop; i++) {
            const char *nl = memchr(p, '\n', (size_t)(stop - p));
            const char *line_end = nl ? nl : stop;
            if (ok) {
                const char *array = NULL, *array_end = NULL, *echo = NULL, *echo_end = NULL;
                if (!one_line(p, line_end, key, key_len, name, name_len, &array, &array_end, &echo, &echo_end)) {
                    ok = 0; /* the rest of the batch is only counted */
                } else if (used + (array_end - array) + 1 > out.len) {
                    ok = 0;
                    full = 1; /* each array is shorter than its line: the batch's bytes will hold it */
                } else {
                    memcpy(w + used, array, (size_t)(array_end - array));
                    used += array_end - array;
                    w[used++] = '\n';
                    span[2 * i] = echo - base;
                    span[2 * i + 1] = echo_end - base;
                }
            }
            p = nl ? nl + 1 : stop;
        }
        if (full)
            used = -((p - base) - pos + 1);
        pos = p - base;
        Py_END_ALLOW_THREADS
    }
    result = Py_BuildValue("(Onnn)", ok ? Py_True : Py_False, i, pos, used);
done:
    PyBuffer_Release(&data);
    PyBuffer_Release(&out);
    PyBuffer_Release(&spans);
    return result;
}

static PyMethodDef methods[] = {
    {"pluck", pluck, METH_VARARGS, pluck_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_keyedlines",
                                    "Object JSON lines (with or without a key) taken apart for the dense readers.",
                                    -1, methods};

PyMODINIT_FUNC PyInit__keyedlines(void) { return PyModule_Create(&module); }
