"""SequenceAdder against a per-step reference that builds every item's window directly."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from distrl.replay.sequences import SequenceAdder, chunks_per_item

STORED = ("obs", "actions", "rewards", "extra", "discount", "mask")


# ---------------------------------------------------------------- input streams
def make_calls(rng, episodes: list[list[tuple[int, bool]]], T: int, calls: int) -> list[dict]:
    """`calls` fragments of T steps for len(episodes) envs; env e runs episodes[e] = [(length, terminated)].

    obs = (env, episode, step, 0) identifies every step; next_obs = (env, episode, step + 1, 1).
    Steps past the listed episodes belong to one more episode that never ends.
    """
    E, n = len(episodes), T * calls
    obs = np.zeros((n, E, 4), np.float32)
    term, trunc = np.zeros((n, E), bool), np.zeros((n, E), bool)
    for e, eps in enumerate(episodes):
        t = 0
        for ep, (length, terminated) in enumerate([*eps, (n, False)]):
            m = min(length, n - t)
            obs[t:t + m, e] = np.stack([np.full(m, e), np.full(m, ep), np.arange(m), np.zeros(m)], axis=1)
            if m == length and ep < len(eps):
                (term if terminated else trunc)[t + m - 1, e] = True
            t += m
            if t == n:
                break
    next_obs = obs + np.array([0, 0, 1, 1], np.float32)
    rand = {"actions": rng.integers(0, 5, (n, E)), "rewards": rng.normal(size=(n, E)).astype(np.float32),
            "extra": rng.integers(1, 9, (n, E, 2)).astype(np.int32)}
    q = rng.normal(size=(n, E, 3)).astype(np.float32)
    states = rng.normal(size=(n, E, 2)).astype(np.float32) + 5.0
    out = []
    for c in range(calls):
        sl = slice(c * T, (c + 1) * T)
        out.append({"steps": {"obs": obs[sl], **{k: v[sl] for k, v in rand.items()}},
                    "next_obs": {"obs": next_obs[sl]}, "terminated": term[sl], "truncated": trunc[sl],
                    "states": states[sl], "version": 100 + c, "aux": {"q": q[sl]}})
    return out


# ---------------------------------------------------------------- the reference
class Reference:
    """Loops over steps; builds each item's (L,) window from its episode's rows."""

    def __init__(self, E, L, period, burn_in, C):
        self.L, self.period, self.burn_in, self.C = L, period, burn_in, C
        self.current = [self._new() for _ in range(E)]
        self.done_eps: list[tuple[int, int, dict]] = []  # (env, episode, episode rows)
        self.count = [0] * E
        self.versions: dict[tuple, int] = {}  # item id -> version of the call it became ready in

    @staticmethod
    def _new():
        return {k: [] for k in (*STORED, "q", "state")} | {"ended": False}

    def add(self, call: dict) -> None:
        T, E = call["terminated"].shape
        for t in range(T):
            for e in range(E):
                ep = self.current[e]
                for k in ("obs", "actions", "rewards", "extra"):
                    ep[k].append(call["steps"][k][t, e])
                ep["q"].append(call["aux"]["q"][t, e])
                ep["state"].append(call["states"][t, e])
                ep["discount"].append(np.float32(0.0 if call["terminated"][t, e] else 1.0))
                ep["mask"].append(np.float32(1.0))
                if call["terminated"][t, e] or call["truncated"][t, e]:
                    for k in ("actions", "rewards", "extra", "discount", "mask", "q"):
                        ep[k].append(np.zeros_like(ep[k][-1]))
                    ep["obs"].append(call["next_obs"]["obs"][t, e])
                    ep["ended"] = True
                    self.done_eps.append((e, self.count[e], ep))
                    self.current[e] = self._new()
                    self.count[e] += 1
        for item in self.ready():
            self.versions.setdefault(item, call["version"])

    def _ks(self, ep: dict) -> list[int]:
        real = len(ep["state"])
        ks = [k for k in range(real + 1) if k * self.period < real]
        if ep["ended"]:
            return ks
        stored = len(ep["obs"])
        last = lambda k: k * self.period - self.burn_in + self.L - 1
        return [k for k in ks if stored >= (last(k) // self.C + 1) * self.C]

    def ready(self) -> set[tuple]:
        """Ids (env, episode, k) of items whose chunks are all closed by now."""
        out = {(e, n, k) for e, n, ep in self.done_eps for k in self._ks(ep)}
        return out | {(e, self.count[e], k) for e, ep in enumerate(self.current) for k in self._ks(ep)}

    def window(self, item: tuple) -> dict:
        e, n, k = item
        ep = next(ep for ee, nn, ep in self.done_eps if (ee, nn) == (e, n)) if n < self.count[e] else self.current[e]
        s = k * self.period - self.burn_in
        out = {}
        for f in (*STORED, "q"):
            rows = [ep[f][s + t] if 0 <= s + t < len(ep[f]) else np.zeros_like(ep[f][0]) for t in range(self.L)]
            out[f] = np.stack(rows)
        out["valid"] = np.array([0 <= s + t < len(ep["obs"]) for t in range(self.L)], np.float32)
        out["first"] = np.array([s + t == 0 for t in range(self.L)])
        out["state"] = ep["state"][s] if s > 0 else np.zeros_like(ep["state"][0])
        out["version"] = self.versions[item]
        return out


# ---------------------------------------------------------------- what the adder sent
class Collected:
    """Chunks and item windows rebuilt from the adder's messages, checking the message contract."""

    def __init__(self, L, C, burn_in, period):
        self.L, self.C, self.burn_in, self.period = L, C, burn_in, period
        self.chunks: dict[int, dict] = {}
        self.items: dict[tuple, dict] = {}

    def take(self, out) -> None:
        if out is None:
            return
        msg, emitted = out
        N, M = len(msg["version"]), len(msg["chunk/key"])
        assert N > 0 and msg["item/chunks"].shape == (N, chunks_per_item(self.L, self.C))
        assert msg["chunk/key"].dtype == np.int64 and np.all(msg["chunk/key"] >= 0)
        for i, key in enumerate(msg["chunk/key"].tolist()):
            assert key not in self.chunks, "a chunk's data travels once"
            n = int(msg["chunk/length"][i])
            assert 1 <= n <= self.C
            self.chunks[key] = {f: msg["chunk/" + f][i] for f in STORED}
            for f in STORED:
                assert not np.any(msg["chunk/" + f][i][n:]), "zero past the chunk's length"
        for i in range(N):
            w = self._window(msg, i)
            item = self._id(w, int(msg["item/pad_left"][i]))
            assert item not in self.items
            self.items[item] = w | {"emitted/" + f: v[:, i] for f, v in emitted.items()}
        assert all(emitted[f].shape[:2] == (self.L, N) for f in emitted)
        assert M == 0 or msg["chunk/obs"].shape[1] == self.C

    def _window(self, msg, i) -> dict:
        keys = [k for k in msg["item/chunks"][i].tolist() if k != -1]
        off, pad, n = (int(msg[f"item/{k}"][i]) for k in ("offset", "pad_left", "length"))
        assert pad + n <= self.L and all(k in self.chunks for k in keys)
        out = {}
        for f in STORED:
            seq = np.concatenate([self.chunks[k][f] for k in keys])[off:off + n]
            out[f] = np.zeros((self.L, *seq.shape[1:]), seq.dtype)
            out[f][pad:pad + n] = seq
        out["valid"] = np.zeros(self.L, np.float32)
        out["valid"][pad:pad + n] = 1
        out["first"] = np.zeros(self.L, bool)
        out["first"][pad] = bool(msg["item/first"][i])
        out["state"], out["version"] = msg["item/state"][i], int(msg["version"][i])
        return out

    def _id(self, w: dict, pad: int) -> tuple:
        e, n, step = (int(x) for x in w["obs"][pad, :3])
        k, rem = divmod(step - pad + self.burn_in, self.period)
        assert rem == 0
        return e, n, k


def check_against_reference(episodes, T, calls, L, period, burn_in, C, seed=0):
    rng = np.random.default_rng(seed)
    stream = make_calls(rng, episodes, T, calls)
    adder = SequenceAdder(len(episodes), L, period, burn_in, C, seed)
    ref, got = Reference(len(episodes), L, period, burn_in, C), Collected(L, C, burn_in, period)
    for call in stream:
        got.take(adder.add(**call))
        ref.add(call)
        assert set(got.items) == ref.ready(), "items are emitted exactly when their chunks are closed"
    for item, w in got.items.items():
        want = ref.window(item)
        for f in (*STORED, "valid", "first", "state"):
            np.testing.assert_array_equal(w[f], want[f], err_msg=f"{item} {f}")
        assert w["version"] == want["version"]
        for f in ("q", "rewards", "discount", "mask", "valid"):
            np.testing.assert_array_equal(w["emitted/" + f], want[f], err_msg=f"{item} emitted {f}")
    return got, ref


# ---------------------------------------------------------------- tests
def test_overlap_left_padding_and_shared_chunks():
    # one long episode; L = 2 + 4 + 1, period 2: 50% overlap of the trained part
    got, _ = check_against_reference([[]], T=10, calls=4, L=7, period=2, burn_in=2, C=3)
    pads = {k: w["valid"].argmax() for (_, _, k), w in got.items.items()}
    assert pads[0] == 2 and all(p == 0 for k, p in pads.items() if k > 0)
    assert len(got.chunks) == 40 // 3, "each full chunk sent once although items overlap"
    # item k ends at step 2k + 4; only the chunks up to step 38 are closed after 40 steps
    assert len(got.items) == 18


def test_terminated_and_truncated_ends():
    got, _ = check_against_reference([[(5, True)], [(5, False)]], T=8, calls=1, L=6, period=3, burn_in=0, C=4)
    for env, discount_last in ((0, 0.0), (1, 1.0)):
        w = got.items[(env, 0, 0)]
        assert w["valid"].tolist() == [1] * 6
        assert w["mask"].tolist() == [1, 1, 1, 1, 1, 0]
        assert w["discount"].tolist() == [1, 1, 1, 1, discount_last, 0]
        assert w["obs"][5].tolist() == [env, 0, 5, 1], "pseudo-step holds the final observation"
        assert w["actions"][5] == 0 and w["rewards"][5] == 0
        tail = got.items[(env, 0, 1)]
        assert tail["valid"].tolist() == [1, 1, 1, 0, 0, 0], "right padding after the pseudo-step"


def test_states_at_sequence_starts():
    got, ref = check_against_reference([[(9, True)]], T=12, calls=1, L=6, period=2, burn_in=3, C=4)
    states = ref.done_eps[0][2]["state"]
    for (_, _, k), w in got.items.items():
        s = 2 * k - 3
        want = states[s] if s > 0 else np.zeros(2, np.float32)
        np.testing.assert_array_equal(w["state"], want)
        assert (s <= 0) == w["first"].any()
    assert not np.any(got.items[(0, 0, 1)]["state"]), "start at the episode start: zero state"


@pytest.mark.parametrize("C", [1, 3, 16])
def test_items_span_fragments_and_envs(C):
    episodes = [[(3, True), (17, False), (1, True)], [(25, True)], []]
    got, _ = check_against_reference(episodes, T=4, calls=9, L=9, period=3, burn_in=2, C=C, seed=C)
    assert {e for e, _, _ in got.items} == {0, 1, 2}


def test_period_longer_than_window_skips_steps():
    got, _ = check_against_reference([[(30, True)]], T=31, calls=1, L=3, period=7, burn_in=0, C=2)
    assert sorted(k for _, _, k in got.items) == [0, 1, 2, 3, 4]


@settings(max_examples=300, deadline=None, database=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), E=st.integers(1, 3), T=st.integers(1, 9), calls=st.integers(1, 5),
       burn_in=st.integers(0, 5), length=st.integers(1, 6), n_step=st.integers(0, 3),
       period=st.integers(1, 8), C=st.integers(1, 8))
def test_matches_reference(data, E, T, calls, burn_in, length, n_step, period, C):
    episode = st.tuples(st.integers(1, 14), st.booleans())
    episodes = [data.draw(st.lists(episode, max_size=6)) for _ in range(E)]
    check_against_reference(episodes, T, calls, burn_in + length + n_step, period, burn_in, C,
                            seed=data.draw(st.integers(0, 2**16)))


def test_chunk_keys_unique_across_envs_and_restarts():
    keys = []
    for _ in range(2):  # the same seed twice: a restarted worker
        adder = SequenceAdder(3, 4, 2, 0, 2, seed=7)
        for call in make_calls(np.random.default_rng(0), [[(5, True)]] * 3, T=6, calls=2):
            out = adder.add(**call)
            if out is not None:
                keys.extend(out[0]["chunk/key"].tolist())
    assert len(keys) == len(set(keys)) > 10


def test_rejects_bad_input():
    adder = SequenceAdder(2, 4, 2, 0, 2, seed=0)
    call = make_calls(np.random.default_rng(0), [[], []], T=3, calls=2)
    with pytest.raises(ValueError, match="reserved"):
        adder.add(**{**call[0], "aux": {"mask": call[0]["aux"]["q"]}})
    with pytest.raises(ValueError, match="envs"):
        adder.add(**{**call[0], "terminated": call[0]["terminated"][:, :1], "truncated": call[0]["truncated"][:, :1]})
    adder.add(**call[0])
    with pytest.raises(ValueError, match="changed"):
        adder.add(**{**call[1], "aux": {"q": call[1]["aux"]["q"][..., :2]}})
    with pytest.raises(ValueError):
        SequenceAdder(1, 3, 1, 3, 2, seed=0)  # no room for a trained step after the burn-in


def test_reset_abandons_episodes():
    adder = SequenceAdder(1, 4, 2, 0, 2, seed=0)
    calls = make_calls(np.random.default_rng(0), [[]], T=4, calls=2)
    adder.add(**calls[0])
    adder.reset()
    msg, _ = adder.add(**calls[1])
    assert msg["item/first"][0] and msg["item/pad_left"][0] == 0
    assert msg["chunk/obs"][0, 0, 2] == 4, "the new episode starts at the first step after the reset"
