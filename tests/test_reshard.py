"""hvdcompress.reshard: compressor state redistributed from P to P' ranks (no Horovod)."""
from __future__ import annotations

import numpy as np
import pytest

from hvdcompress.reshard import pooled, redistribute, segments_of

N = 11  # not a multiple of 2, 3 or 4: the segments are padded


def vec(seed: int, n: int = N) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(n).astype(np.float32)


def cut(x: np.ndarray, parts: int) -> list:
    length = -(-x.size // parts)
    padded = np.concatenate([x, np.zeros(length * parts - x.size, x.dtype)])
    return [padded[j * length:(j + 1) * length] for j in range(parts)]


def whole(state: dict, key: str) -> np.ndarray:
    """The new rank's ``key`` over the whole tensor, from either layout (float64)."""
    if key in state:
        return state[key].astype(np.float64)
    return np.concatenate([state[f"seg{j}.{key}"] for j in range(segments_of(state))])[:N].astype(np.float64)


def delivered(states: list, key: str, average: bool) -> np.ndarray:
    """What the key's state stands for in the update: Σ_r e_r / P (Average) or Σ_r e_r (Sum),
    server residuals (``sum.<key>``, segment r on rank r) included, in float64."""
    world = len(states)
    total = np.zeros(N)
    for r, st in enumerate(states):
        total += whole(st, key)
        if f"sum.{key}" in st:
            server = np.zeros(-(-N // world) * world)
            length = st[f"sum.{key}"].size
            server[r * length:(r + 1) * length] = st[f"sum.{key}"]
            total += server[:N]
    return total / world if average else total


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
