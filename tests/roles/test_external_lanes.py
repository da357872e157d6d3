"""A recurrent policy's external episodes cut into columns that each store their start state
(`distrl.roles.external_lanes`): the learner, starting each column from its stored state and zeroing it where
an episode ends, sees at every step the state the step's action was taken from."""
import numpy as np

from distrl.roles.external_lanes import Lanes
from distrl.roles.external_steps import Episodes
from tests.roles.test_external_steps import Identity


def state_of(episode: int, step: int) -> np.ndarray:
    """A toy policy's state before `step` of `episode`: zeros at its start (a (1, 2) state: S = 1, C = 2)."""
    return np.array([[step, episode + 1]], np.float32) if step else np.zeros((1, 2), np.float32)


def book(T=4, E=2):
    counts = {"steps": 0, "episodes": 0, "steps_lost": 0, "episodes_cut": 0}
    lanes = Lanes(Identity(), T, E, worker_index=0)
    return lanes, counts, lambda: Episodes(lanes, T, max_open=64, counts=counts)


class Play:
    """Open episodes of one connection, stepped one action at a time: the observation is (episode, step)."""

    def __init__(self, episodes: Episodes):
        self.episodes, self.steps = episodes, {}

    def start(self, episode: int) -> None:
        self.episodes.start(str(episode))
        self.steps[episode] = 0

    def act(self, episode: int, state: np.ndarray | None = None) -> None:
        j = self.steps[episode]
        self.episodes.act(str(episode), np.array([episode, j], np.float32), 0,
                          {"state": state_of(episode, j) if state is None else state}, 0)
        self.episodes.reward(str(episode), 1.0)
        self.steps[episode] = j + 1

    def end(self, episode: int, truncated: bool = False) -> None:
        self.episodes.end(str(episode), np.array([episode, self.steps.pop(episode)], np.float32), truncated)


def replay(data: dict) -> None:
    """Unroll each column as the learner does: its stored state, zeroed after an end, one step of the toy
    recurrence a step; every step's state must be the one its action was taken from."""
    T, E = data["rewards"].shape
    for e in range(E):
        state = data["state"][0, e]
        for t in range(T):
            if t and (data["terminated"][t - 1, e] or data["truncated"][t - 1, e]):
                state = np.zeros_like(state)
            np.testing.assert_array_equal(state, data["state"][t, e], err_msg=f"column {e}, step {t}")
            episode, step = data["obs"][t, e]
            state = state_of(int(episode), int(step) + 1)


def test_a_long_episode_goes_on_in_columns_that_store_its_state_and_a_new_one_fills_where_one_ended():
    lanes, counts, connection = book(T=4, E=2)
    play = Play(connection())
    play.start(0)
    play.start(1)
    for _ in range(3):  # interleaved: episode 0 takes 3 steps and ends, episode 1 goes on for 9
        play.act(0)
        play.act(1)
    play.end(0)  # its 3 steps wait in their column for an episode to go on after them
    assert len(lanes.waiting) == 1 and lanes.waiting[0].filled == 3
    for _ in range(6):
        play.act(1)
    assert len(lanes.ready) == 1
    data = lanes.ready[0].data
    replay(data)
    # episode 1's first step (from zeros) ends episode 0's column; its steps 1-4 fill a column of their own
    np.testing.assert_array_equal(data["obs"][:, :, 0].T, [[0, 0, 0, 1], [1, 1, 1, 1]])
    np.testing.assert_array_equal(data["obs"][:, :, 1].T, [[0, 1, 2, 0], [1, 2, 3, 4]])
    assert data["terminated"][2, 0] and data["terminated"].sum() == 1 and not data["truncated"].any()  # no cut
    # what a fragment stores of a column's states: the one before its first step (each step's, here)
    np.testing.assert_array_equal(data["state"][0, 0], state_of(0, 0))
    np.testing.assert_array_equal(data["state"][0, 1], state_of(1, 1))
    column = play.episodes.open["1"].column  # steps 5-7 wait in a third column, from their state
    assert column.filled == 3 and column.arrays["obs"][0].tolist() == [1, 5]
    np.testing.assert_array_equal(column.arrays["x/state"][0], state_of(1, 5))
    assert counts["steps"] == 11 and lanes.waiting == [] and lanes.full == []


def test_pieces_of_interleaved_episodes_on_many_connections_replay_as_they_were_acted():
    rng = np.random.default_rng(0)
    lanes, counts, connection = book(T=8, E=3)
    plays = [Play(connection()) for _ in range(3)]
    ids, lengths, truncated_ends, cut = iter(range(10**6)), {}, set(), set()
    for _ in range(4000):
        play = plays[rng.integers(len(plays))]
        if len(play.steps) < 3 and rng.random() < 0.3:
            episode = next(ids)
            play.start(episode)
            lengths[episode] = int(rng.choice([1, 3, 7, 8, 9, 20, 50]))
        elif play.steps:
            episode = list(play.steps)[rng.integers(len(play.steps))]
            if play.steps[episode] < lengths[episode]:
                play.act(episode)
            else:
                truncated = bool(rng.random() < 0.3)
                if truncated:
                    truncated_ends.add((episode, play.steps[episode] - 1))
                play.end(episode, truncated)
        if rng.random() < 0.002:  # a connection closes: its open episodes are cut
            cut |= set(play.steps)
            play.episodes.close()
            plays[plays.index(play)] = Play(connection())
        # memory stays bounded: a column per open episode, those waiting fewer than the episodes open
        assert len(lanes.waiting) <= 9 and all(ep.held <= 8 for p in plays for ep in p.episodes.open.values())
    assert len(lanes.ready) >= 20 and counts["episodes_cut"] >= 3
    for frag in lanes.ready:
        replay(frag.data)
    data = {k: np.concatenate([f.data[k] for f in lanes.ready], axis=1)
            for k in ("state", "obs", "terminated", "truncated")}
    steps = [tuple(map(int, o)) for o in data["obs"].reshape(-1, 2)]
    assert len(set(steps)) == len(steps)  # every step once
    truncations = {steps[i] for i in np.flatnonzero(data["truncated"].reshape(-1))}
    assert truncated_ends & truncations and truncations <= truncated_ends | {s for s in truncations if s[0] in cut}
    assert (data["state"][0] != 0).any(axis=(1, 2)).sum() >= 10  # columns that start inside an episode...
    going_on = ~(data["terminated"][-1] | data["truncated"][-1])
    assert going_on.sum() >= 10  # ...where the column before them ended with no cut


def test_a_piece_that_does_not_start_from_zeros_starts_a_column_and_a_cut_episode_ends_in_a_truncation():
    lanes, counts, connection = book(T=4, E=2)
    play = Play(connection())
    play.start(0)
    for _ in range(3):
        play.act(0)
    play.end(0)  # 3 steps: their column waits for an episode to go on after them
    other = Play(connection())
    other.start(7)  # a reconnected client's episode, announced anew mid-way: its first step's state is its own
    other.steps[7] = 5
    for _ in range(3):
        other.act(7)
    other.end(7)
    assert [c.arrays["obs"][0].tolist() for c in lanes.waiting] == [[0, 0], [7, 5]]  # a column of its own
    play.start(1)
    for _ in range(5):  # steps 0-3 complete: step 0 ends the fullest waiting column, 1-3 start a new one
        play.act(1)
    play.episodes.close()  # step 4, acted, never completed: lost
    assert counts["steps_lost"] == 1 and counts["episodes_cut"] == 1
    assert len(lanes.full) == 1 and lanes.full[0].arrays["obs"][:, 0].tolist() == [0, 0, 0, 1]
    column = lanes.waiting[-1]  # episode 1's, waiting for another to go on after its last step...
    assert column.arrays["obs"][:3, 1].tolist() == [1, 2, 3]
    assert column.arrays["truncated"][:3].tolist() == [False, False, True]  # ...now a truncation
    np.testing.assert_array_equal(column.arrays["x/state"][0], state_of(1, 1))


def test_steps_in_bulk_make_the_same_columns_as_steps_one_by_one():
    def fill(bulk: bool):
        lanes, counts, connection = book(T=4, E=2)
        episodes = connection()
        episodes.start("e")
        obs = np.stack([np.zeros(13), np.arange(13)], 1).astype(np.float32)
        states = np.stack([state_of(0, j) for j in range(13)])
        if bulk:  # a local client's segments
            for a, b in ((0, 5), (5, 6), (6, 13)):
                episodes.extend("e", obs[a:b], np.zeros(b - a, np.int64), {"state": states[a:b]},
                                np.zeros(b - a, np.int64), np.ones(b - a))
        else:
            for j in range(13):
                episodes.act("e", obs[j], 0, {"state": states[j]}, 0)
                episodes.reward("e", 1.0)
        episodes.end("e", np.array([0, 13], np.float32), truncated=True)
        assert len(lanes.ready) == 1 and len(lanes.full) == 1 and len(lanes.waiting) == 1
        return lanes.ready[0].data, lanes.full[0].arrays, lanes.waiting[0]

    (bulk, bulk_full, bulk_last), (single, single_full, single_last) = fill(True), fill(False)
    for name in single:
        np.testing.assert_array_equal(bulk[name], single[name], err_msg=name)
    for name in single_full:
        np.testing.assert_array_equal(bulk_full[name], single_full[name], err_msg=name)
    replay(single)
    np.testing.assert_array_equal(single["obs"][:, :, 1].T, [[0, 1, 2, 3], [4, 5, 6, 7]])
    np.testing.assert_array_equal(single["state"][0, 1], state_of(0, 4))
    np.testing.assert_array_equal(single_full["x/state"][0], state_of(0, 8))
    assert not single["truncated"].any() and not single_full["truncated"].any()  # no cut between its columns
    assert bulk_last.filled == single_last.filled == 1 and single_last.arrays["truncated"][0]  # its own end
