"""Return and advantage estimators over time-major (T, B) tensors: GAE and V-trace.

Episode ends follow gymnasium: at a *terminated* step the future is worth 0;
at a *truncated* step the episode was cut, so the step bootstraps from
V(next_obs) but no recursion carries across the boundary into the next
episode. The last step of a fragment bootstraps from V(next_obs[T-1]).
Everything here is computed without gradient.
"""
from __future__ import annotations

import torch


def _backward_scan(deltas: torch.Tensor, coefs: torch.Tensor) -> torch.Tensor:
    """acc_t = deltas_t + coefs_t * acc_{t+1}, with acc_T = 0 (loop over time, batch vectorised)."""
    out = torch.empty_like(deltas)
    acc = torch.zeros_like(deltas[0])
    for t in range(deltas.shape[0] - 1, -1, -1):
        acc = deltas[t] + coefs[t] * acc
        out[t] = acc
    return out


def _discounts(terminated: torch.Tensor, truncated: torch.Tensor, gamma: float
               ) -> tuple[torch.Tensor, torch.Tensor]:
    """(gamma_t: 0 after a termination, carry_t: 0 where the episode ended either way)."""
    terminated, truncated = terminated.bool(), truncated.bool()
    discount = gamma * (~terminated).float()
    carry = (~(terminated | truncated)).float()
    return discount, carry


@torch.no_grad()
def gae(rewards: torch.Tensor, values: torch.Tensor, next_values: torch.Tensor,
        terminated: torch.Tensor, truncated: torch.Tensor, gamma: float, lam: float
        ) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimation (Schulman et al., 2016) -> (advantages, returns).

    `next_values[t]` is V(next_obs[t]); lam = 1 gives n-step returns to the end
    of the fragment (or episode) minus V.
    """
    discount, carry = _discounts(terminated, truncated, gamma)
    deltas = rewards + discount * next_values - values
    advantages = _backward_scan(deltas, discount * lam * carry)
    return advantages, advantages + values


@torch.no_grad()
def vtrace(behaviour_logp: torch.Tensor, target_logp: torch.Tensor, rewards: torch.Tensor,
           values: torch.Tensor, next_values: torch.Tensor, terminated: torch.Tensor,
           truncated: torch.Tensor, gamma: float, rho_bar: float, c_bar: float, lam: float = 1.0
           ) -> tuple[torch.Tensor, torch.Tensor]:
    """V-trace (Espeholt et al., 2018) -> (vs, pg_advantages).

    rho_t = min(rho_bar, pi/mu), c_t = lam * min(c_bar, pi/mu);
    vs_t - V(x_t) = rho_t delta_t + gamma_t c_t (vs_{t+1} - V(x_{t+1})),
    pg_advantage_t = rho_t (r_t + gamma_t vs_{t+1} - V(x_t)).
    `lam` is the optional trace decay of the paper's remark 1 (1 = plain V-trace).
    """
    ratio = (target_logp - behaviour_logp).exp()
    rho = ratio.clamp(max=rho_bar)
    c = lam * ratio.clamp(max=c_bar)
    discount, carry = _discounts(terminated, truncated, gamma)
    deltas = rho * (rewards + discount * next_values - values)
    acc = _backward_scan(deltas, discount * c * carry)  # vs - V
    vs = values + acc
    # vs_{t+1} = V(x_{t+1}) + acc_{t+1} inside an episode; at an episode end or the
    # fragment's last step the trace restarts and vs_{t+1} is just the bootstrap value.
    acc_next = torch.cat([acc[1:], torch.zeros_like(acc[:1])]) * carry
    pg_advantages = rho * (rewards + discount * (next_values + acc_next) - values)
    return vs, pg_advantages
