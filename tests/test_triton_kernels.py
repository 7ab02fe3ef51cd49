"""The Triton kernels (hvdcompress/ops/triton_kernels.py) run by Triton's interpreter on CPU tensors,
through ``TorchOps(kernels="triton")``: against the numpy references of tests/test_kernels.py
(imported from there), and bit for bit against the C++ kernels' results for the same key.

The interpreter needs ``TRITON_INTERPRET=1`` when triton and the kernels are defined (imported) and
when they run: this module sets it around its imports (no other module imports triton before
pytest collects this one; if one did, the tests skip saying so) and, through the module-scoped
``triton_ops`` fixture, while its tests run, restoring it in between, so other tests see no
change. The interpreter runs each program in numpy: sizes are a few thousand elements, chosen to
leave partial blocks (1024 elements, or 128 packed bytes, per program). A last test compiles
every kernel for a GPU (no GPU needed). Skipped only where triton is not installed.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Callable, Iterator

import numpy as np
import pytest
import torch

_SAVED = os.environ.get("TRITON_INTERPRET")


def _restore_env() -> None:
    if _SAVED is None:
        os.environ.pop("TRITON_INTERPRET", None)
    else:
        os.environ["TRITON_INTERPRET"] = _SAVED


os.environ["TRITON_INTERPRET"] = "1"  # while triton and the kernels are defined (collection)
try:
    triton = pytest.importorskip("triton", reason="triton is not installed (pip install "
                                                  "hvdcompress[gpu]); the Triton kernels cannot be tested")
    from triton.runtime.interpreter import InterpretedFunction

    from hvdcompress.ops import triton_kernels
finally:
    _restore_env()

from test_kernels import (  # noqa: E402
    LEVEL_CASES,
    data,
    decoders,
    np_levels,
    np_magnitude_keys,
    np_minmax,
    np_minmax_sum,
    np_natural_pack,
    np_pack,
    np_sign_runs,
    np_sign_runs_sum,
    np_twobit,
    np_uniform24,
    t,
)
from test_paths_identical import RTOL, SPECS, simulate  # noqa: E402

from hvdcompress.ops.torch_ops import TorchOps  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")  # numpy under the interpreter: NaN casts

SIZES = [1, 7, 8, 9, 1000, 4099]  # 4099: four full 1024-element programs and a partial one


@pytest.fixture(scope="module")
def triton_ops() -> Iterator[TorchOps]:
    """``TorchOps(kernels="triton")`` under the interpreter, with TRITON_INTERPRET=1 set while
    this module's tests run (triton reads it when a kernel runs too)."""
    if not (triton_kernels.INTERPRETED and isinstance(triton.language.sum, InterpretedFunction)):
        pytest.skip("triton was imported before this module without TRITON_INTERPRET=1, so its "
                    "kernels are compiled and need CUDA tensors; run this file on its own")
    os.environ["TRITON_INTERPRET"] = "1"
    try:
        ops = TorchOps(kernels="triton")
        assert ops._impl(torch.zeros(1)) is triton_kernels
        yield ops
    finally:
        _restore_env()


@pytest.fixture(scope="module")
def cpp_ops() -> TorchOps:
    try:
        return TorchOps(kernels=True)
    except ImportError as exc:
        pytest.skip(f"the C++ kernels are not built ({exc})")


def same_bits(got: torch.Tensor, want: np.ndarray) -> None:
    """Equal bit for bit (NaN payloads and -0.0 included)."""
    got = got.numpy().reshape(-1)
    want = np.asarray(want).reshape(-1)
    assert got.dtype == want.dtype, (got.dtype, want.dtype)
    view = {4: np.uint32, 2: np.uint16, 1: np.uint8, 8: np.uint64}[got.dtype.itemsize]
    np.testing.assert_array_equal(got.view(view), want.view(view))


# ---- packers against the numpy references -----------------------------------------------------
@pytest.mark.parametrize("n", SIZES)
def test_sign_pack(triton_ops, n):
    x = data(n, specials=True)
    packed, mean = triton_ops.sign_pack(t(x))
    same_bits(packed, np_pack((~np.signbit(x)).astype(np.uint32), 1))
    if np.isfinite(x).all():
        np.testing.assert_allclose(mean.numpy(), [np.abs(x).astype(np.float64).mean()], rtol=1e-6)
    else:
        assert np.isinf(mean.item())
    x[0] = np.nan
    assert np.isnan(triton_ops.sign_pack(t(x))[1].item())


@pytest.mark.parametrize("n", [5, 3001])
def test_ef_sign_pack_updates_the_residual_in_place(triton_ops, n):
    x, e = data(n, 1), data(n, 2) * 0.1
    residual = t(e)
    packed, scale, new = triton_ops.ef_sign_pack(t(x), residual)
    assert new.data_ptr() == residual.data_ptr()
    p = x + e
    np.testing.assert_allclose(scale.numpy(), [np.abs(p).astype(np.float64).mean()], rtol=1e-6)
    same_bits(packed, np_pack((~np.signbit(p)).astype(np.uint32), 1))
    s = np.float32(scale.item())
    same_bits(residual, p - np.where(np.signbit(p), -s, s))


@pytest.mark.parametrize("n", SIZES)
def test_twobit_pack_without_residual(triton_ops, n):
    x = data(n, specials=True)
    x[n // 2] = np.nan
    packed, residual = triton_ops.twobit_pack(t(x), 0.5)
    assert residual is None
    same_bits(packed, np_pack(np_twobit(x, np.float32(0.5))[0], 2))


def test_twobit_pack_with_residual_over_steps(triton_ops):
    n, threshold = 3001, np.float32(0.7)
    residual_np, residual = np.zeros(n, np.float32), torch.zeros(n)
    for step in range(3):
        x = data(n, step)
        packed, residual = triton_ops.twobit_pack(t(x), float(threshold), residual)
        codes, residual_np = np_twobit(x, threshold, residual_np)
        same_bits(packed, np_pack(codes, 2))
        same_bits(residual, residual_np)


def levels_input(n: int = 3001) -> np.ndarray:
    x = data(n, specials=True)
    x[[7, 9]] = [np.nan, 1e-30]
    return x


def np_uniform(n: int, key: int) -> np.ndarray:
    return np_uniform24(n, key).astype(np.float32) * np.float32(2.0 ** -24)


@pytest.mark.parametrize("key", [1, 123456789, 0xDEADBEEF])  # 1: Triton specialises ints == 1
@pytest.mark.parametrize("levels,natural,inv", LEVEL_CASES)
def test_levels_pack_is_the_documented_rule_bit_for_bit(triton_ops, levels, natural, inv, key):
    x = levels_input()
    level = np_levels(x, inv, levels, natural, np_uniform(x.size, key))
    want = np.where(np.isnan(x), -128, np.where(x < 0, -level, level)).astype(np.int8).view(np.uint8)
    same_bits(triton_ops.levels_pack(t(x), inv, levels, natural, key), want)


def test_ternary_pack_bit_for_bit(triton_ops):
    x = levels_input()
    x[2] = np.nan
    inv, key = 0.5, 42
    level = np_levels(x, inv, 1, False, np_uniform(x.size, key))
    codes = np.where(np.isnan(x), 1, level * np.where(x < 0, 2, 3)).astype(np.uint32)
    same_bits(triton_ops.ternary_pack(t(x), inv, key), np_pack(codes, 2))


@pytest.mark.parametrize("key", [1, 77, 0xFFFFFFFF])
def test_natural_pack_bit_for_bit(triton_ops, key):
    x = levels_input()
    x[[10, 11, 12]] = [np.nan, 1e-35, 1e9]
    same_bits(triton_ops.natural_pack(t(x), key), np_natural_pack(x, key))


@pytest.mark.parametrize("bits", [8, 4])
@pytest.mark.parametrize("n,chunk", [(1, 4), (11, 4), (3000, 256), (4099, 2048), (64, 64), (1500, 1500)])
def test_minmax_pack_and_unpack(triton_ops, n, chunk, bits):
    x = data(n, 8)
    if n > 300:
        x[260] = np.nan
        x[:256] = 1.5  # a constant chunk
    codes, bounds = triton_ops.minmax_pack(t(x), chunk, bits)
    want_codes, want_bounds = np_minmax(x, chunk, bits)
    same_bits(codes, want_codes)
    np.testing.assert_array_equal(bounds.numpy(), want_bounds)  # NaN bounds: NaN
    payloads = [np_minmax(v, chunk, bits) for v in (x, data(n, 9))]
    got = triton_ops.minmax_unpack_sum(t(np.concatenate([q for q, _ in payloads])),
                                       t(np.concatenate([b for _, b in payloads])), n, chunk, bits)
    np.testing.assert_array_equal(got.numpy(), np_minmax_sum(payloads, n, chunk, bits))


@pytest.mark.parametrize("n,run", [(1, 4), (13, 3), (3001, 64), (4099, 1000)])
def test_sign_runs_pack_and_sum(triton_ops, n, run):
    """The codes and per-run means of sign_pack_runs, and the rank-ordered sum of three payloads."""
    x = data(n, 10)
    packed, means = triton_ops.sign_pack_runs(t(x), run)
    want_packed, want_means = np_sign_runs(x, run)
    same_bits(packed, want_packed)
    same_bits(means, want_means)
    payloads = [np_sign_runs(v, run) for v in (x, data(n, 11), -data(n, 12))]
    got = triton_ops.sign_runs_sum(t(np.concatenate([c for c, _ in payloads])),
                                   t(np.concatenate([m for _, m in payloads])), n, run)
    same_bits(got, np_sign_runs_sum(payloads, n, run))


# ---- decoders -----------------------------------------------------------------------------------
@pytest.mark.parametrize("bits", [1, 2, 8])
@pytest.mark.parametrize("n,ranks", [(1, 1), (13, 3), (3001, 2)])
def test_unpack_sum(triton_ops, bits, n, ranks):
    rng = np.random.default_rng(bits * 100 + n)
    codes = rng.integers(0, 1 << bits, size=(ranks, n)).astype(np.uint32)
    tables = rng.standard_normal((ranks, 1 << bits)).astype(np.float32)
    want = np.zeros(n, np.float32)
    for r in range(ranks):
        want = want + tables[r][codes[r]]
    packed = np.concatenate([np_pack(c, bits) for c in codes])
    same_bits(triton_ops.unpack_sum(t(packed), n, bits, t(tables.reshape(-1))), want)


@pytest.mark.parametrize("n,ranks", [(1, 1), (13, 2), (3001, 3), (1000, 4)])
def test_sign_vote(triton_ops, n, ranks):
    xs = [data(n, 20 + r) for r in range(ranks)]
    packed = np.concatenate([np_pack((~np.signbit(x)).astype(np.uint32), 1) for x in xs])
    votes = sum(np.where(np.signbit(x), -1, 1) for x in xs)
    same_bits(triton_ops.sign_vote(t(packed), n, 2.5), (np.sign(votes) * 2.5).astype(np.float32))


@pytest.mark.parametrize("n,ranks", [(1, 1), (13, 2), (3001, 3)])
def test_bf16_sum(triton_ops, n, ranks):
    bits = np.random.default_rng(70 + n).integers(-2 ** 15, 2 ** 15, ranks * n).astype(np.int16)
    bits[0] = np.int16(-32768)  # -0.0
    values = (bits.astype(np.uint16).astype(np.uint32) << np.uint32(16)).view(np.float32)
    want = np.zeros(n, np.float32)
    with np.errstate(invalid="ignore", over="ignore"):  # random patterns include inf and NaN
        for r in range(ranks):
            want = want + values[r * n:(r + 1) * n]
    np.testing.assert_array_equal(triton_ops.bf16_sum(t(bits), n).numpy(), want)


@pytest.mark.parametrize("index_dtype", [np.int32, np.int64])
def test_sparse_sum_adds_repeats_in_order(triton_ops, index_dtype):
    rng = np.random.default_rng(13)
    n = 3000
    indices = rng.integers(0, n, 2500).astype(index_dtype)  # repeats, as across ranks
    indices[100:110] = 17  # a long run
    values = rng.standard_normal(2500).astype(np.float32)
    values[0] = -0.0
    want = np.zeros(n, np.float32)
    np.add.at(want, indices, values)  # float32, in index order: the C++ kernel's sums
    same_bits(triton_ops.sparse_sum(n, t(indices), t(values)), want)
    assert triton_ops.sparse_sum(n, t(indices[:0]), t(values[:0])).abs().sum().item() == 0.0


def test_sparse_sum_checks_indices_before_writing(triton_ops):
    out = torch.full((10,), 7.0)
    with pytest.raises(IndexError, match="index 10 at position 1"):
        triton_ops.sparse_sum(10, torch.tensor([0, 10], dtype=torch.int32), torch.ones(2), out=out)
    with pytest.raises(IndexError, match="index -1 at position 0"):
        triton_ops.sparse_sum(10, torch.tensor([-1, 2]), torch.ones(2), out=out)
    assert torch.equal(out, torch.full((10,), 7.0))


@pytest.mark.parametrize("name", ["unpack_sum", "sign_vote", "minmax_unpack_sum", "sparse_sum"])
def test_decoders_write_into_the_given_buffer(triton_ops, name):
    decode = decoders(3001)[name]
    want = decode(triton_ops, None)
    out = torch.full((3001,), 7.0)  # stale contents must not leak into the result
    got = decode(triton_ops, out)
    assert got.data_ptr() == out.data_ptr()
    same_bits(out, want.numpy())


# ---- DGC: sampled threshold and selection ------------------------------------------------------
@pytest.mark.parametrize("threshold", [0.0, 1.0, 2.5, 100.0])
def test_count_and_select_ge(triton_ops, threshold):
    x = data(4099, 10, specials=True)
    x[100] = np.nan
    selected = ~(np.abs(x) < threshold)
    assert triton_ops.count_ge(t(x), threshold) == selected.sum()
    values, indices = triton_ops.select_ge(t(x), threshold)
    np.testing.assert_array_equal(indices.numpy(), np.nonzero(selected)[0])
    same_bits(values, x[selected])


@pytest.mark.parametrize("start,stride,top", [(0, 1, 1), (3, 7, 50), (0, 11, 373), (2, 1, 4097)])
@pytest.mark.parametrize("ties", [False, True])
def test_sampled_threshold(triton_ops, start, stride, top, ties):
    x = data(4099, 11)
    if ties:
        x = np.round(x * 4) / 4  # keys equal across buckets and passes
    x[3 + 7 * 5] = np.nan
    want = np.sort(np_magnitude_keys(x[start::stride]))[::-1][top - 1:top].view(np.float32)[0]
    got = triton_ops.sampled_threshold(t(x), start, stride, top)
    assert (np.isnan(got) and np.isnan(want)) or got == want


def test_sampled_threshold_rejects_a_rank_outside_the_sample(triton_ops):
    with pytest.raises(ValueError, match=r"top=11 is outside \[1, 10\]"):
        triton_ops.sampled_threshold(torch.zeros(100), 0, 10, 11)


# ---- the same codes as the C++ kernels ---------------------------------------------------------
def _key_ops(x: torch.Tensor) -> dict:
    """Each packer and state update as f(ops) -> tensors, on x (with NaN, infinities, -0.0)."""
    residual = torch.from_numpy(data(x.numel(), 3)) * 0.1
    return {
        "sign_pack": lambda ops: ops.sign_pack(x)[0],
        "ef_sign_pack": lambda ops: ops.ef_sign_pack(x, residual.clone())[0],
        "twobit_pack": lambda ops: ops.twobit_pack(x, 0.5, residual.clone()),
        "levels_pack": lambda ops: [ops.levels_pack(x, inv, lv, nat, 0x9E3779B9)
                                    for lv, nat, inv in LEVEL_CASES],
        "ternary_pack": lambda ops: ops.ternary_pack(x, 0.7, 2 ** 32 - 1),
        "natural_pack": lambda ops: ops.natural_pack(x, 31337),
        "minmax_pack": lambda ops: [ops.minmax_pack(x, chunk, bits) for chunk, bits in
                                    ((3, 8), (100, 8), (2048, 8), (6, 4), (100, 4), (2048, 4))],
        "select_ge": lambda ops: ops.select_ge(x, 1.5),
        "sampled_threshold": lambda ops: torch.as_tensor(ops.sampled_threshold(x, 0, 3, 200)),
        "momentum_correction": lambda ops: [ops.momentum_correction(residual.clone(), x.clone(), x, 0.9, nesterov)
                                            for nesterov in (False, True)],
        "sub_finite": lambda ops: [ops.sub_finite(x, residual), ops.sub_finite(x.clone(), residual, out=x.clone())],
    }


def _flat(result) -> list:
    if isinstance(result, (list, tuple)):
        return [leaf for item in result for leaf in _flat(item)]
    return [] if result is None else [result]


@pytest.mark.parametrize("name", list(_key_ops(torch.zeros(1))))
def test_same_codes_as_the_cpp_kernels(triton_ops, cpp_ops, name):
    x = torch.from_numpy(levels_input(4099))
    op: Callable = _key_ops(x)[name]
    got, want = _flat(op(triton_ops)), _flat(op(cpp_ops))
    assert len(got) == len(want)
    for g, w in zip(got, want):
        same_bits(g, w.numpy())


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: "-".join(map(str, s.values())))
def test_every_compressor_gives_the_cpp_kernels_bits(triton_ops, cpp_ops, spec):
    """A simulated 2-rank, 3-step exchange (tests/test_paths_identical.py): every payload, decoded
    sum and state equal to the C++ path's; PowerSGD's QR and products are torch's (as on the
    plain-torch path), so to its tolerance."""
    want, got = simulate(cpp_ops, spec), simulate(triton_ops, spec)
    assert sorted(got) == sorted(want)
    rtol = RTOL.get(spec["compressor"], {}).get("torch-fallback")
    for name, b in want.items():
        if rtol is not None and b.dtype.kind == "f":
            np.testing.assert_allclose(got[name], b, rtol=rtol, atol=rtol * float(np.nanmax(np.abs(b))),
                                       err_msg=name)
        else:
            same_bits(torch.from_numpy(np.ascontiguousarray(got[name])), b)


# ---- compiled for a GPU ------------------------------------------------------------------------
_P, _U8, _I32P, _I64P = "*fp32", "*u8", "*i32", "*i64"
_PACK = {"n": "i32", "nbytes": "i32", "BYTES": 128}
#: Each kernel (and variant) as {argument: type, or the value of a constexpr}.
KERNEL_SIGNATURES = {
    "_sign_pack_kernel": {"x_ptr": _P, "out_ptr": _U8, "part_ptr": "*fp64", **_PACK},
    "_ef_add_kernel": {"x_ptr": _P, "res_ptr": _P, "out_ptr": _P, "part_ptr": "*fp64", "n": "i32",
                       "BLOCK": 1024},
    "_ef_sign_kernel": {"res_ptr": _P, "scale_ptr": _P, "out_ptr": _U8, **_PACK},
    **{f"_twobit_kernel/{r}": {"x_ptr": _P, "res_ptr": _P, "res_out_ptr": _P, "t_ptr": _P, "out_ptr": _U8,
                               **_PACK, "HAS_RESIDUAL": r} for r in (True, False)},
    **{f"_levels_kernel/{natural}/{levels}": {
        "x_ptr": _P, "inv_ptr": _P, "out_ptr": _U8, "n": "i32", "levels": levels, "smallest": "fp32",
        "stretch": "fp32", "key": "i32", "NATURAL": natural, "BLOCK": 1024}
       for natural in (True, False) for levels in ("i32", 1)},  # ints equal to 1 are constants
    "_ternary_kernel": {"x_ptr": _P, "inv_ptr": _P, "out_ptr": _U8, **_PACK, "key": "i32"},
    "_natural_kernel": {"x_ptr": _P, "out_ptr": _U8, "n": "i32", "key": "i32", "BLOCK": 1024},
    **{f"_unpack_sum_kernel/{bits}/{vote}": {
        "packed_ptr": _U8, "tables_ptr": _U8 if vote else _P, "scale_ptr": _P if vote else _U8,
        "out_ptr": _P, "n": "i32", "nbytes": "i32", "R": "i32", "BITS": bits, "VOTE": vote,
        "BYTES": 1024 if bits == 8 else 128} for bits, vote in ((1, False), (2, False), (8, False), (1, True))},
    "_bf16_sum_kernel": {"bits_ptr": "*i16", "out_ptr": _P, "n": "i32", "R": "i32", "BLOCK": 1024},
    **{f"_minmax_pack_kernel/{chunk}/{bits}": {"x_ptr": _P, "codes_ptr": _U8, "bounds_ptr": _P, "n": "i32",
                                               "chunk": chunk, "chunks": "i32", "ROWS": rows, "COLS": 1024 // rows,
                                               "BITS": bits}
       for chunk, rows, bits in (("i32", 1, 8), ("i32", 256, 8), (1, 1024, 8), ("i32", 1, 4), ("i32", 256, 4))},
    **{f"_minmax_unpack_kernel/{bits}": {"codes_ptr": _U8, "bounds_ptr": _P, "out_ptr": _P, "n": "i32",
                                         "nbytes": "i32", "chunk": "i32", "chunks": "i32", "R": "i32",
                                         "BLOCK": 1024, "BITS": bits} for bits in (8, 4)},
    "_sign_runs_kernel": {"packed_ptr": _U8, "means_ptr": _P, "out_ptr": _P, "n": "i32", "nbytes": "i32",
                          "run": "i32", "runs": "i32", "R": "i32", "BLOCK": 1024},
    "_count_kernel": {"x_ptr": _P, "t_ptr": _P, "counts_ptr": _I64P, "n": "i32", "BLOCK": 1024},
    "_select_kernel": {"x_ptr": _P, "t_ptr": _P, "starts_ptr": _I64P, "values_ptr": _P, "indices_ptr": _I64P,
                       "n": "i32", "BLOCK": 1024},
    **{f"_radix_histogram_kernel/{first}": {"x_ptr": _P, "state_ptr": _I32P, "hist_ptr": _I32P, "start": "i32",
                                            "stride": "i32", "count": "i32", "SHIFT": 24 if first else 0,
                                            "FIRST": first, "BLOCK": 1024} for first in (True, False)},
    **{f"_radix_select_kernel/{first}": {"state_ptr": _I32P, "hist_ptr": _I32P, "top": "i32",
                                         "SHIFT": 24 if first else 8, "FIRST": first} for first in (True, False)},
    **{f"_momentum_kernel/{nesterov}": {"g_ptr": _P, "u_ptr": _P, "v_ptr": _P, "mu_ptr": _P, "u_out_ptr": _P,
                                         "v_out_ptr": _P, "n": "i32", "NESTEROV": nesterov, "BLOCK": 1024}
       for nesterov in (False, True)},
    "_sub_finite_kernel": {"a_ptr": _P, "b_ptr": _P, "out_ptr": _P, "n": "i32", "BLOCK": 1024},
    **{f"_segment_sum_kernel/{index}": {"sorted_ptr": index, "values_ptr": _P, "out_ptr": _P, "m": "i32",
                                        "BLOCK": 1024} for index in (_I32P, _I64P)},
}
COMPILE = """
import json, sys
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from hvdcompress.ops import triton_kernels
for name, args in json.loads(sys.argv[1]).items():
    signature = {a: t if isinstance(t, str) else "constexpr" for a, t in args.items()}
    constants = {a: t for a, t in args.items() if not isinstance(t, str)}
    kernel = getattr(triton_kernels, name.split("/")[0])
    ptx = triton.compile(ASTSource(kernel, signature, constants), target=GPUTarget("cuda", 90, 32),
                         options=triton_kernels.LAUNCH).asm["ptx"]
    print(json.dumps({"kernel": name, "fma": ptx.count("fma.rn.f32"), "approx_div": ptx.count("div.full") +
                      ptx.count("div.approx"), "ieee_div": ptx.count("div.rn.f32")}))
"""


def test_every_kernel_compiles_for_a_gpu_without_fma_or_approximate_division(tmp_path):
    """Triton's compiler (to PTX, then ptxas, both in the triton wheel) needs no GPU: every kernel
    compiles for sm_90 in a process without the interpreter, with no fused multiply-add (the C++
    kernels' -ffp-contract=off) and only IEEE divisions, as the bit-exactness above requires."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.update(TRITON_CACHE_DIR=str(tmp_path), OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, "-c", COMPILE, json.dumps(KERNEL_SIGNATURES)], env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    compiled = [json.loads(line) for line in proc.stdout.splitlines()]
    assert [c["kernel"] for c in compiled] == list(KERNEL_SIGNATURES)
    assert {c["kernel"] for c in compiled if c["fma"] or c["approx_div"]} == set()
    assert all(c["ieee_div"] > 0 for c in compiled if "minmax" in c["kernel"])  # 255 / range, range / 255
    kernels = {name for name in dir(triton_kernels) if name.endswith("_kernel")}
    assert kernels == {name.split("/")[0] for name in KERNEL_SIGNATURES}, "a kernel is not compiled here"


# ---- dispatch -----------------------------------------------------------------------------------
def test_kernels_argument_is_checked():
    with pytest.raises(ValueError, match="kernels='cuda'; allowed: None, True, False, 'triton'"):
        TorchOps(kernels="cuda")


def test_cpu_tensors_use_the_triton_kernels_only_when_asked(triton_ops):
    module = triton_ops._impl(torch.zeros(1))
    assert TorchOps(kernels=False)._impl(torch.zeros(1)) is not module
    assert TorchOps()._impl(torch.zeros(1)) is not module
