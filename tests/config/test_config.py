import dataclasses
import glob
import os
import pickle
import typing

import pytest
import yaml

from distrl.config import (Config, ConfigError, config_class, describe, dump_yaml, from_dict, load_config,
                           read_yaml, to_dict)
from distrl.config.sections import NormalizeConfig
from distrl.registry import ALGORITHMS, algorithm

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# Every config we ship: the examples and the benchmarks' own.
CONFIGS = sorted(glob.glob(os.path.join(ROOT, "configs", "*.yaml")) + glob.glob(os.path.join(ROOT, "bench", "configs", "*.yaml")))


def test_defaults_build():
    cfg = load_config(None)
    assert cfg.algo == "apex_dqn" and cfg.mode == "async" and cfg.env.id == "CartPole-v1"


def a_dataset_for(env_id: str, path: str) -> str:
    """A few random episodes of `env_id` as a Minari dataset: what an offline config trains from."""
    import gymnasium as gym
    import numpy as np

    from distrl.data.datasets import DatasetWriter, Episode

    env = gym.make(env_id)
    obs, _ = env.reset(seed=0)
    steps = 20
    actions = np.stack([env.action_space.sample() for _ in range(steps)])
    episode = Episode(np.repeat(obs[None], steps + 1, 0), actions, np.zeros(steps), np.zeros(steps, bool),
                      np.eye(steps, dtype=bool)[-1])
    DatasetWriter(path, env.observation_space, env.action_space, {}).add([episode])
    return path


@pytest.mark.parametrize("path", CONFIGS, ids=os.path.basename)
def test_every_shipped_config_loads_and_validates(path, tmp_path):
    from distrl.checks import validate
    from distrl.registry import algorithm

    cfg = load_config(path)
    if algorithm(cfg.algo).offline:  # an offline config takes its dataset from --set data.dataset=...
        cfg = load_config(path, [f"data.dataset={a_dataset_for(cfg.env.id, str(tmp_path / 'data-v0'))}"])
    validate(cfg)
    assert isinstance(cfg, Config)


def test_default_config_is_apex_dqn_cartpole_async():
    cfg = load_config(os.path.join(ROOT, "configs", "apex_dqn_cartpole.yaml"))
    assert (cfg.algo, cfg.env.id, cfg.mode) == ("apex_dqn", "CartPole-v1", "async")
    assert cfg.eval.target_return == 475


def test_overrides_are_typed_and_nested():
    cfg = load_config(None, ["replay.alpha=0.5", "workers=3", "env.kwargs={continuous: true}",
                             "eval.target_return=null", "async.window_s=0.1"])
    assert cfg.replay.alpha == 0.5 and cfg.workers == 3
    assert cfg.env.kwargs == {"continuous": True}
    assert cfg.eval.target_return is None
    assert cfg.async_.window_s == 0.1


def test_int_accepted_for_float_but_not_bool_for_int():
    assert load_config(None, ["replay.alpha=1"]).replay.alpha == 1.0
    with pytest.raises(ConfigError, match="'workers': expected int"):
        load_config(None, ["workers=true"])


@pytest.mark.parametrize("override, message", [
    (["replay.alhpa=0.5"], "unknown config key 'replay.alhpa'"),
    (["bogus=1"], "unknown config key 'bogus'"),
    (["workers=two"], "config key 'workers': expected int, got 'two'"),
    (["replay.alpha=1.5"], "config key 'replay.alpha': must be <= 1.0, got 1.5"),
    (["workers=0"], "config key 'workers': must be >= 1, got 0"),
    (["replay.samples_per_insert=0"], "config key 'replay.samples_per_insert': must be > 0.0"),
    (["learner.updates_per_step=0.5"], "config key 'learner.updates_per_step' was replaced by replay.samples_per_insert"),
    (["replay.learning_starts=10"], "config key 'replay.learning_starts' was replaced by replay.min_size"),
    (["apex_dqn.hidden=[32]"], "config key 'apex_dqn.hidden' was replaced by model.hidden"),
    (["algo=dhc", "dhc.encoder=[]"], "config key 'dhc.encoder' was replaced by model.conv_channels"),
    (["algo=r2d2", "r2d2.core=gru"], "config key 'r2d2.core' was replaced by model.core"),
    (["mode=turbo"], "config key 'mode': must be one of single, sync, async, got 'turbo'"),
    (["algo=ddpg"], "config key 'algo': unknown algorithm 'ddpg'"),
    (["env=3"], "config key 'env': expected a mapping"),
    (["replay.alpha"], "must look like section.key=value"),
])
def test_bad_values_name_the_key(override, message):
    with pytest.raises(ConfigError) as err:
        load_config(None, override)
    assert message in str(err.value)
    assert "\n" not in str(err.value)


def test_missing_and_malformed_files(tmp_path):
    with pytest.raises(ConfigError, match="config file not found"):
        load_config(str(tmp_path / "nope.yaml"))
    bad = tmp_path / "bad.yaml"
    bad.write_text("algo: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid YAML at line"):
        load_config(str(bad))
    scalar = tmp_path / "scalar.yaml"
    scalar.write_text("42\n")
    with pytest.raises(ConfigError, match="must hold a mapping"):
        read_yaml(str(scalar))


def test_round_trip_through_yaml(tmp_path):
    cfg = load_config(None, ["workers=4", "replay.capacity=1234"])
    path = tmp_path / "c.yaml"
    path.write_text(dump_yaml(cfg))
    assert load_config(str(path)) == cfg


@pytest.mark.parametrize("algo", ALGORITHMS)
def test_every_field_has_a_doc(algo):
    seen = []
    cls = config_class(algo)

    def walk(cls):
        seen.append(cls)
        hints = typing.get_type_hints(cls)  # the annotations are strings (postponed evaluation)
        for fl in dataclasses.fields(cls):
            assert fl.metadata.get("doc"), f"{cls.__name__}.{fl.name} has no doc"
            if dataclasses.is_dataclass(hints[fl.name]):
                walk(hints[fl.name])
    walk(cls)
    sections = {t for t in typing.get_type_hints(cls).values() if dataclasses.is_dataclass(t)}
    assert sections <= set(seen) and NormalizeConfig in seen  # every section walked, and those nested in them
    assert any(line.startswith(f"{algo}:  # ") for line in describe(cls))


def test_describe_of_a_class_gives_its_defaults_with_the_algorithms_own():
    lines = describe(config_class("apex_dqn"))
    assert any(line.startswith("replay.alpha = 0.6  # priority exponent") for line in lines)
    assert "model.hidden = [256, 256]  # " in "\n".join(describe(config_class("sac")))


@pytest.mark.parametrize("algo, key", [("a2c", "epochs"), ("a2c", "clip"), ("a3c", "minibatches"),
                                       ("impala", "gae_lambda"), ("impala", "epochs"), ("ppo", "max_staleness")])
def test_each_on_policy_section_takes_only_the_keys_its_algorithm_reads(algo, key):
    with pytest.raises(ConfigError, match=f"unknown config key '{algo}.{key}'"):
        load_config(None, [f"algo={algo}", f"{algo}.{key}=1"])


@pytest.mark.parametrize("path", CONFIGS, ids=os.path.basename)
def test_every_shipped_config_runs_in_a_mode_its_algorithm_supports(path):
    cfg = load_config(path)
    assert cfg.mode in algorithm(cfg.algo).modes, (cfg.algo, cfg.mode)


def test_from_dict_rejects_unknown_algo_section_key():
    with pytest.raises(ConfigError, match="unknown config key 'apex_dqn.nstep'"):
        from_dict({"apex_dqn": {"nstep": 3}})


def test_placement_section_takes_resources_per_role_and_defaults_to_ray_scheduling():
    cfg = load_config(None, ["placement.learner={GPU: 1}", "placement.workers={worker_node: 1}"])
    assert cfg.placement.learner == {"GPU": 1} and cfg.placement.workers == {"worker_node": 1}
    assert cfg.placement.replay == {} and cfg.placement.workers_strategy == "default"
    assert load_config(None, ["placement.workers_strategy=pack"]).placement.workers_strategy == "pack"
    with pytest.raises(ConfigError, match="placement.workers_strategy': must be one of default, spread, pack"):
        load_config(None, ["placement.workers_strategy=turbo"])


@pytest.mark.parametrize("amount", ["-1", "0", "1.5", "abc", "true", ".nan"])
def test_placement_amounts_ray_would_refuse_name_the_key(amount):
    from distrl.checks import validate

    with pytest.raises(ConfigError, match="config key 'placement.replay.slot'"):
        validate(load_config(None, ["mode=sync", f"placement.replay={{slot: {amount}}}"]))


def test_single_mode_ignores_placement():
    from distrl.checks import validate

    validate(load_config(None, ["mode=single", "placement.learner={nowhere: 1}", "placement.workers={x: -1}"]))


def placement_on_cluster(overrides: list[str]) -> None:
    """check_placement of the default config with `overrides`, on the cluster at head:6379."""
    from distrl.runtime.ray_setup import check_placement, roster

    check_placement(roster(load_config(None, overrides), clustered=True), "head:6379")


def fake_cluster(monkeypatch, *nodes):
    import ray

    from distrl.runtime import ray_setup

    monkeypatch.setattr(ray_setup, "init_ray", lambda address, user_modules=None: None)
    monkeypatch.setattr(ray, "nodes", lambda: [{"Alive": True, "Resources": r} for r in nodes] +
                        [{"Alive": False, "Resources": {"slot": 100, "CPU": 100}}])


@pytest.mark.parametrize("overrides, message", [
    (["placement.learner={nope: 1}"], r"'placement.learner': learner asks for nope: 1 per actor; .* no node offering it"),
    (["placement.replay={slot: 3}"], r"'placement.replay': .*slot: 3 per actor; .* at most 2 on one node"),
    (["workers=3", "placement.workers={slot: 1}"], r"'placement.workers': .*slot: 3 in all; .* has 2"),
    (["workers=4"], r"'placement.workers': .*CPU: 5 in all; .* has 4"),  # on a cluster a worker takes a CPU
])
def test_a_placement_the_cluster_cannot_host_names_the_role_and_resource(monkeypatch, overrides, message):
    fake_cluster(monkeypatch, {"CPU": 2}, {"CPU": 2, "slot": 2})
    with pytest.raises(ConfigError, match=message):
        placement_on_cluster(["device=cpu"] + overrides)


def test_resources_no_single_node_holds_together_are_refused_naming_the_role(monkeypatch):
    """Each resource exists somewhere, but not on one node: Ray would leave the learner pending."""
    fake_cluster(monkeypatch, {"CPU": 2, "GPU": 1}, {"CPU": 2, "node_a": 1})
    with pytest.raises(ConfigError, match=r"^config key 'placement.learner': learner asks for CPU: 1, GPU: 1, "
                                          r"node_a: 1 per actor; no single node of the cluster at head:6379 has"):
        placement_on_cluster(["device=cpu", "placement.learner={GPU: 1, node_a: 1}"])
    fake_cluster(monkeypatch, {"CPU": 2, "GPU": 1}, {"CPU": 2, "node_a": 1, "GPU": 1})
    placement_on_cluster(["device=cpu", "placement.learner={GPU: 1, node_a: 1}"])


def test_on_cuda_the_learner_and_a_central_inference_server_share_one_gpu(monkeypatch):
    from distrl.runtime.ray_setup import role_resources

    placement = load_config(None, ["mode=sync"]).placement
    wanted = role_resources(placement, True, True, "cuda")
    assert wanted["learner"]["GPU"] == wanted["inference"]["GPU"] == 0.5
    assert wanted["workers"].get("GPU", 0.0) == wanted["evaluator"].get("GPU", 0.0) == 0.0
    assert role_resources(placement, False, True, "cuda")["learner"]["GPU"] == 1.0
    assert role_resources(placement, True, True, "cpu")["inference"]["GPU"] == 0.0
    fake_cluster(monkeypatch, {"CPU": 4, "GPU": 1})
    placement_on_cluster(["mode=sync", "device=cuda", "rollout.inference=central"])


def test_the_placement_of_a_role_the_run_does_not_start_is_not_checked(monkeypatch):
    fake_cluster(monkeypatch, {"CPU": 2}, {"CPU": 2})
    placement_on_cluster(["device=cpu", "placement.inference={nope: 1}", "placement.gradient_workers={nope: 1}"])
    with pytest.raises(ConfigError, match="'placement.inference': inference asks for nope: 1"):
        placement_on_cluster(["device=cpu", "placement.inference={nope: 1}", "rollout.inference=central"])


def test_a_placement_the_cluster_can_host_passes(monkeypatch):
    fake_cluster(monkeypatch, {"CPU": 2}, {"CPU": 2, "slot": 2})
    placement_on_cluster(["device=cpu", "workers=2", "placement.workers={slot: 1}", "placement.learner={CPU: 2}"])


@pytest.mark.parametrize("overrides, counts", [
    (["workers=3"], {"workers": 3, "gradient_workers": 0, "inference": 0, "external": 0}),
    (["workers=2", "learner.num_gradient_workers=2", "rollout.inference=central"],
     {"workers": 2, "gradient_workers": 2, "inference": 1, "external": 0}),
    (["workers=2", "learner.num_gradient_workers=1"], {"workers": 2, "gradient_workers": 0, "inference": 0, "external": 0}),
    (["workers=2", "external.enabled=true"], {"workers": 0, "gradient_workers": 0, "inference": 0, "external": 1}),
    (["workers=2", "external.enabled=true", "external.with_workers=true"],
     {"workers": 2, "gradient_workers": 0, "inference": 0, "external": 1}),
])
def test_the_roster_counts_each_roles_actors_and_what_one_asks_for(overrides, counts):
    """One learner, replay server, parameter server and evaluator; gradient workers only past one; an
    inference server only for central inference; a simulator server in the workers' stead, or beside
    them. On a cluster a worker and the learner reserve a CPU."""
    from distrl.runtime.ray_setup import roster

    plan = roster(load_config(None, ["mode=sync", "device=cpu"] + overrides), clustered=True)
    assert plan.counts == {"learner": 1, "replay": 1, "parameter_server": 1, "evaluator": 1, **counts}
    assert plan.device == "cpu"
    assert plan.resources["workers"]["CPU"] == plan.resources["learner"]["CPU"] == 1.0
    assert roster(load_config(None, ["mode=sync", "device=cpu"] + overrides), clustered=False
                  ).resources["workers"]["CPU"] == 0.0


def test_an_offline_runs_roster_starts_no_rollout_workers(tmp_path):
    from distrl.runtime.ray_setup import roster

    dataset = tmp_path / "d"
    dataset.mkdir()
    plan = roster(load_config(None, ["mode=sync", "workers=2", f"data.dataset={dataset}"]), clustered=False)
    assert plan.counts["workers"] == 0


def test_an_error_buffer_that_can_stall_the_run_is_refused_with_the_smallest_that_works():
    from distrl.checks import validate

    base = ["mode=single", "replay.samples_per_insert=2", "learner.batch_size=64"]  # smallest: (2 + 64) / 2
    with pytest.raises(ConfigError, match=r"^config key 'replay.error_buffer': 32.5 is too small: .* the smallest "
                                          r"that works is 33$"):
        validate(load_config(os.path.join(ROOT, "configs", "apex_dqn_cartpole.yaml"), base + ["replay.error_buffer=32.5"]))
    validate(load_config(os.path.join(ROOT, "configs", "apex_dqn_cartpole.yaml"), base + ["replay.error_buffer=33"]))
    r2d2 = os.path.join(ROOT, "configs", "r2d2_repeat_previous.yaml")  # sequence replay: items are sequences
    validate(load_config(r2d2, ["mode=single", "replay.error_buffer=null"]))
    with pytest.raises(ConfigError, match="'replay.error_buffer': 1 is too small"):
        validate(load_config(r2d2, ["mode=single", "replay.error_buffer=1"]))


def test_time_fields_are_bounded_and_exponents_without_a_dot_are_numbers():
    cfg = load_config(None, ["fault.role_timeout_s=1e3", "apex_dqn.lr=1e-4", "async.window_s=5E-2"])
    assert (cfg.fault.role_timeout_s, cfg.apex_dqn.lr, cfg.async_.window_s) == (1000.0, 1e-4, 0.05)
    for key in ("fault.role_timeout_s", "fault.worker_timeout_s", "async.window_s", "eval.interval_s",
                "checkpoint.interval_s", "log.interval_s", "stop.max_seconds"):
        with pytest.raises(ConfigError, match=rf"^config key '{key}': must be <= \d+"):
            load_config(None, [f"{key}=1e18"])
    with pytest.raises(ConfigError, match="'workers': expected int, got '1e3'"):
        load_config(None, ["workers=1e3"])


def test_the_epsilon_keys_are_shared_but_keep_their_names_and_defaults():
    from distrl.algos.qlearning import EpsilonGreedyConfig

    ApexDQNConfig, R2D2Config, DHCConfig = (algorithm(a).config for a in ("apex_dqn", "r2d2", "dhc"))
    names = ("eps", "eps_alpha", "eps_start", "eps_end", "eps_decay_steps")
    for cls in (ApexDQNConfig, R2D2Config, DHCConfig):
        assert issubclass(cls, EpsilonGreedyConfig)
        cfg = cls()
        assert (cfg.eps, cfg.eps_alpha, cfg.eps_start, cfg.eps_end) == (0.4, 7.0, 1.0, 0.02)
        assert all(n in {f.name for f in dataclasses.fields(cls)} for n in names)
    assert (ApexDQNConfig().eps_decay_steps, R2D2Config().eps_decay_steps, DHCConfig().eps_decay_steps) == (5000, 5000, 20000)
    assert load_config(None, ["algo=dhc", "dhc.eps_end=0.1"]).dhc.eps_end == 0.1


def test_a_key_that_is_not_a_name_is_one_error(tmp_path):
    path = tmp_path / "config.yaml"
    path.write_text("replay:\n  1: 2\n")
    with pytest.raises(ConfigError, match=r"^config key 'replay.1': a key must be a name, got 1$"):
        load_config(str(path))


# --- a config holds the run's sections only --------------------------------------

def test_another_algorithms_section_is_refused_naming_it(tmp_path):
    with pytest.raises(ConfigError, match=r"^config key 'sac': a section of another algorithm; this config's "
                                          r"algo is ppo") as err:
        load_config(None, ["algo=ppo", "sac.tau=0.01"])
    assert "\n" not in str(err.value)
    path = tmp_path / "config.yaml"  # the same from a file, whatever the section's order
    path.write_text("apex_dqn: {lr: 0.001}\nalgo: r2d2\n")
    with pytest.raises(ConfigError, match=r"^config key 'apex_dqn': a section of another algorithm; this "
                                          r"config's algo is r2d2"):
        load_config(str(path))


@pytest.mark.parametrize("algo, section", [("ppo", "replay"), ("a3c", "replay"), ("ppo", "sequence"),
                                           ("apex_dqn", "sequence"), ("sac", "queue"), ("r2d2", "queue")])
def test_a_data_section_the_algorithm_does_not_read_is_refused_naming_it(algo, section):
    with pytest.raises(ConfigError) as err:
        from_dict({"algo": algo, section: {}})  # even empty: it says the author expects it to matter
    message = str(err.value)
    assert message.startswith(f"config key '{section}': {algo} learns from {algorithm(algo).data_path} data "
                              f"and reads no {section} section"), message
    assert "\n" not in message


def test_a_ppo_config_file_with_a_replay_section_is_refused(tmp_path):
    path = tmp_path / "ppo.yaml"
    path.write_text(open(os.path.join(ROOT, "configs", "ppo_cartpole.yaml")).read() + "replay:\n  capacity: 1000\n")
    with pytest.raises(ConfigError, match=r"^config key 'replay': ppo learns from trajectory data"):
        load_config(str(path))


def test_a_model_given_in_part_keeps_the_algorithms_own_defaults(tmp_path):
    ppo = load_config(None, ["algo=ppo", "model.hidden=[32]"]).model
    assert (ppo.hidden, ppo.activation) == ([32], "tanh")  # an actor-critic's MLP is tanh
    sac = load_config(None, ["algo=sac", "model.activation=elu"]).model
    assert (sac.hidden, sac.activation) == ([256, 256], "elu")
    path = tmp_path / "r2d2.yaml"  # a recurrent model keeps its core's defaults too
    path.write_text("algo: r2d2\nmodel:\n  core_size: 32\n")
    r2d2 = load_config(str(path)).model
    assert (r2d2.hidden, r2d2.core, r2d2.core_size) == ([64], "lstm", 32)
    dhc = load_config(None, ["algo=dhc", "model.hidden=[16]"]).model
    assert (dhc.conv_channels, dhc.core, dhc.hidden) == ([32, 32], "gru", [16])
    assert load_config(None, ["algo=ppo"]).model.core == "none"  # the on-policy family's core is optional
    assert load_config(None, ["algo=ppo", "model.core=gru"]).model.core == "gru"
    with pytest.raises(ConfigError, match=r"^config key 'model.core': sac has no recurrent core \(model.core is "
                       r"for r2d2, dhc, a2c, a3c, ppo, mappo, impala\)$"):
        load_config(None, ["algo=sac", "model.core=gru"])


def a_float_key(algo: str) -> str:
    """The first float key of an algorithm's section (every section has one)."""
    section = config_class(algo)().algo_config
    return next(fl.name for fl in dataclasses.fields(section) if isinstance(getattr(section, fl.name), float))


@pytest.mark.parametrize("algo", ALGORITHMS)
def test_an_algorithm_section_given_in_part_keeps_its_defaults(algo):
    default, key = config_class(algo)(), a_float_key(algo)
    cfg = load_config(None, [f"algo={algo}", f"{algo}.{key}=0.5"])
    assert getattr(cfg.algo_config, key) == 0.5
    assert dataclasses.replace(cfg.algo_config, **{key: getattr(default.algo_config, key)}) == default.algo_config
    assert cfg.model == default.model


def test_the_config_a_run_dumps_holds_only_its_sections(tmp_path):
    from distrl.api import train

    run_dir = tmp_path / "run"
    cfg = load_config(os.path.join(ROOT, "configs", "ppo_cartpole.yaml"),
                      ["mode=single", "stop.max_env_steps=64", "log.progress=false", "log.tensorboard=false",
                       "eval.episodes=1", "env.num_envs=2", "rollout.fragment_length=8"])
    train(cfg, run_dir=str(run_dir))
    dumped = yaml.safe_load((run_dir / "config.yaml").read_text())
    run_sections = [fl.metadata.get("key", fl.name) for fl in dataclasses.fields(Config)]
    assert list(dumped) == run_sections + ["queue", "model", "ppo"]
    assert dumped["model"]["activation"] == "tanh" and dumped["ppo"] == to_dict(cfg.ppo)
    assert load_config(str(run_dir / "config.yaml")) == cfg  # what a resume reads back


def test_a_dumped_config_round_trips_for_every_algorithm(tmp_path):
    for algo in ALGORITHMS:
        cfg = load_config(None, [f"algo={algo}", "model.hidden=[8]", f"{algo}.{a_float_key(algo)}=0.9"])
        assert set(yaml.safe_load(dump_yaml(cfg))) == set(to_dict(config_class(algo)()))
        path = tmp_path / f"{algo}.yaml"
        path.write_text(dump_yaml(cfg))
        assert load_config(str(path)) == cfg


def dotted_keys(cfg, prefix=""):
    """(leaf keys, section keys) of a config instance, as the YAML names them."""
    leaves, sections = set(), set()
    for fl in dataclasses.fields(cfg):
        name, value = prefix + fl.metadata.get("key", fl.name), getattr(cfg, fl.name)
        if dataclasses.is_dataclass(value):
            sections.add(name)
            inner = dotted_keys(value, name + ".")
            leaves |= inner[0]
            sections |= inner[1]
        else:
            leaves.add(name)
    return leaves, sections


def test_describe_lists_every_key_of_the_resolved_config_with_its_doc():
    cfg = load_config(os.path.join(ROOT, "configs", "sac_pendulum.yaml"), ["sac.tau=0.01", "model.hidden=[32]"])
    lines = describe(cfg)
    leaves, sections = dotted_keys(cfg)
    assert {line.split(" = ")[0] for line in lines if " = " in line} == leaves
    assert {line.split(":  # ")[0] for line in lines if " = " not in line} == sections
    assert len(lines) == len(leaves) + len(sections)
    assert all(line.split("  # ", 1)[1].strip() for line in lines), "a key without its doc"
    assert "sac.tau = 0.01  # Polyak factor for the target critics" in lines  # the value resolved, not the default
    assert "model.hidden = [32]  # layer sizes of the MLP torso ([] = the flattened observation)" in lines
    assert "sac" in sections and not sections & {*ALGORITHMS, "queue", "sequence"} - {"sac"}


def test_configs_pickle_by_value():
    from ray import cloudpickle  # what carries a config to Ray actors

    for algo in ALGORITHMS:
        cfg = load_config(None, [f"algo={algo}", "seed=7", "model.hidden=[16]"])
        for back in (pickle.loads(pickle.dumps(cfg)), cloudpickle.loads(cloudpickle.dumps(cfg))):
            assert back == cfg and type(back) is config_class(algo) and back.algo_config == cfg.algo_config


def test_a_config_class_is_made_once_per_algorithm_and_the_base_holds_only_run_sections():
    assert config_class("ppo") is config_class("ppo") and issubclass(config_class("ppo"), Config)
    assert type(load_config(None, ["algo=sac"])) is config_class("sac")
    assert config_class("sac")() == load_config(None, ["algo=sac"])  # its defaults name its algorithm
    assert not hasattr(Config(algo="sac"), "sac")  # the base is the run sections only


def test_the_api_takes_a_base_config_as_its_algorithms_and_checks_a_built_one():
    from distrl.api import resolve_config

    cfg = resolve_config(Config(algo="ppo", mode="single", workers=3))
    assert type(cfg) is config_class("ppo") and (cfg.mode, cfg.workers) == ("single", 3)
    assert cfg.model.activation == "tanh" and cfg.ppo == config_class("ppo")().ppo
    built = load_config(None, ["algo=sac"])
    built.workers = 0  # set in code, past the parser
    with pytest.raises(ConfigError, match="config key 'workers': must be >= 1, got 0"):
        resolve_config(built)
    with pytest.raises(ConfigError, match="config key 'algo': unknown algorithm 'ddpg'"):
        resolve_config(Config(algo="ddpg"))


def test_configs_share_no_mutable_default():
    a, b = load_config(None, ["algo=sac"]), load_config(None, ["algo=sac"])
    a.model.hidden.append(7)
    a.env.kwargs["x"] = 1
    assert b.model.hidden == [256, 256] and b.env.kwargs == {}
    assert load_config(None, ["algo=sac"]).model.hidden == [256, 256] == algorithm("sac").model_defaults["hidden"]
