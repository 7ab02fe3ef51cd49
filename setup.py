"""Build hook: compiles the optional torch extension hvdcompress.ops._torch_kernels.

Metadata lives in pyproject.toml. The extension is built when torch is importable at build time
(``pip install --no-build-isolation -e .`` builds it in place); if torch is missing or the compiler
fails, the install still succeeds and hvdcompress uses its pure-framework fallback, logging so.
Set HVDCOMPRESS_BUILD_KERNELS=0 to skip the build.
"""
import os
import sys

from setuptools import setup
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


def torch_extension():
    """(extensions, cmdclass) for the torch kernels, or nothing when they cannot be built."""
    if os.environ.get("HVDCOMPRESS_BUILD_KERNELS", "1") == "0":
        return [], {}
    try:
        from torch.utils.cpp_extension import BuildExtension, CppExtension
    except ImportError:
        print("hvdcompress: torch is not importable at build time; skipping the C++ kernels",
              file=sys.stderr)
        return [], {}

    class Build(OptionalBuildExt, BuildExtension):
        pass

    ext = CppExtension(
        "hvdcompress.ops._torch_kernels",
        [os.path.join(OPS, "kernels.cpp"), os.path.join(OPS, "torch_binding.cpp")],
        extra_compile_args=CXX_FLAGS, extra_link_args=["-fopenmp"])
    return [ext], {"build_ext": Build.with_options(use_ninja=False)}


extensions, cmdclass = torch_extension()
setup(ext_modules=extensions, cmdclass=cmdclass)
