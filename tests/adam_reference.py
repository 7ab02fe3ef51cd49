"""Numpy references of the Adam take-over (hvdcompress.adam.frozen.FrozenAdam) on WORLD ranks with the
exact gradients of tests/hvd/torch_adam.py and tf_adam.py (loss = sum(w * c_r)), shared by the
torch and TensorFlow tests (no framework import here)."""
from __future__ import annotations

import numpy as np

N, WORLD = 1000, 2

#: each step's lr in the schedule cases (it falls, is 0 once, rises): the compressed steps' units
LRS = [0.01, 0.01, 0.008, 0.004, 0.0, 0.002, 0.006]


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


def int8_decoded(x: np.ndarray, steps: int = 255, chunk: int = 2048) -> np.ndarray:
    """Int8's min-max quantisation of x per chunk and back: codes rint((x - min) · steps/(max -
    min)), decoded min + code·(max - min)/steps (hvdcompress.compressors.int8; Int4: 15 steps)."""
    f32 = np.float32
    out = np.empty_like(x)
    for c in range(0, x.size, chunk):
        v = x[c:c + chunk]
        mn, mx = v.min(), v.max()
        span = mx - mn
        inv = f32(steps) / span if span > 0 else f32(0)
        codes = np.clip(np.round((v - mn) * inv), 0, steps)
        out[c:c + chunk] = mn + codes * (span / f32(steps))
    return out


def int8_mean(sent: list) -> np.ndarray:
    """The v-steps' exchange by default (FrozenAdam's warmup="auto" around onebit): every rank's
    gradient int8-quantised, allgathered, decoded and summed in rank order, times 1/WORLD."""
    return (int8_decoded(sent[0]) + int8_decoded(sent[1])) * np.float32(1 / WORLD)


def int8_alltoall(sent: list) -> np.ndarray:
    """The same exchange as the compressed allreduce: segment j of every rank int8-quantised,
    summed on rank j, the sum int8-quantised again and gathered; times 1/WORLD."""
    half = N // WORLD
    out = [int8_decoded(int8_decoded(sent[0][j * half:(j + 1) * half]) + int8_decoded(sent[1][j * half:(j + 1) * half]))
           for j in range(WORLD)]
    return np.concatenate(out) * np.float32(1 / WORLD)


def int4_alltoall(sent: list, server_chunk: int = 64) -> np.ndarray:
    """:func:`int8_alltoall` with 4-bit codes (FrozenAdam's warmup="int4"): each rank's segment
    in one chunk, the reduced sum in chunks of ``server_chunk`` (hvdcompress.adam.frozen.SERVER_INT4_CHUNK)."""
    half = N // WORLD
    out = [int8_decoded(int8_decoded(sent[0][j * half:(j + 1) * half], 15) +
                        int8_decoded(sent[1][j * half:(j + 1) * half], 15), 15, server_chunk)
           for j in range(WORLD)]
    return np.concatenate(out) * np.float32(1 / WORLD)


def dense_mean(sent: list) -> np.ndarray:
    return (sent[0] + sent[1]) * np.float32(1 / WORLD)


def v_steps(steps: int, b2: float, warmup: int = 128, per_level: int = 8, share: float = 1.0) -> dict:
    """FrozenAdam's default variance schedule (hvdcompress.adam.variance), simulated: {v-step t:
    the interval since the previous one}; every step up to ``warmup``, then ``per_level``
    v-steps at each interval 2, 4, 8, ... up to the largest power of 2 <= share/(1-b2), which
    then lasts."""
    cap = 2
    while cap * 2 <= share / (1 - b2):
        cap *= 2
    out = {t: 1 for t in range(1, min(warmup, steps) + 1)}
    t, interval, count = warmup, 2, 0
    while t + interval <= steps:
        t += interval
        out[t] = interval
        count += 1
        if count == per_level and interval < cap:
            interval, count = interval * 2, 0
    return out


def v_weights(interval: int, b2: float) -> tuple:
    """(keep, alpha) of a v-step after ``interval`` steps: v <- keep·v + alpha·g², Adam's decay
    over the interval (keep = b2^interval)."""
    keep = b2 ** interval
    return keep, 1 - keep


def coefficient(x: np.ndarray, limit: float) -> float:
    """What scales x to an L2 norm of at most ``limit`` (torch.nn.utils.clip_grad_norm_'s formula)."""
    norm = np.float32(np.sqrt(np.sum(x.astype(np.float64) ** 2)))
    return float(np.float32(min(1.0, limit / (norm + 1e-6))))


def clipped(x: np.ndarray, limit: float) -> np.ndarray:
    """x scaled to an L2 norm of at most ``limit``."""
    return x * np.float32(coefficient(x, limit))


def reference(steps: int, freeze: int | None, lr: float, b1: float, b2: float, wd: float, decoupled: bool,
              exchange=None, eps: float = 1e-8, clip: float | None = None,
              send: str = "gradient", warmup=dense_mean, live: int = 128, clip_each: bool = False,
              all_live: bool = False, lrs: list | None = None, units: bool = True) -> list:
    """Weights after each step of the take-over on WORLD ranks (module doc of hvdcompress.adam.frozen):
    dense mean gradient for t <= freeze, then
    ``exchange`` (default: the exact mean) of every rank's b1*m + (1-b1)*g_r; with ``clip``: the
    exchanged mean clipped to it in the v-steps (Horovod's pattern), its coefficient kappa kept,
    and in the other steps every rank's g_r scaled by kappa, then clipped to clip·sqrt(WORLD)
    (``clip_each``: every rank's g_r clipped to ``clip`` in every step instead, the rule before);
    Adam's L2 decay added after the exchange; ``all_live``: a tensor under ``min_numel``, live
    Adam at every step, clipped as the schedule's step (the large tensors') says. ``send="gradient"``
    (FrozenAdam's default): after the freeze ``exchange`` takes every rank's g_r and m is formed
    from its result; ``"preconditioned"``: every rank's g_r / (sqrt(v_hat) + eps) (0 where v = 0),
    the result multiplied back, then as ``"gradient"``. ``freeze=None``: the default variance
    schedule (:func:`v_steps`, its first ``live`` steps live: live Adam in its v-steps, v updated with :func:`v_weights`, bias
    correction 1 - prod(keep)); ``warmup``: the v-steps' exchange (:func:`dense_mean`,
    :func:`int8_mean`, :func:`int8_alltoall`). ``lrs``: each step's lr (default ``lr`` in every
    step); a compressed step sends u·x and divides the result by u, u = lr/L, L the first compressed
    step's positive lr, at lr 0 the last u (1.0 before any); ``units=False``: u = 1 (the rule before)."""
    f32 = np.float32
    w = np.linspace(-1, 1, N, dtype=np.float32)
    m, v = np.zeros(N, f32), np.zeros(N, f32)
    residuals: dict = {}
    kappa = 1.0   # the clip coefficient of the last v-step's mean
    l2 = 0.0 if decoupled else wd
    out = []
    schedule = {t: 1 for t in range(1, freeze + 1)} if freeze is not None else v_steps(steps, b2, warmup=live)
    decay = 1.0 if freeze is None else b2 ** max(freeze, 1)   # freeze: the old closed form
    first, unit = None, 1.0   # L and the last u
    for step in range(steps):
        t = step + 1
        lr = lrs[step] if lrs is not None else lr
        xs = gradients(step)
        vstep = t in schedule
        live = vstep or all_live
        if clip is not None and clip_each:
            xs = [clipped(x, clip) for x in xs]
        elif clip is not None and not vstep:
            xs = [clipped(x * f32(kappa), clip * np.sqrt(WORLD)) for x in xs]
        if live:
            g = warmup(xs)
            if clip is not None and not clip_each and vstep:
                kappa = coefficient(g, clip)
                g = g * f32(kappa)
            if l2:
                g = g + w * f32(l2)
            keep, alpha = v_weights(1 if all_live else schedule[t], b2)
            m = m * f32(b1) + g * f32(1 - b1)
            v = v * f32(keep) + g * g * f32(alpha)
            decay = b2 ** t if freeze is not None else decay * keep
        else:
            denom = np.sqrt(v * f32(1 / (1 - decay))) + f32(eps)
            sent = xs if send == "gradient" else [m * f32(b1) + x * f32(1 - b1) for x in xs] \
                if send == "momentum" else [np.where(v > 0, x / denom, f32(0)) for x in xs]
            if units and lr > 0:
                first = first or lr
                unit = lr / first
            sent = [s * f32(unit) for s in sent]
            got = exchange(sent, residuals) if exchange else (sent[0] + sent[1]) * f32(1 / WORLD)
            got = got * f32(1.0 / unit) if lr > 0 or not units else got / f32(unit)
            if send == "preconditioned":   # back from update space, then as the gradient's
                got = got * denom
            if send != "momentum":
                g = got + w * f32(l2) if l2 else got
                m = m * f32(b1) + g * f32(1 - b1)
            else:
                m = got + w * f32((1 - b1) * l2) if l2 else got
        update = m * f32(1 / (1 - b1 ** t)) / (np.sqrt(v * f32(1 / (1 - decay))) + f32(eps))
        if not live:  # no step where the frozen v is 0
            update = np.where(v > 0, update, f32(0))
        if decoupled:
            w = w * f32(1 - lr * wd)
        w = w - update * f32(lr)
        out.append(w.copy())
    return out
