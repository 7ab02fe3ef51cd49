"""The plain-torch implementation of the kernels in kernels.h (which specifies them), with the
signatures of the kernel table (:mod:`hvdcompress.ops.table`).

Used on devices the C++ kernels do not cover, and when the kernel library is not built (or
HVDCOMPRESS_DISABLE_KERNELS=1). It follows kernels.h bit for bit, random numbers included: the
stochastic kernels draw the same counter-based uniforms (:func:`uniform24`), so every path gives
the same codes for the same key. Argument checking is done by the caller
(:class:`hvdcompress.ops.facade.Ops`).
"""
from __future__ import annotations

from typing import Optional, Tuple

import torch

from . import counter_hash, table
from .layout import SHIFTS, check_minmax, packed_bytes
from .table import implements

Tensor = torch.Tensor

#: Scalar arguments (thresholds, ``inv``) may be 0-d or 1-element tensors on the data's device,
#: and ``count_ge`` and ``sampled_threshold`` return 0-d tensors there: no host reads.
DEVICE_SCALARS = True

def _pack(codes: Tensor, bits: int) -> Tensor:
    """Integer codes (< 2**bits) packed first-element-in-the-highest-bits, as uint8."""
    per = 8 // bits
    n = codes.numel()
    padded = torch.zeros(packed_bytes(n, bits) * per, dtype=torch.int32, device=codes.device)
    padded[:n] = codes
    shifts = torch.tensor(SHIFTS[bits], dtype=torch.int32, device=codes.device)
    return (padded.view(-1, per) << shifts).sum(1, dtype=torch.int32).to(torch.uint8)


def _unpack(packed: Tensor, n: int, bits: int) -> Tensor:
    """The first ``n`` ``bits``-bit codes of ``packed`` as int64."""
    shifts = torch.tensor(SHIFTS[bits], dtype=torch.int32, device=packed.device)
    codes = (packed.to(torch.int32).view(-1, 1) >> shifts) & ((1 << bits) - 1)
    return codes.view(-1)[:n].long()


def _sign_bits(x: Tensor) -> Tensor:
    return (~torch.signbit(x)).to(torch.int32)


def _finite_or_zero(x: Tensor) -> Tensor:
    return torch.where(torch.isfinite(x), x, torch.zeros_like(x))


def uniform24(n: int, key: int, device) -> Tensor:
    """kernels.h's uniforms as 24-bit integers (int64) of elements 0..n-1, on ``device``
    (:mod:`hvdcompress.ops.counter_hash`)."""
    return counter_hash.uniform24(torch.arange(n, dtype=torch.int64, device=device), key)


def shared_indices(n: int, k: int, key: int, device) -> Tensor:
    """RandomK's ``k`` indices of [0, n), one per stratum, on ``device``
    (:func:`hvdcompress.ops.counter_hash.stratified`)."""
    return counter_hash.stratified(torch.arange(k, dtype=torch.int64, device=device), n, k, key)


def _uniform(n: int, key: int, device) -> Tensor:
    """The uniforms in [0, 1) as float32: ``uniform24 * 2^-24`` (exact)."""
    return uniform24(n, key, device).to(torch.float32) * (1.0 / 16777216.0)


def _into(out: Optional[Tensor], value: Tensor) -> Tensor:
    """``value`` written into the buffer ``out`` when given (an in-place update), else itself."""
    return value if out is None else out.copy_(value.view(out.shape))


@implements
def sign_pack(x: Tensor) -> Tuple[Tensor, Tensor]:
    mean = x.abs().sum(dtype=torch.float64) / max(1, x.numel())
    return _pack(_sign_bits(x), 1), mean.to(torch.float32).view(1)


def run_means(x: Tensor, run: int) -> Tensor:
    """The mean |x| of each run of ``run`` elements, summed in double (``sign_pack_runs``)."""
    sums = torch.nn.functional.pad(x.abs().double(), (0, -x.numel() % run)).view(-1, run).sum(1)
    return (sums / (x.numel() - torch.arange(sums.numel(), device=x.device) * run).clamp(max=run)).float()


@implements
def sign_pack_runs(x: Tensor, run: int) -> Tuple[Tensor, Tensor]:
    return _pack(_sign_bits(x), 1), run_means(x, run)


@implements
def ef_sign_pack(x: Tensor, residual: Tensor, out: Optional[Tensor] = None) -> Tuple[Tensor, Tensor, Tensor]:
    p = x + residual
    packed, scale = sign_pack(p)
    sent = torch.where(torch.signbit(p), -scale, scale)
    return packed, scale, _into(out, _finite_or_zero(p - sent))


def _twobit_codes(v: Tensor, t: float) -> Tensor:
    return (3 * (v >= t).int() + 2 * (v <= -t).int() + torch.isnan(v).int())


@implements
def twobit_pack(x: Tensor, threshold: float, residual: Optional[Tensor] = None,
                out: Optional[Tensor] = None) -> Tuple[Tensor, Optional[Tensor]]:
    if residual is None:
        return _pack(_twobit_codes(x, threshold), 2), None
    v = x + residual
    codes = _twobit_codes(v, threshold)
    sent = threshold * ((v >= threshold).float() - (v <= -threshold).float())
    return _pack(codes, 2), _into(out, _finite_or_zero(v - sent))


def _levels(x: Tensor, inv: float, levels: int, natural: bool, key: int) -> Tensor:
    """Stochastic level in [0, levels] of |x| * inv (kernels.h), as int64."""
    r = torch.nan_to_num(x.abs() * inv, nan=0.0)
    u = _uniform(x.numel(), key, x.device)
    if natural:
        r = r.clamp(max=2.0)
        mantissa, exponent = torch.frexp(r)
        big = (exponent.long() + levels - 1 + (u < 2 * mantissa - 1).long()).clamp(max=levels)
        small = (u < r * 2.0 ** (levels - 1)).long()
        return torch.where(r < 2.0 ** (1 - levels), small, big)
    r = r.clamp(max=levels + 1.0)
    low = r.floor()
    return (low.long() + (u < r - low).long()).clamp(max=levels)


@implements
def levels_pack(x: Tensor, inv: float, levels: int, natural: bool, key: int) -> Tensor:
    level = _levels(x, inv, levels, natural, key)
    code = torch.where(x < 0, -level, level)
    code = torch.where(torch.isnan(x), torch.full_like(code, -128), code)
    return code.to(torch.int8).view(torch.uint8)


@implements
def ternary_pack(x: Tensor, inv: float, key: int) -> Tensor:
    level = _levels(x, inv, 1, False, key)
    codes = level * torch.where(x < 0, 2, 3) + torch.isnan(x).long()
    return _pack(codes.int(), 2)


@implements
def natural_pack(x: Tensor, key: int) -> Tensor:
    bits = x.view(torch.int32)
    mag = bits & 0x7FFFFFFF
    field = mag >> 23
    u24 = uniform24(x.numel(), key, x.device)
    e8 = field + (u24 < 2 * (mag & 0x7FFFFF)).int()
    c = torch.where(e8 < 27, 0, torch.where(e8 > 152, 127, e8 - 26))
    c = torch.where(field == 0, 0, c) | (torch.signbit(x).int() << 7)
    return torch.where(mag > 0x7F800000, 0x80, c).to(torch.uint8)


@implements
def half_cast(x: Tensor, bf16: bool) -> Tensor:
    """The framework's round-to-nearest-even cast, with kernels.h's NaN bits on every device (a
    framework's own NaN bits vary: torch's CPU bfloat16 gives 0xFFFF, TensorFlow's 0x7FC0 or
    0xFFC0)."""
    nan = torch.isnan(x)
    if bf16:
        return x.to(torch.bfloat16).view(torch.int16).masked_fill_(nan, -1)
    # For the NaNs: their sign and top 10 payload bits on the exponent of 2^15 (bits & 0x807FE000,
    # written as an int32, | 0x47000000) convert exactly on every device, to sign | 0x7800 |
    # payload; | 0x0600 then adds the exponent's last bit and the quiet bit.
    payload = (x.view(torch.int32) & -0x7F802000).bitwise_or_(0x47000000).view(torch.float32)
    quiet = payload.to(torch.float16).view(torch.int16).bitwise_or_(0x0600)
    return torch.where(nan, quiet, x.to(torch.float16).view(torch.int16))


def _output(out: Optional[Tensor], n: int, device) -> Tensor:
    """The caller's buffer zeroed, or a new zero buffer (decoders accumulate into it)."""
    return torch.zeros(n, dtype=torch.float32, device=device) if out is None else out.zero_()


@implements
def unpack_sum(packed: Tensor, n: int, bits: int, tables: Tensor, out: Optional[Tensor] = None) -> Tensor:
    per_rank = packed_bytes(n, bits)
    out = _output(out, n, packed.device)
    for r, payload in enumerate(packed.split(per_rank)):
        table = tables[r << bits:(r + 1) << bits]
        out += table[_unpack(payload, n, bits)]
    return out


@implements
def bf16_sum(bits: Tensor, n: int, out: Optional[Tensor] = None) -> Tensor:
    out = _output(out, n, bits.device)
    for payload in bits.split(n):
        out += payload.view(torch.bfloat16).float()
    return out


def _fp16_values(h: Tensor) -> Tensor:
    """The float32 values of the binary16 patterns ``h`` (int16), NaNs as kernels.h's fp16_sum
    (sign and payload kept, quiet; a framework's own NaN bits vary)."""
    h = h.int()
    nan = (h & 0x7C00 == 0x7C00) & (h & 0x3FF != 0)
    quiet = torch.where(h < 0, -0x80000000, 0).bitwise_or_((h & 0x3FF) << 13).bitwise_or_(0x7FC00000).int()
    return torch.where(nan, quiet.view(torch.float32), h.short().view(torch.float16).float())


@implements
def fp16_sum(bits: Tensor, n: int, out: Optional[Tensor] = None) -> Tensor:
    payloads = bits.split(n)
    out = torch.empty(n, dtype=torch.float32, device=bits.device) if out is None else out
    out.copy_(_fp16_values(payloads[0]))  # not from +0.0: a single payload keeps its -0.0
    for payload in payloads[1:]:
        out += _fp16_values(payload)
    return out


@implements
def sign_vote(packed: Tensor, n: int, scale: float, out: Optional[Tensor] = None) -> Tensor:
    ranks = packed.numel() // packed_bytes(n, 1)
    tables = torch.tensor([-1.0, 1.0], device=packed.device).repeat(ranks)
    return unpack_sum(packed, n, 1, tables, out).sign_().mul_(scale)


def _rows(x: Tensor, chunk: int) -> list:
    """``x`` as [full chunks (rows), last partial chunk (one row)], leaving out empty parts."""
    full = x.numel() // chunk * chunk
    parts = [x[:full].view(-1, chunk), x[full:].view(1, -1)]
    return [p for p in parts if p.numel()]


@implements
def minmax_pack(x: Tensor, chunk: int, bits: int = 8) -> Tuple[Tensor, Tensor]:
    check_minmax("minmax_pack", chunk, bits)
    top, codes, bounds = float((1 << bits) - 1), [x.new_zeros(0, dtype=torch.uint8)], [x.new_zeros(0)]
    for rows in _rows(x, chunk):
        mn, mx = rows.amin(1, keepdim=True), rows.amax(1, keepdim=True)
        bad = ~torch.isfinite(rows).all(1, keepdim=True)
        inv = torch.where(mx - mn > 0, top / (mx - mn), torch.zeros_like(mn))
        q = torch.round((rows - mn) * inv).clamp(0, top)
        codes.append(torch.where(bad, torch.zeros_like(q), q).to(torch.uint8).view(-1))
        bounds.append(torch.where(bad, float("nan"), torch.cat([mn, mx], 1)).view(-1))
    codes8 = torch.cat(codes)   # 4 bits: packed two per byte
    return codes8 if bits == 8 else _pack(codes8.to(torch.int32), bits), torch.cat(bounds)


@implements
def sign_runs_sum(packed: Tensor, means: Tensor, n: int, run: int, out: Optional[Tensor] = None) -> Tensor:
    out, scales = _output(out, n, packed.device), means.view(-1, -(-n // run)).repeat_interleave(run, 1)
    for payload, scale in zip(packed.split(packed_bytes(n, 1)), scales[:, :n]):
        out += torch.where(_unpack(payload, n, 1).bool(), scale, -scale)
    return out


@implements
def minmax_unpack_sum(codes: Tensor, bounds: Tensor, n: int, chunk: int, bits: int = 8,
                      out: Optional[Tensor] = None) -> Tensor:
    check_minmax("minmax_unpack_sum", chunk, bits)
    chunks, top = -(-n // chunk), float((1 << bits) - 1)
    out = _output(out, n, codes.device)
    for r, payload in enumerate(codes.split(packed_bytes(n, bits))):
        pairs = bounds[2 * chunks * r:2 * chunks * (r + 1)].view(chunks, 2)
        decoded, c = [], 0
        for rows in _rows(payload if bits == 8 else _unpack(payload, n, bits), chunk):
            mn, mx = pairs[c:c + rows.shape[0], 0:1], pairs[c:c + rows.shape[0], 1:2]
            decoded.append((mn + rows.float() * ((mx - mn) / top)).view(-1))
            c += rows.shape[0]
        out += torch.cat(decoded)
    return out


@implements
def max_abs(x: Tensor) -> Tensor:
    if x.numel() == 0:
        return torch.zeros((), dtype=x.dtype, device=x.device)
    low, high = torch.aminmax(x)
    return torch.maximum(-low, high)


@implements
def l2_norm(x: Tensor) -> Tensor:
    return x.double().square().sum().sqrt().to(torch.float32)


def _selected(x: Tensor, t: float) -> Tensor:
    return ~(x.abs() < t)


@implements
def count_ge(x: Tensor, threshold: float) -> Tensor:
    return _selected(x, threshold).sum()


@implements
def select_ge(x: Tensor, threshold: float) -> Tuple[Tensor, Tensor]:
    indices = torch.nonzero(_selected(x, threshold)).view(-1)
    return x[indices], indices


def _keys(x: Tensor) -> Tensor:
    """Magnitude order keys: the bit pattern of |x| (NaN above +inf), as int32."""
    return x.view(torch.int32) & 0x7FFFFFFF


@implements
def sampled_threshold(x: Tensor, start: int, stride: int, top: int) -> Tensor:
    keys = _keys(x[start::stride].contiguous())
    kth = torch.topk(keys, top).values[-1]
    return kth.view(1).view(torch.float32).view(())


@implements
def topk_abs(x: Tensor, k: int) -> Tuple[Tensor, Tensor]:
    if k == 0:
        return x[:0], torch.zeros(0, dtype=torch.int64, device=x.device)
    keys = _keys(x)
    kth = torch.topk(keys, k).values[-1]
    above = torch.nonzero(keys > kth).view(-1)
    ties = torch.nonzero(keys == kth).view(-1)[:k - above.numel()]
    indices = torch.cat([above, ties]).sort().values
    return x[indices], indices


@implements
def sparse_sum(n: int, indices: Tensor, values: Tensor, out: Optional[Tensor] = None) -> Tensor:
    bad = torch.nonzero((indices < 0) | (indices >= n)).view(-1)
    if bad.numel():
        j = int(bad[0])
        raise IndexError(f"scatter_add: index {int(indices[j])} at position {j} is outside [0, {n})")
    return _output(out, n, values.device).index_add_(0, indices.long(), values)


@implements
def fill_at(x: Tensor, indices: Tensor, value: float, out: Optional[Tensor] = None,
            non_finite_only: bool = False) -> Tensor:
    bad = torch.nonzero((indices < 0) | (indices >= x.numel())).view(-1)
    if bad.numel():
        j = int(bad[0])
        raise IndexError(f"fill_at: index {int(indices[j])} at position {j} is outside [0, {x.numel()})")
    target = x.clone() if out is None else _into(out, x) if out is not x else x
    if non_finite_only:
        sent = target[indices]
        return target.index_put_((indices,), torch.where(torch.isfinite(sent), sent, value))
    return target.index_fill_(0, indices, value)


@implements
def sub_finite(a: Tensor, b: Tensor, out: Optional[Tensor] = None) -> Tensor:
    out = torch.sub(a, b) if out is None else torch.sub(a, b, out=out)
    return out.masked_fill_(~torch.isfinite(out), 0.0)


@implements
def momentum_correction(g: Tensor, u: Tensor, v: Tensor, mu: float, nesterov: bool,
                        u_out: Optional[Tensor] = None, v_out: Optional[Tensor] = None) -> Tuple[Tensor, Tensor]:
    """In the order of kernels.h (so the results are bit-identical)."""
    new_u = (u + g) * mu if nesterov else u * mu + g
    new_v = (v + new_u) + g if nesterov else v + new_u
    return _into(u_out, new_u), _into(v_out, new_v)


@implements
def dgc_select(g: Tensor, u: Tensor, v: Tensor, mu: float, nesterov: bool, start: int, stride: int, top: int,
               cap: int, low: int, high: int, masking: bool, u_out: Optional[Tensor] = None,
               v_out: Optional[Tensor] = None) -> Tuple[Tensor, Tensor, Tensor, Tensor, int, float]:
    """kernels.h ``dgc_select`` as momentum_correction, sampled_threshold, select_ge and
    fill_at: the count is read on the host (the outputs' size depends on it)."""
    if not 0 <= cap <= g.numel():
        raise ValueError(f"dgc_select: cap={cap} is out of range; allowed: 0..{g.numel()}")
    new_u, new_v = momentum_correction(g, u, v, mu, nesterov)
    threshold = float(sampled_threshold(new_v, start, stride, top))
    threshold = threshold if threshold == threshold else float("inf")
    selected = _selected(new_v, threshold)
    count = int(selected.sum())
    if low <= count <= high:
        indices = torch.nonzero(selected).view(-1)[:cap]
        values = new_v[indices]
        new_v = fill_at(new_v, indices, 0.0, out=new_v)
        new_u = fill_at(new_u, indices, 0.0, out=new_u, non_finite_only=not masking)
    else:
        indices = torch.zeros(0, dtype=torch.int64, device=g.device)
        values = new_v[indices]
    return _into(u_out, new_u), _into(v_out, new_v), values, indices, count, threshold


@implements
def lowrank_project(e: Tensor, g: Optional[Tensor], q: Tensor,
                    out: Optional[Tensor] = None) -> Tuple[Tensor, Tensor]:
    m = e.clone() if out is None else out if out is e else out.copy_(e)
    if g is not None:
        m.add_(g)
    return m, m @ q


@implements
def lowrank_project_back(m: Tensor, p: Tensor) -> Tensor:
    return m.t() @ p


@implements
def lowrank_residual(m: Tensor, p: Tensor, q: Tensor, out: Optional[Tensor] = None) -> Tensor:
    return sub_finite(m.reshape(-1), (p @ q.t()).view(-1), out=None if out is None else out.view(-1))


table.implementation(globals())  # every kernel of the table, checked at import
