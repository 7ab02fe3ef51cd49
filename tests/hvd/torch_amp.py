"""Mixed precision with a loss scaler under 2 ranks (tests/test_amp.py; hvdcompress.step.loss_scale).

A 64-300-10 MLP in float32, its forward under ``torch.autocast("cpu", bf16 / fp16)``, 30 steps
on each rank's own batches. Every run of one compressor starts from the same weights; the
GradScaler starts at 2^INIT[dtype] and doubles every 3 steps (growth_interval=3) without overflowing,
so the scale takes eleven values. Modes:

  plain:    no scaler (the reference);
  horovod:  Horovod's AMP pattern without scaler= (synchronize, unscale_, skip_synchronize,
            scaler.step, update): what the issue measured;
  scaler:   scaler= and PyTorch's recipe (scaler.step(opt); scaler.update());
  sync:     scaler= and Horovod's pattern without unscale_ (synchronize; skip_synchronize:
            scaler.step).

Each record: the gap |w_mode - w_plain| / |w_plain - w_0|, a checksum of the weights (ranks
compared by the test), the scale at the end, the warnings raised.

Overflow (``overflow_<case>``, scaler=): on step OVERFLOW_STEP rank 1's loss is multiplied by
inf. Recorded: whether the compressor state after that step equals, exactly, the state before
it, whether the weights moved, the scale before and after, and the gap to the plain run
that leaves that step's batches out (the skipped step must be as if it never happened).
"""
import hashlib
import warnings

import horovod.torch as hvd
import torch
from common import result

import hvdcompress as hc
import hvdcompress.torch as hvc

hvd.init()
rank = hvd.rank()
STEPS, OVERFLOW_STEP = 30, 12
#: log2 of the initial scale: 2^20 after 30 steps in bf16 (float32's range); 2^12 in fp16, whose
#: largest value is 65504, so that no step overflows
INIT = {torch.bfloat16: 10, torch.float16: 2}

CASES = {  # name -> (compressor factory, optimizer factory[, DistributedOptimizer keywords])
    "none": (hc.NoCompression, lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9)),
    "onebit_ef": (lambda: hc.ErrorFeedback(hc.OneBit()), lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9)),
    "topk_ef": (lambda: hc.ErrorFeedback(hc.TopK(0.05)), lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9)),
    "dgc": (lambda: hc.DGC(0.95, min_numel=0), lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9)),
    "powersgd": (lambda: hc.PowerSGD(2), lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9)),
    "momentum_topk_ef": (lambda: hc.Momentum(hc.ErrorFeedback(hc.TopK(0.05)), nesterov=True),
                         lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9)),
    "frozen_adam": (lambda: hc.FrozenAdam(hc.ErrorFeedback(hc.OneBit()), freeze_steps=8),
                    lambda p: torch.optim.AdamW(p, lr=1e-3)),
    # fusion=: the bucket's residual is saved and restored under the bucket's name
    "fused_onebit_ef": (lambda: hc.ErrorFeedback(hc.OneBit()), lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9),
                        {"fusion": True}),
}


def model_and_batches(dtype):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 300), torch.nn.ReLU(), torch.nn.Linear(300, 10))
    gen = torch.Generator().manual_seed(1000 + rank)
    data = [(torch.randn(16, 64, generator=gen), torch.randint(0, 10, (16,), generator=gen))
            for _ in range(STEPS)]
    return model, data


def loss_of(model, x, y, dtype, poison=False):
    with torch.autocast("cpu", dtype=dtype):
        loss = torch.nn.functional.cross_entropy(model(x), y)
    return loss * float("inf") if poison else loss


def flat(model) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def checksum(model) -> str:
    return hashlib.sha256(flat(model).numpy().tobytes()).hexdigest()[:16]


def state_copy(opt) -> dict:
    return {name: {k: v.clone() if torch.is_tensor(v) else v for k, v in st.items()}
            for name, st in opt._tensor_state.items()}


def same_state(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(
        a[n].keys() == b[n].keys() and all(
            torch.equal(a[n][k], b[n][k]) if torch.is_tensor(a[n][k]) else a[n][k] == b[n][k]
            for k in a[n]) for n in a)


def train(case, mode, dtype, skip=None, overflow_at=None):
    """Weights after the run; ``skip``: a step whose batches are left out (plain only)."""
    make_comp, make_opt, *extra = CASES[case]
    model, data = model_and_batches(dtype)
    scaler = None if mode == "plain" else torch.amp.GradScaler("cpu", init_scale=2.0 ** INIT[dtype], growth_interval=3)
    opt = hvc.DistributedOptimizer(make_opt(model.parameters()), named_parameters=model.named_parameters(),
                                   compression=make_comp(),
                                   scaler=scaler if mode in ("scaler", "sync") else None, **(extra or [{}])[0])
    info = {}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for step, (x, y) in enumerate(data):
            if step == skip:
                continue
            opt.zero_grad()
            poison = step == overflow_at and rank == 1
            if mode == "plain":
                loss_of(model, x, y, dtype).backward()
                opt.step()
                continue
            if step == overflow_at:
                info["state_before"], info["weights_before"] = state_copy(opt), flat(model)
                info["scale_before"] = scaler.get_scale()
            scaler.scale(loss_of(model, x, y, dtype, poison)).backward()
            if mode == "horovod":
                opt.synchronize()
                scaler.unscale_(opt)
                with opt.skip_synchronize():
                    scaler.step(opt)
            elif mode == "sync":
                opt.synchronize()
                with opt.skip_synchronize():
                    scaler.step(opt)
            else:
                scaler.step(opt)
            scaler.update()
            if step == overflow_at:
                info["same_state"] = same_state(info.pop("state_before"), state_copy(opt))
                info["weights_moved"] = not torch.equal(info.pop("weights_before"), flat(model))
                info["scale_after"] = scaler.get_scale()
    info["warnings"] = [str(w.message) for w in caught]
    info["scale"] = None if scaler is None else scaler.get_scale()
    return model, info


def gap(model, reference, start) -> float:
    return float((flat(model) - flat(reference)).norm() / (flat(reference) - start).norm())


for dtype_name, dtype in (("bf16", torch.bfloat16), ("fp16", torch.float16)):
    for case in CASES:
        if dtype_name == "fp16" and case not in ("none", "onebit_ef", "dgc"):
            continue
        start = flat(model_and_batches(dtype)[0])
        plain, _ = train(case, "plain", dtype)
        for mode in ("horovod", "scaler", "sync"):
            if mode == "sync" and case not in ("topk_ef", "dgc"):
                continue
            model, info = train(case, mode, dtype)
            result(rank, case=f"{mode}_{case}_{dtype_name}", gap=gap(model, plain, start),
                   checksum=checksum(model), scale=info["scale"], warnings=info["warnings"])

for case in CASES:
    dtype = torch.bfloat16
    start = flat(model_and_batches(dtype)[0])
    model, info = train(case, "scaler", dtype, overflow_at=OVERFLOW_STEP)
    reference, _ = train(case, "plain", dtype, skip=OVERFLOW_STEP)
    result(rank, case=f"overflow_{case}", gap=gap(model, reference, start), checksum=checksum(model),
           same_state=info["same_state"], weights_moved=info["weights_moved"],
           scale_before=info["scale_before"], scale_after=info["scale_after"], scale=info["scale"],
           warnings=info["warnings"])
