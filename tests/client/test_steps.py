"""Local inference's step buffer: each episode's rows in order, an open episode's newest held back."""
import numpy as np

from distrl.client.steps import StepBuffer


def add(buf: StepBuffer, slots: list[int], step: int) -> int:
    k = len(slots)
    obs = np.array([[10 * s + step] for s in slots], np.float32)
    return buf.add(np.array(slots), {"": obs}, np.arange(k), {"logp": np.full(k, -step, np.float32)}, step, np.zeros(k))


def test_rows_group_by_episode_in_order_and_held_rows_stay_with_their_rewards():
    buf = StepBuffer()
    rows = {}
    for step in range(3):
        slots = [0, 1, 2] if step < 2 else [2, 0]  # episode 1 ended after two steps
        block = add(buf, slots, step)
        for i, s in enumerate(slots):
            rows[s] = (block, i)
            buf.add_reward(rows[s], 1.0 + s)
    assert buf.rows == 8
    columns, hold, groups = buf.split([rows[0], rows[2]])  # 0 and 2 are open: their newest rows wait
    assert sorted(groups) == [0, 1, 2]
    assert columns["o/"][groups[0], 0].tolist() == [0.0, 1.0]
    assert columns["o/"][groups[1], 0].tolist() == [10.0, 11.0]
    assert columns["o/"][groups[2], 0].tolist() == [20.0, 21.0]
    assert columns["x/logp"][groups[2]].tolist() == [0.0, -1.0] and columns["versions"][groups[1]].tolist() == [0, 1]
    assert columns["rewards"][groups[1]].tolist() == [2.0, 2.0]
    buf.keep(columns, hold)
    assert buf.rows == 2 and buf.blocks[0]["o/"][:, 0].tolist() == [2.0, 22.0]
    buf.add_reward((0, 1), 5.0)  # the held row's reward still grows
    block = add(buf, [2], 3)
    columns, hold, groups = buf.split([(block, 0)])
    assert list(groups) == [0, 2] and len(groups[0]) == 1 and columns["rewards"][groups[2]].tolist() == [8.0]
    assert columns["o/"][hold, 0].tolist() == [23.0]


def test_an_empty_buffer_splits_into_nothing():
    columns, hold, groups = StepBuffer().split([])
    assert columns == {} and len(hold) == 0 and groups == {}
