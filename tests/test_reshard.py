"""hvdcompress.state.reshard: compressor state redistributed from P to P' ranks: the function alone
(numpy references), then checkpoints written at 2 ranks resumed at 3 and back at 2 under
horovodrun (tests/hvd/torch_reshard.py)."""
from __future__ import annotations

import numpy as np
import pytest
from conftest import run_horovod

from hvdcompress.state.reshard import pooled, redistribute, segments_of, share_of_rank

N = 11  # not a multiple of 2, 3 or 4: the segments are padded


def vec(seed: int, n: int = N) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(n).astype(np.float32)


def cut(x: np.ndarray, parts: int) -> list:
    length = -(-x.size // parts)
    padded = np.concatenate([x, np.zeros(length * parts - x.size, x.dtype)])
    return [padded[j * length:(j + 1) * length] for j in range(parts)]


def whole(state: dict, key: str, n: int = N) -> np.ndarray:
    """A rank's ``key`` over the whole tensor of ``n`` elements, from either layout (float64)."""
    if key in state:
        return state[key].astype(np.float64)
    segments = sorted(int(k[3:].split(".")[0]) for k in state if k.startswith("seg") and k.endswith("." + key))
    return np.concatenate([state[f"seg{j}.{key}"] for j in segments])[:n].astype(np.float64)


def delivered(states: list, key: str, average: bool, n: int = N) -> np.ndarray:
    """What the key's state stands for in the update: Σ_r e_r / P (Average) or Σ_r e_r (Sum),
    server residuals (``sum.<key>``, segment r on rank r) included, in float64."""
    world = len(states)
    total = np.zeros(n)
    for r, st in enumerate(states):
        total += whole(st, key, n)
        if f"sum.{key}" in st:
            server = np.zeros(-(-n // world) * world)
            length = st[f"sum.{key}"].size
            server[r * length:(r + 1) * length] = st[f"sum.{key}"]
            total += server[:n]
    return total / world if average else total


def load_states(path) -> dict:
    """Tensor name -> {key: array} from a worker's npz (entries ``<tensor>/<key>``; a tensor's
    name may hold slashes, a key does not)."""
    out: dict = {}
    with np.load(path) as z:
        for k in z.files:
            name, key = k.rsplit("/", 1)
            out.setdefault(name, {})[key] = z[k]
    return out


def rank_states(path_of, world: int) -> list:
    """Per rank, :func:`load_states` of ``path_of(rank)``."""
    return [load_states(path_of(r)) for r in range(world)]


def check_shares(old: list, new: list, name: str, key: str, n: int) -> np.ndarray:
    """The rule after a change of world: the new ranks' ``key`` of tensor ``name`` (``n``
    elements) delivers the old ranks' mass Σ_r e_r / P (T / P rounded once to float32: within
    half an ulp) and every new rank holds the same share. Returns the old mass."""
    want = delivered([st[name] for st in old], key, True, n)
    got = delivered([st[name] for st in new], key, True, n)
    assert np.all(np.abs(got - want) <= np.abs(want) * 2.0 ** -24 + 1e-30), (name, key, np.abs(got - want).max())
    for r in range(1, len(new)):
        np.testing.assert_array_equal(whole(new[r][name], key, n), whole(new[0][name], key, n))
    return want


def check_reset_states(work, records: list, resets: list, sizes: dict, keys) -> None:
    """An elastic launch's resets (tests/hvd/common.save_reset_states wrote the states): the
    entries after each reset are ``resets`` [(batch, old world, new world)], and at each one
    every tensor's ``keys`` follow :func:`check_shares` with some mass to carry."""
    entries: dict = {}
    for r in records:
        if r["event"] == "entry":
            entries.setdefault(r["batch"], []).append(r)
    assert sorted((b, e[0]["old_world"], len(e)) for b, e in entries.items()) == resets
    for batch, seen in entries.items():
        old = rank_states(lambda r: work / f"b{batch}.old.rank{r}.npz", seen[0]["old_world"])
        new = rank_states(lambda r: work / f"b{batch}.new.rank{r}.npz", len(seen))
        for name, n in sizes.items():
            for key in sorted(keys):
                assert np.abs(check_shares(old, new, name, key, n)).max() > 0, (batch, name, key)


def flat_states(world: int) -> list:
    """Whole-tensor states: top-k + error feedback with Nesterov momentum, plus replicated
    FrozenAdam moments and a counter."""
    return [{"residual": vec(10 + r), "momentum": vec(20 + r), "adam.m": vec(1), "adam.v": vec(2),
             "step": 7} for r in range(world)]


def segmented_states(world: int) -> list:
    """Compressed-allreduce states (onebit + EF at P segments): per-segment residuals and
    counters, and each rank's server residual of its own segment."""
    out = []
    for r in range(world):
        st = {f"seg{j}.residual": piece for j, piece in enumerate(cut(vec(30 + r), world))}
        st.update({f"seg{j}.step": 5 for j in range(world)})
        st["sum.residual"] = vec(40 + r, -(-N // world))
        out.append(st)
    return out


@pytest.mark.parametrize("average", [True, False], ids=["average", "sum"])
@pytest.mark.parametrize("world,new_world,old_seg,new_seg", [
    (2, 3, False, False), (4, 2, False, False), (3, 2, True, True), (2, 3, True, True),
    (3, 2, True, False), (2, 4, False, True)])
def test_the_delivered_mass_is_preserved(average, world, new_world, old_seg, new_seg):
    states = segmented_states(world) if old_seg else flat_states(world)
    new = [redistribute(states, N, new_world, r, average, new_world if new_seg else 0)
           for r in range(new_world)]
    for key in {"residual", "momentum"} & {k.split(".")[-1] for k in states[0]}:
        want = delivered(states, key, average)
        got = delivered(new, key, average)
        # one rounding of the exact share to float32: half an ulp of it
        share = want if average else want / new_world
        bound = np.abs(share) * 2.0 ** -24 * (1 if average else new_world) + 1e-30
        assert np.all(np.abs(got - want) <= bound), (key, np.abs(got - want).max())
        for r in range(1, new_world):  # every new rank holds the same share
            np.testing.assert_array_equal(whole(new[r], key), whole(new[0], key))
    for r, st in enumerate(new):
        assert segments_of(st) == (new_world if new_seg else 0)
        assert not any(k.startswith("sum.") and k.endswith("residual") for k in st), \
            "server residuals are folded into the ranks' own"
        if not old_seg:
            np.testing.assert_array_equal(st["adam.m"], vec(1))
            assert st["step"] == 7
        elif new_seg:
            assert all(st[f"seg{j}.step"] == 5 for j in range(new_world))


def test_same_world_and_layout_keeps_every_rank_own_state_bit_for_bit():
    states = segmented_states(3)
    for r in range(3):
        new = redistribute(states, N, 3, r, True, 3)
        assert new.keys() == states[r].keys()
        for k in new:
            assert new[k] is states[r][k]


def test_two_level_state_resumes_at_the_same_world_size_only():
    """The shard's state (``cross.``) is kept as it is at the same P, whatever the node level's
    layout; at another P it is refused."""
    states = [{"cross.seg0.residual": vec(r, 3), "cross.sum.residual": vec(9 + r, 3)} for r in range(4)]
    for r in range(4):
        assert redistribute(states, N, 4, r, True, 2) == states[r]
    with pytest.raises(ValueError, match="written at 4 ranks cannot be redistributed to 2"):
        redistribute(states, N, 2, 0, True, 2)


def test_the_share_by_hand():
    states = [{"residual": np.array([1, 2, 3], np.float32)}, {"residual": np.array([3, 0, -3], np.float32)}]
    np.testing.assert_array_equal(pooled(states, "residual", 3, 2, 3, average=True), [2, 1, 0])
    np.testing.assert_array_equal(pooled(states, "residual", 3, 2, 4, average=False), [1, 0.5, 0])
    new = redistribute(states, 3, 3, 2, True, 3)  # one element per segment
    assert [float(new[f"seg{j}.residual"][0]) for j in range(3)] == [2, 1, 0]
    assert new["seg0.residual"].dtype == np.float32


def test_errors_name_what_is_wrong():
    with pytest.raises(ValueError, match="new_rank=3 with new_world=3"):
        redistribute(flat_states(2), N, 3, 3, True, 0)
    with pytest.raises(ValueError, match="new_segments=2"):
        redistribute(flat_states(2), N, 3, 0, True, 2)
    with pytest.raises(ValueError, match="two-level"):
        redistribute([{"cross.residual": vec(1, 6)}] * 2, N, 3, 0, True, 0)
    with pytest.raises(ValueError, match="states is empty"):
        redistribute([], N, 3, 0, True, 0)


def test_a_front_ends_share_checks_the_op_and_lays_out_as_the_run_cuts():
    """share_of_rank, which both front ends load through: the op of a state with residuals must
    be the run's; replicated state takes either op; the layout is asked only when there is state."""
    states = [{"residual": np.array([1, 2, 3], np.float32)}, {"residual": np.array([3, 0, -3], np.float32)}]
    with pytest.raises(ValueError, match=r"load: the state was gathered with op=hvd.Sum and this "
                                         r"run has op=hvd.Average.*use the same op"):
        share_of_rank(states, 3, 3, 0, True, False, lambda: False, "load")
    asked = []
    new = share_of_rank(states, 3, 3, 2, True, True, lambda: asked.append(1) or True, "load")
    assert asked == [1] and [float(new[f"seg{j}.residual"][0]) for j in range(3)] == [2, 1, 0]
    replicated = [{"adam.m": vec(1), "step": 3}] * 2
    new = share_of_rank(replicated, N, 3, 1, True, False, lambda: False, "load")   # no residual: any op
    np.testing.assert_array_equal(new["adam.m"], vec(1))
    assert new["step"] == 3
    assert share_of_rank([{}, {}], N, 3, 0, True, None, lambda: asked.append(2) or True, "load") == {}
    assert asked == [1]


# ---- under horovodrun -----------------------------------------------------------------------------
CASES = ["topk_ef_nesterov", "dgc", "onebit_ef_auto", "onebit_ef_alltoall", "frozen_adam", "onebit_ef_fused"]
PER_RANK = {"residual", "quant_residual", "momentum", "velocity"}
SIZES = {"0.weight": 1000, "0.bias": 50, "2.weight": 200, "2.bias": 4}
FUSED = {"fused[0.bias..2.weight]": sum(SIZES.values())}   # fusion=True: one bucket of the four
LAUNCHES = [(2, ["--write", "a"]), (3, ["--read", "a", "--write", "b"]), (2, ["--read", "b"])]


@pytest.fixture(scope="module")
def launches(tmp_path_factory):
    """Write at 2 ranks (a), resume at 3 and write again (b), resume at 2: three launches."""
    work = tmp_path_factory.mktemp("reshard")
    records = [run_horovod("torch_reshard.py", np=np_, args=[str(work), *extra], timeout=300)
               for np_, extra in LAUNCHES]
    return work, records


@pytest.mark.horovod
@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("tag,world,new_world", [("a", 2, 3), ("b", 3, 2)], ids=["2to3", "3to2"])
def test_a_checkpoint_resumes_at_another_world_size(launches, case, tag, world, new_world):
    work, records = launches
    old = rank_states(lambda r: work / f"{case}.{tag}.rank{r}.npz", world)
    new = rank_states(lambda r: work / f"{case}.{tag}.loaded.rank{r}.npz", new_world)
    checked = carried = 0
    for name, n in (FUSED if case.endswith("_fused") else SIZES).items():
        keys = {k.split(".")[-1] for st in old for k in st.get(name, {})}
        for key in keys & PER_RANK:
            carried += bool(np.abs(check_shares(old, new, name, key, n)).max() > 0)
            checked += 1
        for key in keys & {"adam.m", "adam.v"}:   # replicated: rank 0's, bit for bit
            for r in range(new_world):
                np.testing.assert_array_equal(new[r][name][key], old[0][name][key])
            checked += 1
    assert checked and carried, "no state to carry over"
    resumed = [rec for rec in records[1 if tag == "a" else 2] if rec["case"] == case]
    assert len(resumed) == new_world
    assert all("gather=True" in rec["refused"] for rec in resumed), resumed[0]["refused"]


@pytest.mark.horovod
def test_the_collectives_follow_the_world_size(launches):
    """The compressed allreduce's segments were re-cut: onebit with collective='auto' takes the
    allgather at 2 ranks and the compressed allreduce for its large tensor at 3."""
    work, records = launches
    plans = {(rec["world"], rec["case"]): rec["plan"] for launch in records[:2] for rec in launch}
    assert plans[(2, "onebit_ef_auto")]["0.weight"] == "allgather"
    assert plans[(3, "onebit_ef_auto")]["0.weight"] == "alltoall"
    assert plans[(3, "onebit_ef_alltoall")]["0.weight"] == "alltoall"
    loaded = rank_states(lambda r: work / f"onebit_ef_auto.a.loaded.rank{r}.npz", 3)
    assert sorted(k for k in loaded[0]["0.weight"] if k.endswith("residual")) == \
        ["seg0.residual", "seg1.residual", "seg2.residual"]
