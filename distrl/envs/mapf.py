"""A multi-agent path-finding gridworld, vectorised in numpy (after DHC: Ma, Luo, Pan 2021).

Map: a square `size` x `size` grid, each cell an obstacle with probability `density`; N agents,
each with a start and a goal. Cells are (row, col); row 0 is the top.

Actions: 0 stay, 1 up (row - 1), 2 down (row + 1), 3 left (col - 1), 4 right (col + 1).

Moves are resolved simultaneously and deterministically (no agent has priority):
1. A move off the map or into an obstacle is not made: the agent stays and is penalised.
2. Then, in rounds until nothing changes: every moving agent in a vertex conflict (its target cell
   is the target of another agent, including one that stays there) or in a swap conflict (it and
   another agent would exchange cells) stays where it is and is penalised, all of a round's
   conflicts at once (two agents heading for one free cell both stay). An agent sent back
   occupies its cell again, so it can block the agent behind it in the next round (chains).
   Following (moving into a cell its occupant leaves) and rotations of 3+ agents are allowed.
   An agent that chose to stay is never penalised for others bumping into it.

Rewards per agent and step (kwargs, DHC's values): a blocked move `collision_reward` (-0.5);
a move `move_reward` (-0.075); stay off goal `stay_off_goal_reward` (-0.075); stay on goal
`stay_on_goal_reward` (0). Arriving on the own goal adds `goal_reward` (+3) and leaving it
subtracts `goal_reward`, so a goal can't be farmed by stepping off and on again.

Observation per agent: (7, fov, fov) float32 centred on the agent, channels
0 obstacles (cells outside the map count as obstacles), 1 other active agents,
2 own goal (1.0 at the goal cell if in view; else 0.5 at the border cell where the ray from
the agent towards the goal leaves the view), 3-6 DHC's heuristic channels for up, down, left,
right: 1 at free cells of the view from which that move reaches a cell strictly closer to
the agent's goal (BFS distances on the static map, computed once per map).

Episode: terminated when every agent is on its goal, truncated after `max_steps` steps.
With `remove_done_agents=True` an agent that reaches its goal leaves the map (it no longer
occupies a cell, is inactive; after its arrival reward it gets zero observations and rewards). `info` at the end: `success`,
`agent_success`, `makespan` (max over agents of the step at which it last arrived on its goal
and stayed, the episode length if not on goal), `sum_of_costs` (sum of the same),
`solved_sum_of_costs` (the same, in a solved episode only: MAPF's sum of costs over solved instances),
`collisions` (penalised moves: agents, obstacles, walls), `agent_collisions` (agents only),
`return_mean`, `length`.

Communication: mask[i, j] (i receives from j) for active j inside i's view (a symmetric
relation), keeping i's `comm_k` nearest (Euclidean, ties to the lower index); so not symmetric.
`comm_k=None` keeps everyone in view (symmetric).

Maps are solvable by construction: the starts and goals are 2N distinct cells of the largest
free component (avoiding corridor and junction cells when there are enough others), and the
endpoints of failing agents are redrawn until the instance is well-formed: every agent has a
path from its start to its goal avoiding all other agents' starts and goals (checked by BFS).
Then moving the agents one at a time to their goals solves it. `reset(seed)` reproduces the
map and, given the same actions, the whole episode; `reset_to(obstacles, starts, goals)` starts
on a given map.
"""
from __future__ import annotations

import numpy as np
from gymnasium import spaces

from distrl.envs.comm import comm_mask_from_positions
from distrl.envs.multiagent import MAStep, MultiAgentEnv, ParallelView

MOVES = np.array([[0, 0], [-1, 0], [1, 0], [0, -1], [0, 1]], np.int64)  # stay, up, down, left, right
CHANNELS = ("obstacles", "agents", "goal", "toward_up", "toward_down", "toward_left", "toward_right")
FAR = np.iinfo(np.int32).max  # BFS distance of unreachable cells


def bfs_distances(free: np.ndarray, sources: np.ndarray, targets: np.ndarray | None = None) -> np.ndarray:
    """Shortest-path lengths (N, S, S) int32 from each source (N, 2) over its free cells (FAR if
    unreachable); `free` is (S, S) shared or (N, S, S) per source. One wavefront for all sources.
    With `targets` (N, 2) it stops once every source has reached its target (farther cells: FAR)."""
    n = len(sources)
    free = np.broadcast_to(free, (n,) + free.shape[-2:])
    dist = np.full(free.shape, FAR, np.int32)
    front = np.zeros(free.shape, bool)
    front[np.arange(n), sources[:, 0], sources[:, 1]] = True
    front &= free
    seen = front.copy()
    d = 0
    while front.any():
        dist[front] = d
        if targets is not None and seen[np.arange(n), targets[:, 0], targets[:, 1]].all():
            break
        grown = np.zeros_like(front)
        grown[:, 1:] |= front[:, :-1]
        grown[:, :-1] |= front[:, 1:]
        grown[:, :, 1:] |= front[:, :, :-1]
        grown[:, :, :-1] |= front[:, :, 1:]
        front = grown & free & ~seen
        seen |= front
        d += 1
    return dist


def local_cut_points(free: np.ndarray) -> np.ndarray:
    """Free cells whose free 4-neighbours are not all connected through the ring of 8 cells around
    them (corridors, junctions): an agent parked there may cut others' paths."""
    p = np.pad(free, 1)
    s = free.shape[0]
    ring = [p[1 + dr:1 + dr + s, 1 + dc:1 + dc + s] for dr, dc in
            ((-1, 0), (-1, 1), (0, 1), (1, 1), (1, 0), (1, -1), (0, -1), (-1, -1))]  # N NE E SE S SW W NW
    orth = [ring[k] for k in (0, 2, 4, 6)]
    links = [orth[k] & ring[2 * k + 1] & orth[(k + 1) % 4] for k in range(4)]  # N-NE-E, E-SE-S, ...
    count, linked = sum(o.astype(int) for o in orth), sum(x.astype(int) for x in links)
    groups = np.where(linked == 4, 1, count - linked)
    return free & (groups > 1)


def largest_component(free: np.ndarray) -> np.ndarray:
    """The largest 4-connected set of free cells, by propagating the minimum cell label."""
    size = free.shape[0]
    none = size * size
    label = np.where(free, np.arange(none).reshape(free.shape), none)
    while True:
        low = label.copy()
        np.minimum(low[1:], label[:-1], out=low[1:])
        np.minimum(low[:-1], label[1:], out=low[:-1])
        np.minimum(low[:, 1:], label[:, :-1], out=low[:, 1:])
        np.minimum(low[:, :-1], label[:, 1:], out=low[:, :-1])
        low = np.where(free, low, none)
        if np.array_equal(low, label):
            break
        label = low
    if not free.any():
        return free.copy()
    return label == np.bincount(label[free]).argmax()


def is_well_formed(free: np.ndarray, starts: np.ndarray, goals: np.ndarray) -> np.ndarray:
    """(N,) bool: agent i reaches its goal without entering any other agent's start or goal."""
    n = len(starts)
    own = np.zeros((n,) + free.shape, bool)
    own[np.arange(n), starts[:, 0], starts[:, 1]] = True
    own[np.arange(n), goals[:, 0], goals[:, 1]] = True
    others = own.any(axis=0)[None] & ~own
    dist = bfs_distances(free[None] & ~others, starts, targets=goals)
    return dist[np.arange(n), goals[:, 0], goals[:, 1]] < FAR


def generate_map(rng: np.random.Generator, size: int, num_agents: int, density: float,
                 max_maps: int = 1000) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(obstacles (S, S) bool, starts (N, 2), goals (N, 2)) of a well-formed instance."""
    n = num_agents
    for _ in range(max_maps):
        obstacles = rng.random((size, size)) < density
        component = largest_component(~obstacles)
        cells = np.flatnonzero(component & ~local_cut_points(~obstacles))
        if len(cells) < 2 * n:  # too few good cells: allow corridors too
            cells = np.flatnonzero(component)
        if len(cells) < 2 * n:
            continue
        ends = rng.choice(cells, 2 * n, replace=False)  # flat cell ids: starts, then goals
        for _ in range(30):
            starts, goals = np.stack(np.divmod(ends[:n], size), 1), np.stack(np.divmod(ends[n:], size), 1)
            bad = np.flatnonzero(~is_well_formed(~obstacles, starts, goals))
            if len(bad) == 0:
                return obstacles, starts, goals
            # redraw only the failing agents' endpoints: with many agents a full redraw rarely succeeds
            unused = np.setdiff1d(cells, ends)
            if len(unused) < 2 * len(bad):
                break
            new = rng.choice(unused, 2 * len(bad), replace=False)
            ends[bad], ends[n + bad] = new[:len(bad)], new[len(bad):]
    raise RuntimeError(f"no solvable {size}x{size} map with {num_agents} agents at density {density} "
                       f"in {max_maps} tries: lower the density or the number of agents")


def resolve_moves(pos: np.ndarray, actions: np.ndarray, free: np.ndarray, present: np.ndarray):
    """New positions (N, 2), and which agents were blocked by walls/obstacles and by agents.

    Agents not `present` are off the map: they neither move nor block anyone.
    """
    n, size = len(pos), free.shape[0]
    moving = present & (actions != 0)
    target = pos + MOVES[actions]
    inside = ((target >= 0) & (target < size)).all(axis=1)
    clipped = np.clip(target, 0, size - 1)
    bumped = moving & ~(inside & free[clipped[:, 0], clipped[:, 1]])
    moving &= ~bumped
    # cell ids; absent agents get ids past the map so they never meet anyone
    idx = np.arange(n)
    cur = np.where(present, pos[:, 0] * size + pos[:, 1], size * size + idx)
    nxt = np.where(moving, clipped[:, 0] * size + clipped[:, 1], cur)
    occupant = np.full(size * size + n, -1)
    occupant[cur] = idx
    blocked = np.zeros(n, bool)
    while True:
        vertex = np.bincount(nxt, minlength=size * size + n)[nxt] > 1
        other = occupant[nxt]  # who stands now in the cell I move to (myself if I stay)
        swap = (other >= 0) & (other != idx) & (nxt[other] == cur)
        stop = moving & (vertex | swap)
        if not stop.any():
            break
        nxt[stop] = cur[stop]
        moving &= ~stop
        blocked |= stop
    new_pos = np.where(moving[:, None], clipped, pos)
    return new_pos, bumped, blocked


class MAPF(MultiAgentEnv):
    """The gridworld; rules in the module docstring."""

    def __init__(self, size: int = 20, num_agents: int = 8, density: float = 0.3, fov: int = 9,
                 max_steps: int = 256, comm_k: int | None = 4, remove_done_agents: bool = False,
                 move_reward: float = -0.075, stay_off_goal_reward: float = -0.075,
                 stay_on_goal_reward: float = 0.0, collision_reward: float = -0.5,
                 goal_reward: float = 3.0, seed: int | None = None):
        if size < 2 or num_agents < 1 or 2 * num_agents > size * size:
            raise ValueError(f"need size >= 2 and 1 <= num_agents <= size*size/2, got {size}, {num_agents}")
        if not 0.0 <= density < 1.0:
            raise ValueError(f"density must be in [0, 1), got {density}")
        if fov < 1 or fov % 2 == 0:
            raise ValueError(f"fov must be a positive odd number, got {fov}")
        if max_steps < 1 or (comm_k is not None and comm_k < 0):
            raise ValueError(f"need max_steps >= 1 and comm_k >= 0 or None, got {max_steps}, {comm_k}")
        self.size, self.num_agents, self.density, self.fov = size, num_agents, density, fov
        self.max_steps, self.comm_k, self.remove_done_agents = max_steps, comm_k, remove_done_agents
        self.rewards = dict(move=move_reward, stay_off=stay_off_goal_reward, stay_on=stay_on_goal_reward,
                            collision=collision_reward, goal=goal_reward)
        self.observation_space = spaces.Box(0.0, 1.0, (len(CHANNELS), fov, fov), np.float32)
        self.action_space = spaces.Discrete(len(MOVES))
        self._rng = np.random.default_rng(seed)
        r, side = fov // 2, size + 2 * (fov // 2)
        self._radius, self._side = r, side
        # flat offsets of a view's cells in the padded (C, side, side) stack, from its top-left corner
        self._window = (np.arange(fov)[:, None] * side + np.arange(fov)[None, :])
        self._chan_window = np.arange(len(CHANNELS))[:, None, None] * side * side + self._window
        self._over = True

    # --- episodes -------------------------------------------------------------------
    def reset(self, seed: int | None = None) -> MAStep:
        if seed is not None:
            self._rng = np.random.default_rng(seed)
        return self._start(*generate_map(self._rng, self.size, self.num_agents, self.density))

    def reset_to(self, obstacles: np.ndarray, starts: np.ndarray, goals: np.ndarray) -> MAStep:
        """Start an episode on a given map (not checked for solvability)."""
        obstacles = np.asarray(obstacles, bool)
        starts, goals = np.asarray(starts, np.int64), np.asarray(goals, np.int64)
        n, s = self.num_agents, self.size
        if obstacles.shape != (s, s) or starts.shape != (n, 2) or goals.shape != (n, 2):
            raise ValueError(f"need obstacles ({s}, {s}), starts and goals ({n}, 2)")
        for name, cells in (("starts", starts), ("goals", goals)):
            if (cells < 0).any() or (cells >= s).any() or obstacles[cells[:, 0], cells[:, 1]].any():
                raise ValueError(f"{name} must be free cells of the map")
            if len({tuple(c) for c in cells}) != n:
                raise ValueError(f"{name} must be distinct")
        return self._start(obstacles, starts, goals)

    def _start(self, obstacles: np.ndarray, starts: np.ndarray, goals: np.ndarray) -> MAStep:
        n = self.num_agents
        self.obstacles, self.goals, self.positions = obstacles, goals.copy(), starts.copy()
        self.distances = bfs_distances(~obstacles, goals)
        self._static = self._static_channels().ravel()
        self.t = 0
        self.on_goal = (self.positions == goals).all(axis=1)
        self.present = ~self.on_goal if self.remove_done_agents else np.ones(n, bool)
        self.arrived_at = np.where(self.on_goal, 0, -1)
        self.returns = np.zeros(n, np.float64)
        self.collisions = self.agent_collisions = 0
        self._over = False
        return MAStep(self._observe(), np.zeros(n, np.float32), False, False, self.present.copy(),
                      self.comm_mask(), {})

    def _static_channels(self) -> np.ndarray:
        """(N, C, side, side) padded map of what never changes: obstacles and heuristic channels."""
        n, r, s = self.num_agents, self._radius, self.size
        out = np.zeros((n, len(CHANNELS), self._side, self._side), np.float32)
        out[:, 0] = 1.0  # the padding is outside the map: obstacle
        out[:, 0, r:r + s, r:r + s] = self.obstacles
        dist = self.distances
        for ch, (dr, dc) in enumerate(MOVES[1:], start=3):
            near = np.full_like(dist, FAR)  # distance at the neighbour in direction (dr, dc)
            near[:, max(-dr, 0):s - max(dr, 0), max(-dc, 0):s - max(dc, 0)] = \
                dist[:, max(dr, 0):s + min(dr, 0), max(dc, 0):s + min(dc, 0)]
            out[:, ch, r:r + s, r:r + s] = (near < dist) & (dist < FAR)  # obstacles: FAR, never a start
        return out

    def step(self, actions: np.ndarray) -> MAStep:
        if self._over:
            raise RuntimeError("step() after the episode ended: call reset()")
        actions = np.asarray(actions, np.int64).reshape(self.num_agents)
        if actions.min() < 0 or actions.max() >= len(MOVES):
            raise ValueError(f"actions must be in [0, {len(MOVES)}), got {actions}")
        present = self.present
        actions = np.where(present, actions, 0)
        new_pos, bumped, blocked = resolve_moves(self.positions, actions, ~self.obstacles, present)
        was_on = self.on_goal
        now_on = (new_pos == self.goals).all(axis=1)
        moved = (new_pos != self.positions).any(axis=1)
        rw = self.rewards
        rewards = np.where(bumped | blocked, rw["collision"],
                           np.where(moved, rw["move"], np.where(was_on, rw["stay_on"], rw["stay_off"])))
        rewards += rw["goal"] * (now_on & ~was_on) - rw["goal"] * (was_on & ~now_on)
        rewards = np.where(present, rewards, 0.0).astype(np.float32)
        self.t += 1
        self.positions, self.on_goal = new_pos, now_on
        self.arrived_at = np.where(now_on, np.where(was_on, self.arrived_at, self.t), -1)
        if self.remove_done_agents:
            self.present = present & ~now_on
        self.returns += rewards
        self.collisions += int((bumped | blocked).sum())
        self.agent_collisions += int(blocked.sum())
        terminated = bool(now_on.all())
        truncated = not terminated and self.t >= self.max_steps
        self._over = terminated or truncated
        info = self.episode_metrics() if self._over else {}
        return MAStep(self._observe(), rewards, terminated, truncated, self.present.copy(),
                      self.comm_mask(), info)

    def episode_metrics(self) -> dict:
        cost = np.where(self.on_goal, self.arrived_at, self.t)
        out = {"success": float(self.on_goal.all()), "agent_success": float(self.on_goal.mean()),
               "makespan": float(cost.max()), "sum_of_costs": float(cost.sum()),
               "collisions": float(self.collisions), "agent_collisions": float(self.agent_collisions),
               "return_mean": float(self.returns.mean()), "length": float(self.t)}
        if self.on_goal.all():  # an evaluation averages it over its solved episodes only
            out["solved_sum_of_costs"] = out["sum_of_costs"]
        return out

    # --- views ------------------------------------------------------------------------
    def _observe(self) -> np.ndarray:
        n, r, side = self.num_agents, self._radius, self._side
        pos, present = self.positions, self.present
        corner = pos[:, 0] * side + pos[:, 1]  # the view's top-left corner in padded coordinates
        base = np.arange(n) * (len(CHANNELS) * side * side) + corner
        obs = self._static[base[:, None, None, None] + self._chan_window]
        occupied = np.zeros(side * side, np.float32)
        occupied[((pos[:, 0] + r) * side + pos[:, 1] + r)[present]] = 1.0
        obs[:, 1] = occupied[corner[:, None, None] + self._window]
        obs[:, 1, r, r] = 0.0  # the agent itself
        rel = self.goals - pos
        far = np.abs(rel).max(axis=1)
        in_view = far <= r
        # out of view: scale the offset so its larger coordinate lands on the border
        proj = np.where(in_view[:, None], rel, np.rint(rel * r / np.maximum(far, 1)[:, None]).astype(np.int64))
        obs[np.arange(n), 2, r + proj[:, 0], r + proj[:, 1]] = np.where(in_view, 1.0, 0.5)
        obs[~present] = 0.0
        return obs

    def comm_mask(self) -> np.ndarray:
        """(N, N) bool: i receives from j (module docstring)."""
        return comm_mask_from_positions(self.positions, self.present, self.comm_k, self._radius)

    def agent_positions(self) -> np.ndarray:
        return self.positions.copy()

    def render(self) -> np.ndarray:
        """An RGB picture (uint8) of the grid, the agents (discs) and their goals (squares of their colour)."""
        from distrl.envs.render import render_grid

        return render_grid(self.obstacles, self.positions, self.goals, self.present)

    def close(self) -> None:
        pass


def parallel_env(**kwargs) -> ParallelView:
    """The gridworld behind the PettingZoo Parallel API (kwargs as for `MAPF`; rules of the view in
    `distrl.envs.multiagent.ParallelView`). Reset options {"obstacles", "starts", "goals"} give a map."""
    return ParallelView(MAPF(**kwargs), name="distrl_mapf_v0")
