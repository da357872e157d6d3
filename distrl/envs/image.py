"""`ResizeImage`: an env's frames made smaller (and optionally gray), whether the frame is the whole
observation or one leaf of a Dict observation (VizDoom's `screen`), named in `env.wrappers` as
`distrl.envs.image:ResizeImage`. Gymnasium's own `ResizeObservation` and `GrayscaleObservation` take a
Box observation only.
"""
from __future__ import annotations

import cv2
import gymnasium as gym
import numpy as np
from gymnasium import spaces


class ResizeImage(gym.ObservationWrapper, gym.utils.RecordConstructorArgs):
    """Frames of shape (H, W, C) uint8 resized to `shape` (height, width) by pixel-area averaging (what
    keeps thin sprites visible when shrinking), gray (one channel, ITU-R 601 luma) when `grayscale`.
    `key` names the Dict leaf that holds the frame; None: the observation is the frame."""

    def __init__(self, env: gym.Env, shape: list[int] | tuple[int, int], grayscale: bool = False,
                 key: str | None = None):
        gym.utils.RecordConstructorArgs.__init__(self, shape=shape, grayscale=grayscale, key=key)
        gym.ObservationWrapper.__init__(self, env)
        if len(shape) != 2 or not all(isinstance(n, int) and n > 0 for n in shape):
            raise ValueError(f"shape must be [height, width] in positive pixels, got {shape!r}")
        self.size, self.grayscale, self.key = (int(shape[1]), int(shape[0])), grayscale, key
        space = env.observation_space
        if key is not None:
            if not isinstance(space, spaces.Dict) or key not in space.spaces:
                keys = list(space.spaces) if isinstance(space, spaces.Dict) else None
                raise ValueError(f"key {key!r} is no leaf of the observation "
                                 f"({'its keys: ' + ', '.join(keys) if keys else space})")
            frame = space.spaces[key]
        else:
            frame = space
        if not (isinstance(frame, spaces.Box) and frame.dtype == np.uint8 and len(frame.shape) == 3):
            raise ValueError(f"the frame must be a uint8 Box shaped (height, width, channels), got {frame}")
        if grayscale and frame.shape[2] not in (1, 3):
            raise ValueError(f"grayscale takes RGB (3-channel) or gray frames, the env's are shaped {frame.shape}")
        new = spaces.Box(0, 255, (shape[0], shape[1], 1 if grayscale else frame.shape[2]), np.uint8)
        self.observation_space = spaces.Dict({**space.spaces, key: new}) if key is not None else new
        self.frame_shape = new.shape  # cv2 drops a single channel's axis: put it back

    def frame(self, image: np.ndarray) -> np.ndarray:
        if self.grayscale and image.shape[2] == 3:
            image = cv2.cvtColor(image, cv2.COLOR_RGB2GRAY)
        small = cv2.resize(image, self.size, interpolation=cv2.INTER_AREA)
        return small.reshape(self.frame_shape)

    def observation(self, observation):
        if self.key is None:
            return self.frame(observation)
        return {**observation, self.key: self.frame(observation[self.key])}
