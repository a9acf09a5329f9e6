"""Build hook for the optional compiled forwarding engine (flowrouter/core/_fastpath.c).

Everything else about the package is in pyproject.toml. The extension is marked optional: on a
machine without a C compiler ``pip install .`` still succeeds, and the router uses the
pure-Python twin (flowrouter/core/fastpath_py.py), saying so in its log and status.
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension("flowrouter.core._fastpath",
                  ["flowrouter/core/_fastpath.c", "flowrouter/core/_fastpath_tables.c"],
                  depends=["flowrouter/core/_fastpath.h"],
                  extra_compile_args=["-O2"], optional=True),
    ],
)
