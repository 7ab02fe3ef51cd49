"""Numpy references of the Adam take-over (hvdcompress.adam.FrozenAdam) on WORLD ranks with the
exact gradients of tests/hvd/torch_adam.py and tf_adam.py (loss = sum(w * c_r)), shared by the
torch and TensorFlow tests (no framework import here)."""
from __future__ import annotations

import numpy as np

N, WORLD = 1000, 2


def by_case(records: list) -> dict:
    """Horovod records grouped as {case: {rank: record}}."""
    out: dict = {}
    for r in records:
        out.setdefault(r["case"], {})[r["rank"]] = r
    return out


def rank_vector(rank: int, n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed + rank).standard_normal(n).astype(np.float32)


def gradients(step: int) -> list:
    return [rank_vector(r, N, 100 + 10 * step) for r in range(WORLD)]


def onebit_ef(x: np.ndarray, residual: np.ndarray) -> np.ndarray:
    """Decoded sign(p) * mean|p| of p = x + residual; the residual is updated in place."""
    p = x + residual
    decoded = np.where(np.signbit(p), np.float32(-1), np.float32(1)) * np.float32(np.abs(p).mean(dtype=np.float64))
    residual[:] = p - decoded
    return decoded


def allgather_exchange(sent: list, residuals: dict) -> np.ndarray:
    """Mean over ranks of onebit_ef(sent[r]), each rank with its own residual."""
    decoded = [onebit_ef(s, residuals.setdefault(r, np.zeros(N, np.float32))) for r, s in enumerate(sent)]
    return (decoded[0] + decoded[1]) * np.float32(1 / WORLD)


def compressed_allreduce(sent: list, residuals: dict) -> np.ndarray:
    """The all-to-all compressed allreduce of onebit_ef: segment j of every rank (own residual
    per segment) goes to rank j, which sums the decoded segments, compresses the sum with its
    server residual, and every rank decodes the gathered sums; times 1/WORLD."""
    half = N // WORLD
    out = []
    for j in range(WORLD):
        seg = [onebit_ef(s[j * half:(j + 1) * half], residuals.setdefault((r, j), np.zeros(half, np.float32)))
               for r, s in enumerate(sent)]
        out.append(onebit_ef(seg[0] + seg[1], residuals.setdefault(("sum", j), np.zeros(half, np.float32))))
    return np.concatenate(out) * np.float32(1 / WORLD)


def clipped(x: np.ndarray, limit: float) -> np.ndarray:
    """x scaled to an L2 norm of at most ``limit`` (torch.nn.utils.clip_grad_norm_'s formula)."""
    norm = np.float32(np.sqrt(np.sum(x.astype(np.float64) ** 2)))
    return x * np.float32(min(1.0, limit / (norm + 1e-6)))


def reference(steps: int, freeze: int, lr: float, b1: float, b2: float, wd: float, decoupled: bool,
              exchange=None, eps: float = 1e-8, clip: float | None = None,
              send: str = "gradient") -> list:
    """Weights after each step of the take-over on WORLD ranks (module doc of hvdcompress.adam):
    dense mean gradient for t <= freeze (clipped after the exchange to ``clip``), then
    ``exchange`` (default: the exact mean) of every rank's b1*m + (1-b1)*g_r (g_r clipped to
    clip first: the take-over's local limit keeps the mean within clip); Adam's L2 decay added after the exchange. ``send="gradient"``
    (FrozenAdam's default): after the freeze ``exchange`` takes every rank's g_r and m is formed
    from its result; ``"preconditioned"``: every rank's g_r / (sqrt(v_hat) + eps) (0 where v = 0),
    the result multiplied back, then as ``"gradient"``."""
    f32 = np.float32
    w = np.linspace(-1, 1, N, dtype=np.float32)
    m, v = np.zeros(N, f32), np.zeros(N, f32)
    residuals: dict = {}
    l2 = 0.0 if decoupled else wd
    out = []
    for step in range(steps):
        t = step + 1
        xs = gradients(step)
        if step < freeze:
            g = (xs[0] + xs[1]) * f32(1 / WORLD)
            if clip is not None:
                g = clipped(g, clip)
            if l2:
                g = g + w * f32(l2)
            m = m * f32(b1) + g * f32(1 - b1)
            v = v * f32(b2) + g * g * f32(1 - b2)
        else:
            if clip is not None:
                xs = [clipped(x, clip) for x in xs]
            denom = np.sqrt(v * f32(1 / (1 - b2 ** max(freeze, 1)))) + f32(eps)
            sent = xs if send == "gradient" else [m * f32(b1) + x * f32(1 - b1) for x in xs] \
                if send == "momentum" else [np.where(v > 0, x / denom, f32(0)) for x in xs]
            got = exchange(sent, residuals) if exchange else (sent[0] + sent[1]) * f32(1 / WORLD)
            if send == "preconditioned":   # back from update space, then as the gradient's
                got = got * denom
            if send != "momentum":
                g = got + w * f32(l2) if l2 else got
                m = m * f32(b1) + g * f32(1 - b1)
            else:
                m = got + w * f32((1 - b1) * l2) if l2 else got
        t_v = min(t, max(freeze, 1))
        update = m * f32(1 / (1 - b1 ** t)) / (np.sqrt(v * f32(1 / (1 - b2 ** t_v))) + f32(eps))
        if step >= freeze:  # no step where the frozen v is 0
            update = np.where(v > 0, update, f32(0))
        if decoupled:
            w = w * f32(1 - lr * wd)
        w = w - update * f32(lr)
        out.append(w.copy())
    return out
