"""Build configuration beyond pyproject.toml: two small C extensions for the REST event loop.

``_numjson`` reads all-numbers predict bodies; ``_sendmany`` writes a pass's answers with the
GIL released (see each file). Both are optional: without a C compiler the install still
succeeds (setuptools prints a warning) and the server takes its pure-Python paths, with the
same answers, more slowly.
"""
from setuptools import Extension, setup

setup(ext_modules=[
    Extension("modelyard.serving.protocol._numjson", ["src/modelyard/serving/protocol/_numjson.c"], optional=True),
    Extension("modelyard.serving.transport._sendmany", ["src/modelyard/serving/transport/_sendmany.c"], optional=True),
])
