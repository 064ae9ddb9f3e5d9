/* _denselines: the batch job's hot loop for JSON lines of one fixed-shape numeric tensor, in C.
 *
 * ``parse`` reads up to N lines of a chunk straight into a caller-owned int64 (or float64)
 * buffer, checking each line is strict JSON of exactly the expected nested shape, and records
 * each line's stripped span (the bytes echoed as the output's "instance"). ``assemble`` writes
 * a batch's output lines, ``{"instance":<span>,"prediction":<json>}\n``, into one bytes object.
 *
 * The parser is strict on purpose: any line it does not take (a malformed line, a number
 * spelt the lenient way NumPy reads, a float it cannot read exactly, an integer for which
 * int64 or the double conversion would not be exact) fails the whole batch, and the caller
 * sends that batch through the Python path, which then decides everything exactly as before.
 * So this module changes how fast a batch goes, never what it produces.
 *
 * Floats: Clinger's fast path (significand <= 2^53, |power of ten| <= 22: one exact rounding)
 * and otherwise PyOS_string_to_double, Python's correctly rounded, locale-free reader; a
 * result that overflows to infinity fails the batch.
 *
 * ``integral`` (an integer tensor under dtypes' vertex rule): a number with a fraction or an
 * exponent is read as a double as above and stored as the int64 it equals when it is integral
 * and at most 2^53 in size (exact); any other fails the batch, and the Python path refuses the
 * row in its own words. Ranges are checked by the caller (dtypes.json_array), never here.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <float.h>
#include <stdint.h>
#include <string.h>

#define MAX_NDIM 32
#define MAX_INT_DIGITS 18               /* any 18-digit integer fits in int64 */
#define EXACT_INT ((uint64_t)1 << 53)   /* integers a double holds exactly */
#define MAX_TOKEN 400                   /* longer float spellings fail the batch */

typedef struct {
    const char *p;   /* next byte */
    const char *end; /* end of the line (its '\n' or the end of the data) */
    int integer;     /* int64 values; a fraction or exponent fails (unless integral) */
    int integral;    /* with integer: an integral fraction or exponent (3.0, 1e2) is its integer */
    int64_t *out;    /* next value slot (int64 or double bit patterns) */
    const Py_ssize_t *shape;
    int ndim;
    int newline;     /* the line ends in a '\n' byte (at ``end``), not at the end of the data */
} Line;

static const double POW10[] = {1e0,  1e1,  1e2,  1e3,  1e4,  1e5,  1e6,  1e7,  1e8,  1e9,  1e10, 1e11,
                               1e12, 1e13, 1e14, 1e15, 1e16, 1e17, 1e18, 1e19, 1e20, 1e21, 1e22};

static inline int is_digit(char ch) { return ch >= '0' && ch <= '9'; }

static inline void skip_blanks(Line *l)
{
    /* JSON whitespace; '\n' cannot occur inside a line */
    while (l->p < l->end && (*l->p == ' ' || *l->p == '\t' || *l->p == '\r'))
        l->p++;
}

/* A float spelling the fast path cannot round exactly: Python's correctly rounded reader. */
static int slow_double(const char *start, const char *stop, double *d)
{
    char token[MAX_TOKEN + 1];
    size_t n = (size_t)(stop - start);
    if (n > MAX_TOKEN)
        return -1;
    memcpy(token, start, n);
    token[n] = '\0';
    *d = PyOS_string_to_double(token, NULL, NULL); /* NULL: overflow gives +-inf, no exception */
    if (*d == -1.0 && PyErr_Occurred()) {
        PyErr_Clear();
        return -1;
    }
    if (*d > DBL_MAX || *d < -DBL_MAX)
        return -1; /* the Python path decides what an overflowing number means */
    return 0;
}

/* One strict JSON number into the next slot: 0, or -1 when the batch must take the Python path. */
static int number(Line *l)
{
    const char *start = l->p;
    int negative = 0, floating = 0, digits = 0, exact = 1;
    uint64_t significand = 0;
    long power = 0;
    if (l->p < l->end && *l->p == '-') {
        negative = 1;
        l->p++;
    }
    if (l->p >= l->end || !is_digit(*l->p))
        return -1;
    if (*l->p == '0') {
        l->p++;
        if (l->p < l->end && is_digit(*l->p))
            return -1; /* 01 is not JSON */
    } else {
        for (; l->p < l->end && is_digit(*l->p); l->p++) {
            if (++digits > MAX_INT_DIGITS) {
                exact = 0; /* too long for int64: only a float reads it (slowly) */
                continue;
            }
            significand = significand * 10 + (uint64_t)(*l->p - '0');
        }
    }
    if (l->p < l->end && *l->p == '.') {
        floating = 1;
        l->p++;
        if (l->p >= l->end || !is_digit(*l->p))
            return -1;
        for (; l->p < l->end && is_digit(*l->p); l->p++) {
            if (significand == 0 && *l->p == '0') {
                power--; /* leading zeros of 0.00123 */
                continue;
            }
            if (++digits > MAX_INT_DIGITS) {
                exact = 0;
                continue;
            }
            power--;
            significand = significand * 10 + (uint64_t)(*l->p - '0');
        }
    }
    if (l->p < l->end && (*l->p == 'e' || *l->p == 'E')) {
        long written = 0;
        int below = 0;
        floating = 1;
        l->p++;
        if (l->p < l->end && *l->p == '+')
            return -1; /* the Python path reads 1e+5 row by row (orjson): let it keep doing so */
        if (l->p < l->end && *l->p == '-')
            below = *l->p++ == '-';
        if (l->p >= l->end || !is_digit(*l->p))
            return -1;
        for (; l->p < l->end && is_digit(*l->p); l->p++) {
            if (written < 1000000)
                written = written * 10 + (*l->p - '0');
            else
                exact = 0;
        }
        power += below ? -written : written;
    }
    if (l->integer && !(floating && l->integral)) {
        /* An integer input takes integers only; the Python path words the error for the rest. */
        if (floating || !exact)
            return -1;
        *l->out++ = negative ? -(int64_t)significand : (int64_t)significand;
        return 0;
    }
    {
        double d;
        if (!floating && exact && significand > EXACT_INT)
            return -1; /* NumPy and the Python path may round a big integer differently (int64 first) */
        if (!floating && !exact)
            return -1;
#if FLT_EVAL_METHOD != 0 || defined(__FAST_MATH__)
        /* wider intermediates or reordered arithmetic would round twice: always the exact reader */
        if (slow_double(start, l->p, &d) < 0)
            return -1;
#else
        if (significand == 0 && exact) {
            d = negative ? -0.0 : 0.0;
        } else if (exact && significand <= EXACT_INT && power >= -22 && power <= 22) {
            d = (double)significand;
            d = power < 0 ? d / POW10[-power] : d * POW10[power];
            if (negative)
                d = -d;
        } else if (slow_double(start, l->p, &d) < 0) {
            return -1;
        }
#endif
        if (l->integer) { /* integral: only a whole double a 64-bit integer holds exactly */
            if (d != d || d > (double)EXACT_INT || d < -(double)EXACT_INT || d != (double)(int64_t)d)
                return -1;
            *l->out++ = (int64_t)d; /* -0.0 is 0 */
            return 0;
        }
        memcpy(l->out++, &d, sizeof d);
        return 0;
    }
}

/* The innermost list of an integer tensor: n strict JSON integers of at most 18 digits. This is
 * where nearly all of a line's bytes are, so it keeps its cursor in registers and reads each
 * integer inline; a fraction, an exponent or a longer integer returns -1 like number() does.
 * ``bounded`` 0 is for a line ending in '\n': that byte stops every test below (it is no digit,
 * blank, sign, comma or bracket), so no test needs ``p < end``; the compiler makes two copies. */
static inline int integer_leaf(Line *l, Py_ssize_t n, const int bounded)
{
    const char *p = l->p, *end = l->end;
    int64_t *out = l->out;
    Py_ssize_t i;
#define MORE (!bounded || p < end)
    if (!MORE || *p != '[')
        return -1;
    p++;
    for (i = 0; i < n; i++) {
        int negative = 0, digits;
        int64_t v;
        while (MORE && (*p == ' ' || *p == '\t' || *p == '\r'))
            p++;
        if (i > 0) {
            if (!MORE || *p != ',')
                return -1;
            p++;
            while (MORE && (*p == ' ' || *p == '\t' || *p == '\r'))
                p++;
        }
        if (MORE && *p == '-') {
            negative = 1;
            p++;
        }
        if (!MORE || !is_digit(*p))
            return -1;
        v = *p++ - '0';
        if (v == 0) {
            if (MORE && is_digit(*p))
                return -1; /* 01 is not JSON */
        } else {
            for (digits = 1; MORE && is_digit(*p); p++) {
                if (++digits > MAX_INT_DIGITS)
                    return -1;
                v = v * 10 + (*p - '0');
            }
        }
        if (MORE && (*p == '.' || *p == 'e' || *p == 'E'))
            return -1;
        *out++ = negative ? -v : v;
    }
    while (MORE && (*p == ' ' || *p == '\t' || *p == '\r'))
        p++;
    if (!MORE || *p != ']')
        return -1;
#undef MORE
    l->p = p + 1;
    l->out = out;
    return 0;
}

static int integer_leaf_to_newline(Line *l, Py_ssize_t n) { return integer_leaf(l, n, 0); }
static int integer_leaf_bounded(Line *l, Py_ssize_t n) { return integer_leaf(l, n, 1); }

/* A list of shape[depth] elements (a number at depth ndim): 0, or -1 for anything else. */
static int value(Line *l, int depth)
{
    Py_ssize_t i, n;
    if (depth == l->ndim)
        return number(l);
    if (l->integer && depth == l->ndim - 1) {
        const char *p = l->p;
        int64_t *out = l->out;
        int read = l->newline ? integer_leaf_to_newline(l, l->shape[depth]) : integer_leaf_bounded(l, l->shape[depth]);
        if (read == 0 || !l->integral)
            return read;
        l->p = p; /* integral: the leaf again, number by number (it may hold 3.0 or 1e2) */
        l->out = out;
    }
    if (l->p >= l->end || *l->p != '[')
        return -1;
    l->p++;
    n = l->shape[depth];
    for (i = 0; i < n; i++) {
        skip_blanks(l);
        if (i > 0) {
            if (l->p >= l->end || *l->p != ',')
                return -1;
            l->p++;
            skip_blanks(l);
        }
        if (value(l, depth + 1) < 0)
            return -1;
    }
    skip_blanks(l);
    if (l->p >= l->end || *l->p != ']')
        return -1;
    l->p++;
    return 0;
}

static int read_shape(PyObject *shape_obj, Py_ssize_t *shape, int *ndim, Py_ssize_t *size)
{
    Py_ssize_t i, n;
    PyObject *seq = PySequence_Fast(shape_obj, "shape must be a sequence of ints");
    if (seq == NULL)
        return -1;
    n = PySequence_Fast_GET_SIZE(seq);
    if (n > MAX_NDIM) {
        Py_DECREF(seq);
        PyErr_SetString(PyExc_ValueError, "shape has too many dimensions");
        return -1;
    }
    *size = 1;
    for (i = 0; i < n; i++) {
        Py_ssize_t d = PyLong_AsSsize_t(PySequence_Fast_GET_ITEM(seq, i));
        if (d == -1 && PyErr_Occurred()) {
            Py_DECREF(seq);
            return -1;
        }
        if (d < 0 || (d > 0 && *size > PY_SSIZE_T_MAX / 8 / d)) {
            Py_DECREF(seq);
            PyErr_SetString(PyExc_ValueError, "shape dimensions must be non-negative and small enough");
            return -1;
        }
        shape[i] = d;
        *size *= d;
    }
    *ndim = (int)n;
    Py_DECREF(seq);
    return 0;
}

/* The shape and the [pos, end) window of a parse request: 0, or -1 with a ValueError set. */
static int read_request(PyObject *shape_obj, Py_ssize_t *shape, int *ndim, Py_ssize_t *size, Py_ssize_t pos,
                        Py_ssize_t end, Py_ssize_t len, Py_ssize_t max_lines)
{
    if (read_shape(shape_obj, shape, ndim, size) < 0)
        return -1;
    if (pos < 0 || end > len || pos > end || max_lines < 0) {
        PyErr_SetString(PyExc_ValueError, "pos, end or max_lines out of range");
        return -1;
    }
    return 0;
}

PyDoc_STRVAR(parse_doc,
"parse(data, pos, end, max_lines, shape, integer, values, spans, integral=False) -> (ok, lines, next_pos)\n\n"
"Read up to max_lines lines of data[pos:end] (each ends at a newline or at end). With ok True,\n"
"every line held one strict JSON tensor of the given shape: its values fill ``values`` (int64\n"
"when integer, else float64; lines * prod(shape) slots) and its stripped [start, stop) byte\n"
"span fills ``spans`` (int64 pairs). With ok False, some line did not: lines and next_pos\n"
"still say where the batch ends, and the buffers hold garbage. With integer and integral, a\n"
"whole-valued number written with a fraction or exponent (3.0, 1e2) is read as its integer.");

static PyObject *parse(PyObject *self, PyObject *args)
{
    Py_buffer data, values, spans;
    Py_ssize_t pos, end, max_lines, size, lines = 0;
    PyObject *shape_obj, *result = NULL;
    Py_ssize_t shape[MAX_NDIM];
    int integer, integral = 0, ndim, ok = 1;
    if (!PyArg_ParseTuple(args, "y*nnnOpw*w*|p", &data, &pos, &end, &max_lines, &shape_obj, &integer,
                          &values, &spans, &integral))
        return NULL;
    if (read_request(shape_obj, shape, &ndim, &size, pos, end, data.len, max_lines) < 0)
        goto done;
    if (max_lines > 0 && (values.len / 8 / (size ? size : 1) < max_lines || spans.len / 16 < max_lines)) {
        PyErr_SetString(PyExc_ValueError, "values or spans buffer too small for max_lines");
        goto done;
    }
    {
        const char *base = (const char *)data.buf;
        int64_t *out = (int64_t *)values.buf;
        int64_t *span = (int64_t *)spans.buf;
        while (pos < end && lines < max_lines) {
            const char *line_start = base + pos;
            const char *nl = memchr(line_start, '\n', (size_t)(end - pos));
            const char *line_end = nl ? nl : base + end;
            if (ok) {
                Line l = {line_start, line_end, integer, integral, out + lines * size, shape, ndim, nl != NULL};
                const char *first;
                skip_blanks(&l);
                first = l.p;
                if (value(&l, 0) < 0) {
                    ok = 0;
                } else {
                    span[2 * lines] = first - base;
                    span[2 * lines + 1] = l.p - base;
                    skip_blanks(&l);
                    if (l.p != line_end)
                        ok = 0; /* something after the tensor */
                }
            }
            lines++;
            pos = nl ? (nl - base) + 1 : end;
        }
    }
    result = Py_BuildValue("(Onn)", ok ? Py_True : Py_False, lines, pos);
done:
    PyBuffer_Release(&data);
    PyBuffer_Release(&values);
    PyBuffer_Release(&spans);
    return result;
}

/* ---- uint8 tensors: the digits-image case, read 64 bytes at a time where the CPU can ----
 *
 * A line of a uint8 tensor is validated by its token sequence: with blanks dropped and each
 * run of digits turned into one '#', it must equal the shape's template ("[[#,#],[#,#]]" for
 * [2, 2]), so the nesting, the separators and the number of values are exactly the shape's.
 * Each run of digits is then one JSON integer of 1 to 3 digits without a leading zero whose
 * value is at most 255; anything else (a sign, a fraction, 256, 007) is refused by this reader
 * and the line goes to the scalar reader above, which keeps deciding every other case. */

typedef struct {
    char *tmpl;        /* the shape's token template */
    Py_ssize_t tmpl_len;
    char *skel;        /* scratch: a line's token sequence (tmpl_len + 64 bytes) */
    int64_t *scratch;  /* scratch: one line's values for the scalar reader */
} U8Reader;

static void template_of(const Py_ssize_t *shape, int ndim, int depth, char **w)
{
    Py_ssize_t i;
    if (depth == ndim) {
        *(*w)++ = '#';
        return;
    }
    *(*w)++ = '[';
    for (i = 0; i < shape[depth]; i++) {
        if (i > 0)
            *(*w)++ = ',';
        template_of(shape, ndim, depth + 1, w);
    }
    *(*w)++ = ']';
}

static Py_ssize_t template_len(const Py_ssize_t *shape, int ndim, int depth)
{
    Py_ssize_t d;
    if (depth == ndim)
        return 1;
    d = shape[depth];
    return 2 + (d > 0 ? d - 1 : 0) + d * template_len(shape, ndim, depth + 1);
}

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define U8_SIMD 1
#ifndef PREFETCH_AHEAD
#define PREFETCH_AHEAD 4096
#endif
#define U8_TARGET __attribute__((target("avx512f,avx512bw,avx512vbmi,avx512vbmi2,bmi,bmi2,popcnt")))

static int u8_simd_supported(void)
{
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vbmi") && __builtin_cpu_supports("avx512vbmi2");
}

/* The line at p (it ends at the first '\n', or at limit) into ``out`` (``n`` values, 64 bytes of
 * slack after them). 0, with *line_end (the '\n' or limit) and the tensor's stripped span
 * [*first, *stop); or -1 when this reader refuses the line (the caller then finds its end). */
U8_TARGET static int u8_line_simd(const char *p, const char *limit, uint8_t *out, Py_ssize_t n, U8Reader *r,
                                  const char **line_end, const char **first, const char **stop)
{
    const __m512i zero_char = _mm512_set1_epi8('0'), ten = _mm512_set1_epi8(10), newline = _mm512_set1_epi8('\n');
    const __m512i comma = _mm512_set1_epi8(','), open = _mm512_set1_epi8('['), close = _mm512_set1_epi8(']');
    const __m512i space = _mm512_set1_epi8(' '), tab = _mm512_set1_epi8('\t'), cr = _mm512_set1_epi8('\r');
    const __m512i hash = _mm512_set1_epi8('#');
    /* hundreds digit -> its value; 3..9 are refused before this is used */
    const __m512i hundreds = _mm512_set4_epi32(0, 0, 0, 200 << 16 | 100 << 8);
    uint64_t prev = 0; /* the previous block's digit mask */
    Py_ssize_t values = 0, tokens = 0;
    char *skel = r->skel;
    *first = *stop = NULL;
    *line_end = limit;
    for (; p < limit; p += 64) {
        size_t left = (size_t)(limit - p);
        __mmask64 in = left >= 64 ? ~(__mmask64)0 : (((__mmask64)1 << left) - 1);
        __m512i x;
        uint64_t found;
        /* page-cache bytes come from memory, and the hardware's prefetch stops at each 4 KiB page */
        _mm_prefetch(p + PREFETCH_AHEAD, _MM_HINT_T0);
        x = _mm512_maskz_loadu_epi8(in, p);
        found = _mm512_mask_cmpeq_epi8_mask(in, x, newline);
        int last = left <= 64;
        uint64_t d, structural, blank, next_digit, d1, d2, d3, ends, starts, keep, solid;
        int count, kept;
        __m512i dv, ones, tens, h, t, v;
        if (found) { /* the line ends in this block: the bytes from its '\n' on are not ours */
            int k = __builtin_ctzll(found);
            in &= ((uint64_t)1 << k) - 1;
            x = _mm512_maskz_mov_epi8(in, x);
            *line_end = p + k;
            last = 1;
        }
        dv = _mm512_sub_epi8(x, zero_char);
        d = _mm512_mask_cmplt_epu8_mask(in, dv, ten);
        structural = _mm512_cmpeq_epi8_mask(x, comma) | _mm512_cmpeq_epi8_mask(x, open) |
                     _mm512_cmpeq_epi8_mask(x, close);
        blank = _mm512_cmpeq_epi8_mask(x, space) | _mm512_cmpeq_epi8_mask(x, tab) | _mm512_cmpeq_epi8_mask(x, cr);
        next_digit = !last && is_digit(p[64]);
        d1 = d << 1 | prev >> 63;
        d2 = d << 2 | prev >> 62;
        d3 = d << 3 | prev >> 61;
        ends = d & ~(d >> 1 | next_digit << 63);
        starts = d & ~d1;
        keep = (structural | starts) & in;
        solid = in & ~blank;
        if ((in & ~(d | structural | blank)) != 0)
            return -1;                                /* a sign, a dot, a letter: not for this reader */
        if (d & d1 & d2 & d3)
            return -1;                                /* four digits or more */
        if (_mm512_mask_cmpeq_epi8_mask(starts, x, zero_char) & (d >> 1 | next_digit << 63))
            return -1;                                /* 0 followed by a digit: 01 is not JSON */
        if (solid) {
            if (*first == NULL)
                *first = p + __builtin_ctzll(solid);
            *stop = p + 64 - __builtin_clzll(solid);
        }
        /* value at each run's last byte: ones + 10 * tens + 100 * hundreds (digits of the same run) */
        ones = _mm512_maskz_mov_epi8(d, dv);
        tens = _mm512_maskz_sub_epi8(d & d1, _mm512_maskz_loadu_epi8(d & d1, p - 1), zero_char);
        h = _mm512_maskz_sub_epi8(d & d1 & d2, _mm512_maskz_loadu_epi8(d & d1 & d2, p - 2), zero_char);
        if (_mm512_mask_cmpgt_epu8_mask(ends, h, _mm512_set1_epi8(2)))
            return -1;                                /* 300 and up */
        t = _mm512_add_epi8(ones, _mm512_add_epi8(_mm512_slli_epi16(tens, 3), _mm512_slli_epi16(tens, 1)));
        h = _mm512_shuffle_epi8(hundreds, h);
        if (_mm512_mask_cmpgt_epu8_mask(ends, t, _mm512_sub_epi8(_mm512_set1_epi8((char)255), h)))
            return -1;                                /* 256 to 299 */
        v = _mm512_add_epi8(t, h);
        count = __builtin_popcountll(ends);
        kept = __builtin_popcountll(keep);
        if (values + count > n || tokens + kept > r->tmpl_len)
            return -1;
        _mm512_storeu_si512((void *)(out + values), _mm512_maskz_compress_epi8(ends, v));
        _mm512_storeu_si512((void *)(skel + tokens), _mm512_maskz_compress_epi8(keep, _mm512_mask_mov_epi8(x, d, hash)));
        values += count;
        tokens += kept;
        prev = d;
        if (last)
            break;
    }
    if (values != n || tokens != r->tmpl_len || memcmp(skel, r->tmpl, (size_t)tokens) != 0)
        return -1;
    return 0;
}
#else
#define U8_SIMD 0
static int u8_simd_supported(void) { return 0; }
static int u8_line_simd(const char *p, const char *limit, uint8_t *out, Py_ssize_t n, U8Reader *r,
                        const char **line_end, const char **first, const char **stop) { return -1; }
#endif

static int u8_simd = -1; /* whether this CPU runs u8_line_simd; set at import */

#if U8_SIMD
/* memcpy into a buffer nobody here reads again (it goes to the disk): whole 64-byte lines are
 * stored non-temporally, so the CPU does not first read each destination line from memory. */
U8_TARGET static void copy_streaming(char *dst, const char *src, size_t n)
{
    size_t head = (64 - ((uintptr_t)dst & 63)) & 63;
    if (head > n)
        head = n;
    memcpy(dst, src, head);
    dst += head;
    src += head;
    n -= head;
    for (; n >= 64; n -= 64, dst += 64, src += 64)
        _mm512_stream_si512((void *)dst, _mm512_loadu_si512((const void *)src));
    memcpy(dst, src, n);
}
#endif



/* One line through the scalar reader, narrowed to uint8 only when every value fits exactly. */
static int u8_line_scalar(const char *p, const char *end, int newline, uint8_t *out, const Py_ssize_t *shape,
                          int ndim, Py_ssize_t n, U8Reader *r, const char **stop)
{
    Line l = {p, end, 1, 0, r->scratch, shape, ndim, newline};
    Py_ssize_t i;
    if (value(&l, 0) < 0)
        return -1;
    *stop = l.p;
    for (i = 0; i < n; i++) {
        if (r->scratch[i] < 0 || r->scratch[i] > 255)
            return -1; /* the Python path decides what an out-of-range value becomes */
        out[i] = (uint8_t)r->scratch[i];
    }
    return 0;
}

PyDoc_STRVAR(parse_u8_doc,
"parse_u8(data, pos, end, max_lines, shape, values, spans) -> (ok, lines, next_pos)\n\n"
"``parse`` for a uint8 tensor: ``values`` is a uint8 buffer of lines * prod(shape) + 64 bytes, and\n"
"a line is taken only when every value is a JSON integer from 0 to 255. 64 bytes at a time\n"
"with AVX-512 (VBMI2) where the CPU has it, else (and for lines that path refuses) the scalar reader.");

static PyObject *parse_u8(PyObject *self, PyObject *args)
{
    Py_buffer data, values, spans;
    Py_ssize_t pos, end, max_lines, size, lines = 0;
    PyObject *shape_obj, *result = NULL;
    Py_ssize_t shape[MAX_NDIM];
    int ndim, ok = 1;
    U8Reader r = {NULL, 0, NULL, NULL};
    if (!PyArg_ParseTuple(args, "y*nnnOw*w*", &data, &pos, &end, &max_lines, &shape_obj, &values, &spans))
        return NULL;
    if (read_request(shape_obj, shape, &ndim, &size, pos, end, data.len, max_lines) < 0)
        goto done;
    if (values.len < max_lines * size + 64 || spans.len / 16 < max_lines) {
        PyErr_SetString(PyExc_ValueError, "values (max_lines * size + 64 bytes) or spans buffer too small");
        goto done;
    }
    r.tmpl_len = template_len(shape, ndim, 0);
    r.tmpl = PyMem_Malloc((size_t)r.tmpl_len + 64);
    r.skel = PyMem_Malloc((size_t)r.tmpl_len + 64);
    r.scratch = PyMem_Malloc(sizeof(int64_t) * (size_t)(size ? size : 1));
    if (r.tmpl == NULL || r.skel == NULL || r.scratch == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    {
        char *w = r.tmpl;
        template_of(shape, ndim, 0, &w);
    }
    {
        const char *base = (const char *)data.buf;
        uint8_t *out = (uint8_t *)values.buf;
        int64_t *span = (int64_t *)spans.buf;
        Py_BEGIN_ALLOW_THREADS
        while (pos < end && lines < max_lines) {
            const char *line_start = base + pos, *line_end, *first, *stop;
            uint8_t *slot = out + lines * size;
            if (ok && u8_simd && u8_line_simd(line_start, base + end, slot, size, &r, &line_end, &first, &stop) == 0) {
                span[2 * lines] = first - base;
                span[2 * lines + 1] = stop - base;
            } else {
                const char *nl = memchr(line_start, '\n', (size_t)(end - pos));
                line_end = nl ? nl : base + end;
                if (ok) {
                    first = line_start;
                    stop = NULL;
                    while (first < line_end && (*first == ' ' || *first == '\t' || *first == '\r'))
                        first++;
                    if (u8_line_scalar(first, line_end, nl != NULL, slot, shape, ndim, size, &r, &stop) < 0) {
                        ok = 0;
                    } else {
                        const char *after = stop;
                        while (after < line_end && (*after == ' ' || *after == '\t' || *after == '\r'))
                            after++;
                        if (after != line_end)
                            ok = 0; /* something after the tensor */
                    }
                    span[2 * lines] = first - base;
                    span[2 * lines + 1] = stop ? stop - base : 0;
                }
            }
            lines++;
            pos = line_end < base + end ? (line_end - base) + 1 : end;
        }
        Py_END_ALLOW_THREADS
    }
    result = Py_BuildValue("(Onn)", ok ? Py_True : Py_False, lines, pos);
done:
    PyMem_Free(r.tmpl);
    PyMem_Free(r.skel);
    PyMem_Free(r.scratch);
    PyBuffer_Release(&data);
    PyBuffer_Release(&values);
    PyBuffer_Release(&spans);
    return result;
}

/* The [start, stop) spans of a JSON array's top-level elements (numbers and arrays only),
 * byte by byte: any nesting. */
static int split_array_nested(const char *json, Py_ssize_t len, Py_ssize_t n, Py_ssize_t *bounds)
{
    Py_ssize_t i, count = 0, depth = 0, start = 1;
    for (i = 1; i < len - 1; i++) {
        char ch = json[i];
        if (ch == '[')
            depth++;
        else if (ch == ']')
            depth--;
        else if (ch == ',' && depth == 0) {
            if (count >= n)
                return -1;
            bounds[2 * count] = start;
            bounds[2 * count + 1] = i;
            count++;
            start = i + 1;
        }
    }
    if (count >= n || depth != 0)
        return -1;
    bounds[2 * count] = start;
    bounds[2 * count + 1] = len - 1;
    return count + 1 == n ? 0 : -1;
}

/* The same spans, found with memchr where the elements are numbers or flat arrays of numbers
 * (a batch of class scores: the common case), else by split_array_nested. */
static int split_array(const char *json, Py_ssize_t len, Py_ssize_t n, Py_ssize_t *bounds)
{
    const char *p, *end;
    Py_ssize_t count = 0;
    if (len < 2 || json[0] != '[' || json[len - 1] != ']')
        return -1;
    if (len == 2)
        return n == 0 ? 0 : -1;
    if (memchr(json, '"', (size_t)len))
        return -1; /* strings could hold brackets and commas: not for this splitter */
    p = json + 1;
    end = json + len - 1;
    for (;;) {
        const char *stop;
        if (count >= n || p >= end)
            return -1;
        if (*p == '[') {
            const char *close = memchr(p, ']', (size_t)(end - p));
            if (close == NULL)
                return -1;
            if (memchr(p + 1, '[', (size_t)(close - p - 1)))
                return split_array_nested(json, len, n, bounds);
            stop = close + 1;
        } else {
            stop = memchr(p, ',', (size_t)(end - p));
            if (stop == NULL)
                stop = end;
            if (memchr(p, ']', (size_t)(stop - p)))
                return -1;
        }
        bounds[2 * count] = p - json;
        bounds[2 * count + 1] = stop - json;
        count++;
        if (stop == end)
            break;
        if (*stop != ',')
            return -1;
        p = stop + 1;
    }
    return count == n ? 0 : -1;
}

PyDoc_STRVAR(assemble_doc,
"assemble(data, spans, n, predictions, out=None, offset=0, head=None) -> bytes | int\n\n"
"n output lines b'{\"instance\":' + data[start:stop] + b',\"prediction\":' + p + b'}\\n' (``head``\n"
"instead of b'{\"instance\":' when given, e.g. b'{\"key\":'), with\n"
"spans as from parse and p the i-th prediction: ``predictions`` is a list of n JSON bytes, or\n"
"the JSON bytes of one array of n numbers or number arrays (split at its top-level commas).\n"
"Without ``out``, returns the lines as bytes. With ``out`` (a writable buffer), writes them at\n"
"``offset`` and returns the offset after them, or -(bytes needed) when they do not fit.");

static const char HEAD[] = "{\"instance\":";
static const char MIDDLE[] = ",\"prediction\":";
static const char TAIL[] = "}\n";

static PyObject *assemble(PyObject *self, PyObject *args)
{
    Py_buffer data, spans, target;
    int has_target = 0;
    Py_ssize_t n, i, total = 0, offset = 0;
    PyObject *predictions, *target_obj = Py_None, *head_obj = Py_None, *out = NULL;
    Py_ssize_t *bounds = NULL;
    const char *whole = NULL, *head = HEAD;
    Py_ssize_t head_len = sizeof HEAD - 1;
    if (!PyArg_ParseTuple(args, "y*y*nO|OnO", &data, &spans, &n, &predictions, &target_obj, &offset, &head_obj))
        return NULL;
    if (head_obj != Py_None) {
        if (!PyBytes_Check(head_obj)) {
            PyErr_SetString(PyExc_TypeError, "head must be bytes or None");
            PyBuffer_Release(&data);
            PyBuffer_Release(&spans);
            return NULL;
        }
        head = PyBytes_AS_STRING(head_obj);
        head_len = PyBytes_GET_SIZE(head_obj);
    }
    if (target_obj != Py_None) {
        if (PyObject_GetBuffer(target_obj, &target, PyBUF_WRITABLE) < 0)
            goto done;
        has_target = 1;
    }
    if (n < 0 || spans.len / 16 < n) {
        PyErr_SetString(PyExc_ValueError, "spans holds fewer than n pairs");
        goto done;
    }
    if (has_target && (offset < 0 || offset > target.len)) {
        PyErr_SetString(PyExc_ValueError, "offset lies outside out");
        goto done;
    }
    if (PyBytes_Check(predictions)) {
        whole = PyBytes_AS_STRING(predictions);
        bounds = PyMem_Malloc(sizeof(Py_ssize_t) * 2 * (size_t)(n ? n : 1));
        if (bounds == NULL) {
            PyErr_NoMemory();
            goto done;
        }
        if (split_array(whole, PyBytes_GET_SIZE(predictions), n, bounds) < 0) {
            PyErr_SetString(PyExc_ValueError, "predictions is not a JSON array of n numeric elements");
            goto done;
        }
    } else if (!PyList_Check(predictions) || PyList_GET_SIZE(predictions) != n) {
        PyErr_SetString(PyExc_TypeError, "predictions must be bytes or a list of n bytes");
        goto done;
    }
    {
        const int64_t *span = (const int64_t *)spans.buf;
        char *w;
        for (i = 0; i < n; i++) {
            Py_ssize_t plen;
            if (span[2 * i] < 0 || span[2 * i] > span[2 * i + 1] || span[2 * i + 1] > data.len) {
                PyErr_SetString(PyExc_ValueError, "a span lies outside data");
                goto done;
            }
            if (whole) {
                plen = bounds[2 * i + 1] - bounds[2 * i];
            } else {
                PyObject *p = PyList_GET_ITEM(predictions, i);
                if (!PyBytes_Check(p)) {
                    PyErr_SetString(PyExc_TypeError, "predictions must be bytes or a list of n bytes");
                    goto done;
                }
                plen = PyBytes_GET_SIZE(p);
            }
            total += head_len + (Py_ssize_t)(sizeof MIDDLE - 1 + sizeof TAIL - 1)
                     + (Py_ssize_t)(span[2 * i + 1] - span[2 * i]) + plen;
        }
        if (has_target) {
            if (total > target.len - offset) {
                out = PyLong_FromSsize_t(-total);
                goto done;
            }
            w = (char *)target.buf + offset;
        } else {
            out = PyBytes_FromStringAndSize(NULL, total);
            if (out == NULL)
                goto done;
            w = PyBytes_AS_STRING(out);
        }
        {
            const char *base = (const char *)data.buf;
            for (i = 0; i < n; i++) {
                Py_ssize_t len = (Py_ssize_t)(span[2 * i + 1] - span[2 * i]);
                const char *p;
                Py_ssize_t plen;
                if (whole) {
                    p = whole + bounds[2 * i];
                    plen = bounds[2 * i + 1] - bounds[2 * i];
                } else {
                    PyObject *item = PyList_GET_ITEM(predictions, i);
                    p = PyBytes_AS_STRING(item);
                    plen = PyBytes_GET_SIZE(item);
                }
                memcpy(w, head, (size_t)head_len);
                w += head_len;
#if U8_SIMD
                if (has_target && u8_simd)
                    copy_streaming(w, base + span[2 * i], (size_t)len);
                else
#endif
                    memcpy(w, base + span[2 * i], (size_t)len);
                w += len;
                memcpy(w, MIDDLE, sizeof MIDDLE - 1);
                w += sizeof MIDDLE - 1;
                memcpy(w, p, (size_t)plen);
                w += plen;
                memcpy(w, TAIL, sizeof TAIL - 1);
                w += sizeof TAIL - 1;
            }
        }
        if (has_target) {
#if U8_SIMD
            if (u8_simd)
                _mm_sfence(); /* the streamed stores are visible before the writer thread takes the buffer */
#endif
            out = PyLong_FromSsize_t(offset + total);
        }
    }
done:
    PyMem_Free(bounds);
    PyBuffer_Release(&data);
    PyBuffer_Release(&spans);
    if (has_target)
        PyBuffer_Release(&target);
    return out;
}

#if U8_SIMD
U8_TARGET static Py_ssize_t count_byte_simd(const char *p, Py_ssize_t n, char byte)
{
    const __m512i wanted = _mm512_set1_epi8(byte);
    Py_ssize_t count = 0, i = 0;
    for (; i + 64 <= n; i += 64)
        count += __builtin_popcountll(_mm512_cmpeq_epi8_mask(_mm512_loadu_si512((const void *)(p + i)), wanted));
    if (i < n) {
        __mmask64 in = ((__mmask64)1 << (n - i)) - 1;
        count += __builtin_popcountll(_mm512_mask_cmpeq_epi8_mask(in, _mm512_maskz_loadu_epi8(in, p + i), wanted));
    }
    return count;
}
#endif

PyDoc_STRVAR(count_byte_doc,
"count_byte(data, byte) -> int\n\n"
"How many times ``byte`` (an int) occurs in ``data``: planning counts a file's lines with it\n"
"(64 bytes at a time with AVX-512 where the CPU has it).");

static PyObject *count_byte(PyObject *self, PyObject *args)
{
    Py_buffer data;
    int byte;
    Py_ssize_t count = 0;
    if (!PyArg_ParseTuple(args, "y*i", &data, &byte))
        return NULL;
    Py_BEGIN_ALLOW_THREADS
#if U8_SIMD
    if (u8_simd)
        count = count_byte_simd((const char *)data.buf, data.len, (char)byte);
    else
#endif
    {
        const char *p = (const char *)data.buf, *end = p + data.len;
        while ((p = memchr(p, byte, (size_t)(end - p))) != NULL) {
            count++;
            p++;
        }
    }
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&data);
    return PyLong_FromSsize_t(count);
}

static PyMethodDef methods[] = {
    {"parse", parse, METH_VARARGS, parse_doc},
    {"parse_u8", parse_u8, METH_VARARGS, parse_u8_doc},
    {"assemble", assemble, METH_VARARGS, assemble_doc},
    {"count_byte", count_byte, METH_VARARGS, count_byte_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_denselines",
                                    "Batch jobs' JSON lines of one numeric tensor, read and written in C.", -1,
                                    methods};

PyMODINIT_FUNC PyInit__denselines(void)
{
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    u8_simd = u8_simd_supported();
    /* SIMD: whether parse_u8 reads 64 bytes at a time on this CPU (tests check both readers agree) */
    if (PyModule_AddIntConstant(m, "SIMD", u8_simd) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
