"""The one thing pyproject.toml cannot say: build the native kernels unless
``MRC_PURE_PYTHON=1``, and never fail the install over them (``optional``: without a C
compiler, their pure-Python twins do the same work, slower).

Two extensions, so that a missing library costs only what needs it: ``mrc._native``
(mrc/_native.c: the data path's batch kernels, Python's headers only) and ``mrc._native_gcm``
(mrc/_native_gcm.c: keyed mode's sealing and unsealing with their AES-GCM, which links
OpenSSL's libcrypto and needs its headers, Debian's libssl-dev). mrc.native uses them together,
or ``mrc._native`` alone (keyed mode in Python) where the second did not build."""

import os

from setuptools import Extension, setup

pure = os.environ.get("MRC_PURE_PYTHON") == "1"
setup(
    ext_modules=[]
    if pure
    else [
        Extension("mrc._native", ["mrc/_native.c"], optional=True),
        Extension("mrc._native_gcm", ["mrc/_native_gcm.c"], libraries=["crypto"], optional=True),
    ]
)
