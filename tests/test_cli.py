"""Bad input: one clear line naming the problem, exit status 2, no run dir created."""
import os
import subprocess
import sys

import pytest

from distrl.cli import main

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CARTPOLE = os.path.join(ROOT, "configs", "apex_dqn_cartpole.yaml")


def run_main(capsys, *argv):
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


def test_eval_of_a_run_without_checkpoint_is_a_clear_error(capsys, tmp_path):
    run_dir = tmp_path / "run"
    (run_dir / "checkpoints").mkdir(parents=True)
    (run_dir / "config.yaml").write_text("algo: apex_dqn\n")
    code, _, err = run_main(capsys, "eval", str(run_dir))
    assert code == 2
    assert "checkpoint file not found" in err and "best.safetensors" in err


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
