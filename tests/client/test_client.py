"""A simulator's side imports neither torch nor Ray nor gymnasium, and acts locally with onnxruntime as the
run's policy would."""
import subprocess
import sys

import numpy as np
from gymnasium import spaces

from distrl.client.local import LocalActor
from distrl.config import load_config
from distrl.core import EnvSpec
from distrl.models.export import acting_network, example_batch, onnx_bytes
from distrl.roles.factory import make_algorithm

CHECK = """
import sys
import distrl.client, distrl.client.local
from distrl.client.local import LocalActor
actor = LocalActor(open(sys.argv[1], "rb").read(), {"kind": "categorical"}, 0)
import numpy as np
print(actor.act({"": np.zeros(4, np.float32)}, np.random.default_rng(0))[0])
print(" ".join(sorted(m for m in ("torch", "ray", "gymnasium") if m in sys.modules)) or "none")
"""


def test_the_client_and_local_inference_import_no_torch_ray_or_gymnasium(tmp_path):
    cfg = load_config(None, ["algo=ppo"])
    algorithm = make_algorithm(cfg)
    policy = algorithm.make_policy(-1, 1, 0)
    policy.set_weights(algorithm.make_learner("cpu").get_weights(), 0)
    model = tmp_path / "m.onnx"
    model.write_bytes(onnx_bytes(acting_network(policy), example_batch(algorithm.spec.observation_space)))
    out = subprocess.run([sys.executable, "-c", CHECK, str(model)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    action, imported = out.stdout.split("\n")[:2]
    assert action in ("0", "1") and imported == "none"


def test_local_acting_records_what_the_policy_records_with_the_same_randomness():
    for algo, act_space in (("apex_dqn", spaces.Discrete(3)), ("ppo", spaces.Discrete(3)),
                            ("ppo", spaces.Box(-1.0, 2.0, (2,), np.float32)), ("sac", spaces.Box(-1.0, 2.0, (2,), np.float32))):
        cfg = load_config(None, [f"algo={algo}"])
        algorithm = make_algorithm(cfg, EnvSpec(spaces.Box(-5, 5, (4,), np.float32), act_space))
        weights = algorithm.make_learner("cpu").get_weights()
        worker = algorithm.make_policy(1, 4, seed=7)  # a worker's exploration (Ape-X: its own epsilon)
        worker.set_weights(weights, 3)
        worker.observe_steps(10_000)  # SAC: past its random steps
        exporter = algorithm.make_policy(-1, 1, 0)
        exporter.set_weights(weights, 3)
        actor = LocalActor(onnx_bytes(acting_network(exporter), example_batch(algorithm.spec.observation_space)),
                           worker.acting_rule().to_wire(), 3)
        obs = np.random.default_rng(0).standard_normal((50, 4)).astype(np.float32)
        rng = np.random.default_rng(11)
        mine = [actor.act({"": o}, rng) for o in obs]
        worker.rng = np.random.default_rng(11)
        theirs = [worker.act(o[None], explore=True) for o in obs]
        for (a, extras, after), (b, their_extras) in zip(mine, theirs):
            assert after is None  # a feedforward policy has no state
            np.testing.assert_allclose(a, b[0], atol=1e-5)
            assert set(extras) == set(their_extras)
            for k in extras:
                np.testing.assert_allclose(extras[k], their_extras[k][0], rtol=1e-4, atol=1e-5)
        # many rows at once (Client.get_actions): what the worker's policy does with the same rows
        actions, extras, _ = actor.act_rows({"": obs}, np.random.default_rng(5))
        worker.rng = np.random.default_rng(5)
        their_actions, their_extras = worker.act(obs, explore=True)
        np.testing.assert_allclose(actions, their_actions, atol=1e-5)
        for k in extras:
            np.testing.assert_allclose(extras[k], their_extras[k], rtol=1e-4, atol=1e-5)
