"""Build configuration beyond pyproject.toml: the one C extension (integer JSON bodies, see its file)."""
from setuptools import Extension, setup

setup(ext_modules=[Extension("modelyard.serving._intjson", ["src/modelyard/serving/_intjson.c"])])
