"""The compressed allreduce (collective='alltoall') against the allgather form, on the in-process
simulator at P = 4, for every registered compressor that supports it, each within the error
bound that its own compression implies (derived below, computed in numpy from the inputs).

Notation: rank r's gradient x_r (n elements), the exact average a = (1/P) Σ_r x_r, and C the
compressor. The allgather form returns (1/P) Σ_r C(x_r): one compression per rank. The
compressed allreduce cuts x_r into P zero-padded segments x_rj of L = ceil(n/P) elements,
sums S'_j = Σ_r C(x_rj) on rank j and returns (1/P) C(S'_j): a second compression, of the sum.
So its error is (1/P) [Σ_r (C(x_rj) − x_rj) + (C(S'_j) − S'_j)], the allgather form's only the
first sum: each bound below is "the first-stage error summed over ranks, plus one compression
error of the sum", divided by P.

The exact case: NoCompression and FP16 are summable and always take Horovod's allreduce
(tests/test_exchange.py checks collective='alltoall' is refused for them), so no exact
compressor runs the compressed allreduce; bf16 is exact on gradients whose values and partial
sums are representable in bf16 (small integers), and then both forms equal the average bit for bit.
"""
from __future__ import annotations

from typing import Callable

import numpy as np
import pytest
import torch
from simulator import run_ranks

import hvdcompress as hc
from hvdcompress.compressors.residual import RESIDUAL
from hvdcompress.contract.compressor import TensorInfo
from hvdcompress.engines.exchange import Exchange
from hvdcompress.ops.torch_ops import TorchOps

OPS = TorchOps()
P = 4
N = 997            # not a multiple of P: the last segment is zero-padded
FLOAT_SLACK = 1e-6  # float32 rounding of the kernels' arithmetic, relative to Σ_r |x_r|
DETERMINISTIC = ["bf16", "int8", "onebit", "efsignsgd", "twobit"]
STOCHASTIC = ["dithering", "natural", "qsgd", "terngrad"]


def gradient(rank: int, step: int, n: int = N) -> np.ndarray:
    return np.random.default_rng([7, step, rank]).standard_normal(n).astype(np.float32)


def run_form(compressor: hc.Compressor, collective: str, grads: Callable[[int, int], np.ndarray],
             steps: int, world: int = P) -> list:
    """Per rank: (averaged results per step, the tensor's state dict at the end)."""
    def body(comm):
        engine = Exchange(compressor, OPS, comm, average=True, collective=collective)
        state, results = {}, []
        for step in range(steps):
            x = grads(comm.rank, step)
            info = TensorInfo(name="w", numel=x.size, world=world, shape=(x.size,), rank=comm.rank)
            entry = engine.compress("w", torch.from_numpy(x), state, info)
            engine.finish(engine.start([entry]))
            engine.end_step()
            assert engine.plan["w"][1] == collective
            results.append(entry.total.numpy().astype(np.float64))
        return results, state
    runs = run_ranks(world, body)
    for results, _ in runs[1:]:
        assert all(np.array_equal(a, b) for a, b in zip(results, runs[0][0])), "ranks disagree"
    return runs


def segments(x: np.ndarray, world: int = P) -> np.ndarray:
    """x zero-padded to world·L and cut into [world, L] (the compressed allreduce's segments)."""
    length = -(-x.size // world)
    return np.concatenate([x, np.zeros(world * length - x.size, x.dtype)]).reshape(world, length)


def unsegment(s: np.ndarray, n: int = N) -> np.ndarray:
    return s.reshape(-1)[:n]


def test_the_compressors_that_run_the_compressed_allreduce():
    """Every registered compressor is classified here: a new one must get its bound."""
    supporting = sorted(name for name in hc.available()
                        if hc.from_params({"compressor": name}).supports_alltoall)
    assert supporting == sorted(DETERMINISTIC + STOCHASTIC)


# ---- deterministic compressors: per-element or per-segment bounds ---------------------------------
def int8_halfstep(x: np.ndarray, chunk: int) -> np.ndarray:
    """Int8's worst rounding error per element of x: half a step, (max − min)/510, of its chunk."""
    h = np.empty(x.size)
    for start in range(0, x.size, chunk):
        part = x[start:start + chunk].astype(np.float64)
        h[start:start + chunk] = (part.max() - part.min()) / 510
    return h


def int8_bounds(xs: list, chunk: int) -> tuple:
    """Int8 (min-max, rint): |C(x) − x| ≤ (max − min)/510 per element of each chunk.
    allgather: Σ_r h(x_r)/P. alltoall: chunks lie inside each segment; the sum S' = Σ_r C(x_rj)
    has range ≤ range(S_j) + 2 Σ_r h(x_rj) (S_j the exact segment sum), so the second rounding
    adds at most that range/510 per chunk: (Σ_r h(x_rj) + range(S' chunk)/510)/P."""
    gather = sum(int8_halfstep(x, chunk) for x in xs) / P
    segs = [segments(x) for x in xs]
    total = sum(s.astype(np.float64) for s in segs)
    a2a = np.empty_like(total)
    for j in range(P):
        first = sum(int8_halfstep(s[j], chunk) for s in segs)
        for start in range(0, total.shape[1], chunk):
            part, h = total[j, start:start + chunk], first[start:start + chunk]
            h_sum = (part.max() - part.min() + 2 * h.max()) / 510
            a2a[j, start:start + chunk] = h + h_sum
    return gather, unsegment(a2a) / P


def bf16_bounds(xs: list) -> tuple:
    """bf16 (round to nearest, 8 significant bits): |bf16(x) − x| ≤ 2⁻⁸ |x|. allgather:
    2⁻⁸ Σ_r |x_r| / P. alltoall: the sum S' = Σ_r bf16(x_r) is rounded again:
    (2⁻⁸ Σ_r |x_r| + 2⁻⁸ |S'|)/P with |S'| ≤ (1 + 2⁻⁸) Σ_r |x_r|."""
    u = 2.0 ** -8
    absolute = sum(np.abs(x.astype(np.float64)) for x in xs)
    return u * absolute / P, (u + u * (1 + u)) * absolute / P


def onebit_bounds(xs: list) -> tuple:
    """Scaled 1-bit, C(y) = s·sign(y) with s = mean|y| over m elements: ⟨C(y), y⟩ = m s² =
    ‖C(y)‖², so ‖y − C(y)‖² = ‖y‖² − m s² exactly (a contraction). Bounds in the L2 norm:
    allgather over the whole tensor: Σ_r √(‖x_r‖² − n s_r²)/P; alltoall per segment j:
    (Σ_r √(‖x_rj‖² − L s_rj²) + ‖S'_j‖)/P, since ‖S' − C(S')‖ ≤ ‖S'‖ ≤ Σ_r √L s_rj."""
    def err(y):
        y = y.astype(np.float64)
        return np.sqrt(max(float(y @ y) - y.size * np.mean(np.abs(y)) ** 2, 0.0))
    gather = sum(err(x) for x in xs) / P
    segs = [segments(x) for x in xs]
    length = segs[0].shape[1]
    a2a = np.array([sum(err(s[j]) + np.sqrt(length) * np.mean(np.abs(s[j].astype(np.float64)))
                        for s in segs) for j in range(P)]) / P
    return gather, a2a


@pytest.mark.parametrize("compressor,bounds", [
    (hc.Int8(chunk=128), lambda xs: int8_bounds(xs, 128)),
    (hc.Int8(), lambda xs: int8_bounds(xs, 2048)),
    (hc.BF16(), bf16_bounds),
], ids=["int8-chunk128", "int8", "bf16"])
def test_elementwise_bound(compressor, bounds):
    """Both forms lie within their per-element bound of the exact average (hence within the sum
    of the two bounds of each other), and the bound is not vacuous: the error reaches at least
    a tenth of it somewhere."""
    xs = [gradient(r, 0) for r in range(P)]
    exact = sum(x.astype(np.float64) for x in xs) / P
    slack = FLOAT_SLACK * sum(np.abs(x.astype(np.float64)) for x in xs)
    for collective, bound in zip(("allgather", "alltoall"), bounds(xs)):
        got = run_form(compressor, collective, lambda r, s: xs[r], steps=1)[0][0][0]
        error = np.abs(got - exact)
        assert np.all(error <= bound + slack), (collective, float(np.max(error - bound)))
        assert np.max(error / bound) > 0.1, collective


def test_onebit_l2_bound():
    """Scaled 1-bit (no error feedback), one step: see :func:`onebit_bounds`."""
    xs = [gradient(r, 0) for r in range(P)]
    exact = sum(x.astype(np.float64) for x in xs) / P
    gather, a2a = onebit_bounds(xs)
    got = {c: run_form(hc.OneBit(), c, lambda r, s: xs[r], steps=1)[0][0][0]
           for c in ("allgather", "alltoall")}
    assert np.linalg.norm(got["allgather"] - exact) <= gather * (1 + 1e-5)
    seg_err = np.linalg.norm(segments(got["alltoall"] - exact), axis=1)
    assert np.all(seg_err <= a2a * (1 + 1e-5)), (seg_err, a2a)


def test_bf16_is_exact_on_small_integers():
    """Integers in [-16, 16]: every bf16 rounding (values, sums of 4 of them ≤ 64) is exact,
    and so is dividing by P = 4: both forms equal the average bit for bit."""
    xs = [np.random.default_rng(r).integers(-16, 17, N).astype(np.float32) for r in range(P)]
    exact = (sum(xs) / np.float32(P)).astype(np.float64)
    for collective in ("allgather", "alltoall"):
        got = run_form(hc.BF16(), collective, lambda r, s: xs[r], steps=1)[0][0][0]
        assert np.array_equal(got, exact), collective


@pytest.mark.parametrize("compressor,key", [
    (hc.EFSignSGD(), RESIDUAL), (hc.TwoBit(threshold=0.5), RESIDUAL),
    (hc.ErrorFeedback(hc.OneBit()), "residual"), (hc.ErrorFeedback(hc.Int8()), "residual"),
], ids=["efsignsgd", "twobit", "ef-onebit", "ef-int8"])
def test_error_feedback_conserves_the_sum_in_both_forms(compressor, key):
    """With error feedback nothing is lost, only delayed. allgather: P Σ_t out_t = Σ_t Σ_r g_rt −
    Σ_r e_r. alltoall (client residuals e_r per segment, server residual ε_j of the sum on rank
    j): P Σ_t out_t = Σ_t Σ_r g_rt − Σ_r e_r − ε, for every element, to float rounding. So both
    forms track the sum of gradients, each up to its residuals, over T = 6 steps."""
    steps = 6
    want = sum(gradient(r, t).astype(np.float64) for r in range(P) for t in range(steps))
    slack = FLOAT_SLACK * steps * sum(np.abs(gradient(r, t)).astype(np.float64)
                                      for r in range(P) for t in range(steps))
    for collective in ("allgather", "alltoall"):
        runs = run_form(compressor, collective, gradient, steps)
        sent = P * sum(runs[0][0])
        if collective == "allgather":
            residuals = sum(state[key].numpy().astype(np.float64) for _, state in runs)
        else:
            client = sum(unsegment(np.stack([state[f"seg{j}.{key}"].numpy() for j in range(P)]))
                         for _, state in runs)
            server = unsegment(np.stack([state[f"sum.{key}"].numpy() for _, state in runs]))
            residuals = client.astype(np.float64) + server
        assert np.all(np.abs(sent + residuals - want) <= slack + 1e-5), collective
        assert np.linalg.norm(residuals) > 0, collective  # the identity is not trivially 0 = 0


# ---- stochastic compressors: unbiasedness ------------------------------------------------------
@pytest.mark.parametrize("name", STOCHASTIC)
def test_stochastic_compressors_are_unbiased_in_both_forms(name):
    """E[C(y)] = y for dithering/QSGD/TernGrad/natural, so E[(1/P) Σ_r C(x_r)] = a, and for the
    compressed allreduce E[C(S')/P] = E[S']/P = a too (each stage draws its own key). The same
    gradients for T = 200 steps (a new key each step); per element the standardised error of
    the mean, z = (mean − a) / (sample sd / √T), is about N(0, 1) when unbiased. Over the 101
    elements: |mean z| ≤ 0.5 (5 standard errors of a mean of 101), rms z ≤ 1.5 (a bias of one
    standard error everywhere gives rms ≈ 1.4) and max |z| ≤ 7 (the second stage's rounding of
    a sum has heavy tails: at T = 120, natural's alltoall form had one |z| = 5.1 that fell to
    2.1 at T = 600). The keys are fixed, so the test is deterministic."""
    steps = 200
    xs = [gradient(r, 0, n=101) for r in range(P)]
    exact = sum(x.astype(np.float64) for x in xs) / P
    compressor = hc.from_params({"compressor": name})
    for collective in ("allgather", "alltoall"):
        results = np.stack(run_form(compressor, collective, lambda r, s: xs[r], steps)[0][0])
        mean, sd = results.mean(axis=0), results.std(axis=0, ddof=1)
        assert np.all(sd > 0), collective  # every element really random
        z = (mean - exact) / (sd / np.sqrt(steps))
        summary = (collective, float(np.mean(z)), float(np.sqrt(np.mean(z ** 2))),
                   float(np.max(np.abs(z))))
        assert abs(summary[1]) <= 0.5 and summary[2] <= 1.5 and summary[3] <= 7, summary
