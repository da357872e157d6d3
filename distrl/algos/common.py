"""What every algorithm file uses: the network-backed policy and algorithm bases, guarded optimizer
steps, action scaling and the storage form of observations (no ray, no env code)."""
from __future__ import annotations

import functools

import numpy as np
import torch
from gymnasium import spaces

from distrl import tree
from distrl.core import Algorithm, Batch, Policy, Trajectory, Weights
from distrl.envs.normalize import STATISTICS_PREFIX, network_weights
from distrl.models import as_input, laid_out_as, load_numpy_weights
from distrl.models.numpy_run import Program, numpy_program
from distrl.replay import nstep_transitions
from distrl.sampling import HALF_LOG_2PI, BoxScaler  # noqa: F401 - the algorithms' names for them

# Action kinds an algorithm may declare (`Algorithm.actions`): (kind, space class, its name in messages).
ACTION_KINDS = (("discrete", spaces.Discrete, "Discrete"), ("box", spaces.Box, "Box"),
                ("multi_discrete", spaces.MultiDiscrete, "MultiDiscrete"),
                ("multi_binary", spaces.MultiBinary, "MultiBinary"))


def _listed(words: list[str], last: str) -> str:
    """"a", "a or b", "a, b or c" (`last` the joining word)."""
    return f" {last} ".join([", ".join(words[:-1]), words[-1]] if len(words) > 1 else words)


def spec_problem(name: str, spec, actions: tuple[str, ...], vector_only: bool = False,
                 structured: bool = False) -> str | None:
    """Why algorithm `name` can't run on `spec` (the action kinds it takes, of `ACTION_KINDS`; a Box
    observation, flat if `vector_only`, or with `structured` a Dict or Tuple one too), or None. Whether a
    torso fits the observation is the torso factory's to say."""
    act, obs = spec.action_space, spec.observation_space
    kind = next((k for k, cls, _ in ACTION_KINDS if isinstance(act, cls)), None)
    taken = _listed([label for k, _, label in ACTION_KINDS if k in actions], "or")
    if kind in ("multi_discrete", "multi_binary") and kind not in actions:
        from distrl.registry import ALGORITHMS, algorithm

        takers = [n for n in ALGORITHMS if kind in algorithm(n).actions]
        shown = " ".join(str(act).split())  # one line: a 2-d nvec prints on several
        return f"{name} takes {taken} actions; {shown} actions are for {_listed(takers, 'and')}"
    if kind == "box" and "box" in actions:
        low, high = np.asarray(act.low, np.float64), np.asarray(act.high, np.float64)
        if len(act.shape) != 1 or not (np.all(np.isfinite(low)) and np.all(np.isfinite(high)) and np.all(low < high)):
            return f"{name} needs a flat Box action space with finite low < high, the env has {act}"
    elif kind not in actions:
        return f"{name} needs a {taken} action space, the env has {act}"
    if tree.is_structured(obs) and not structured:
        from distrl.registry import ALGORITHMS, algorithm

        takers = [n for n in ALGORITHMS if getattr(algorithm(n), "structured_obs", False)]
        masked = tree.has_mask(obs)
        hint = " (env.action_mask: none trains without the env's action mask)" if masked else ""
        return (f"{name} takes Box observations; structured ones (Dict, Tuple, an action mask) are for "
                f"{_listed(takers, 'and')}, the env has {obs}{hint}")
    if tree.is_structured(obs):
        return None
    if not isinstance(obs, spaces.Box):
        return f"{name} needs a Box observation space, the env has {obs}"
    if vector_only and len(obs.shape) != 1:
        return f"{name} takes vector observations only (no image torsos), the env's are shaped {obs.shape}"
    return None


def stored_obs(obs: tree.Tree) -> tree.Tree:
    """Observations as replay and fragments keep them: floats as float32 (the network's precision),
    anything else (uint8 frames, bools, a Discrete leaf's ints) in its own dtype, scaled only inside the
    network; a structured observation leaf by leaf."""
    return tree.map(_stored_leaf, obs)


def obs_columns(obs: tree.Tree) -> dict[str, np.ndarray]:
    """Observations as replay's stored fields: `obs`, or a structured observation's leaves as `obs.<key>`
    columns (`tree.to_columns`)."""
    return tree.to_columns({"obs": stored_obs(obs)})


def _stored_leaf(x) -> np.ndarray:
    x = np.asarray(x)
    return x.astype(np.float32, copy=False) if x.dtype.kind == "f" else x


def nstep_items(traj: Trajectory, gamma: float, n_step: int) -> tuple[Batch, np.ndarray]:
    """A trajectory's n-step transitions as replay stores them (one per (t, e) step, in that order), and
    each one's bootstrap step: the flat (t, e) index whose next observation is its `next_obs`."""
    T, E = traj.rewards.shape
    steps = np.arange(T * E).reshape(T, E)
    # The windows run once, over step indices in place of observations; those are gathered after (a tree
    # of them for a structured observation).
    items = nstep_transitions(steps, traj.actions, traj.rewards, traj.terminated, traj.truncated, steps,
                              gamma, n_step)
    items.pop("nsteps", None)
    boot = items["next_obs"]
    items["obs"] = stored_obs(tree.flatten_lead(traj.obs, 2))
    items["next_obs"] = stored_obs(tree.index(tree.flatten_lead(traj.next_obs, 2), boot))
    return items, boot


class NetworkPolicy(Policy):
    """A policy acting with its algorithm's network (`Algorithm.build_network`): the module the learner
    trains, loaded from published weights, run under `torch.inference_mode()`. `forward`'s outputs are
    `self.net.<acting_method>(obs)`, named `acting_outputs()` in the order the method returns them."""

    acting_method = "forward"

    def acting_outputs(self) -> tuple[str, ...]:
        """The names of `acting_method`'s outputs, in its order (what an exported file calls them)."""
        raise NotImplementedError(f"{type(self).__name__} names no acting outputs")

    @property
    def acting_space(self) -> spaces.Space:
        """The space of what `acting_method` takes (what an exported file's inputs are): the env's
        observation space, unless the policy acts on rows of its own making (MAPPO's agents)."""
        return self.spec.observation_space

    def __init__(self, algo: Algorithm, worker_index: int, num_workers: int, seed: int):
        self.cfg, self.spec = algo.cfg, algo.spec
        self.worker_index, self.num_workers = worker_index, num_workers
        self.rng = np.random.default_rng(seed)  # exploration; saved with the worker's state at checkpoints
        self.net = algo.build_network().requires_grad_(False).eval()
        self.device = torch.device("cpu")
        self.loaded = False  # set_weights comes before the first act (workers pull first)
        self.programs: dict[str, Program | None] = {}  # per method: its numpy program, or None (torch)

    def place(self, device: str) -> None:
        """Run the network on `device` (an inference server on a GPU); inputs and outputs stay numpy."""
        self.device = torch.device(device)
        self.net.to(self.device)
        self.programs.clear()

    def set_weights(self, weights: Weights, version: int) -> None:
        load_numpy_weights(self.net, network_weights(weights))
        self.statistics = {k: v for k, v in weights.items() if k.startswith(STATISTICS_PREFIX)}
        self.loaded, self.version = True, version

    def after_truncation(self, traj: Trajectory, now, final):
        """The outputs of `evaluate` on the final observation of each truncated (not terminated) episode,
        with the index (ts, es) of those steps, or None where there are none.

        The policy never acted on that observation, so the episode's last step is replayed from its stored
        state to get the state after it. `now(ts, es)` and `final(ts, es)` give the network's inputs at
        those steps and after them.
        """
        ts, es = np.nonzero(traj.truncated & ~traj.terminated)
        if not len(ts):
            return None
        _, after = self.evaluate(now(ts, es), traj.extras["state"][ts, es])
        return (ts, es), self.evaluate(final(ts, es), after)[0]

    def run(self, method: str, *inputs):
        """`self.net.<method>(*inputs)` on numpy inputs (None passes through), as numpy arrays.

        On the CPU, a method of one input (an array, or a tree of them: a Dict or Tuple observation) runs
        as its numpy program where the network has one (`distrl.models.numpy_run`: the same module's ops
        without torch's per-op dispatch).
        """
        if not self.loaded:
            raise RuntimeError(f"{type(self).__name__} has no weights yet: call set_weights first")
        if self.device.type == "cpu" and len(inputs) == 1 and isinstance(inputs[0], (np.ndarray, dict, tuple)):
            if method not in self.programs:
                self.programs[method] = numpy_program(self.net, method, inputs[0])
            program = self.programs[method]
            if program is not None:
                return program(inputs[0])
        device = None if self.device.type == "cpu" else self.device  # CPU: no .to() per input on the hot path
        with torch.inference_mode():
            out = getattr(self.net, method)(*(_to_tensor(x, device) for x in inputs))
        return _to_numpy(out)


def _to_tensor(x, device: torch.device | None = None):
    """A tree of arrays (a structured or multi-agent observation, or one array) as tensors."""
    if x is None:
        return None
    return tree.map(lambda a: as_input(a) if device is None else as_input(a).to(device, non_blocking=True), x)


def _to_numpy(out):
    if isinstance(out, torch.Tensor):
        # detach: a view of a parameter that requires grad (A3C's workers train their net; the Gaussian's
        # expanded log-std) still requires grad under inference_mode.
        return out.detach().cpu().numpy()
    if isinstance(out, dict):
        return {k: _to_numpy(v) for k, v in out.items()}
    if isinstance(out, (tuple, list)):
        return type(out)(_to_numpy(v) for v in out)
    return out


class NetworkAlgorithm(Algorithm):
    """An algorithm whose learner and policy classes take the algorithm itself (its config parts and its
    network builder): `learner_cls(algo, device)`, `policy_cls(algo, worker_index, num_workers, seed)`."""

    learner_cls: type
    policy_cls: type
    vector_only = False

    structured_obs = False  # takes Dict and Tuple observations (`distrl.tree`), action masks among them

    @classmethod
    def check_spec(cls, spec) -> str | None:
        return spec_problem(cls.name, spec, cls.actions, cls.vector_only, cls.structured_obs)

    def make_learner(self, device: str):
        torch.manual_seed(self.seed)
        return self.learner_cls(self, device)

    def make_policy(self, worker_index: int, num_workers: int, seed: int):
        return self.policy_cls(self, worker_index, num_workers, seed)


def guarded_step(opt, params, loss=None, clip: float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Backward `loss` (or use the gradients already set), clip to `clip`, step: (grad norm, skipped), both
    0-d tensors on the parameters' device, with no wait for the device.

    A non-finite loss or gradient would poison every weight it reaches, and through published weights
    every worker: then the step changes nothing (the fused Adam is told through `found_inf`, as a gradient
    scaler tells it, and skips its whole update on the device) and `skipped` is True. The caller reads
    `skipped` back later, with the rest of its block.
    """
    params = list(params)
    if loss is not None:
        opt.zero_grad(set_to_none=True)
        loss.backward()
    if clip:
        norm = torch.nn.utils.clip_grad_norm_(params, clip, foreach=True)
    else:  # the norm alone: clip_grad_norm_ would also scale every gradient by 1
        grads = [p.grad for p in params if p.grad is not None]
        norm = torch.linalg.vector_norm(torch.stack(torch._foreach_norm(grads))) if grads else torch.zeros(())
    # An infinite loss can have a finite gradient (a Huber loss against an infinite target): 0 * loss is
    # NaN exactly when the loss is not finite.
    bad = ~torch.isfinite(norm if loss is None else norm + 0.0 * loss.detach())
    if all(group.get("fused") for group in opt.param_groups):
        opt.found_inf = bad.float()
        _step(opt)
    elif not bool(bad):  # an optimizer without found_inf: one wait for the device per step
        _step(opt)
    return norm.detach(), bad


# torch.optim imports torch._dynamo (~1 s of CPU: a learner's start, and each restart, costs that much more)
# the first time an optimizer is built, stepped or saved, only to keep torch.compile out of those calls;
# distrl compiles nothing. So those calls go straight to the functions torch wraps: the methods marked as
# already excluded from compilation (the mark torch's own wrapper caches on its first call), and a step
# run under no_grad as its wrapper would run it (its other wrapper fires step hooks, of which distrl sets
# none).
@functools.cache
def _mark_dynamo_disabled() -> None:
    for name in ("add_param_group", "zero_grad", "state_dict", "load_state_dict"):
        fn = getattr(getattr(torch.optim.Optimizer, name), "__wrapped__", None)
        if fn is not None:
            setattr(fn, "__dynamo_disable", fn)


def _step(opt: torch.optim.Optimizer) -> None:
    step = type(opt).step
    while hasattr(step, "__wrapped__"):
        step = step.__wrapped__
    with torch.no_grad():
        step(opt)


def skipped(loss) -> dict:
    """What an update that read back its step as skipped returns (its loss or gradient was not finite)."""
    return {"nonfinite": 1, "loss": float(loss.detach()) if hasattr(loss, "detach") else float(loss)}


def step_report(norm: torch.Tensor, bad: torch.Tensor, loss: torch.Tensor, **terms: torch.Tensor) -> dict:
    """An update's scalars as `Learner.update` returns them: tensors, read back with the learner's block."""
    return {"nonfinite": bad, "loss": loss.detach(), **{k: v.detach() for k, v in terms.items()}, "grad_norm": norm}


def adam(params, lr: float, device: str) -> torch.optim.Adam:
    """Adam over `params` (tensors, or param groups with their own "lr"); groups of one learning rate are
    merged: the fused kernel takes one launch per group, and small networks are launch-bound."""
    params = list(params)
    if params and isinstance(params[0], dict):
        by_lr: dict[float, list] = {}
        for group in params:
            by_lr.setdefault(group.get("lr", lr), []).extend(group["params"])
        params = [{"params": ps, "lr": group_lr} for group_lr, ps in by_lr.items()]
    _mark_dynamo_disabled()
    # capturable on a GPU: its step count stays on the device, so an update can be a CUDA graph.
    return torch.optim.Adam(params, lr=lr, fused=device.startswith(("cpu", "cuda")), capturable=device.startswith("cuda"))


def load_optimizer_state(opt: torch.optim.Optimizer, state: dict) -> None:
    """`opt.load_state_dict(state)`, with each per-parameter tensor (Adam's moments) laid out in memory as
    its parameter is: the fused Adam walks them in memory order, and a checkpoint may hold them in another
    layout (one written before a torso's weight became input-major)."""
    opt.load_state_dict(state)
    for group in opt.param_groups:
        for p in group["params"]:
            for name, value in opt.state.get(p, {}).items():
                if torch.is_tensor(value) and value.shape == p.shape and value.stride() != p.stride():
                    opt.state[p][name] = laid_out_as(p, value)


def as_tensors(batch: dict[str, np.ndarray], device: str) -> dict[str, torch.Tensor]:
    """Zero-copy on CPU (a structured observation: a tree of tensors); ignores private keys (leading
    underscore)."""
    return {k: tree.map(lambda v: torch.as_tensor(v, device=device), v) for k, v in batch.items()
            if not k.startswith("_")}
