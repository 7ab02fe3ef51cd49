"""Feature parity, as a matrix: every feature of the step driver (hvdcompress/driver.py) on every
front end (Horovod torch optimizer, DDP hook, TF tape, Keras optimizer), issue 35.

Each cell is either the test that proves the feature on that front end (in real multi-process
runs: the named test must exist, and it runs in the same suite), or a refusal: the front end
cannot offer it and says so with a ValueError naming the parameter, which this test provokes.
A cell left empty fails (a hole). The matrix is printed in README.md ("Feature parity").
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

HERE = Path(__file__).parent
FRONT_ENDS = ("horovod_torch", "ddp", "tf_tape", "keras")
REFUSED = "refused"

MATRIX = {
    "scaler": {
        "horovod_torch": "test_amp.py::test_overflow_on_one_rank_leaves_state_and_skips_everywhere",
        "ddp": "test_ddp_parity.py::test_overflow_step_leaves_state_and_parameters_and_halves_the_scale",
        "tf_tape": "test_tf_state_change.py::test_overflow_on_one_rank_leaves_the_state_and_skips_everywhere",
        "keras": "test_tf_state_change.py::test_keras_loss_scale_optimizer_inside_equals_the_unscaled_run",
    },
    "gathered_resume_other_world": {
        "horovod_torch": "test_reshard.py::test_a_checkpoint_resumes_at_another_world_size",
        "ddp": "test_ddp_parity.py::test_gathered_state_resumes_at_three_ranks_with_the_mean_kept",
        "tf_tape": "test_tf_state_change.py::test_resume_at_three_ranks_keeps_the_delivered_mass",
        "keras": "test_tf_state_change.py::test_resume_at_three_ranks_keeps_the_delivered_mass",
    },
    "frozen_adam_clip_order": {
        "horovod_torch": "test_adam.py::test_clip_grad_norm_clips_the_mean_in_v_steps_and_each_rank_by_its_coefficient_after",
        "ddp": "test_ddp.py::test_two_ranks_equal_the_horovod_front_end",
        "tf_tape": REFUSED,   # FrozenAdam replaces the optimizer's step; the tape has none
        "keras": "test_tf_adam.py::test_keras_clips_the_mean_in_v_steps_and_each_rank_by_its_coefficient_after",
    },
    "check_replicas": {
        "horovod_torch": "test_replica_matrix.py::test_guard_names_parameter_step_and_ranks_on_every_rank",
        "ddp": "test_ddp.py::test_replica_check_names_the_parameter_on_every_rank",
        "tf_tape": "test_tf_replicas.py::test_tensorflow_tape_function_and_keras_fit_keep_replicas_identical",
        "keras": "test_tf_replicas.py::test_tensorflow_tape_function_and_keras_fit_keep_replicas_identical",
    },
    "auto": {
        "horovod_torch": "test_auto.py::test_horovod_ranks_pick_the_same_plan_and_stay_identical",
        "ddp": "test_ddp_parity.py::test_auto_plans_alike_on_every_rank",
        "tf_tape": "test_auto.py::test_horovod_tensorflow_tape_and_keras_plan_alike",
        "keras": "test_auto.py::test_horovod_tensorflow_tape_and_keras_plan_alike",
    },
    "bytes": {
        "horovod_torch": "test_torch_arguments.py::test_multi_round_payloads_are_counted",
        "ddp": "test_ddp.py::test_bytes",
        "tf_tape": "test_tf_horovod.py::test_topk_allgather_equals_hand_computed_sum",
        "keras": "test_tf_horovod.py::test_keras2_compute_gradients_exchanges_once_whichever_path",
    },
}


def _functions(path: Path) -> set:
    return {node.name for node in ast.walk(ast.parse(path.read_text())) if isinstance(node, ast.FunctionDef)}


def test_every_cell_is_proved_or_refused():
    holes = [(f, e) for f, row in MATRIX.items() for e in FRONT_ENDS if not row.get(e)]
    assert not holes, f"features without a test or a refusal on a front end: {holes}"
    missing = []
    for feature, row in MATRIX.items():
        for front_end, cell in row.items():
            if cell == REFUSED:
                continue
            file, name = cell.split("::")
            if not (HERE / file).exists() or name not in _functions(HERE / file):
                missing.append((feature, front_end, cell))
    assert not missing, f"cells naming tests that do not exist: {missing}"


def test_refusals_name_the_parameter():
    tf = pytest.importorskip("tensorflow")
    import horovod.tensorflow as hvd

    import hvdcompress as hc
    import hvdcompress.tensorflow as hvc
    hvd.init()
    refusals = {("frozen_adam_clip_order", "tf_tape"):
                lambda: hvc.DistributedGradientTape(tf.GradientTape(), compression=hc.FrozenAdam(hc.OneBit()))}
    assert set(refusals) == {(f, e) for f, row in MATRIX.items() for e, c in row.items() if c == REFUSED}
    for (feature, front_end), build in refusals.items():
        with pytest.raises(ValueError, match="compression="):
            build()


def test_every_front_end_counts_bytes_under_one_name():
    """``total_bytes`` and ``last_step_bytes`` (a ByteCount each) on every front end's object."""
    import horovod.torch as hvd
    import torch

    import hvdcompress as hc
    import hvdcompress.torch as hvt
    from hvdcompress.engines.accounting import ByteCount
    from hvdcompress.torch import ddp
    hvd.init()
    model = torch.nn.Linear(3, 2)
    opt = hvt.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters(), compression=hc.FP16())
    state = ddp.CompressionState(compression=hc.FP16())   # before any process group: nothing collective yet
    objects = {"horovod_torch": opt, "ddp": state}
    tf = pytest.importorskip("tensorflow")
    import hvdcompress.tensorflow as hvc
    import hvdcompress.tensorflow.keras as hvck
    objects["tf_tape"] = hvc.DistributedGradientTape(tf.GradientTape(), compression=hc.FP16())
    objects["keras"] = hvck.DistributedOptimizer(tf.keras.optimizers.SGD(0.1), compression=hc.FP16())
    for front_end, obj in objects.items():
        for attr in ("total_bytes", "last_step_bytes"):
            assert isinstance(getattr(obj, attr), ByteCount), f"{front_end}.{attr}"
