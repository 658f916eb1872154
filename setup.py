"""The one thing pyproject.toml cannot say: build the native receive kernel (mrc/_native.c)
unless ``MRC_PURE_PYTHON=1``, and never fail the install over it (``optional``: without a C
compiler, mrc.core.fastpath's pure-Python twin does the same work, slower)."""

import os

from setuptools import Extension, setup

pure = os.environ.get("MRC_PURE_PYTHON") == "1"
setup(ext_modules=[] if pure else [Extension("mrc._native", ["mrc/_native.c"], optional=True)])
