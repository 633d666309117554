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
        build_paged_attention("." if self.inplace else self.build_lib)

    def build_extension(self, ext):
        try:
            super().build_extension(ext)
        except Exception as exc:
            if "-fopenmp" in ext.extra_compile_args:  # a compiler without OpenMP: build it serial
                print(f"warning: {ext.name} built without OpenMP ({exc})", file=sys.stderr)
                ext.extra_compile_args = [a for a in ext.extra_compile_args if a != "-fopenmp"]
                ext.extra_link_args = [a for a in ext.extra_link_args if a != "-fopenmp"]
                return self.build_extension(ext)
            print(f"warning: {ext.name} not built ({exc})", file=sys.stderr)


def build_paged_attention(root: str) -> None:
    """The CUDA decode kernel (csrc/paged_attention.cu), only where nvcc and a CUDA torch with a GPU are."""
    try:
        import shutil

        import torch

        if not (shutil.which("nvcc") and torch.version.cuda and torch.cuda.is_available()):
            return
        from pathlib import Path

        from engine.attention.cuda_backend import build_library

        major, minor = torch.cuda.get_device_capability()
        print(f"built {build_library(f'{major}{minor}', out_dir=Path(root) / 'engine')}")
    except Exception as exc:  # the backend builds it on first use instead
        print(f"warning: CUDA paged attention not prebuilt ({exc})", file=sys.stderr)


def extensions():
    try:
        from pybind11.setup_helpers import Pybind11Extension
    except ImportError:
        return []
    # CPU paged attention: -O3 vectorizes its lane loops; no -march=native, so the build runs anywhere
    # (the kernel carries its own AVX2 clone, picked at load time)
    kernels = Pybind11Extension("engine._paged_kernels", ["csrc/paged_kernels.cpp"], cxx_std=17,
                                extra_compile_args=["-O3", "-fopenmp", "-Wno-psabi"],
                                extra_link_args=["-fopenmp"])
    return [Pybind11Extension("engine._page_allocator", ["csrc/page_allocator.cpp"], cxx_std=17), kernels]


setup(ext_modules=extensions(), cmdclass={"build_ext": OptionalBuildExt})
