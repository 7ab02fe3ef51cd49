"""Know before you run: a cost model of gradient compression on a cluster.

    from hvdcompress.plan import Cluster, Link, from_sizes, predict, recommend
    cluster = Cluster(nodes=4, gpus_per_node=8, intra=Link(2e-6, 300e9), inter=Link(10e-6, 25e9 / 8))
    rows = predict(from_sizes([[1024, 1024]] * 8, compute_s=0.05), cluster)
    best = recommend(rows)      # Prediction(compressor, collective, level, step_time_s, ...)

Per tensor: payload bytes measured from the real compressors (:mod:`.payloads`), alpha-beta
collectives (:mod:`.collectives`), the engine's rounds on one or two levels (:mod:`.exchanges`),
codec time from a per-machine calibration (:mod:`.calibration`); per step: Horovod's cycle and
fusion and the overlap with the backward pass (:mod:`.pipeline`) from traced ready times
(:mod:`.profile`). The maths and the assumptions: docs/plan.md. Command line:
``python -m hvdcompress.plan --help``. No framework is imported until a measurement needs one.
"""
from .calibration import Calibration, CodecTimes, Fit, calibrate
from .collectives import Cost
from .exchanges import COLLECTIVES, LEVELS, Exchange, exchange
from .links import Cluster, Link, cpu_share, parse_bandwidth, parse_latency
from .model import Prediction, predict, recommend
from .payloads import DEFAULT_COMPRESSORS, Payload, measure
from .pipeline import Fusion, Job, Timeline, simulate
from .profile import ModelProfile, TensorProfile, from_sizes, trace_keras, trace_torch

__all__ = [
    "Calibration", "CodecTimes", "Fit", "calibrate", "Cost", "COLLECTIVES", "LEVELS", "Exchange",
    "exchange", "Cluster", "Link", "cpu_share", "parse_bandwidth", "parse_latency", "Prediction", "predict",
    "recommend", "DEFAULT_COMPRESSORS", "Payload", "measure", "Fusion", "Job", "Timeline",
    "simulate", "ModelProfile", "TensorProfile", "from_sizes", "trace_keras", "trace_torch",
]
