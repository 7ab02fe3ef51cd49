"""Build hook: compiles the optional C++ kernel library hvdcompress/ops/_kernels*.so.

Metadata lives in pyproject.toml. The library (kernels_*.cpp, one per section of the kernel
table, + capi.cpp) is plain C++ with OpenMP and a C ABI, loaded with ctypes by
hvdcompress.ops.native for PyTorch and TensorFlow alike: building it needs a C++ compiler and no
framework (``pip install --no-build-isolation -e .`` builds it in
place). If the compiler fails, the install still succeeds and hvdcompress uses its plain-torch
fallback, logging so. Set HVDCOMPRESS_BUILD_KERNELS=0 to skip the build.
"""
import glob
import os
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

OPS = os.path.join("hvdcompress", "ops")
CXX_FLAGS = ["-O3", "-fopenmp", "-ffp-contract=off", "-fno-math-errno", "-fno-trapping-math"]


class OptionalBuildExt(build_ext):
    """build_ext that reports a failed extension build instead of failing the install."""

    def run(self):
        try:
            super().run()
        except Exception as exc:  # noqa: BLE001 - any compiler/toolchain failure
            self._skip(exc)

    def build_extension(self, ext):
        try:
            super().build_extension(ext)
        except Exception as exc:  # noqa: BLE001
            self._skip(exc)

    @staticmethod
    def _skip(exc):
        print(f"hvdcompress: building the C++ kernels failed ({exc}); installing without them, "
              "the pure-framework fallback will be used", file=sys.stderr)


def kernel_library():
    """(extensions, cmdclass) for the kernel library, or nothing when HVDCOMPRESS_BUILD_KERNELS=0.
    It is built as an extension module only to get setuptools' compiler, flags and install
    location; Python never imports it (ctypes loads it)."""
    if os.environ.get("HVDCOMPRESS_BUILD_KERNELS", "1") == "0":
        return [], {}
    ext = Extension(
        "hvdcompress.ops._kernels",
        sorted(glob.glob(os.path.join(OPS, "kernels_*.cpp"))) + [os.path.join(OPS, "capi.cpp")],
        depends=[os.path.join(OPS, "kernels.h"), os.path.join(OPS, "kernels_common.h")],
        language="c++", extra_compile_args=["-std=c++17"] + CXX_FLAGS, extra_link_args=["-fopenmp"])
    return [ext], {"build_ext": OptionalBuildExt}


extensions, cmdclass = kernel_library()
setup(ext_modules=extensions, cmdclass=cmdclass)
