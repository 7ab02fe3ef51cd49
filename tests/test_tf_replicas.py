"""Replicas stay bit-identical on TensorFlow (issue 19), under real Horovod processes at 2 ranks:
the tape (eager and tf.function) and Keras fit with several compressors, clip_grad_norm and
SGD, Nesterov or Adam, 20 steps each, with check_replicas=10; then the replica guard naming a
one-bit difference. Runs on TF 2.15 / Keras 2 and on TF 2.18 / Keras 3 (make test-keras3)."""
from __future__ import annotations

import json

import pytest
from conftest import run_horovod
from test_replica_matrix import CLIP, STEPS, by_case, first_drift

pytestmark = pytest.mark.horovod

TF_CASES = ([dict(spec={"compressor": name}, api=api, clip=clip, optimizer=opt)
             for name in ("none", "fp16", "int8", "dgc", "topk", "powersgd", "randomk")
             for api, clip, opt in (("tape", CLIP, "adam"), ("function", None, "nesterov"),
                                    ("fit", CLIP, "momentum"))]
            + [dict(spec={"compressor": "onebit", "ef": "vanilla"}, api="fit", clip=None, optimizer="adam")])


def test_tensorflow_tape_function_and_keras_fit_keep_replicas_identical():
    results = by_case(run_horovod("tf_replica_matrix.py", np=2, timeout=900,
                                  args=[json.dumps({"cases": TF_CASES, "steps": STEPS})]))
    drifted = []
    for case in TF_CASES:
        ranks = results[json.dumps(case, sort_keys=True)]
        assert len(ranks[0]["digests"]) == STEPS, case
        if first_drift(ranks, [0, 1]) is not None:
            drifted.append((case, first_drift(ranks, [0, 1])))
    assert not drifted, drifted
    guard = results[json.dumps({"guard": "tape"})]
    for r in (0, 1):
        error = guard[r]["error"]
        assert error is not None and "step 5" in error and "dense_1/bias" in error, error
        assert "ranks [0] hold" in error and "ranks [1] hold" in error, error
