"""hvdcompress kernels.

``kernels.h`` / ``kernels.cpp``: the C++ source of truth on raw buffers (semantics and byte layouts
documented there and in :class:`hvdcompress.backend.Ops`). ``torch_binding.cpp`` binds it as the
torch extension ``hvdcompress.ops._torch_kernels`` (built by setup.py when possible);
``torch_fallback`` implements the same operations in plain torch. :mod:`hvdcompress.torch.backend`
picks one. This package imports no framework.
"""
