"""Build configuration beyond pyproject.toml: small C extensions for the hot loops.

``_numjson`` reads all-numbers predict bodies; ``_sendmany`` writes a pass's answers with the
GIL released; ``_denselines`` reads and writes batch jobs' numeric JSON lines, ``_keyedlines`` takes
object lines (with a key) apart for it (see each file).
All are optional: without a C compiler the install still succeeds (setuptools prints a
warning) and the server and batch jobs take their pure-Python paths, with the same answers,
more slowly.
"""
from setuptools import Extension, setup

setup(ext_modules=[
    Extension("modelyard.serving.protocol._numjson", ["src/modelyard/serving/protocol/_numjson.c"], optional=True),
    Extension("modelyard.serving.transport._sendmany", ["src/modelyard/serving/transport/_sendmany.c"], optional=True),
    Extension("modelyard.batch._denselines", ["src/modelyard/batch/_denselines.c"], optional=True),
    Extension("modelyard.batch._keyedlines", ["src/modelyard/batch/_keyedlines.c"], optional=True),
])
