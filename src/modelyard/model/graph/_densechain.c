/* A fused chain of dense layers in one C call, for small batches: the graph runtime's hot path.
 *
 * A batch-1 request to a small dense model (the Quickstart's: Rescaling, Flatten, Dense relu, Dense softmax)
 * costs more in NumPy's per-call overhead (a dozen ufunc and BLAS calls of a microsecond each) than in
 * arithmetic. modelyard.model.graph.native builds a spec once per compiled plan and calls run() per request:
 *
 *   spec(cast, prologue, features, layers) -> capsule
 *       cast: True when the chain starts with a Cast to float32 (any of the input dtypes below is taken);
 *             False when the input must already be float32.
 *       prologue: ((op, value), ...) elementwise float32 steps on every input value in order, op 0 = multiply,
 *             1 = add (a Rescaling's Mul and AddV2 by scalar constants).
 *       features: the first layer's inputs per row (the caller checks the input's shape against it).
 *       layers: ((weights, bias or None, activation), ...): weights a C-contiguous float32 matrix (inputs x
 *             outputs), bias float32 (outputs,), activation 0 none, 1 relu, 2 relu6, 3 softmax, 4 sigmoid,
 *             5 tanh. The capsule holds buffer views of the arrays, so they stay alive and unchanged in size,
 *             and a copy of each weight matrix laid out in the order the product reads it (pack): the C path
 *             holds the weights twice.
 *   run(spec, x, out) -> bool
 *       x: a C-contiguous array of rows * features values; out: a C-contiguous float32 array of rows * outputs
 *       (rows = len(out) / outputs). False, with nothing raised, when this kernel does not take x (its dtype,
 *       layout or size): the caller then runs the NumPy kernels, which give TensorFlow's errors.
 *
 * Arithmetic is float32 as the NumPy kernels', in their order where it matters for exactness: the cast and
 * prologue are the same IEEE operations (compiled with -ffp-contract=off, so no fused multiply-add changes a
 * rounding), the bias is added after the product. The products' sums run in another order than a BLAS's
 * (every BLAS has its own), and exp is the C library's: results agree with NumPy's to float32 rounding.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#define MAX_LAYERS 16
#define MAX_PROLOGUE 8
#define STACK_FLOATS 8192 /* intermediate values kept on the stack (32 KB); more is allocated */
#define NOGIL_MACS (1L << 20) /* larger products run with the GIL released */

enum { ACT_NONE, ACT_RELU, ACT_RELU6, ACT_SOFTMAX, ACT_SIGMOID, ACT_TANH, ACT_LAST };

typedef struct {
    Py_buffer weights, bias;
    int has_bias;
    Py_ssize_t in, out;
    int activation;
    float *packed; /* the weights' columns in panels of 32, then of 8, each panel's rows in order (see pack) */
} Layer;

typedef struct {
    int cast, nprologue, nlayers;
    int prologue_op[MAX_PROLOGUE];
    float prologue_value[MAX_PROLOGUE];
    Py_ssize_t features, widest;
    long macs; /* multiply-adds per row */
    Layer layers[MAX_LAYERS];
} Spec;

static const char *CAPSULE = "modelyard.model.graph._densechain.Spec";

/* A copy of w (in x out, row-major) whose columns 0..out-out%8 are laid out as the product reads them: for each
 * block of 32 columns (then of 8), the block's rows one after another, so each block streams its weights in
 * order instead of 32 of every row's out (a stride the prefetcher follows worse, past the caches for larger
 * layers). The last out%8 columns are read from w itself. */
static float *pack(const float *w, Py_ssize_t in, Py_ssize_t out) {
    float *packed = PyMem_Malloc((in * out + 1) * sizeof(float)), *p = packed;
    if (!packed)
        return NULL;
    Py_ssize_t j = 0;
    for (; j + 32 <= out; j += 32)
        for (Py_ssize_t i = 0; i < in; i++, p += 32)
            memcpy(p, w + i * out + j, 32 * sizeof(float));
    for (; j + 8 <= out; j += 8)
        for (Py_ssize_t i = 0; i < in; i++, p += 8)
            memcpy(p, w + i * out + j, 8 * sizeof(float));
    return packed;
}

static void spec_free(Spec *spec) {
    for (int i = 0; i < spec->nlayers; i++) {
        PyBuffer_Release(&spec->layers[i].weights);
        PyMem_Free(spec->layers[i].packed);
        if (spec->layers[i].has_bias)
            PyBuffer_Release(&spec->layers[i].bias);
    }
    PyMem_Free(spec);
}

static void capsule_free(PyObject *capsule) {
    Spec *spec = PyCapsule_GetPointer(capsule, CAPSULE);
    if (spec)
        spec_free(spec);
}

/* The buffer's one-character struct format without its byte-order prefix ('=', '<', '@'). */
static char format_of(const Py_buffer *view) {
    const char *f = view->format ? view->format : "B";
    if (*f == '=' || *f == '<' || *f == '@')
        f++;
    return f[1] ? 0 : f[0];
}

static int float32_buffer(PyObject *obj, Py_buffer *view, int ndim, const char *what) {
    if (PyObject_GetBuffer(obj, view, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0)
        return -1;
    if (format_of(view) != 'f' || view->itemsize != 4 || view->ndim != ndim) {
        PyBuffer_Release(view);
        PyErr_Format(PyExc_ValueError, "%s must be a C-contiguous float32 array of %d dimensions", what, ndim);
        return -1;
    }
    return 0;
}

static PyObject *spec_new(PyObject *module, PyObject *args) {
    int cast;
    PyObject *prologue, *layers;
    Py_ssize_t features;
    if (!PyArg_ParseTuple(args, "pO!nO!", &cast, &PyTuple_Type, &prologue, &features, &PyTuple_Type, &layers))
        return NULL;
    Py_ssize_t np = PyTuple_GET_SIZE(prologue), nl = PyTuple_GET_SIZE(layers);
    if (np > MAX_PROLOGUE || nl < 1 || nl > MAX_LAYERS || features < 1) {
        PyErr_SetString(PyExc_ValueError, "a chain has 1-16 layers, at most 8 prologue steps, features >= 1");
        return NULL;
    }
    Spec *spec = PyMem_Calloc(1, sizeof(Spec));
    if (!spec)
        return PyErr_NoMemory();
    spec->cast = cast;
    spec->features = spec->widest = features;
    for (Py_ssize_t i = 0; i < np; i++) {
        int op;
        float value;
        if (!PyArg_ParseTuple(PyTuple_GET_ITEM(prologue, i), "if", &op, &value) || op < 0 || op > 1) {
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_ValueError, "a prologue step is (0 multiply | 1 add, value)");
            goto fail;
        }
        spec->prologue_op[i] = op;
        spec->prologue_value[i] = value;
        spec->nprologue++;
    }
    Py_ssize_t in = features;
    for (Py_ssize_t i = 0; i < nl; i++) {
        PyObject *weights, *bias;
        int activation;
        Layer *layer = &spec->layers[i];
        if (!PyArg_ParseTuple(PyTuple_GET_ITEM(layers, i), "OOi", &weights, &bias, &activation))
            goto fail;
        if (activation < 0 || activation >= ACT_LAST) {
            PyErr_SetString(PyExc_ValueError, "unknown activation");
            goto fail;
        }
        if (float32_buffer(weights, &layer->weights, 2, "weights") < 0)
            goto fail;
        spec->nlayers++; /* from here spec_free releases this layer's views */
        layer->in = layer->weights.shape[0];
        layer->out = layer->weights.shape[1];
        layer->activation = activation;
        if (layer->in != in || layer->out < 1) {
            PyErr_SetString(PyExc_ValueError, "a layer's inputs must be the previous layer's outputs");
            goto fail;
        }
        if (bias != Py_None) {
            if (float32_buffer(bias, &layer->bias, 1, "bias") < 0)
                goto fail;
            layer->has_bias = 1;
            if (layer->bias.shape[0] != layer->out) {
                PyErr_SetString(PyExc_ValueError, "a bias must have one value per output");
                goto fail;
            }
        }
        if (!(layer->packed = pack(layer->weights.buf, layer->in, layer->out))) {
            PyErr_NoMemory();
            goto fail;
        }
        spec->macs += (long)layer->in * layer->out;
        if (layer->out > spec->widest)
            spec->widest = layer->out;
        in = layer->out;
    }
    PyObject *capsule = PyCapsule_New(spec, CAPSULE, capsule_free);
    if (!capsule)
        goto fail;
    return capsule;
fail:
    spec_free(spec);
    return NULL;
}

/* The input as float32: the cast (C's conversions round as NumPy's astype) and the prologue's steps. */
static int load_input(const Spec *spec, const void *data, char format, Py_ssize_t n, float *x) {
    switch (format) {
    case 'f': memcpy(x, data, n * sizeof(float)); break;
    case 'B': for (Py_ssize_t i = 0; i < n; i++) x[i] = (float)((const uint8_t *)data)[i]; break;
    case 'b': for (Py_ssize_t i = 0; i < n; i++) x[i] = (float)((const int8_t *)data)[i]; break;
    case 'i': for (Py_ssize_t i = 0; i < n; i++) x[i] = (float)((const int32_t *)data)[i]; break;
    case 'l': case 'q': for (Py_ssize_t i = 0; i < n; i++) x[i] = (float)((const int64_t *)data)[i]; break;
    case 'd': for (Py_ssize_t i = 0; i < n; i++) x[i] = (float)((const double *)data)[i]; break;
    default: return 0;
    }
    for (int p = 0; p < spec->nprologue; p++) {
        const float value = spec->prologue_value[p];
        if (spec->prologue_op[p] == 0)
            for (Py_ssize_t i = 0; i < n; i++) x[i] = x[i] * value;
        else
            for (Py_ssize_t i = 0; i < n; i++) x[i] = x[i] + value;
    }
    return 1;
}

typedef float v8f __attribute__((vector_size(32)));

#if defined(__x86_64__) && defined(__linux__) && defined(__GNUC__)
#define CPU_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define CPU_CLONES
#endif

/* Unaligned loads and stores (macros: a function passing a v8f by value warns of the ABI without AVX). */
#define LOAD8(p) __extension__({ v8f v_; memcpy(&v_, (p), sizeof v_); v_; })
#define STORE8(p, v) do { v8f v_ = (v); memcpy((p), &v_, sizeof v_); } while (0)

/* y (rows x out) = x (rows x in) . w (in x out), 32 outputs at a time kept in registers across the inputs, the
 * weights from pack's panels; on x86-64 Linux built for AVX2 and for the baseline, picked at load by the CPU. */
CPU_CLONES
static void matmul(const float *x, Py_ssize_t rows, Py_ssize_t in, const float *w, const float *packed,
                   Py_ssize_t out, float *y) {
    for (Py_ssize_t r = 0; r < rows; r++) {
        const float *xr = x + r * in, *panel = packed;
        float *yr = y + r * out;
        Py_ssize_t j = 0;
        for (; j + 32 <= out; j += 32) {
            v8f a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0};
            const float *wj = panel;
            panel += in * 32;
            for (Py_ssize_t i = 0; i < in; i++, wj += 32) {
                const float s = xr[i];
                const v8f v = {s, s, s, s, s, s, s, s};
                a0 += v * LOAD8(wj);
                a1 += v * LOAD8(wj + 8);
                a2 += v * LOAD8(wj + 16);
                a3 += v * LOAD8(wj + 24);
            }
            STORE8(yr + j, a0); STORE8(yr + j + 8, a1); STORE8(yr + j + 16, a2); STORE8(yr + j + 24, a3);
        }
        for (; j + 8 <= out; j += 8) {
            v8f a0 = {0};
            const float *wj = panel;
            panel += in * 8;
            for (Py_ssize_t i = 0; i < in; i++, wj += 8) {
                const float s = xr[i];
                const v8f v = {s, s, s, s, s, s, s, s};
                a0 += v * LOAD8(wj);
            }
            STORE8(yr + j, a0);
        }
        if (j < out) {
            float acc[8] = {0};
            const Py_ssize_t left = out - j;
            const float *wj = w + j;
            for (Py_ssize_t i = 0; i < in; i++, wj += out)
                for (Py_ssize_t k = 0; k < left; k++)
                    acc[k] += xr[i] * wj[k];
            memcpy(yr + j, acc, left * sizeof(float));
        }
    }
}

static void finish(const Layer *layer, Py_ssize_t rows, float *y) {
    const Py_ssize_t out = layer->out, n = rows * out;
    if (layer->has_bias) {
        const float *b = layer->bias.buf;
        for (Py_ssize_t r = 0; r < rows; r++)
            for (Py_ssize_t j = 0; j < out; j++)
                y[r * out + j] = y[r * out + j] + b[j];
    }
    switch (layer->activation) {
    case ACT_RELU: /* NaN stays NaN, as np.maximum's */
        for (Py_ssize_t i = 0; i < n; i++) y[i] = y[i] < 0.0f ? 0.0f : y[i];
        break;
    case ACT_RELU6:
        for (Py_ssize_t i = 0; i < n; i++) y[i] = y[i] < 0.0f ? 0.0f : (y[i] > 6.0f ? 6.0f : y[i]);
        break;
    case ACT_SIGMOID:
        for (Py_ssize_t i = 0; i < n; i++) y[i] = 1.0f / (1.0f + expf(-y[i]));
        break;
    case ACT_TANH:
        for (Py_ssize_t i = 0; i < n; i++) y[i] = tanhf(y[i]);
        break;
    case ACT_SOFTMAX: /* as the NumPy kernel: minus the row's maximum, exp, over the sum */
        for (Py_ssize_t r = 0; r < rows; r++) {
            float *yr = y + r * out, top = yr[0], sum = 0.0f;
            for (Py_ssize_t j = 1; j < out; j++) top = yr[j] > top ? yr[j] : top;
            for (Py_ssize_t j = 0; j < out; j++) { yr[j] = expf(yr[j] - top); sum += yr[j]; }
            for (Py_ssize_t j = 0; j < out; j++) yr[j] = yr[j] / sum;
        }
        break;
    }
}

static void forward(const Spec *spec, Py_ssize_t rows, float *x, float *scratch, float *out) {
    const float *in = x;
    for (int i = 0; i < spec->nlayers; i++) {
        const Layer *layer = &spec->layers[i];
        /* Intermediate layers alternate between the two halves of scratch; the last writes out. */
        float *y = i == spec->nlayers - 1 ? out : scratch + (i % 2) * rows * spec->widest;
        matmul(in, rows, layer->in, layer->weights.buf, layer->packed, layer->out, y);
        finish(layer, rows, y);
        in = y;
    }
}

static PyObject *run(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "run(spec, x, out)");
        return NULL;
    }
    Spec *spec = PyCapsule_GetPointer(args[0], CAPSULE);
    if (!spec)
        return NULL;
    Py_buffer xv, ov;
    if (PyObject_GetBuffer(args[1], &xv, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) {
        PyErr_Clear(); /* not contiguous: the NumPy kernels' turn */
        Py_RETURN_FALSE;
    }
    if (PyObject_GetBuffer(args[2], &ov, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | PyBUF_WRITABLE) < 0) {
        PyBuffer_Release(&xv);
        return NULL;
    }
    PyObject *result = Py_False;
    const Py_ssize_t outputs = spec->layers[spec->nlayers - 1].out;
    const Py_ssize_t rows = ov.len / 4 / outputs, n = rows * spec->features;
    char format = format_of(&xv);
    if (format_of(&ov) != 'f' || ov.len != rows * outputs * 4) {
        PyErr_SetString(PyExc_ValueError, "out must be a C-contiguous float32 array of rows x outputs");
        result = NULL;
        goto done;
    }
    if (rows < 1 || xv.len != n * xv.itemsize || (!spec->cast && format != 'f'))
        goto done;
    const Py_ssize_t need = n + 2 * rows * spec->widest;
    float stack[STACK_FLOATS], *buffer = stack;
    if (need > STACK_FLOATS && !(buffer = PyMem_RawMalloc(need * sizeof(float)))) {
        result = PyErr_NoMemory();
        goto done;
    }
    int taken = 1;
    const int nogil = spec->macs * rows >= NOGIL_MACS;
    PyThreadState *save = nogil ? PyEval_SaveThread() : NULL;
    if (load_input(spec, xv.buf, format, n, buffer))
        forward(spec, rows, buffer, buffer + n, ov.buf);
    else
        taken = 0;
    if (save)
        PyEval_RestoreThread(save);
    if (buffer != stack)
        PyMem_RawFree(buffer);
    result = taken ? Py_True : Py_False;
done:
    PyBuffer_Release(&xv);
    PyBuffer_Release(&ov);
    Py_XINCREF(result);
    return result;
}

static PyMethodDef methods[] = {
    {"spec", spec_new, METH_VARARGS, "spec(cast, prologue, features, layers) -> a chain's spec"},
    {"run", (PyCFunction)(void (*)(void))run, METH_FASTCALL, "run(spec, x, out) -> True when computed into out"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, .m_name = "_densechain", .m_doc = "A fused dense chain in C.", .m_size = -1, .m_methods = methods,
};

PyMODINIT_FUNC PyInit__densechain(void) { return PyModule_Create(&module); }
