"""Build configuration beyond pyproject.toml: the one C extension (integer JSON bodies, see its file).

It is optional: without a C compiler the install still succeeds (setuptools prints a warning)
and REST bodies go through the general JSON parser, with the same answers, more slowly.
"""
from setuptools import Extension, setup

setup(ext_modules=[Extension("modelyard.serving._intjson", ["src/modelyard/serving/_intjson.c"], optional=True)])
