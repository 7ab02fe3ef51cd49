"""DiLoCo under Horovod elastic (tests/hvd/torch_diloco_elastic.py): one launch of
``horovodrun -np 2 --min-np 2 --max-np 4 --host-discovery-script tests/hvd/elastic_discovery.sh``
on this host, 2 sites grown to 3 at the sync of batch 6 and shrunk to 2 at that of batch 12, with
one discovery on the way that finds no host. Checked: it finishes within the launch's time-out,
every sync ran on the world it asked for and left every site with the same parameters (the
script's check_replicas=1 raises otherwise; the digests are compared here), a joining site starts
from rank 0's inner AdamW state while the sites already there keep their own, and after each
reset the error feedback every site holds delivers the last commit's mass, Σ_r e_r / P, with every
site holding the same share (numpy references of tests/test_reshard.py)."""
from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
from conftest import HVD_SCRIPTS, run_elastic
from test_reshard import check_reset_states

pytestmark = pytest.mark.horovod
TIMEOUT_S = 400
SIZES = {"0.weight": 1000, "0.bias": 50, "2.weight": 200, "2.bias": 4}


@pytest.fixture(scope="module")
def elastic():
    with tempfile.TemporaryDirectory(prefix="hvdcompress-diloco-elastic-") as d:
        work = Path(d)
        yield work, run_elastic(work, HVD_SCRIPTS / "torch_diloco_elastic.py", TIMEOUT_S)


def test_every_sync_runs_on_its_world_with_identical_sites(elastic):
    _, records = elastic
    syncs = [r for r in records if r["event"] == "sync"]
    assert sorted({r["batch"] for r in syncs}) == [3, 6, 9, 12, 15]
    for batch in (3, 6, 9, 12, 15):
        world = 2 if batch <= 6 else 3 if batch <= 12 else 2
        ranks = [r for r in syncs if r["batch"] == batch]
        assert sorted(r["rank"] for r in ranks) == list(range(world)), (batch, ranks)
        assert {r["world"] for r in ranks} == {world}, (batch, ranks)
        assert len({r["digest"] for r in ranks}) == 1, f"sites differ after the sync of batch {batch}"


def test_a_joining_site_takes_rank_0s_inner_state_and_the_others_keep_theirs(elastic):
    _, records = elastic
    entry = {r["rank"]: r for r in records if r["event"] == "entry" and r["batch"] == 6}
    before = {r["rank"]: r["inner"] for r in records if r["event"] == "sync" and r["batch"] == 6}
    assert sorted(entry) == [0, 1, 2] and all(e["steps"] == 6 for e in entry.values()), entry
    assert entry[0]["inner"] == before[0] and entry[1]["inner"] == before[1], (entry, before)
    assert before[0] != before[1], "the two sites' AdamW states should differ (their own batches)"
    assert entry[2]["inner"] == before[0], "the joining site should start from rank 0's inner state"


def test_error_feedback_follows_the_rule_at_each_reset(elastic):
    work, records = elastic
    check_reset_states(work, records, [(6, 2, 3), (12, 3, 2)], SIZES, {"residual"})
