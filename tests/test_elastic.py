"""Compression under Horovod elastic (tests/hvd/torch_elastic.py): one launch of
``horovodrun -np 2 --min-np 2 --max-np 3 --host-discovery-script tests/hvd/elastic_discovery.sh``
on this host, grown to 3 ranks and shrunk back to 2 by the script's rank 0 through the hosts
file, with one discovery on the way that finds no host (tests/hvd/elastic_discovery.sh: a removal
Horovod would skip the sync for, hvdcompress/elastic.py). Checked: it finishes within the
launch's time-out (no hang), the replicas are identical
at every batch (the script's replica guard raises otherwise, and the digests are compared
here), the large tensor's collective follows the world size, and after each reset every rank
holds the share of the last commit's compressor state that hvdcompress.state.reshard defines
(numpy references of tests/test_reshard.py)."""
from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
from conftest import HVD_SCRIPTS, run_elastic
from horovod.common.exceptions import HostsUpdatedInterrupt
from test_reshard import check_reset_states

from hvdcompress.step.elastic import SyncEveryReset

pytestmark = pytest.mark.horovod
TIMEOUT_S = 400
SIZES = {"0.weight": 1000, "0.bias": 50, "2.weight": 200, "2.bias": 4}
PER_RANK = {"residual", "momentum"}


@pytest.fixture(scope="module")
def elastic():
    with tempfile.TemporaryDirectory(prefix="hvdcompress-elastic-") as d:
        work = Path(d)
        records = run_elastic(work, HVD_SCRIPTS / "torch_elastic.py", TIMEOUT_S)
        yield work, records


def test_grows_and_shrinks_with_identical_replicas(elastic):
    _, records = elastic
    steps = [r for r in records if r["event"] == "step"]
    worlds = {}
    for r in steps:
        worlds.setdefault(r["batch"], set()).add((r["world"], r["collective"]))
    assert sorted(worlds) == list(range(1, 17)), "every batch ran"
    expected = {b: 2 if b <= 5 else 3 if b <= 10 else 2 for b in range(1, 17)}
    for batch, seen in worlds.items():
        world = expected[batch]
        assert seen == {(world, "alltoall" if world == 3 else "allgather")}, (batch, seen)
        ranks = [r for r in steps if r["batch"] == batch]
        assert sorted(r["rank"] for r in ranks) == list(range(world)), (batch, ranks)
        assert len({r["digest"] for r in ranks}) == 1, f"replicas differ at batch {batch}"


def test_compressor_state_follows_the_rule_at_each_reset(elastic):
    work, records = elastic
    check_reset_states(work, records, [(5, 2, 3), (10, 3, 2)], SIZES, PER_RANK)


@pytest.mark.parametrize("skip_sync", [True, False])
def test_every_host_update_syncs(skip_sync):
    """SyncEveryReset keeps Horovod's decision to reset and drops its skip of the sync."""
    class Horovods:
        def check_host_updates(self):
            raise HostsUpdatedInterrupt(skip_sync)

    class State(SyncEveryReset, Horovods):
        pass

    with pytest.raises(HostsUpdatedInterrupt) as raised:
        State().check_host_updates()
    assert raised.value.skip_sync is False
