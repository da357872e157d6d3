"""Simulators' events into complete steps, chunks and (T, E) fragments (`distrl.roles.external_steps`)."""
import numpy as np

from distrl.roles.external_steps import Assembler, Episodes


class Identity:
    """A policy whose stored items are the trajectory itself: the fragment's layout shows."""

    def postprocess(self, traj):
        return {"obs": traj.obs, "rewards": traj.rewards, "terminated": traj.terminated, "truncated": traj.truncated,
                "next_obs": traj.next_obs, "actions": traj.actions, **traj.extras}, None


def book(T=4, E=2, chunk=4):
    counts = {"steps": 0, "episodes": 0, "steps_lost": 0, "episodes_cut": 0}
    assembler = Assembler(Identity(), T, E, worker_index=3)
    return assembler, Episodes(assembler, chunk, max_open=8, counts=counts), counts


def play(episodes, name, steps, base, end=None, version=0):
    """`steps` actions in episode `name`, observation base + i, reward i + 1 each; then `end`."""
    episodes.start(name)
    episodes.reward(name, 100.0)  # before the first action: no step to earn it, dropped
    for i in range(steps):
        episodes.act(name, np.array([base + i], np.float32), i % 2, {"logp": np.float32(-i)}, version + i)
        episodes.reward(name, i + 1.0)
    if end is not None:
        episodes.end(name, np.array([base + steps], np.float32), truncated=end == "truncated")


def test_chunks_fill_the_columns_one_after_another_and_each_chunk_ends():
    assembler, episodes, counts = book()
    play(episodes, "a", 3, 0.0, end="terminated")
    play(episodes, "b", 6, 10.0, end="terminated")
    assert len(assembler.ready) == 1
    frag = assembler.ready[0]
    d = frag.data
    np.testing.assert_array_equal(d["obs"][:, :, 0].T, [[0, 1, 2, 10], [11, 12, 13, 14]])  # column 0, column 1
    np.testing.assert_array_equal(d["next_obs"][:, :, 0].T, [[1, 2, 3, 11], [12, 13, 14, 15]])
    np.testing.assert_array_equal(d["terminated"].T, [[False, False, True, False], [False, False, False, False]])
    # b's first chunk (b0..b3) was cut after 4 steps: its last step is a truncation, bootstrapped from b4's obs
    np.testing.assert_array_equal(d["truncated"].T, [[False, False, False, False], [False, False, True, False]])
    np.testing.assert_array_equal(d["rewards"].T, [[1, 2, 3, 1], [2, 3, 4, 5]])
    np.testing.assert_array_equal(d["version"].T, [[0, 1, 2, 0], [1, 2, 3, 4]])  # each step's own weights
    assert d["version"].dtype == np.int32 and d["logp"].shape == (4, 2)
    assert frag.info.env_steps == 8 and frag.info.items == 4 and frag.info.worker == 3 and frag.info.version == 0
    np.testing.assert_array_equal(frag.info.episode_returns, [6.0])  # a's; b's end goes with the next fragment
    assert counts["steps"] == 9 and counts["episodes"] == 2
    assert assembler.filled == 1 and assembler.returns == [21.0]  # b's last step starts the next fragment


def test_a_truncated_end_is_a_truncation_and_a_closed_connection_loses_only_the_unsent_part():
    assembler, episodes, counts = book(T=8, E=1, chunk=4)
    play(episodes, "a", 2, 0.0, end="truncated")
    play(episodes, "b", 6, 10.0)  # open: its first 4 steps were sent as a chunk, 1 complete + 1 pending wait
    episodes.close()
    assert counts == {"steps": 7, "episodes": 1, "steps_lost": 2, "episodes_cut": 1}
    assert assembler.filled == 6 and not assembler.ready
    trunc = assembler.arrays["truncated"][:6]
    np.testing.assert_array_equal(trunc, [False, True, False, False, False, True])
    assert not assembler.arrays["terminated"][:6].any()


def test_an_episode_id_opens_once_and_a_connection_holds_a_bounded_number():
    _, episodes, _ = book()
    assert episodes.start("x") is None
    assert "already open" in episodes.start("x")
    for i in range(7):
        episodes.start(f"y{i}")
    assert "most" in episodes.start("z")


def test_steps_in_bulk_make_the_same_fragment_as_steps_one_by_one():
    def fill(bulk: bool):
        assembler, episodes, counts = book(T=4, E=3, chunk=4)
        episodes.start("e")
        obs, rewards = np.arange(12, dtype=np.float32)[:, None], np.arange(12, dtype=np.float32) + 1
        extras, versions = {"logp": -np.arange(12, dtype=np.float32)}, np.arange(12)
        if bulk:  # a local client's segments: 5 steps, 4, then 3 (chunks cut where one by one cuts them)
            for cut in (slice(0, 5), slice(5, 9), slice(9, 12)):
                episodes.extend("e", obs[cut], obs[cut, 0].astype(np.int64) % 2,
                                {k: v[cut] for k, v in extras.items()}, versions[cut], rewards[cut])
        else:
            for i in range(12):
                episodes.act("e", obs[i], i % 2, {"logp": extras["logp"][i]}, i)
                episodes.reward("e", rewards[i])
        episodes.end("e", np.array([12.0], np.float32), truncated=False)
        return assembler.ready[0].data, counts

    (bulk, bulk_counts), (single, single_counts) = fill(True), fill(False)
    assert bulk_counts == single_counts == {"steps": 12, "episodes": 1, "steps_lost": 0, "episodes_cut": 0}
    for name in single:
        np.testing.assert_array_equal(bulk[name], single[name], err_msg=name)
    np.testing.assert_array_equal(single["next_obs"][:, :, 0].T, [[1, 2, 3, 4], [5, 6, 7, 8], [9, 10, 11, 12]])
    assert single["terminated"].sum() == 1 and single["terminated"][3, 2]  # the episode's end
    assert single["truncated"].sum() == 2 and single["truncated"][3, :2].all()  # where its chunks were cut
