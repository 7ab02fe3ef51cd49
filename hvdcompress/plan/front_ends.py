"""The copies of every gradient that a front end makes beside the exchange.

DDP (``torch.nn.parallel.DistributedDataParallel``, ``gradient_as_bucket_view=False``, its
default) copies each gradient into its bucket as autograd produces it, in the backward pass,
and the bucket back into ``.grad`` after the communication hook's future completes. A hook that
does not reduce the bucket in place (every compression hook: DDP's fp16 and PowerSGD hooks,
ours) also writes the decoded average into the bucket: one more pass. Each pass costs the
calibration's ``copy_s_per_byte`` per gradient byte (memory bandwidth; 0 where it was not
measured, e.g. on a GPU), whatever the compressor sends: DDP at 33.6M parameters copies 134 MB
three times a step (~0.1 s on this project's 2-core CPU), the difference between its dense step
and a compressed one that a model of the wire alone misses.

Horovod's optimizers copy into and out of the fusion buffer what they send (the payload, not
the gradient): that cost scales with the bytes on the wire and sits in the link's fitted
seconds per byte. No copy is added for them.

Per tensor, a front end's Python costs the calibration's ``per_tensor`` (and ``per_member`` in
a fused bucket; :mod:`hvdcompress.torch.job_costs`): hvdcompress's hooks on either front end,
Horovod's own hook for its dense and fp16 exchange. DDP's own dense and fp16 (``native_per_tensor``
False) run in its C++ reducer, per bucket: nothing per tensor.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping


@dataclass(frozen=True)
class FrontEnd:
    """``hook_copies`` passes over each gradient while the backward runs (they delay it),
    ``sync_copies`` after the exchange, and ``decode_copies`` more there for a compressor
    (anything but ``none``, which reduces in place); ``native_per_tensor``: whether the front
    end's own dense and fp16 exchange pay the measured cost per tensor."""

    name: str
    hook_copies: int = 0
    sync_copies: int = 0
    decode_copies: int = 0
    native_per_tensor: bool = True

    def copies(self, dense: bool) -> tuple:
        """(passes in the hook, passes after the exchange) for a dense or a compressed exchange."""
        return self.hook_copies, self.sync_copies + (0 if dense else self.decode_copies)


def native(spec: Mapping[str, str]) -> bool:
    """Whether ``spec`` is the front end's own exchange, the references of the speed-ups:
    ``none`` or ``fp16`` alone (Horovod's optimizer, DDP's reducer and fp16 hook), not one of
    hvdcompress's compressors."""
    return len(spec) == 1 and spec.get("compressor") in ("none", "fp16")


HOROVOD = FrontEnd("horovod")
DDP = FrontEnd("ddp", hook_copies=1, sync_copies=1, decode_copies=1, native_per_tensor=False)
FRONT_ENDS = {f.name: f for f in (HOROVOD, DDP)}
