"""Bad input: one clear line naming the problem, exit status 2, no run dir created."""
import os
import re
import subprocess
import sys
import time

import pytest

from distrl.cli import main

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CARTPOLE = os.path.join(ROOT, "configs", "apex_dqn_cartpole.yaml")
R2D2 = os.path.join(ROOT, "configs", "r2d2_repeat_previous.yaml")


def run_main(capsys, *argv):
    import distrl.cli

    distrl.cli.START = time.time()  # the command's start, as the console script's import sets it (a budget counts from it)
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.mark.parametrize("argv, message", [
    (["train", CARTPOLE, "--set", "replay.alhpa=1"], "unknown config key 'replay.alhpa'"),
    (["train", CARTPOLE, "--set", "workers=many"], "config key 'workers': expected int, got 'many'"),
    (["train", CARTPOLE, "--set", "replay.alpha=2"], "config key 'replay.alpha': must be <= 1.0"),
    (["train", CARTPOLE, "--workers", "0"], "config key 'workers': must be >= 1, got 0"),
    (["train", CARTPOLE, "--set", "env.id=CartPole-v9"], "unknown gymnasium environment 'CartPole-v9'"),
    (["train", CARTPOLE, "--set", "algo=ddpg"], "config key 'algo': unknown algorithm 'ddpg'"),
    (["train", CARTPOLE, "--set", "env.id=Pendulum-v1"], "apex_dqn needs a Discrete action space"),
    (["train", CARTPOLE, "--set", "env.kwargs={bogus: 1}"], "config key 'env.kwargs'"),
    (["train", CARTPOLE, "--device", "tpu"], "config key 'device'"),
    (["train", "no/such/config.yaml"], "config file not found: no/such/config.yaml"),
    (["train", CARTPOLE, "--mode", "turbo"], "invalid choice: 'turbo'"),
    (["train", CARTPOLE, "--max-seconds", "soon"], "invalid float value: 'soon'"),
    (["eval", "no/such/run"], "run dir not found: no/such/run"),
    (["frobnicate"], "invalid choice: 'frobnicate'"),
    (["train", CARTPOLE, "--workers", "10000"], "config key 'workers': 10000 workers cannot run on this machine"),
    (["train", CARTPOLE, "--set", "learner.batch_size=1000000"], "config key 'learner.batch_size': 1000000 is larger"),
    (["train", CARTPOLE, "--set", "stop.max_seconds=-1"], "config key 'stop.max_seconds': must be > 0.0"),
    (["train", CARTPOLE, "--set", "env.id=:CartPole-v1"], "config key 'env.id': ':CartPole-v1' must look like"),
    (["train", CARTPOLE, "--set", "env.kwargs={max_episode_steps: -5}"], "config key 'env.kwargs': CartPole-v1 could not be built"),
    (["train", CARTPOLE, "--set", "env.id=LunarLander-v3", "--set", "env.kwargs={gravity: 100.0}"],
     "config key 'env.kwargs': LunarLander-v3 could not be built with {'gravity': 100.0}: gravity"),
    (["train", CARTPOLE, "--set", "env.id=distrl.envs.testing:NaNCartPole-v1", "--set", "env.kwargs={nan_prob: 2, seed: x}"],
     "config key 'env.kwargs'"),
    (["train", CARTPOLE, "--seed", str(2**64)], "config key 'seed': must be <="),
    (["train", CARTPOLE, "--address", "127.0.0.1:9"], "--address 127.0.0.1:9: no Ray cluster answers there"),
    (["train", CARTPOLE, "--device", "cuda:99"], "config key 'device': cuda:99"),
    (["train", CARTPOLE, "--set", "replay.alpha=.nan"], "config key 'replay.alpha': must be a finite number"),
    (["train", CARTPOLE, "--set", "eval.target_return=.inf"], "config key 'eval.target_return': must be a finite number"),
    (["train", CARTPOLE, "--set", "model.hidden=[64, x]"], "config key 'model.hidden': must be a list of integers >= 1"),
    # a learner this wide would not fit in memory (the fuzz test once built one and the machine ran out)
    (["train", CARTPOLE, "--set", "model.hidden=[64, 40000]"],
     "config key 'model.hidden': must be a list of integers >= 1 and <= 8192, got [64, 40000]"),
    (["train", CARTPOLE, "--set", "apex_dqn.hidden=[64]"], "config key 'apex_dqn.hidden' was replaced by model.hidden"),
    (["train", CARTPOLE, "--set", "algo=r2d2"], "config key 'apex_dqn': a section of another algorithm; this config's algo is r2d2"),
    (["train", CARTPOLE, "--set", "model.torso=no_such_module:Torso"], "config key 'model.torso'"),
    (["train", CARTPOLE, "--mode", "single", "--set", "learner.num_gradient_workers=2"],
     "config key 'learner.num_gradient_workers': only modes sync and async start Ray actors"),
    (["train", R2D2, "--set", "learner.num_gradient_workers=2"],
     "config key 'learner.num_gradient_workers': r2d2 has no gradient workers"),
    (["train", CARTPOLE, "--mode", "single", "--set", "env.id=.x:Foo"], "config key 'env.id': cannot import '.x'"),
    (["train", CARTPOLE, "--mode", "single", "--set", "env.id=.:Foo"], "config key 'env.id': cannot import '.'"),
    (["train", CARTPOLE, "--mode", "single", "--set", "fault.role_timeout_s=1e18"],
     "config key 'fault.role_timeout_s': must be <= 604800"),
    (["train", CARTPOLE, "--mode", "single", "--set", "fault.worker_timeout_s=1.0e+18"],
     "config key 'fault.worker_timeout_s': must be <= 604800"),
    (["train", CARTPOLE, "--mode", "single", "--set", "async.window_s=1e18"], "config key 'async.window_s': must be <= 604800"),
    (["train", CARTPOLE, "--mode", "single", "--set", "replay.samples_per_insert=1e300"],
     "config key 'replay.samples_per_insert': must be <= 10000"),
    (["train", CARTPOLE, "--mode", "single", "--set", f"replay.capacity={10**12}"],
     "config key 'replay.capacity': 1000000000000 items need at least"),
    (["train", CARTPOLE, "--mode", "single", "--set", "replay.error_buffer=5"],
     "config key 'replay.error_buffer': 5 is too small"),
    (["train", CARTPOLE, "--mode", "single", "--set", "env.kwargs=" + "[" * 5000 + "]" * 5000],
     "override 'env.kwargs': the value is nested too deeply"),
])
def test_bad_input_is_one_line_exit_2_and_no_run_dir(capsys, tmp_path, argv, message):
    run_dir = tmp_path / "run"
    code, out, err = run_main(capsys, *argv, *(["--run-dir", str(run_dir)] if argv[0] == "train" else []))
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("distrl: error: ")
    assert message in lines[0]
    assert "Traceback" not in err
    assert not run_dir.exists()


def test_existing_run_is_not_overwritten(capsys, tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "config.yaml").write_text("algo: apex_dqn\n")
    code, _, err = run_main(capsys, "train", CARTPOLE, "--run-dir", str(run_dir))
    assert code == 2 and "already holds a run" in err
    assert (run_dir / "config.yaml").read_text() == "algo: apex_dqn\n"


def test_corrupt_best_checkpoint_is_a_clear_error(capsys, tmp_path):
    run_dir = tmp_path / "run"
    (run_dir / "checkpoints").mkdir(parents=True)
    (run_dir / "config.yaml").write_text("algo: apex_dqn\n")
    (run_dir / "checkpoints" / "best.safetensors").write_bytes(b"\x80\x04garbage")
    code, _, err = run_main(capsys, "eval", str(run_dir))
    assert code == 2 and "corrupt" in err and len(err.strip().splitlines()) == 1


def test_console_script_exit_status(tmp_path):
    """The installed entry point itself: real process, real exit code, no traceback."""
    proc = subprocess.run([sys.executable, "-m", "distrl.cli", "train", CARTPOLE, "--set", "replay.alpha=-1",
                           "--run-dir", str(tmp_path / "run")], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.strip() == "distrl: error: config key 'replay.alpha': must be >= 0.0, got -1.0"
    assert not (tmp_path / "run").exists()


def test_a_binary_config_file_and_a_run_dir_that_is_a_file(capsys, tmp_path):
    binary = tmp_path / "config.yaml"
    binary.write_bytes(bytes(range(256)) * 4)
    code, _, err = run_main(capsys, "train", str(binary), "--run-dir", str(tmp_path / "run"))
    assert code == 2 and err.strip() == f"distrl: error: config file {binary} is not a text (YAML) file"
    afile = tmp_path / "afile"
    afile.write_text("x")
    code, _, err = run_main(capsys, "train", CARTPOLE, "--run-dir", str(afile))
    assert code == 2 and "is a file, not a directory" in err and afile.read_text() == "x"


def test_an_env_that_fails_in_a_worker_leaves_no_run_dir(capsys, tmp_path):
    """A start-up failure after the run dir was claimed (here: Ray can't be reached) removes it again."""
    run_dir = tmp_path / "run"
    code, _, err = run_main(capsys, "train", CARTPOLE, "--mode", "async", "--address", "127.0.0.1:9",
                            "--run-dir", str(run_dir))
    assert code == 2 and "Traceback" not in err and not run_dir.exists()


def assert_one_line_exit_2(code, err, message):
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and "Traceback" not in err, err
    assert lines[0].startswith("distrl: error: ") and message in lines[0], err


def test_a_run_dir_under_a_file_or_in_an_unwritable_dir_is_one_line(capsys, tmp_path):
    afile = tmp_path / "afile"
    afile.write_text("x")
    code, _, err = run_main(capsys, "train", CARTPOLE, "--mode", "single", "--run-dir", str(afile / "run"))
    assert_one_line_exit_2(code, err, f"run dir {afile / 'run'} cannot be created: {afile} is a file, not a directory")
    assert afile.read_text() == "x"
    if os.path.isdir("/sys/kernel"):  # sysfs refuses new entries even to root
        code, _, err = run_main(capsys, "train", CARTPOLE, "--mode", "single", "--run-dir", "/sys/distrl-test/run")
        assert_one_line_exit_2(code, err, "run dir /sys/distrl-test/run cannot be created: /sys/distrl-test: ")
        code, _, err = run_main(capsys, "train", CARTPOLE, "--mode", "single", "--run-dir", "/sys/kernel")
        assert_one_line_exit_2(code, err, "run dir /sys/kernel is not writable: ")


def test_a_run_dir_in_a_directory_without_write_permission_is_one_line(capsys, tmp_path):
    if os.geteuid() == 0:
        pytest.skip("root writes into any directory whatever its mode")
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    code, _, err = run_main(capsys, "train", CARTPOLE, "--mode", "single", "--run-dir", str(locked / "new" / "run"))
    assert_one_line_exit_2(code, err, "cannot be created")
    existing = locked / "existing"  # made before the dir lost its write bit: the lock file cannot be created
    os.chmod(locked, 0o700)
    existing.mkdir(mode=0o500)
    os.chmod(locked, 0o500)
    code, _, err = run_main(capsys, "train", CARTPOLE, "--mode", "single", "--run-dir", str(existing))
    assert_one_line_exit_2(code, err, f"run dir {existing} is not writable")
    assert os.listdir(existing) == []


def test_an_unreadable_config_file_is_one_line(capsys, tmp_path):
    if os.geteuid() == 0:
        pytest.skip("root reads a file whatever its mode")
    config = tmp_path / "config.yaml"
    config.write_text(open(CARTPOLE).read())
    config.chmod(0)
    code, _, err = run_main(capsys, "train", str(config), "--run-dir", str(tmp_path / "run"))
    assert_one_line_exit_2(code, err, f"config file {config} cannot be read: Permission denied")
    assert not (tmp_path / "run").exists()


def test_a_config_file_the_os_fails_to_read_is_one_line(capsys, tmp_path):
    """A regular file whose read fails even for root (Linux's clear_refs is write-only: EINVAL)."""
    path = "/proc/self/clear_refs"
    if not os.path.isfile(path):
        pytest.skip(f"{path} exists on Linux only")
    code, _, err = run_main(capsys, "train", path, "--run-dir", str(tmp_path / "run"))
    assert_one_line_exit_2(code, err, f"config file {path} cannot be read: ")
    assert not (tmp_path / "run").exists()


def test_a_config_path_that_is_a_directory_says_so(capsys, tmp_path):
    code, _, err = run_main(capsys, "train", str(tmp_path), "--run-dir", str(tmp_path / "run"))
    assert_one_line_exit_2(code, err, f"config file {tmp_path} is a directory")


def test_config_prints_every_resolved_key_with_its_doc(capsys):
    ppo = os.path.join(ROOT, "configs", "ppo_cartpole.yaml")
    code, out, err = run_main(capsys, "config", ppo, "--set", "ppo.lr=0.01", "--set", "model.hidden=[32]")
    assert code == 0 and err == ""
    lines = out.strip().splitlines()
    assert all(re.fullmatch(r"[a-z_.0-9]+( = .+|:)  # \S.*", line) for line in lines), out  # key, value, doc
    assert "ppo.lr = 0.01  # Adam learning rate" in lines  # the override, not the file's value
    assert "model.hidden = [32]  # layer sizes of the MLP torso ([] = the flattened observation)" in lines
    assert any(line.startswith("model.activation = 'tanh'  # ") for line in lines)  # PPO's default, not the base's
    assert any(line.startswith("queue.capacity = ") for line in lines)
    assert not [line for line in lines if line.startswith(("replay", "sequence", "apex_dqn", "sac", "a2c"))]


@pytest.mark.parametrize("argv, message", [
    (["--set", "ppo.lrr=0.01"], "unknown config key 'ppo.lrr'"),
    (["--set", "replay.capacity=10"], "config key 'replay': ppo learns from trajectory data and reads no replay section"),
    (["--set", "ppo.lr=-1"], "config key 'ppo.lr': must be > 0.0"),
    (["--set", "lr"], "override 'lr' must look like section.key=value"),
])
def test_config_with_a_bad_key_is_one_line_exit_2(capsys, argv, message):
    code, out, err = run_main(capsys, "config", os.path.join(ROOT, "configs", "ppo_cartpole.yaml"), *argv)
    assert_one_line_exit_2(code, err, message)
    assert out == ""


def test_a_users_module_imports_from_the_working_directory(capsys, tmp_path, monkeypatch):
    """`model.torso: my_nets:Torso` with my_nets.py where distrl runs: the `distrl` script puts its own
    directory first on the path, not the working directory, so the CLI adds it (as `python -m` would)."""
    (tmp_path / "my_nets_cli.py").write_text(
        "from torch import nn\n\n"
        "class Torso(nn.Module):\n"
        "    def __init__(self, observation_space, model_cfg):\n"
        "        super().__init__()\n"
        "        self.body, self.out_features = nn.Linear(observation_space.shape[0], 8), 8\n\n"
        "    def forward(self, obs):\n"
        "        return self.body(obs.float())\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    code, out, err = run_main(capsys, "train", os.path.join(ROOT, "configs", "ppo_cartpole.yaml"), "--run-dir", "run",
                              "--set", "model.torso=my_nets_cli:Torso", "--set", "stop.max_env_steps=100",
                              "--set", "log.progress=false")
    assert code == 0, err
    assert "not solved (max_env_steps)" in out
