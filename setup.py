"""Build configuration beyond pyproject.toml: small C extensions for the hot loops.

``_numjson`` reads all-numbers predict bodies; ``_sendmany`` writes a pass's answers with the
GIL released; ``_denselines`` reads and writes batch jobs' numeric JSON lines, ``_keyedlines`` takes
object lines (with a key) apart for it; ``_densechain`` runs the graph runtime's fused dense layers for
small batches (see each file).
All are optional: without a C compiler the install still succeeds (setuptools prints a
warning) and the server and batch jobs take their pure-Python paths, with the same answers
(the dense layers' to float32 rounding), more slowly.
"""
from setuptools import Extension, setup

setup(ext_modules=[
    Extension("modelyard.serving.protocol._numjson", ["src/modelyard/serving/protocol/_numjson.c"], optional=True),
    Extension("modelyard.serving.transport._sendmany", ["src/modelyard/serving/transport/_sendmany.c"], optional=True),
    Extension("modelyard.batch._denselines", ["src/modelyard/batch/_denselines.c"], optional=True),
    Extension("modelyard.batch._keyedlines", ["src/modelyard/batch/_keyedlines.c"], optional=True),
    # -ffp-contract=off: no fused multiply-add, so the cast and Rescaling steps round as NumPy's do.
    Extension("modelyard.model.graph._densechain", ["src/modelyard/model/graph/_densechain.c"],
              extra_compile_args=["-ffp-contract=off"], optional=True),
])
