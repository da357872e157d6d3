"""The MAPF gridworld: collision rules, solvable maps, observations, episodes and metrics."""
from __future__ import annotations

from collections import deque

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from distrl.envs.mapf import MAPF, MOVES, resolve_moves

STAY, UP, DOWN, LEFT, RIGHT = range(5)
R = dict(move=-0.075, stay_off=-0.075, stay_on=0.0, collision=-0.5, goal=3.0)


def grid(rows: str) -> np.ndarray:
    """'#' obstacle, '.' free; one string per row."""
    return np.array([[c == "#" for c in row] for row in rows.split()], bool)


def env_on(rows: str, starts, goals, **kw) -> tuple[MAPF, object]:
    obstacles = grid(rows)
    env = MAPF(size=len(obstacles), num_agents=len(starts), **kw)
    return env, env.reset_to(obstacles, starts, goals)


# --- collision rules on hand-built cases ------------------------------------------------
def test_vertex_conflict_both_movers_stay_and_are_penalised():
    env, _ = env_on("... ... ...", [(1, 0), (1, 2)], [(0, 0), (0, 2)])
    st = env.step([RIGHT, LEFT])
    assert env.positions.tolist() == [[1, 0], [1, 2]]
    assert np.allclose(st.rewards, [R["collision"]] * 2)
    assert st.info == {} and env.agent_collisions == 2


def test_moving_into_a_staying_agent_blocks_only_the_mover():
    env, _ = env_on("... ... ...", [(1, 0), (1, 1)], [(0, 0), (0, 2)])
    st = env.step([RIGHT, STAY])
    assert env.positions.tolist() == [[1, 0], [1, 1]]
    assert np.allclose(st.rewards, [R["collision"], R["stay_off"]])


def test_swap_conflict():
    env, _ = env_on("... ... ...", [(1, 0), (1, 1)], [(0, 0), (0, 2)])
    st = env.step([RIGHT, LEFT])
    assert env.positions.tolist() == [[1, 0], [1, 1]]
    assert np.allclose(st.rewards, [R["collision"]] * 2)


def test_following_and_rotation_are_allowed():
    env, _ = env_on("... ... ...", [(1, 0), (1, 1)], [(0, 0), (0, 2)])
    env.step([RIGHT, RIGHT])
    assert env.positions.tolist() == [[1, 1], [1, 2]]
    # four agents turning around a 2x2 block: no vertex and no swap conflict
    env, _ = env_on("... ... ...", [(0, 0), (0, 1), (1, 1), (1, 0)], [(2, 0), (2, 1), (2, 2), (0, 2)])
    st = env.step([RIGHT, DOWN, LEFT, UP])
    assert env.positions.tolist() == [[0, 1], [1, 1], [1, 0], [0, 0]]
    assert np.allclose(st.rewards, R["move"])


def test_chain_behind_a_wall_blocked_agent_stays():
    # agents in a row all moving right; the front one hits the wall, so each blocks the one behind
    env, _ = env_on(".... .... .... ....", [(0, 1), (0, 2), (0, 3)], [(3, 0), (3, 1), (3, 2)])
    st = env.step([RIGHT, RIGHT, RIGHT])
    assert env.positions.tolist() == [[0, 1], [0, 2], [0, 3]]
    assert np.allclose(st.rewards, R["collision"])
    assert env.collisions == 3 and env.agent_collisions == 2


def test_chain_behind_a_vertex_conflict():
    # 0 and 1 both move into (1, 2): both sent back; 2 was following 1 and is blocked in round 2
    env, _ = env_on("..... ..... ..... ..... .....", [(0, 2), (1, 1), (1, 0)], [(2, 0), (2, 1), (2, 2)])
    st = env.step([DOWN, RIGHT, RIGHT])
    assert env.positions.tolist() == [[0, 2], [1, 1], [1, 0]]
    assert np.allclose(st.rewards, R["collision"])


def test_obstacles_and_walls_block_with_penalty():
    env, _ = env_on(".#. ... ...", [(0, 0), (2, 2)], [(2, 0), (0, 2)])
    st = env.step([RIGHT, DOWN])
    assert env.positions.tolist() == [[0, 0], [2, 2]]
    assert np.allclose(st.rewards, R["collision"])
    st = env.step([UP, LEFT])
    assert env.positions.tolist() == [[0, 0], [2, 1]]
    assert np.allclose(st.rewards, [R["collision"], R["move"]])
    assert env.collisions == 3 and env.agent_collisions == 0


def test_agents_on_goal_rewards():
    env, _ = env_on("... ... ...", [(1, 1), (2, 2)], [(1, 1), (0, 0)])
    st = env.step([STAY, STAY])
    assert np.allclose(st.rewards, [R["stay_on"], R["stay_off"]])
    st = env.step([UP, STAY])  # leaving the goal gives the goal reward back
    assert np.allclose(st.rewards, [R["move"] - R["goal"], R["stay_off"]])
    st = env.step([DOWN, STAY])
    assert np.allclose(st.rewards, [R["move"] + R["goal"], R["stay_off"]])
    env.step([STAY, LEFT])  # agent 1 to (2, 1)
    st = env.step([DOWN, UP])  # a swap: blocked on its goal, agent 0 is still on it
    assert env.positions.tolist() == [[1, 1], [2, 1]]
    assert np.allclose(st.rewards, R["collision"]) and env.on_goal[0]


def reference_moves(pos, actions, obstacles, present):
    """The rules written out agent by agent: the independent reference for `resolve_moves`."""
    n, size = len(pos), len(obstacles)
    target, penalised = [tuple(p) for p in pos], set()
    for i in range(n):
        if present[i] and actions[i] != STAY:
            r, c = pos[i][0] + MOVES[actions[i]][0], pos[i][1] + MOVES[actions[i]][1]
            if 0 <= r < size and 0 <= c < size and not obstacles[r][c]:
                target[i] = (r, c)
            else:
                penalised.add(i)
    while True:
        stop = []
        for i in range(n):
            if not present[i] or target[i] == tuple(pos[i]):
                continue
            for j in range(n):
                if j == i or not present[j]:
                    continue
                if target[j] == target[i] or (target[j] == tuple(pos[i]) and target[i] == tuple(pos[j])):
                    stop.append(i)
                    break
        if not stop:
            return target, penalised
        for i in stop:
            target[i] = tuple(pos[i])
            penalised.add(i)


@settings(max_examples=300, deadline=None, database=None, derandomize=True)
@given(st.integers(0, 2**32 - 1), st.integers(1, 10), st.integers(3, 6))
def test_resolve_moves_matches_reference_and_invariants(seed, n, size):
    rng = np.random.default_rng(seed)
    obstacles = rng.random((size, size)) < 0.2
    cells = np.flatnonzero(~obstacles)
    n = min(n, len(cells))
    pos = np.stack(np.divmod(rng.choice(cells, n, replace=False), size), axis=1)
    actions = rng.integers(0, 5, n)
    present = rng.random(n) < 0.85
    new_pos, bumped, blocked = resolve_moves(pos, actions, ~obstacles, present)
    target, penalised = reference_moves(pos.tolist(), actions, obstacles.tolist(), present)
    assert [tuple(p) for p in new_pos.tolist()] == target
    assert set(np.flatnonzero(bumped | blocked).tolist()) == penalised
    live = [tuple(p) for p, a in zip(new_pos.tolist(), present) if a]
    assert len(set(live)) == len(live)  # no two agents in one cell
    assert not obstacles[new_pos[:, 0], new_pos[:, 1]].any()
    for i in range(n):
        for j in range(n):
            if i != j and present[i] and present[j]:
                assert not ((new_pos[i] == pos[j]).all() and (new_pos[j] == pos[i]).all())


# --- maps ------------------------------------------------------------------------------
def bfs(free: np.ndarray, source) -> np.ndarray:
    """Reference BFS distances (-1 unreachable), one cell at a time."""
    size = len(free)
    dist = -np.ones(free.shape, int)
    dist[source] = 0
    queue = deque([source])
    while queue:
        r, c = queue.popleft()
        for dr, dc in ((-1, 0), (1, 0), (0, -1), (0, 1)):
            nr, nc = r + dr, c + dc
            if 0 <= nr < size and 0 <= nc < size and free[nr, nc] and dist[nr, nc] < 0:
                dist[nr, nc] = dist[r, c] + 1
                queue.append((nr, nc))
    return dist


def path(free: np.ndarray, start, goal) -> list[int]:
    """Actions of a shortest path from start to goal (reference BFS from the goal)."""
    dist, here, acts = bfs(free, tuple(goal)), tuple(start), []
    while dist[here] > 0:
        for a in (UP, DOWN, LEFT, RIGHT):
            nxt = (here[0] + MOVES[a][0], here[1] + MOVES[a][1])
            if 0 <= nxt[0] < len(free) and 0 <= nxt[1] < len(free) and dist[nxt] == dist[here] - 1:
                acts.append(a)
                here = nxt
                break
    return acts


def test_every_generated_map_is_well_formed():
    rng = np.random.default_rng(0)
    for seed in range(150):
        size, n = int(rng.integers(5, 21)), int(rng.integers(1, 9))
        env = MAPF(size=size, num_agents=n, density=float(rng.uniform(0, 0.4)), fov=5)
        env.reset(seed=seed)
        ends = {tuple(c) for c in np.concatenate([env.positions, env.goals]).tolist()}
        assert len(ends) == 2 * n  # starts and goals all distinct
        for i in range(n):
            free = ~env.obstacles.copy()
            for cell in ends - {tuple(env.positions[i]), tuple(env.goals[i])}:
                free[cell] = False
            assert bfs(free, tuple(env.positions[i]))[tuple(env.goals[i])] >= 0, (seed, i)


@pytest.mark.parametrize("seed", range(5))
def test_generated_maps_are_solved_by_moving_agents_one_at_a_time(seed):
    env = MAPF(size=12, num_agents=6, density=0.3, max_steps=10_000)
    env.reset(seed=seed)
    starts, goals = env.positions.copy(), env.goals.copy()
    ends = {tuple(c) for c in np.concatenate([starts, goals]).tolist()}
    st = None
    for i in range(env.num_agents):
        free = ~env.obstacles.copy()
        for cell in ends - {tuple(starts[i]), tuple(goals[i])}:
            free[cell] = False
        for a in path(free, starts[i], goals[i]):
            actions = np.zeros(env.num_agents, int)
            actions[i] = a
            st = env.step(actions)
            assert env.collisions == 0
    assert st.terminated and st.info["success"] == 1.0


def test_heuristic_channels_match_reference_bfs():
    env = MAPF(size=10, num_agents=4, density=0.3, fov=7)
    st = env.reset(seed=3)
    r = env.fov // 2
    for i in range(env.num_agents):
        dist = bfs(~env.obstacles, tuple(env.goals[i]))
        for ch, a in zip(range(3, 7), (UP, DOWN, LEFT, RIGHT)):
            for vr in range(env.fov):
                for vc in range(env.fov):
                    cell = (env.positions[i][0] + vr - r, env.positions[i][1] + vc - r)
                    nxt = (cell[0] + MOVES[a][0], cell[1] + MOVES[a][1])
                    inside = all(0 <= x < env.size for x in cell + nxt)
                    want = inside and dist[cell] >= 0 and dist[nxt] >= 0 and dist[nxt] < dist[cell]
                    assert st.obs[i, ch, vr, vc] == float(want), (i, ch, vr, vc)


def test_seeding_reproduces_maps_and_episodes():
    def episode(seed):
        env = MAPF(size=10, num_agents=4, max_steps=30)
        steps = [env.reset(seed=seed)]
        rng = np.random.default_rng(0)
        while not (steps[-1].terminated or steps[-1].truncated):
            steps.append(env.step(rng.integers(0, 5, 4)))
        return env, steps

    (e1, s1), (e2, s2), (e3, _) = episode(7), episode(7), episode(8)
    assert np.array_equal(e1.obstacles, e2.obstacles) and np.array_equal(e1.goals, e2.goals)
    assert not np.array_equal(e1.obstacles, e3.obstacles)
    for a, b in zip(s1, s2):
        assert np.array_equal(a.obs, b.obs) and np.array_equal(a.rewards, b.rewards)
        assert np.array_equal(a.comm_mask, b.comm_mask)
    assert s1[-1].info == s2[-1].info
    env = MAPF(size=10, num_agents=4)
    env.reset(seed=7)
    env.reset()  # unseeded resets continue the generator: a new map
    assert not np.array_equal(env.obstacles, e1.obstacles)


# --- observations --------------------------------------------------------------------
def test_observation_channels_on_a_hand_built_map():
    rows = "..#.. ..... .#... ..... ....#"
    _, st = env_on(rows, [(0, 0), (1, 1)], [(4, 0), (0, 4)], fov=3)
    o0, o1 = st.obs
    assert st.obs.shape == (2, 7, 3, 3) and st.obs.dtype == np.float32
    assert o0[0].tolist() == [[1, 1, 1], [1, 0, 0], [1, 0, 0]]  # outside the map counts as obstacle
    assert o0[1].tolist() == [[0, 0, 0], [0, 0, 0], [0, 0, 1]]
    assert o0[2].tolist() == [[0, 0, 0], [0, 0, 0], [0, 0.5, 0]]  # goal (4, 0) straight down
    assert o1[0].tolist() == [[0, 0, 1], [0, 0, 0], [0, 1, 0]]
    assert o1[1].tolist() == [[1, 0, 0], [0, 0, 0], [0, 0, 0]]
    assert o1[2].tolist() == [[0, 0, 0], [0, 0, 0.5], [0, 0, 0]]  # goal (0, 4): offset (-1, 3)
    # at the centre: agent 0 gets closer only going down; agent 1 only right ((0, 2) walls off up)
    assert o0[3:, 1, 1].tolist() == [0, 1, 0, 0]
    assert o1[3:, 1, 1].tolist() == [0, 0, 0, 1]
    _, st = env_on(rows, [(0, 0), (1, 1)], [(1, 0), (2, 2)], fov=3)
    assert st.obs[0, 2].tolist() == [[0, 0, 0], [0, 0, 0], [0, 1, 0]]  # in view: the cell itself
    assert st.obs[1, 2].tolist() == [[0, 0, 0], [0, 0, 0], [0, 0, 1]]


# --- episodes and metrics ---------------------------------------------------------------
def test_episode_terminates_when_all_on_goal_with_metrics():
    env, _ = env_on("... ... ...", [(0, 0), (2, 0)], [(0, 2), (2, 2)])
    st = env.step([RIGHT, LEFT])
    assert not (st.terminated or st.truncated) and st.info == {}
    st = env.step([RIGHT, RIGHT])
    assert not st.terminated
    st = env.step([STAY, RIGHT])
    assert st.terminated and not st.truncated and st.active.all()
    assert st.info == pytest.approx({"success": 1.0, "agent_success": 1.0, "makespan": 3.0, "sum_of_costs": 5.0,
                                     "solved_sum_of_costs": 5.0, "collisions": 1.0, "agent_collisions": 0.0,
                                     "return_mean": 2.6, "length": 3.0})
    with pytest.raises(RuntimeError):
        env.step([STAY, STAY])


def test_truncation_at_step_limit_and_costs_of_late_agents():
    env, _ = env_on("... ... ...", [(0, 0), (2, 0)], [(0, 1), (2, 2)], max_steps=4)
    env.step([RIGHT, STAY])  # agent 0 arrives at t=1
    env.step([LEFT, STAY])   # ...leaves at t=2
    st = env.step([RIGHT, STAY])  # ...and is back at t=3, for good
    assert not st.truncated
    st = env.step([STAY, STAY])
    assert st.truncated and not st.terminated
    assert st.info["success"] == 0.0 and st.info["agent_success"] == 0.5
    assert st.info["makespan"] == 4.0 and st.info["sum_of_costs"] == 3.0 + 4.0
    assert "solved_sum_of_costs" not in st.info  # unsolved: left out of its evaluation's mean


def test_arriving_on_the_last_step_terminates_not_truncates():
    env, _ = env_on("... ... ...", [(0, 0), (2, 2)], [(0, 1), (2, 2)], max_steps=1)
    st = env.step([RIGHT, STAY])
    assert st.terminated and not st.truncated and st.info["makespan"] == 1.0


def test_remove_done_agents_leave_the_map():
    rows = ".... #### #### ####"
    env, st = env_on(rows, [(0, 1), (0, 3)], [(0, 2), (0, 0)], remove_done_agents=True)
    st = env.step([RIGHT, STAY])
    assert st.active.tolist() == [False, True]
    assert not st.obs[0].any() and st.rewards[0] == pytest.approx(R["move"] + R["goal"])
    assert st.obs[1, 1].sum() == 0  # agent 0 is gone from the agents channel
    st = env.step([LEFT, LEFT])  # agent 1 passes where agent 0 vanished; agent 0's action is ignored
    assert env.positions[1].tolist() == [0, 2] and st.rewards[0] == 0 and not st.comm_mask.any()
    env.step([STAY, LEFT])
    st = env.step([STAY, LEFT])
    assert st.terminated and not st.active.any()
    assert st.info["makespan"] == 4.0 and st.info["sum_of_costs"] == 5.0


# --- communication ---------------------------------------------------------------------
def test_comm_mask_in_view_k_nearest():
    starts = [(0, 0), (0, 1), (2, 2), (0, 3), (5, 5)]
    goals = [(9, 0), (9, 1), (9, 2), (9, 3), (9, 4)]
    rows = " ".join(["." * 10] * 10)
    _, st = env_on(rows, starts, goals, fov=5, comm_k=2)
    receives = [set(np.flatnonzero(row).tolist()) for row in st.comm_mask]
    assert receives == [{1, 2}, {0, 3}, {1, 3}, {1, 2}, set()]  # ties (2: 1 and 3 at d^2 5) -> lower index
    assert not st.comm_mask.diagonal().any()
    assert st.comm_mask[0, 2] and not st.comm_mask[2, 0]  # k nearest makes it asymmetric
    _, st = env_on(rows, starts, goals, fov=5, comm_k=None)  # everyone in view: symmetric
    assert np.array_equal(st.comm_mask, st.comm_mask.T)
    assert [set(np.flatnonzero(row).tolist()) for row in st.comm_mask] == [{1, 2}, {0, 2, 3}, {0, 1, 3}, {1, 2}, set()]


@pytest.mark.parametrize("kwargs", [dict(size=1), dict(density=1.0), dict(fov=4), dict(num_agents=0),
                                    dict(max_steps=0), dict(comm_k=-1)])
def test_bad_kwargs_raise(kwargs):
    with pytest.raises(ValueError):
        MAPF(**kwargs)
