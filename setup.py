"""Builds the optional native page allocator; never fails the install without a compiler."""
import sys

from setuptools import setup
from setuptools.command.build_ext import build_ext


class OptionalBuildExt(build_ext):
    def run(self):
        try:
            super().run()
        except Exception as exc:  # no compiler or headers: the pure-Python allocator is used
            print(f"warning: native extension not built ({exc})", file=sys.stderr)

    def build_extension(self, ext):
        try:
            super().build_extension(ext)
        except Exception as exc:
            print(f"warning: {ext.name} not built ({exc})", file=sys.stderr)


def extensions():
    try:
        from pybind11.setup_helpers import Pybind11Extension
    except ImportError:
        return []
    return [Pybind11Extension("engine._page_allocator", ["csrc/page_allocator.cpp"], cxx_std=17)]


setup(ext_modules=extensions(), cmdclass={"build_ext": OptionalBuildExt})
