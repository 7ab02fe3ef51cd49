"""Every public name users import keeps working across the layout change: the names below are
those each public module offered before the package was split into layers (main @ 3db1552),
plus the compressors ``import hvdcompress`` has always exposed. A name removed or renamed fails
here, naming the module and the name."""
import importlib

import pytest

PUBLIC = {
    "hvdcompress": [
        "BF16", "CSC", "Compressor", "DGC", "Dithering", "EFSignSGD", "ErrorFeedback",
        "ExponentialWarmup", "FP16", "FrozenAdam", "Int4", "Int8", "ListWarmup", "Momentum",
        "Natural", "NoCompression", "OneBit", "Packet", "PowerSGD", "QSGD", "RandomK",
        "ReplicaMismatch", "Signum", "SparsityScheduler", "TensorInfo", "TernGrad", "Threshold",
        "TopK", "TwoBit", "available", "from_params", "payload_bytes", "register"],
    "hvdcompress.torch": ["DistributedOptimizer", "SparsityScheduler", "TorchOps",
                          "broadcast_optimizer_state", "node_process_sets"],
    "hvdcompress.torch.ddp": ["CompressionState", "compression_hook", "node_groups"],
    "hvdcompress.torch.fsdp": ["CompressionState", "compress", "reduce_scatter_hook"],
    "hvdcompress.torch.elastic": ["TorchState"],
    "hvdcompress.tensorflow": [
        "CompressionState", "DistributedGradientTape", "DistributedOptimizer",
        "PartialDistributedGradientTape", "TFOps", "broadcast_variables", "compression_state",
        "gather_compression_state", "load_compression_state", "node_process_sets"],
    "hvdcompress.tensorflow.keras": ["DistributedOptimizer", "PartialDistributedOptimizer",
                                     "broadcast_variables", "callbacks"],
    "hvdcompress.tensorflow.keras.callbacks": ["BroadcastGlobalVariablesCallback", "SparsityWarmupCallback"],
    "hvdcompress.tensorflow.elastic": ["TensorFlowKerasState"],
    "hvdcompress.auto": ["AUTO", "Auto", "CHOICES", "Choice", "Dispatch", "SAFE", "choose",
                         "from_arguments", "parse_allowed", "parse_link", "predict_exchange"],
    "hvdcompress.plan": [
        "COLLECTIVES", "Calibration", "Cluster", "CodecTimes", "Cost", "DEFAULT_COMPRESSORS",
        "Exchange", "Fit", "Fusion", "Job", "LEVELS", "Link", "ModelProfile", "Payload",
        "Prediction", "TensorProfile", "Timeline", "calibrate", "cpu_share", "exchange",
        "from_sizes", "measure", "parse_bandwidth", "parse_latency", "predict", "recommend",
        "simulate", "trace_keras", "trace_torch"],
}


@pytest.mark.parametrize("module", sorted(PUBLIC))
def test_public_names_keep_working(module):
    mod = importlib.import_module(module)
    missing = [name for name in PUBLIC[module] if not hasattr(mod, name)]
    assert not missing, f"{module} lost {missing}"


def test_the_compressors_are_in_the_package_all():
    """``from hvdcompress import *`` gives every compressor ``import hvdcompress`` exposes."""
    import hvdcompress

    classes = [n for n in PUBLIC["hvdcompress"] if isinstance(getattr(hvdcompress, n), type)
               and issubclass(getattr(hvdcompress, n), hvdcompress.Compressor)]
    assert sorted(set(classes) - set(hvdcompress.__all__)) == []
