"""Count the device-to-host reads hvdcompress makes per training step, per compressor.

Runs on the path CUDA tensors take without triton: HVDCOMPRESS_DISABLE_KERNELS=1 (set below,
before hvdcompress is imported) turns the C++ kernels off, so every tensor goes through the
plain-torch fallback (hvdcompress/ops/torch_fallback.py), as CUDA tensors do when triton is not
importable. The torch.Tensor methods that read a tensor on the host are wrapped; a call counts
when hvdcompress/ is on its stack (the test's own calls and Horovod's are not counted). Wrapping
the methods, not a TorchFunctionMode, because compression runs in autograd hooks, which a mode
does not see. Reports, per compressor, the counts of the measured steps and where they came from.

Usage: torch_host_sync.py STEPS SPECS (SPECS: a JSON list of from_params specs); the first step
of each compressor is a warm-up and not counted.
"""
import collections
import json
import os
import sys

os.environ["HVDCOMPRESS_DISABLE_KERNELS"] = "1"

import horovod.torch as hvd  # noqa: E402
import torch  # noqa: E402
from common import result  # noqa: E402
from torch_common import batches, mlp  # noqa: E402

import hvdcompress  # noqa: E402
import hvdcompress.torch as hvc  # noqa: E402

READS = ("item", "__float__", "__int__", "__bool__", "tolist", "cpu", "numpy")
PACKAGE = os.path.dirname(os.path.abspath(hvdcompress.__file__)) + os.sep
counting = {"on": False}
sites: collections.Counter = collections.Counter()


def caller_in_package():
    """``file:line`` of the innermost hvdcompress frame on the stack, or None."""
    frame = sys._getframe(2)
    while frame is not None:
        if frame.f_code.co_filename.startswith(PACKAGE):
            return f"{frame.f_code.co_filename[len(PACKAGE):]}:{frame.f_lineno}"
        frame = frame.f_back
    return None


def wrap(name):
    original = getattr(torch.Tensor, name)

    def counted(self, *args, **kwargs):
        if counting["on"]:
            site = caller_in_package()
            if site is not None:
                sites[f"{name} {site}"] += 1
        return original(self, *args, **kwargs)

    setattr(torch.Tensor, name, counted)


for method in READS:
    wrap(method)

hvd.init()
torch.set_num_threads(1)
steps = int(sys.argv[1])
report = {}
for spec in json.loads(sys.argv[2]):
    model = mlp()
    opt = hvc.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
                                   named_parameters=model.named_parameters(),
                                   compression=hvdcompress.from_params(spec))
    sites.clear()
    for step, (x, y) in enumerate(batches(hvd.rank(), steps + 1)):
        counting["on"] = step > 0  # the first step (set-up, rank agreement) is not measured
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    counting["on"] = False
    report[spec["compressor"]] = {"reads": sum(sites.values()), "sites": dict(sites)}
result(hvd.rank(), steps=steps, tensors=len(list(model.parameters())), report=report)
