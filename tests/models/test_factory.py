"""A user's own torso (`model.torso: module:Factory`): one that works reaches an algorithm's network; each
way a factory can be wrong is one TorsoError line that names it."""
import numpy as np
import pytest
import torch
from gymnasium import spaces

from distrl.algos.apex_dqn import ApexDQN
from distrl.config import load_config
from distrl.config.sections import ModelConfig
from distrl.core import EnvSpec
from distrl.models import TorsoError, check_torso, make_torso

SPACE = spaces.Box(-1.0, 1.0, (5,), np.float32)
HERE = "tests.models.user_torsos"


def torso_of(name: str, space=SPACE, **kwargs):
    """make_torso then check_torso, as a run's config check does (`distrl.checks`)."""
    model = ModelConfig(torso=name, kwargs=kwargs)
    torso = make_torso(space, model)
    check_torso(torso, space, name)
    return torso


def test_a_working_factory_gives_the_torso_and_reads_its_kwargs():
    torso = torso_of(f"{HERE}:Factory", width=6)
    assert torso.out_features == 6
    assert torso(torch.zeros(3, 5)).shape == (3, 6)


def test_an_algorithm_builds_its_network_on_the_users_torso():
    cfg = load_config(None, ["algo=apex_dqn", f"model.torso={HERE}:Factory", "model.kwargs={width: 7}"])
    algo = ApexDQN(EnvSpec(SPACE, spaces.Discrete(3)), cfg.apex_dqn, cfg.model)
    net = algo.build_network()
    assert type(net.torso).__name__ == "Factory" and net.head.advantage.in_features == 7
    assert net(torch.zeros(2, 5)).shape == (2, 3)


@pytest.mark.parametrize("name, says", [
    ("tests.models.no_such_module:Factory", "cannot import"),
    (f"{HERE}:NoSuchFactory", "cannot import"),
    (f"{HERE}:NOT_CALLABLE", "not callable"),
    (f"{HERE}:raises", "raised ValueError: this factory refuses every space"),
    (f"{HERE}:not_a_module", "must return an nn.Module"),
    (f"{HERE}:FloatOutFeatures", "out_features=8.0"),
    (f"{HERE}:WrongShape", "float features shaped (2, 8) (out_features), got (2, 9)"),
])
def test_a_broken_factory_is_one_torso_error_line_naming_it(name, says):
    with pytest.raises(TorsoError) as err:
        torso_of(name)
    message = str(err.value)
    assert "\n" not in message  # one line, even for a multi-line exception message
    assert message.startswith("config key 'model.torso':") and name in message, message
    assert says in message, message


def test_a_name_without_module_or_attribute_is_refused():
    with pytest.raises(TorsoError, match="must look like package.module:Factory"):
        torso_of(":Factory")
