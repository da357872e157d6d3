"""SAC's tanh-squashed Gaussian, written once for numpy arrays and torch tensors alike.

The actor's head gives (mean, raw); log_std = `log_std_from_tanh(tanh(raw))` and
an action is a = tanh(u), u = mean + exp(log_std) * noise. Used by the torch
learner, the numpy update and the numpy acting policy.
"""
from __future__ import annotations

import math

import numpy as np

from distrl.algos.common import HALF_LOG_2PI

LOG_STD_MIN, LOG_STD_MAX = -5.0, 2.0
LOG_STD_HALF_RANGE = 0.5 * (LOG_STD_MAX - LOG_STD_MIN)
LOG2 = math.log(2.0)


def log_std_from_tanh(tanh_raw):
    """tanh(raw) rescaled into [LOG_STD_MIN, LOG_STD_MAX]: unlike a clamp, it keeps a gradient at the bounds."""
    return LOG_STD_MIN + LOG_STD_HALF_RANGE * (tanh_raw + 1.0)


def tanh_log_prob(u, noise, log_std, softplus):
    """log pi(tanh(u)), summed over the last axis, for u = mean + exp(log_std) * noise.

    log N(u; mean, std) - sum log(1 - tanh(u)^2), with the correction written as
    2 * (log 2 - u - softplus(-2u)): exact, and finite for any u. `softplus` is
    the array library's (torch's F.softplus, or numpy's logaddexp(0, x)).
    """
    gauss = -(0.5 * noise * noise + log_std) - HALF_LOG_2PI
    return (gauss - 2.0 * (LOG2 - u - softplus(-2.0 * u))).sum(-1)


def numpy_softplus(x: np.ndarray) -> np.ndarray:
    return np.logaddexp(0.0, x)
