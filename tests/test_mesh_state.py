"""hvdcompress.state.mesh: the HSDP compressor state re-laid to another number of shards, against
a numpy reference written here (bit for bit), and FSDP2's own dim-0 layout (torch.chunk,
``_chunk_with_empty``) pinned for uneven and empty shards."""
from __future__ import annotations

import math

import numpy as np
import pytest

from hvdcompress.state.mesh import COORDINATE, dim0_range, for_shard, reshard_dim0, whole_layout
from hvdcompress.state.store import Conversions

SHAPES = [(7, 3), (5,), (6, 2), (1, 4), (2, 3, 2)]


def reference_rows(rows: int, shards: int) -> list:
    """torch.chunk's row counts, padded with empty chunks to ``shards`` (FSDP2's layout)."""
    size = math.ceil(rows / shards) if rows else 0
    out, left = [], rows
    for _ in range(shards):
        out.append(min(size, left))
        left -= out[-1]
    return out


def reference_cut(full: np.ndarray, shape: tuple, shards: int) -> list:
    """The flat local shards of a flat full tensor: each shard's rows, flattened."""
    rows, inner = shape[0], math.prod(shape[1:])
    pieces, at = [], 0
    for n in reference_rows(rows, shards):
        pieces.append(full[at * inner:(at + n) * inner])
        at += n
    return pieces


def test_dim0_range_is_fsdp2s_chunking():
    torch = pytest.importorskip("torch")
    from torch.distributed.fsdp._fully_shard._fsdp_common import _chunk_with_empty
    for rows in range(0, 12):
        for shards in range(1, 6):
            chunks = _chunk_with_empty(torch.arange(rows * 3).reshape(rows, 3), shards, dim=0)
            assert [c.numel() // 3 if c.numel() else 0 for c in chunks] == reference_rows(rows, shards)
            for j, chunk in enumerate(chunks):
                start, stop = dim0_range((rows, 3), shards, j)
                assert chunk.reshape(-1).tolist() == list(range(start, stop)), (rows, shards, j)
    assert reference_rows(5, 4) == [2, 2, 1, 0] and reference_rows(6, 4) == [2, 2, 2, 0]


def full_states(rng, shape: tuple, replicas: int) -> list:
    """Each replica's full-tensor state: a residual (its own), m and v (the same on every replica)."""
    numel = math.prod(shape)
    m, v = rng.standard_normal(numel).astype(np.float32), rng.random(numel).astype(np.float32)
    return [{"residual": rng.standard_normal(numel).astype(np.float32), "adam.m": m, "adam.v": v,
             "adam.unit": np.ones(1, np.float32) * 0.5, "step": 3} for _ in range(replicas)]


def shard_states(full: list, shape: tuple, shards: int) -> list:
    """states[j][r] of ``full[r]`` cut into ``shards`` (coordinate entries cut, others kept)."""
    out = []
    for j in range(shards):
        row = []
        for state in full:
            row.append({k: reference_cut(v, shape, shards)[j].copy() if k in COORDINATE else v
                        for k, v in state.items()})
        out.append(row)
    return out


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("shards,new_shards", [(2, 4), (4, 2), (2, 1), (1, 4), (3, 2), (4, 3)])
def test_reshard_dim0_cuts_every_coordinate_entry_bit_for_bit(shape, shards, new_shards):
    rng = np.random.default_rng(shards * 10 + new_shards)
    full = full_states(rng, shape, replicas=2)
    states = shard_states(full, shape, shards)
    for j in range(new_shards):
        got = reshard_dim0(states, shape, new_shards, j, "w")
        assert len(got) == 2
        for r, state in enumerate(got):
            assert set(state) == set(full[r]), (j, r)
            for key in COORDINATE & set(state):
                want = reference_cut(full[r][key], shape, new_shards)[j]
                assert state[key].dtype == np.float32
                np.testing.assert_array_equal(state[key], want, err_msg=f"{key} shard {j} replica {r}")
            np.testing.assert_array_equal(state["adam.unit"], full[r]["adam.unit"])
            assert state["step"] == 3
    # the old states are untouched (pure)
    np.testing.assert_array_equal(np.concatenate([s[0]["residual"] for s in states]), full[0]["residual"])


def test_same_number_of_shards_returns_the_saved_states():
    states = [[{"seg0.residual": np.ones(2), "powersgd_q": np.zeros((3, 1))}], [{"residual": np.ones(1)}]]
    assert reshard_dim0(states, (3,), 2, 1) == [{"residual": states[1][0]["residual"]}]
    assert reshard_dim0(states, (3,), 2, 0)[0]["powersgd_q"] is states[0][0]["powersgd_q"]


def test_a_missing_entry_is_zeros_on_its_shard():
    """An empty shard (FSDP2: 5 rows at 4 shards, the last 0) has no residual."""
    shape = (5, 2)
    full = np.arange(10, dtype=np.float32)
    cut = reference_cut(full, shape, 4)
    states = [[{"residual": cut[j]}] if cut[j].size else [{}] for j in range(4)]
    got = [reshard_dim0(states, shape, 2, j)[0]["residual"] for j in range(2)]
    np.testing.assert_array_equal(np.concatenate(got), full)
    states[1][0] = {}   # a shard that made no residual yet: zeros
    got = [reshard_dim0(states, shape, 1, 0)[0]["residual"]]
    np.testing.assert_array_equal(got[0], np.concatenate([cut[0], np.zeros(4, np.float32), cut[2]]))


def test_the_compressed_allreduce_segments_and_server_residual_come_back_whole():
    """Rank r of R=2 with seg0./seg1. of the 2-way cut (zero-padded) and sum. of segment r: the
    whole residual is the segments concatenated plus the server residual at segment r."""
    rng = np.random.default_rng(7)
    shape, shards = (7, 1), 2
    full = [rng.standard_normal(7).astype(np.float32) for _ in range(2)]
    server = [rng.standard_normal(2).astype(np.float32) for _ in range(2)]   # ceil(4 / 2) elements
    states = []
    for j in range(shards):
        row = []
        for r in range(2):
            local = reference_cut(full[r], shape, shards)[j]   # 4 then 3 elements
            length = math.ceil(local.size / 2)
            padded = np.concatenate([local, np.zeros(2 * length - local.size, np.float32)])
            row.append({"seg0.residual": padded[:length], "seg1.residual": padded[length:],
                        "sum.residual": server[r][:length], "adam.m": local * 2})
        states.append(row)
    got = reshard_dim0(states, shape, 1, 0)
    for r in range(2):
        want = []
        for j in range(shards):
            local = reference_cut(full[r], shape, shards)[j].astype(np.float64)
            placed = np.zeros(2 * math.ceil(local.size / 2))
            length = math.ceil(local.size / 2)
            placed[r * length:(r + 1) * length] = server[r][:length]
            want.append((local + placed[:local.size]).astype(np.float32))
        np.testing.assert_array_equal(got[r]["residual"], np.concatenate(want))
        np.testing.assert_array_equal(got[r]["adam.m"], full[r] * 2)
        assert set(got[r]) == {"residual", "adam.m"}
    whole = whole_layout(states[1][0], 3, 2, 0)
    assert whole["residual"].dtype == np.float32 and whole["residual"].size == 3


@pytest.mark.parametrize("bad,message", [
    (lambda s: s[1][0].update(powersgd_q=np.zeros((2, 1))), "entry 'powersgd_q' differs across the old shards"),
    (lambda s: s[1][1].update(step=4), "entry 'step' differs across the old shards"),
    (lambda s: s[0][1].update(residual=np.zeros(5, np.float32)), "entry 'residual' holds 5 elements; expected 12"),
    (lambda s: s[0][0].update({"seg0.step": 1}), "entry 'seg0.step' is kept per segment"),
])
def test_what_cannot_be_cut_is_refused_naming_the_entry(bad, message):
    shape = (7, 3)
    states = shard_states(full_states(np.random.default_rng(1), shape, 2), shape, 2)
    states[0][0]["powersgd_q"] = np.zeros((4, 1))
    states[1][0]["powersgd_q"] = np.zeros((4, 1))
    reshard_dim0(states, shape, 4, 3)   # as built, it cuts
    bad(states)
    with pytest.raises(ValueError, match="tensor 'w'") as error:
        reshard_dim0(states, shape, 4, 3, "w")
    assert message in str(error.value), str(error.value)
    assert "resume at the saved number of shards" in str(error.value) or "of another model" in str(error.value)


NUMPY = Conversions(is_tensor=lambda v: isinstance(v, np.ndarray), copy=lambda v, like: v.copy(),
                    host=lambda v: v.copy(), to_numpy=lambda v: v.astype(np.float32), numel=lambda v: v.size,
                    from_numpy=lambda a, like, dtype: np.asarray(a, dtype), dtype=lambda v: v.dtype)


def checkpoint(shards: int) -> tuple:
    shape = (7, 3)
    full = full_states(np.random.default_rng(3), shape, 2)
    grid = [[{"w": st} for st in row] for row in shard_states(full, shape, shards)]
    own = {"version": 1, "world": 2, "params": [("w", shape, "float32")], "compressor": {},
           "mesh": {"replicas": 2, "shards": shards}, "shards": grid}
    return own, full, shape


def test_for_shard_gives_the_stores_gathered_checkpoint_of_this_shard():
    own, full, shape = checkpoint(2)
    same = for_shard(own, NUMPY, own["params"], 2, 1)
    assert same["ranks"] is own["shards"][1] and "mesh" not in same and "shards" not in same
    for j in range(3):
        got = for_shard(own, NUMPY, own["params"], 3, j)
        assert got["world"] == 2 and len(got["ranks"]) == 2
        for r in range(2):
            np.testing.assert_array_equal(got["ranks"][r]["w"]["residual"], reference_cut(full[r]["residual"], shape, 3)[j])
    assert for_shard({"tensors": {}}, NUMPY, None, 2, 0) == {"tensors": {}}   # not HSDP's: as it is


@pytest.mark.parametrize("change,message", [
    (lambda o: o.update(mesh={"replicas": 2}), "entry 'mesh' holds"),
    (lambda o: o["shards"].pop(), "entry 'shards' holds [2]; expected 2 lists"),
    (lambda o: o.update(world=3), "entry 'world' holds 3"),
    (lambda o: o.update(params=[("w", (8, 3), "float32")]), "parameter 'w' with shape (8, 3)"),
    (lambda o: o["shards"][0][0].update(v={}), "tensors this front end does not exchange: ['v']"),
])
def test_for_shard_refuses_a_malformed_checkpoint(change, message):
    own, _, _ = checkpoint(2)
    change(own)
    with pytest.raises(ValueError, match="load_state_dict") as error:
        for_shard(own, NUMPY, [("w", (7, 3), "float32")], 4, 0)
    assert message in str(error.value), str(error.value)


def test_one_ranks_checkpoint_at_another_mesh_is_refused():
    own = {"tensors": {"w": {"residual": np.zeros(4)}}, "mesh": {"replicas": 2, "shards": 2, "replica": 0, "shard": 1}}
    assert "mesh" not in for_shard(own, NUMPY, None, 2, 1)
    for shards, shard in ((2, 0), (4, 1), (1, 0)):
        with pytest.raises(ValueError, match="one rank's compressor state, of shard 1 of 2, and this rank "
                                             f"holds shard {shard} of {shards}: save it with state_dict.gather=True."):
            for_shard(own, NUMPY, None, shards, shard)
    own["tensors"] = {"w": {}}   # no state: nothing to lose
    assert for_shard(own, NUMPY, None, 4, 0) == {"tensors": {"w": {}}}
