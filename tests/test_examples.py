"""The PyTorch examples as a user runs them, under horovodrun, with compressors chosen by
``--params`` (the registry's key=value strings): the training script, and its elastic twin."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
from conftest import launch_elastic, run_horovod
from hvdrun import write_hosts

EXAMPLE = Path(__file__).parent.parent / "examples" / "pytorch_train.py"


@pytest.mark.horovod
def test_example_trains_with_a_compressor_given_as_strings():
    """One launch: a compressor with two decorators from ``--params``, as a user writes it, and
    fused compression (every compressor's training is covered by the replica matrix and the
    convergence tests)."""
    params = "compressor=onebit,ef=vanilla,momentum=plain"
    results = run_horovod(str(EXAMPLE), np=2, args=["--params", params, "--epochs", "3",
                                                    "--hidden", "256", "--fusion", str(1 << 20)])
    assert len(results) == 2
    first, second = results
    assert first["param_checksum"] == second["param_checksum"]  # ranks stay in sync
    assert first["compression"] == params.split(",")[0].split("=")[1]
    assert first["sent_bytes"] * 10 < first["dense_bytes"]
    assert first["accuracy"] > 0.8, first  # dense reaches 0.90 in the same 3 epochs


ELASTIC_EXAMPLE = Path(__file__).parent.parent / "examples" / "pytorch_elastic_train.py"
# About 1 s per epoch here (21 steps of 32 at 2 ranks): the test offers the third slot after the
# first, and the growth takes about 2 s (a discovery each second, then the next commit)
ELASTIC_EPOCHS = 12
ELASTIC_TIMEOUT_S = 300


@pytest.mark.horovod
def test_elastic_example_grows_while_it_trains(tmp_path):
    """The elastic example as its docstring runs it (examples/discover_hosts.sh reading a hosts
    file), with onebit + EF + Nesterov: once rank 0 reported its first epoch the test offers a
    third slot (the file replaced whole). Every epoch's parameters are the same on every rank
    that ran it, the job ends on 3 ranks, and it learns."""
    def grow(results: Path, hosts: Path) -> None:
        first = results / "rank0.jsonl"
        if hosts.read_text() == "localhost:2\n" and first.exists() and first.read_text():
            write_hosts(hosts, 3)

    params = "compressor=onebit,ef=vanilla,momentum=nesterov"
    records = launch_elastic(tmp_path, [sys.executable, str(ELASTIC_EXAMPLE), "--params", params,
                                        "--epochs", str(ELASTIC_EPOCHS)],
                             ELASTIC_EXAMPLE.parent / "discover_hosts.sh", ELASTIC_TIMEOUT_S, during=grow)
    epochs = [r for r in records if "epoch" in r]
    by_epoch: dict = {}
    for r in epochs:
        by_epoch.setdefault(r["epoch"], []).append(r)
    assert sorted(by_epoch) == list(range(ELASTIC_EPOCHS)), sorted(by_epoch)
    for epoch, rows in by_epoch.items():   # a repeated epoch (after a reset) reports again
        assert len({r["param_checksum"] for r in rows}) == 1, (epoch, rows)
    assert by_epoch[0][0]["world"] == 2
    last = by_epoch[ELASTIC_EPOCHS - 1]
    assert {r["world"] for r in last} == {3} and sorted(r["rank"] for r in last) == [0, 1, 2], last
    final = [r for r in records if r.get("final")]
    assert len(final) == 1 and final[0]["accuracy"] > 0.8, final
