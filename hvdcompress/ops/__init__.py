"""hvdcompress kernels: one implementation of each per kind of device (docs/kernels.md).

``kernels.h`` specifies every kernel; :mod:`~hvdcompress.ops.table` declares each once with the
arguments its Python implementations take. ``kernels_*.cpp`` (one per section of the table,
sharing ``kernels_common.h``) implement them in C++ on raw buffers and ``capi.cpp`` exports them as a C ABI, compiled by setup.py into ``_kernels*.so``.
:mod:`~hvdcompress.ops.native` calls that library through ctypes on numpy arrays and, through
:class:`~hvdcompress.ops.native.Bridge`, on PyTorch and TensorFlow CPU tensors without copies.
:mod:`~hvdcompress.ops.torch_fallback` is the plain-torch implementation (other devices, no
library), :mod:`~hvdcompress.ops.triton_kernels` the Triton one (CUDA). This package imports no
framework at import time.
"""
