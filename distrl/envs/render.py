"""An RGB picture of a grid world with agents and goals (the MAPF gridworld's `render()`), drawn in numpy.

Free cells are white, obstacles dark grey, with light grid lines. Agent i is a filled disc in its colour
and its goal a square outline in the same colour, so an agent on its goal sits inside its square; an agent
that has left the map (`present` False) is not drawn. Colours repeat after 20 agents.
"""
from __future__ import annotations

import numpy as np

# tab20's colours, darker shades first: distinct on white and on the grey of obstacles.
PALETTE = np.array([
    (31, 119, 180), (255, 127, 14), (44, 160, 44), (214, 39, 40), (148, 103, 189), (140, 86, 75),
    (227, 119, 194), (127, 127, 127), (188, 189, 34), (23, 190, 207), (174, 199, 232), (255, 187, 120),
    (152, 223, 138), (255, 152, 150), (197, 176, 213), (196, 156, 148), (247, 182, 210), (199, 199, 199),
    (219, 219, 141), (158, 218, 229)], np.uint8)
FREE, OBSTACLE, GRID = (255, 255, 255), (64, 64, 64), (215, 215, 215)


def _shapes(cell: int) -> tuple[np.ndarray, np.ndarray]:
    """(disc, square outline) masks of one cell."""
    yy, xx = np.mgrid[0:cell, 0:cell]
    c = (cell - 1) / 2.0
    disc = (yy - c) ** 2 + (xx - c) ** 2 <= (0.34 * cell) ** 2
    inset, width = max(1, cell // 12), max(2, cell // 8)
    inner = (yy >= inset) & (yy < cell - inset) & (xx >= inset) & (xx < cell - inset)
    core = (yy >= inset + width) & (yy < cell - inset - width) & (xx >= inset + width) & (xx < cell - inset - width)
    return disc, inner & ~core


def render_grid(obstacles: np.ndarray, positions: np.ndarray, goals: np.ndarray,
                present: np.ndarray | None = None, cell: int = 24) -> np.ndarray:
    """(S*cell, S*cell, 3) uint8 picture of an S x S grid; `positions` and `goals` are (N, 2) (row, col)."""
    obstacles = np.asarray(obstacles, bool)
    size = obstacles.shape[0]
    present = np.ones(len(positions), bool) if present is None else np.asarray(present, bool)
    img = np.empty((size * cell, size * cell, 3), np.uint8)
    img[:] = FREE
    img[np.kron(obstacles, np.ones((cell, cell), bool))] = OBSTACLE
    img[::cell, :] = GRID
    img[:, ::cell] = GRID
    disc, square = _shapes(cell)
    for i, (r, c) in enumerate(np.asarray(goals, int)):
        img[r * cell:(r + 1) * cell, c * cell:(c + 1) * cell][square] = PALETTE[i % len(PALETTE)]
    for i, (r, c) in enumerate(np.asarray(positions, int)):
        if present[i]:
            img[r * cell:(r + 1) * cell, c * cell:(c + 1) * cell][disc] = PALETTE[i % len(PALETTE)]
    return img
