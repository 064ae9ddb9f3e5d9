/* _sendmany: write one buffer to each of many sockets in a single call that releases the GIL.
 *
 * When a batch of predicts completes, the REST event loop answers dozens of connections in one
 * pass. Each answer's send() into a loopback socket costs tens of microseconds in the kernel,
 * and uvloop makes that call holding the GIL, so the batch thread (which needs the GIL between
 * model runs) waited behind them. Here the sends of one pass run together, GIL released.
 *
 * send_many(fds: list[int], buffers: list[bytes]) -> list[int]
 *     For each pair, one non-blocking send(); the bytes it took: the whole buffer, fewer (the
 *     socket's buffer is full), 0 (EAGAIN), or -1 (any other error, errno not kept). The caller
 *     hands what was not taken to the transport, which queues it or reports the error.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <errno.h>
#include <limits.h>
#include <sys/socket.h>
#include <sys/types.h>

typedef struct {
    PyObject *owner; /* our reference to the bytes object, held while the GIL is released */
    int fd;
    const char *data;
    Py_ssize_t size;
    Py_ssize_t sent;
} job_t;

static PyObject *send_many(PyObject *module, PyObject *args)
{
    PyObject *fds, *buffers;
    if (!PyArg_ParseTuple(args, "O!O!:send_many", &PyList_Type, &fds, &PyList_Type, &buffers))
        return NULL;
    Py_ssize_t n = PyList_GET_SIZE(fds);
    if (PyList_GET_SIZE(buffers) != n) {
        PyErr_SetString(PyExc_ValueError, "send_many: fds and buffers differ in length");
        return NULL;
    }
    job_t *jobs = PyMem_Calloc(n ? n : 1, sizeof(job_t));
    if (jobs == NULL)
        return PyErr_NoMemory();
    /* Every argument is checked before any pointer is taken: only exact types, so no Python code
     * (an __index__) runs and changes the lists meanwhile. Each buffer is held by a reference of
     * our own while the GIL is released, when other threads may change the lists. */
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *fd = PyList_GET_ITEM(fds, i), *buffer = PyList_GET_ITEM(buffers, i);
        if (!PyLong_CheckExact(fd) || !PyBytes_CheckExact(buffer)) {
            PyMem_Free(jobs);
            PyErr_SetString(PyExc_TypeError, "send_many: fds must be ints and buffers bytes");
            return NULL;
        }
        long value = PyLong_AsLong(fd);
        if ((value == -1 && PyErr_Occurred()) || value < 0 || value > INT_MAX) {
            PyErr_Clear();
            PyMem_Free(jobs);
            PyErr_SetString(PyExc_ValueError, "send_many: a descriptor out of range");
            return NULL;
        }
        jobs[i].fd = (int)value;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *buffer = PyList_GET_ITEM(buffers, i);
        Py_INCREF(buffer);
        jobs[i].owner = buffer;
        jobs[i].data = PyBytes_AS_STRING(buffer);
        jobs[i].size = PyBytes_GET_SIZE(buffer);
    }
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < n; i++) {
        ssize_t sent;
        do {
            sent = send(jobs[i].fd, jobs[i].data, (size_t)jobs[i].size, MSG_DONTWAIT | MSG_NOSIGNAL);
        } while (sent < 0 && errno == EINTR);
        if (sent < 0)
            sent = (errno == EAGAIN || errno == EWOULDBLOCK) ? 0 : -1;
        jobs[i].sent = sent;
    }
    Py_END_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < n; i++)
        Py_DECREF(jobs[i].owner);
    PyObject *result = PyList_New(n);
    if (result != NULL) {
        for (Py_ssize_t i = 0; i < n; i++) {
            PyObject *count = PyLong_FromSsize_t(jobs[i].sent);
            if (count == NULL) {
                Py_CLEAR(result);
                break;
            }
            PyList_SET_ITEM(result, i, count);
        }
    }
    PyMem_Free(jobs);
    return result;
}

PyDoc_STRVAR(send_many_doc,
"send_many(fds, buffers) -> list[int]\n\n"
"One non-blocking send() of buffers[i] to fds[i] for each i, all with the GIL released;\n"
"the bytes each one took (0 when the socket would block, -1 on any other error).");

static PyMethodDef methods[] = {
    {"send_many", send_many, METH_VARARGS, send_many_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_sendmany",
    "Write many sockets in one call that releases the GIL (see the file's header).", -1, methods,
};

PyMODINIT_FUNC PyInit__sendmany(void)
{
    return PyModule_Create(&module);
}
