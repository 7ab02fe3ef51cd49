"""The known gradients of the fusion tests, shared by tests/test_fusion.py (numpy references, the
simulator) and the scripts tests/hvd/torch_fusion.py and tf_fusion.py (real ranks)."""
import numpy as np

#: four tensors, the biases 100x larger than the weights; in name order a.bias comes first
SIZES = {"a.bias": 7, "a.weight": 300, "b.bias": 5, "b.weight": 1000}


def grads(rank: int, step: int = 0) -> dict:
    """Rank ``rank``'s gradient of each tensor at ``step``, by name (name order)."""
    rng = np.random.default_rng(100 * step + rank)
    return {n: (rng.standard_normal(k) * (10.0 if "bias" in n else 0.1)).astype(np.float32)
            for n, k in sorted(SIZES.items())}
