"""SequenceReplay: shared chunks, refcounts and FIFO eviction, priorities, checkpoints, and the adder end to end."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from distrl.replay.sequence_replay import SequenceReplay
from distrl.replay.sequences import SequenceAdder, chunks_per_item
from distrl.replay.store import digest
from tests.replay.stacking import reloaded
from tests.replay.test_sequences import STORED, Reference, make_calls

C, L = 4, 8
K = chunks_per_item(L, C)


def message(chunks: dict[int, int], items: list[tuple], version: int = 0) -> dict:
    """Chunks key -> length (obs = (key, step)); items (keys, offset, pad_left, length)."""
    keys = list(chunks)
    obs = np.zeros((len(keys), C, 2), np.float32)
    for i, k in enumerate(keys):
        obs[i, :chunks[k]] = np.stack([np.full(chunks[k], k), np.arange(chunks[k])], axis=1)
    real = (obs[..., 0] > 0).astype(np.float32)
    refs = np.full((len(items), K), -1, np.int64)
    for i, it in enumerate(items):
        refs[i, :len(it[0])] = it[0]
    col = lambda j: np.array([it[j] for it in items], np.int32).reshape(len(items))
    return {"chunk/key": np.array(keys, np.int64).reshape(len(keys)),
            "chunk/length": np.array(list(chunks.values()), np.int32).reshape(len(keys)),
            "chunk/obs": obs, "chunk/rewards": obs[..., 1] * 0.5, "chunk/discount": real, "chunk/mask": real,
            "item/chunks": refs, "item/offset": col(1), "item/pad_left": col(2), "item/length": col(3),
            "item/first": col(1) == 0, "item/state": np.arange(len(items) * 3, dtype=np.float32).reshape(-1, 3),
            "version": np.full(len(items), version, np.int32)}


def sampled_chunk_keys(buf: SequenceReplay, n: int = 50) -> set[int]:
    batch, _, _ = buf.sample_many(n, 8)
    return set(batch["obs"][..., 0][batch["valid"] > 0].astype(int).tolist())


# ---------------------------------------------------------------- chunk store
def test_fifo_eviction_by_steps_frees_chunks():
    buf = SequenceReplay(capacity=12, sequence_length=L, seed=0)
    # a1 and a2 overlap by one chunk: 12 steps stored once, not 16
    buf.add(message({1: 4, 2: 4, 3: 4}, [([1, 2], 0, 0, 8), ([2, 3], 0, 0, 8)]))
    assert (buf.stored_steps, len(buf), buf.chunk_refcounts()) == (12, 2, {1: 1, 2: 2, 3: 1})
    nbytes = buf.nbytes
    buf.add(message({20: 4}, [([20], 0, 4, 4)]))  # needs 4 steps: evicting a1 (frees chunk 1) is enough
    assert (buf.stored_steps, len(buf), buf.chunk_refcounts()) == (12, 2, {2: 1, 3: 1, 20: 1})
    buf.add(message({21: 4}, [([20, 21], 0, 0, 8)]))  # evicting a2 frees chunks 2 and 3
    assert (buf.stored_steps, len(buf), buf.chunk_refcounts()) == (8, 2, {20: 2, 21: 1})
    assert buf.nbytes == nbytes, "freed slots are reused"
    assert sampled_chunk_keys(buf) == {20, 21}


def test_items_referencing_freed_chunks_are_dropped_and_never_sampled():
    buf = SequenceReplay(capacity=8, sequence_length=L, seed=0)
    buf.add(message({1: 4, 2: 4}, [([1, 2], 0, 0, 8)]))
    buf.add(message({10: 4, 11: 4}, [([10, 11], 0, 0, 8)]))  # evicts the only item on chunks 1, 2
    assert buf.chunk_refcounts() == {10: 1, 11: 1}
    buf.add(message({3: 4}, [([2, 3], 2, 0, 6)]))  # stream 1 continues on a freed chunk
    assert buf.dropped_items == 1 and len(buf) == 1
    assert buf.chunk_refcounts() == {10: 1, 11: 1}, "a chunk only dropped items use is not kept"
    assert sampled_chunk_keys(buf) == {10, 11}
    buf.update_priorities(np.arange(3), np.full(3, 100.0))  # slot 0 held the evicted item, 2 none yet
    batch = buf.sample_many(50, 8)[0]
    assert len(set(batch["_generation"].ravel().tolist())) == 1, "a priority update cannot revive a freed slot"
    assert np.all(batch["valid"].sum(axis=1) == 8)


def test_message_larger_than_capacity_keeps_the_newest():
    buf = SequenceReplay(capacity=4, sequence_length=L, seed=0)
    buf.add(message({1: 4, 2: 4, 3: 4}, [([1], 0, 0, 4), ([2], 0, 0, 4), ([3], 0, 0, 4)]))
    assert (len(buf), buf.stored_steps, buf.chunk_refcounts()) == (1, 4, {3: 1})


def test_rejects_malformed_messages_without_changes():
    buf = SequenceReplay(capacity=16, sequence_length=L, seed=0)
    buf.add(message({1: 4}, [([1], 0, 0, 4)]))
    before = digest(buf.state_dict())
    for bad in (message({2: 4}, [([2], 1, 0, 4)]),          # window runs past its chunks
                message({2: 4}, [([2], 0, 6, 4)]),          # pad_left + length > L
                {**message({2: 4}, [([2], 0, 0, 4)]), "chunk/obs": np.zeros((1, C, 3), np.float32)}):
        with pytest.raises(ValueError):
            buf.add(bad)
    with pytest.raises(ValueError):
        buf.add(message({2: 4}, [([2], 0, 0, 4)]), priorities=np.ones(2))
    assert digest(buf.state_dict()) == before


def test_batch_layout_is_time_major_and_padded():
    buf = SequenceReplay(capacity=16, sequence_length=L, prioritized=False, seed=0)
    buf.add(message({5: 4, 6: 3}, [([5, 6], 2, 3, 5)], version=7))
    batch, _, w = buf.sample_many(2, 3)
    assert batch["obs"].shape == (2, L, 3, 2) and batch["state"].shape == (2, 3, 3)
    want_valid = [0, 0, 0, 1, 1, 1, 1, 1]
    assert batch["valid"][0, :, 0].tolist() == want_valid
    assert batch["obs"][0, :, 0].tolist() == [[0, 0]] * 3 + [[5, 2], [5, 3], [6, 0], [6, 1], [6, 2]]
    assert batch["first"][0, :, 0].tolist() == [False] * 8, "offset 2: not the episode's first step"
    assert np.all(batch["version"] == 7) and batch["_generation"].dtype == np.int64 and np.all(w == 1)


def test_shared_steps_are_not_copied():
    """Bytes per stored step with 50% overlap stay within 1.2x of non-overlapping sequences."""
    burn_in, length, n_step, chunk = 20, 40, 5, 20
    seq = burn_in + length + n_step

    def fill(period):
        rng = np.random.default_rng(0)
        adder = SequenceAdder(4, seq, period, burn_in, chunk, seed=0)
        buf = SequenceReplay(capacity=12_000, sequence_length=seq, seed=0)
        copied = 0
        for call in range(40):  # 16k steps of 4 envs, episodes of 400 steps
            done = (call * 100 + np.arange(100)[:, None] + 37 * np.arange(4)) % 400 == 399
            obs = rng.normal(size=(100, 4, 8)).astype(np.float32)
            out = adder.add({"obs": obs, "actions": rng.integers(0, 4, (100, 4)),
                             "rewards": rng.normal(size=(100, 4)).astype(np.float32)}, {"obs": obs},
                            done, np.zeros_like(done), rng.normal(size=(100, 4, 2, 32)), 0)
            if out is not None:
                buf.add(out[0])
                copied += int(out[1]["valid"].sum())
        assert buf.stored_steps > 11_000
        return buf.nbytes / buf.stored_steps, copied

    overlap, copied_overlap = fill(length // 2)
    plain, copied_plain = fill(length)
    assert copied_overlap > 1.8 * copied_plain, "the items do cover each step about twice as often"
    assert overlap <= 1.2 * plain, (overlap, plain)
    step_bytes = 8 * 4 + 8 + 4 + 4 + 4
    assert overlap < 0.6 * seq / (length // 2) * step_bytes, "far below copying every window"


def test_growth_keeps_contents_and_fifo_order():
    buf = SequenceReplay(capacity=40, sequence_length=L, seed=0)  # 16 item slots, 11 chunk slots at first
    buf.add(message({k: 4 for k in range(1, 11)}, [([k], 0, 0, 4) for k in range(1, 11)]))
    nbytes = buf.nbytes
    for k in range(100, 160):  # one-step chunks of two items each: the ring wraps, then both arrays grow
        buf.add(message({k: 1}, [([k], 0, 0, 1)] * 2))
        check_invariants(buf, 40)
    assert (len(buf), buf.num_chunks, buf.stored_steps) == (80, 40, 40) and buf.nbytes > nbytes
    assert sampled_chunk_keys(buf, 200) == set(range(120, 160))


# ---------------------------------------------------------------- priorities
def _four_items(**kw) -> SequenceReplay:
    buf = SequenceReplay(capacity=64, sequence_length=L, seed=1, **kw)
    buf.add(message({k: 4 for k in (1, 2, 3, 4)}, [([k], 0, 0, 4) for k in (1, 2, 3, 4)]),
            priorities=np.array([1.0, 2.0, 3.0, 4.0]))
    return buf


@pytest.mark.parametrize("alpha", [1.0, 0.5])
def test_prioritized_sampling_is_proportional(alpha):
    buf = _four_items(alpha=alpha, eps=1e-9)
    batch = buf.sample_many(400, 64)[0]
    keys = batch["obs"][:, 0, :, 0].astype(int).ravel()  # the chunk key identifies the item
    freq = np.bincount(keys, minlength=5)[1:] / keys.size
    p = np.array([1.0, 2.0, 3.0, 4.0]) ** alpha
    np.testing.assert_allclose(freq, p / p.sum(), atol=0.01)


def test_importance_weights_normalised_and_beta_annealed():
    buf = _four_items(alpha=1.0, eps=0.0, beta0=0.4, beta_steps=10)
    for step in range(3):
        assert buf.beta == pytest.approx(0.4 + 0.6 * step / 10)
        batch, _, w = buf.sample_many(1, 32)
        probs = batch["obs"][0, 0, :, 0] / 10.0  # item k has priority k
        raw = (4 * probs) ** -(0.4 + 0.6 * step / 10)
        np.testing.assert_allclose(w[0], raw / raw.max(), rtol=1e-6)
        assert w.dtype == np.float32 and w.max() == 1.0


def test_new_items_get_the_max_priority_so_far():
    buf = _four_items(alpha=1.0, eps=0.0)
    buf.update_priorities(np.arange(4), np.array([1.0, 9.0, 1.0, 1.0]))  # the first four slots, in order
    buf.add(message({5: 4}, [([5], 0, 0, 4)]))
    assert buf.state_dict()["items"]["priority"].tolist() == [1.0, 9.0, 1.0, 1.0, 9.0]


def test_stale_priority_updates_for_reused_slots_are_dropped():
    buf = SequenceReplay(capacity=16, sequence_length=L, alpha=1.0, eps=0.0, seed=0)  # 16 item slots
    one_step_items = lambda k0: message({k: 1 for k in range(k0, k0 + 16)},
                                        [([k], 0, 0, 1) for k in range(k0, k0 + 16)])
    one_hot = np.where(np.arange(16) == 0, 1000.0, 1.0)[None]
    buf.add(one_step_items(1))
    batch, idx, _ = buf.sample_many(1, 16)
    buf.add(one_step_items(101))  # evicts all 16 items and reuses their slots
    assert set(buf.sample_many(1, 16)[1].ravel().tolist()) & set(idx.ravel().tolist())
    buf.update_priorities(idx, one_hot, batch["_generation"])
    keys = buf.sample_many(20, 16)[0]["obs"][:, 0, :, 0].astype(int)
    assert np.bincount(keys.ravel()).max() < 60, "a stale update was applied to a successor"
    batch, idx, _ = buf.sample_many(1, 16)
    buf.update_priorities(idx, one_hot, batch["_generation"])
    hot = batch["obs"][0, 0, 0, 0]
    assert (buf.sample_many(1, 64)[0]["obs"][0, 0, :, 0] == hot).mean() > 0.9, "a current update applies"


def test_steady_state_needs_no_more_chunk_slots():
    buf = SequenceReplay(capacity=64, sequence_length=L, seed=0)  # 17 chunk slots of 4 steps
    sizes = []
    for k in range(0, 400, 2):  # a stream of full chunks; each item overlaps the previous one by a chunk
        buf.add(message({k + 1: 4, k + 2: 4}, [([k, k + 1], 0, 0, 8), ([k + 1, k + 2], 0, 0, 8)]))
        sizes.append(buf.nbytes)
    assert buf.stored_steps == 64 and len(set(sizes[1:])) == 1, "room is made before new chunks are written"


# ---------------------------------------------------------------- checkpoints
def _fed_buffer(capacity=300, prioritized=True):
    rng = np.random.default_rng(3)
    adder = SequenceAdder(3, 9, 3, 2, 4, seed=3)
    buf = SequenceReplay(capacity, 9, prioritized=prioritized, seed=5)
    calls = make_calls(rng, [[(7, True), (30, False)], [(12, False)] * 5, [(3, True)] * 9], T=8, calls=12)
    return adder, buf, calls, rng


@pytest.mark.parametrize("prioritized", [True, False])
def test_state_dict_round_trip(tmp_path, prioritized):
    adder, buf, calls, rng = _fed_buffer(prioritized=prioritized)
    for call in calls[:8]:
        out = adder.add(**call)
        if out is not None:
            buf.add(out[0], rng.random(len(out[0]["version"])))
            batch, idx, _ = buf.sample_many(2, 4)
            buf.update_priorities(idx, rng.random(idx.shape), batch["_generation"])
    fresh = reloaded(tmp_path, buf, SequenceReplay(300, 9, prioritized=prioritized, seed=99))
    for call in calls[8:]:  # identical samples, and identical after further adds
        out = adder.add(**call)
        for b in (buf, fresh):
            if out is not None:
                b.add(out[0])
            x, idx, _ = b.sample_many(3, 5)
            b.update_priorities(idx, np.arange(idx.size, dtype=float).reshape(idx.shape), x["_generation"])
        (xa, ia, wa), (xb, ib, wb) = buf.sample_many(2, 6), fresh.sample_many(2, 6)
        np.testing.assert_array_equal(ia, ib)
        np.testing.assert_array_equal(wa, wb)
        assert xa.keys() == xb.keys() and all(np.array_equal(xa[k], xb[k]) for k in xa)
    assert digest(fresh.state_dict()) == digest(buf.state_dict())
    assert fresh.chunk_refcounts() == buf.chunk_refcounts() and fresh.dropped_items == buf.dropped_items


def test_empty_state_round_trip():
    buf = SequenceReplay(10, L)
    fresh = SequenceReplay(10, L)
    fresh.load_state_dict(buf.state_dict())
    assert len(fresh) == 0 and fresh.nbytes == 0
    with pytest.raises(ValueError):
        SequenceReplay(11, L).load_state_dict(buf.state_dict())


# ---------------------------------------------------------------- end to end
def check_invariants(buf: SequenceReplay, capacity: int) -> None:
    state = buf.state_dict()
    items, chunks = state["items"], state["chunks"]
    refs = items["chunks"][items["chunks"] >= 0]
    assert set(refs.tolist()) <= set(chunks["slot"].tolist()), "every referenced chunk is live"
    counts = dict(zip(*np.unique(refs, return_counts=True)))
    assert buf.chunk_refcounts() == {int(k): int(counts[s]) for k, s in zip(chunks["key"], chunks["slot"])}
    assert buf.stored_steps == chunks["length"].sum() <= capacity
    serial = int(state["counters"][4])
    assert items["serial"].tolist() == list(range(serial - len(buf), serial)), "FIFO: the newest items live"


@settings(max_examples=60, deadline=None, database=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), E=st.integers(1, 3), burn_in=st.integers(0, 4), length=st.integers(1, 6),
       n_step=st.integers(0, 2), period=st.integers(1, 6), chunk=st.integers(1, 6), capacity=st.integers(20, 200),
       prioritized=st.booleans())
def test_adder_into_store_samples_equal_reference(data, E, burn_in, length, n_step, period, chunk, capacity,
                                                  prioritized):
    seq = burn_in + length + n_step
    episodes = [data.draw(st.lists(st.tuples(st.integers(1, 20), st.booleans()), max_size=5)) for _ in range(E)]
    rng = np.random.default_rng(data.draw(st.integers(0, 1000)))
    adder = SequenceAdder(E, seq, period, burn_in, chunk, seed=1)
    buf = SequenceReplay(capacity, seq, prioritized=prioritized, seed=2)
    ref = Reference(E, seq, period, burn_in, chunk)
    for call in make_calls(rng, episodes, T=7, calls=6):
        out = adder.add(**call)
        ref.add(call)
        if out is not None:
            buf.add(out[0], rng.random(len(out[0]["version"])))
        if len(buf):
            check_invariants(buf, capacity)
            batch, idx, _ = buf.sample_many(2, 8)
            buf.update_priorities(idx, rng.random(idx.shape), batch["_generation"])
            _check_batch(batch, ref, burn_in, period)


def _check_batch(batch: dict, ref: Reference, burn_in: int, period: int) -> None:
    for b in range(batch["valid"].shape[0]):
        for i in range(batch["valid"].shape[2]):
            pad = int(batch["valid"][b, :, i].argmax())
            e, n, step = (int(x) for x in batch["obs"][b, pad, i, :3])
            k, rem = divmod(step - pad + burn_in, period)
            assert rem == 0
            want = ref.window((e, n, k))
            for f in (*STORED, "valid", "first"):
                np.testing.assert_array_equal(batch[f][b, :, i], want[f], err_msg=f)
            np.testing.assert_array_equal(batch["state"][b, i], want["state"])
            assert batch["version"][b, i] == want["version"]
