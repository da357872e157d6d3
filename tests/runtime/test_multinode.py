"""Runs on a real multi-node Ray cluster on this machine, with token authentication on: placement per role
(the central inference server's too), spread and packed workers, a refused placement, drivers joining by
HOST:PORT with and without the cluster's token, and a node lost (and another joining) mid-run.

One `ray.cluster_utils.Cluster` (a head and two more nodes, each with its own custom resource) serves
the whole module, all of it holding a token made for it (RAY_AUTH_MODE=token, RAY_AUTH_TOKEN: every node
and driver this module starts inherits them). The session's embedded Ray (`ray_session`) is shut down
first and started again at the end, with the authentication it had, so the test modules that run after
this one find it as they left it. The node-loss test removes node b, so it stays the last one here.
"""
import csv
import json
import os
import re
import secrets
import signal
import subprocess
import sys
import threading
import time

import pytest
import ray
from ray.cluster_utils import Cluster

from distrl import train
from distrl.config import ConfigError
from distrl.runtime.deaths import route_ray_text
from distrl.runtime.ray_setup import SYSTEM_CONFIG, init_ray
from tests.runtime.processes import stop_as_ctrl_c

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CARTPOLE = os.path.join(ROOT, "configs", "apex_dqn_cartpole.yaml")
PPO = os.path.join(ROOT, "configs", "ppo_cartpole.yaml")
QUICK = ["log.tensorboard=false", "log.progress=false", "log.trace=true", "eval.episodes=2", "eval.interval_s=2",
         "replay.min_size=500", "learner.batch_size=64", "checkpoint.interval_s=3", "stop.max_seconds=60"]


AUTH = ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN")


def use_auth(env: dict) -> None:
    """This process's token authentication as `env` says (None: unset). Ray reads it when imported, so its
    cached config and token are read again (what Ray itself does when it turns token auth on)."""
    from ray._raylet import AuthenticationTokenLoader, Config

    for key in AUTH:
        if env.get(key) is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = env[key]
    Config.initialize("")
    AuthenticationTokenLoader.instance().reset_cache()


@pytest.fixture(scope="module")
def cluster():
    """head {head_node}, a {node_a, 2 worker slots}, b {node_b, 2 worker slots}; 2 logical CPUs each; its
    token in `.token`."""
    embedded = ray.is_initialized()
    ray.shutdown()
    before = {key: os.environ.get(key) for key in AUTH}
    token = secrets.token_hex(16)
    use_auth({"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": token})
    try:
        c = Cluster(initialize_head=True, head_node_args={"num_cpus": 2, "resources": {"head_node": 4},
                                                          "include_dashboard": False, "_system_config": SYSTEM_CONFIG})
        c.nodes_by_name, c.token = {"head": c.head_node}, token
        for name in ("a", "b"):
            c.nodes_by_name[name] = c.add_node(num_cpus=2, resources={f"node_{name}": 4, "worker_slot": 2})
        c.wait_for_nodes()
        route_ray_text()  # raylet's warnings (a nearly full disk) stay off the stderr these tests read
        ray.init(address=c.address)
        yield c
        ray.shutdown()
        c.shutdown()
    finally:
        use_auth(before)
    if embedded:
        init_ray(None)


def node_ids(c) -> dict[str, str]:
    """Node name ('head', 'a', ...) -> the 8-character node id prefix traces carry."""
    return {name: node.node_id[:8] for name, node in c.nodes_by_name.items()}


def traced(run_dir: str) -> list[tuple[str, str, set]]:
    """(process name ('learner', 'worker 0', ...), the node its trace says it ran on, what it did), one per process:
    a restarted worker is a second process under its predecessor's name."""
    with open(os.path.join(run_dir, "trace.json")) as fh:
        events = json.load(fh)["traceEvents"]
    names = {e["pid"]: e["args"]["name"] for e in events if e.get("ph") == "M" and e["name"] == "process_name"}
    labels = {e["pid"]: e["args"]["labels"] for e in events if e.get("ph") == "M" and e["name"] == "process_labels"}
    did = {pid: {e["name"] for e in events if e["pid"] == pid and e.get("ph") == "X"} for pid in names}
    return [(names[pid], labels[pid].split(",")[0].removeprefix("node "), did[pid]) for pid in names]


def placed(run_dir: str) -> dict[str, str]:
    """Process name -> the node it ran on (a run without restarts: one process per name)."""
    processes = traced(run_dir)
    where = {name: node for name, node, _ in processes}
    assert len(where) == len(processes), processes
    return where


def assert_run_dir(run_dir: str, summary: dict) -> None:
    for name in ("config.yaml", "metrics.csv", "summary.json", "trace.json", "checkpoints/best.safetensors"):
        assert os.path.isfile(os.path.join(run_dir, name)), name
    ckpts = os.path.join(run_dir, "checkpoints")
    assert any(os.path.isfile(os.path.join(ckpts, d, "DONE")) for d in os.listdir(ckpts) if d.startswith("ckpt-"))
    with open(os.path.join(run_dir, "summary.json")) as fh:
        assert json.load(fh)["env_steps"] == summary["env_steps"] > 0


def test_sync_run_puts_every_role_on_the_node_its_placement_asks_for(cluster, tmp_path):
    run_dir = str(tmp_path / "run")
    summary = train(CARTPOLE, run_dir=run_dir, address=cluster.address, overrides=QUICK + [
        "mode=sync", "workers=4", "stop.max_env_steps=2000",
        "placement.learner={head_node: 1}", "placement.replay={node_a: 1}", "placement.evaluator={node_b: 1}",
        "placement.parameter_server={node_a: 1}", "placement.workers={worker_slot: 1}"])
    assert summary["stop_reason"] == "max_env_steps"
    assert_run_dir(run_dir, summary)  # the replay on node a wrote its store through the driver
    ids, where = node_ids(cluster), placed(run_dir)
    assert (where["learner"], where["replay"], where["evaluator"], where["parameter server"]) == (
        ids["head"], ids["a"], ids["b"], ids["a"])
    workers = [where[f"worker {i}"] for i in range(4)]
    assert sorted(workers) == sorted([ids["a"], ids["a"], ids["b"], ids["b"]])  # two slots on each


def held_resources() -> tuple[dict, list]:
    """(what actors hold of each resource the cluster has, the placement groups' bundle resources)."""
    total, free = ray.cluster_resources(), ray.available_resources()
    held = {k: total[k] - free.get(k, 0.0) for k in ("CPU", "head_node", "node_a", "node_b", "worker_slot") if k in total}
    return held, [k for k in total if "_group_" in k]  # a placement group's bundles show up as resources


def wait_until_idle(timeout_s: float = 30.0) -> None:
    """Until the previous test's actors have released what they held (Ray frees a killed actor's CPUs
    asynchronously): placement decided meanwhile would see busy nodes. Still held after `timeout_s`:
    something leaked, and the test that follows would fail for a reason it does not name."""
    deadline = time.time() + timeout_s
    while True:
        held, groups = held_resources()
        if not any(held.values()) and not groups:
            return
        if time.time() >= deadline:
            raise AssertionError(f"the cluster is not idle after {timeout_s:g} s: actors hold {held}, "
                                 f"placement groups hold {groups}")
        time.sleep(0.25)


def test_a_replay_server_on_another_node_is_refilled_through_the_driver(cluster, tmp_path):
    """The replay server runs on node a, the driver on the head: after its restart the driver reads the
    newest checkpoint's store and sends it (no disk is shared in principle)."""
    from distrl.config import load_config
    from distrl.runtime.driver import Driver
    from distrl.runtime.ray_roles import RayRoles

    wait_until_idle()
    run_dir = str(tmp_path / "run")
    os.makedirs(run_dir)
    cfg = load_config(CARTPOLE, QUICK + ["mode=async", "workers=1", "placement.replay={node_a: 1}"])
    roles = RayRoles(cfg, run_dir, time.time(), address=cluster.address)
    try:
        assert not roles.replay_on_driver_node()
        driver = Driver(cfg, roles, run_dir, time.time())
        while driver.c.inserts < 2000:
            driver._count_fragments(roles.gather(True))
        driver._checkpoint()
        pid = ray.get(roles.replay.pid.remote(), timeout=30)
        os.kill(pid, signal.SIGKILL)
        deadline = time.time() + 60
        while roles.replay_refilled == 0 and time.time() < deadline:  # counted at once; refilled once back
            roles.gather(True)
            time.sleep(0.1)
        assert roles.restarts().replay == 1 and roles.replay_refilled >= 2000
    finally:
        roles.close()


def test_async_run_spreads_its_workers_over_the_nodes(cluster, tmp_path):
    """Its workers act through a central inference server placed on node a (left unplaced, Ray puts it on
    another node in this layout, so the node checked is the placement's doing)."""
    wait_until_idle()
    run_dir = str(tmp_path / "run")
    summary = train(CARTPOLE, run_dir=run_dir, address=cluster.address, overrides=QUICK + [
        "mode=async", "workers=3", "stop.max_env_steps=3000", "placement.workers_strategy=spread",
        "placement.learner={node_b: 1}", "placement.replay={head_node: 1}", "placement.evaluator={node_a: 1}",
        "placement.parameter_server={head_node: 1}", "rollout.inference=central", "placement.inference={node_a: 1}"])
    assert summary["stop_reason"] == "max_env_steps"
    assert_run_dir(run_dir, summary)
    ids, where = node_ids(cluster), placed(run_dir)
    processes = {name: did for name, _, did in traced(run_dir)}
    assert (where["learner"], where["replay"], where["evaluator"], where["parameter server"], where["inference"]) == (
        ids["b"], ids["head"], ids["a"], ids["head"], ids["a"])
    assert "infer_batch" in processes["inference"]  # the workers' steps ran there
    # Three workers, three nodes with a free CPU each (the learner holds one of node b's two, the inference
    # server one of node a's): one per node.
    assert sorted(where[f"worker {i}"] for i in range(3)) == sorted(ids.values())


def test_async_run_packs_its_workers_onto_one_node_and_removes_their_group_at_the_end(cluster, tmp_path):
    """Two workers, each wanting a worker slot (two on node a, two on node b): pack puts both on one node."""
    from ray.util.placement_group import placement_group_table

    wait_until_idle()
    run_dir = str(tmp_path / "run")
    summary = train(CARTPOLE, run_dir=run_dir, address=cluster.address, overrides=QUICK + [
        "mode=async", "workers=2", "stop.max_env_steps=1500", "placement.workers_strategy=pack",
        "placement.workers={worker_slot: 1}", "placement.learner={head_node: 1}"])
    assert summary["stop_reason"] == "max_env_steps", summary
    ids, where = node_ids(cluster), placed(run_dir)
    assert where["worker 0"] == where["worker 1"] in (ids["a"], ids["b"]), where
    assert all(g["state"] == "REMOVED" for g in placement_group_table().values())


@ray.remote
class _Restartable:
    def where(self) -> tuple[int, str]:
        return os.getpid(), ray.get_runtime_context().get_node_id()


def test_a_worker_restarted_by_ray_goes_back_into_its_pack_bundle(cluster):
    """The options RayRoles gives a packed worker (its bundle of the group): Ray restarts it there."""
    from ray.exceptions import ActorUnavailableError, GetTimeoutError, RayActorError
    from ray.util.placement_group import placement_group_table, remove_placement_group

    from distrl.runtime.ray_setup import in_bundle, pack_group

    wait_until_idle()
    group = pack_group({"CPU": 1.0, "worker_slot": 1.0}, 2, timeout_s=30)
    try:
        bundle_nodes = set(placement_group_table(group)["bundles_to_node_id"].values())
        actor = _Restartable.options(num_cpus=1, resources={"worker_slot": 1}, max_restarts=1,
                                     **in_bundle(group, 1)).remote()
        pid, node = ray.get(actor.where.remote(), timeout=60)
        ray.kill(actor, no_restart=False)  # dies as a crashed process would: Ray restarts it
        deadline, again = time.time() + 60, (pid, node)
        while again[0] == pid and time.time() < deadline:
            try:
                again = ray.get(actor.where.remote(), timeout=10)
            except (RayActorError, ActorUnavailableError, GetTimeoutError):
                time.sleep(0.2)
        assert again[0] != pid and len(bundle_nodes) == 1 and node == again[1] in bundle_nodes
    finally:
        remove_placement_group(group)


def test_ppo_with_two_gradient_workers_on_two_nodes_trains_with_one_on_each(cluster, tmp_path):
    # That such a run learns is tests/runtime/test_gradient_workers.py's; here: where its roles run.
    run_dir = str(tmp_path / "run")
    summary = train(PPO, run_dir=run_dir, address=cluster.address,
                    overrides=["mode=sync", "workers=1", "seed=0", "learner.num_gradient_workers=2",
                               "placement.learner={head_node: 1}", "placement.gradient_workers={worker_slot: 1}",
                               "stop.max_env_steps=4096", "eval.target_return=null", "log.tensorboard=false",
                               "log.progress=false", "log.trace=true"])
    assert summary["stop_reason"] == "max_env_steps" and summary["updates"] > 0 and summary["failure"] is None, summary
    ids, where = node_ids(cluster), placed(run_dir)
    grads = {where["gradient worker 0"], where["gradient worker 1"]}
    assert grads == {ids["a"], ids["b"]}  # spread: one on each node with worker slots
    assert where["learner"] == where["replay"] == ids["head"]  # an unplaced replay server joins the learner


@ray.remote
class _Holder:
    def node(self) -> str:
        return ray.get_runtime_context().get_node_id()


def test_gradient_worker_bundles_wait_for_a_node_still_being_freed(cluster):
    """Node b's CPUs are held by an actor killed just before the group is asked for (as when a run has
    just ended): both bundles still land one per node, not both on node a."""
    from ray.util.placement_group import placement_group_table, remove_placement_group

    from distrl.runtime.ray_setup import spread_group

    holder = _Holder.options(num_cpus=2, resources={"node_b": 1}).remote()
    ray.get(holder.node.remote(), timeout=60)
    freed = threading.Timer(2.0, ray.kill, args=(holder,))
    freed.start()
    group = spread_group({"CPU": 1.0, "worker_slot": 1.0}, 2, timeout_s=30)
    try:
        nodes = {node[:8] for node in placement_group_table(group)["bundles_to_node_id"].values()}
        ids = node_ids(cluster)
        assert nodes == {ids["a"], ids["b"]}
    finally:
        freed.join()
        remove_placement_group(group)



def test_a_run_whose_learner_cannot_start_in_time_is_one_line_and_leaves_nothing(cluster, tmp_path, capsys):
    """Another job holds all of node a: a learner placed there does not start within
    fault.start_timeout_s. One line, exit 1 (the input was valid), no run dir, and every actor and the
    gradient workers' placement group the run had made are gone again (the command runs in this
    process: a driver that exits takes its actors with it, which would hide a leak)."""
    from distrl.cli import main

    holder = _Holder.options(num_cpus=0, resources={"node_a": 4}).remote()
    ray.get(holder.node.remote(), timeout=60)
    run_dir = tmp_path / "run"
    try:
        code = main(["train", PPO, "--mode", "sync", "--address", cluster.address, "--run-dir", str(run_dir),
                     "--set", "placement.learner={node_a: 1}", "--set", "fault.start_timeout_s=3",
                     "--set", "learner.num_gradient_workers=2", "--set", "placement.gradient_workers={worker_slot: 1}"])
    finally:
        ray.kill(holder)
    err = capsys.readouterr().err
    assert code == 1, err
    *starting, failed = err.strip().splitlines()  # the start-up's progress lines, then the one line of the failure
    assert "could not start" in failed and "learner" in failed, err
    assert all(re.match(r" *\d+\.\ds  ", line) for line in starting), err
    assert not run_dir.exists()
    wait_until_idle()
    held, groups = held_resources()
    assert not any(held.values()) and not groups, (held, groups)


def test_an_impossible_placement_is_one_line_and_exit_2_before_anything_starts(cluster, tmp_path):
    run_dir = tmp_path / "run"
    out = subprocess.run([sys.executable, "-m", "distrl.cli", "train", CARTPOLE, "--address", cluster.address,
                          "--run-dir", str(run_dir), "--set", "placement.learner={nope: 1}"],
                         capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert out.returncode == 2, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "placement.learner" in lines[0] and "nope" in lines[0], out.stderr
    assert not run_dir.exists()
    # More than the cluster's total: five workers for four slots (in-process: the same validation).
    with pytest.raises(ConfigError, match=r"placement\.workers.*worker_slot: 5 in all.* has 4"):
        train(CARTPOLE, run_dir=str(run_dir), address=cluster.address,
              overrides=["workers=5", "placement.workers={worker_slot: 1}"])
    with pytest.raises(ConfigError, match=r"placement\.evaluator.*node_a: 5 per actor.*at most 4 on one node"):
        train(CARTPOLE, run_dir=str(run_dir), address=cluster.address, overrides=["placement.evaluator={node_a: 5}"])
    assert not run_dir.exists()


def join_as_a_driver(cluster, tmp_path, auth: dict, *args: str) -> subprocess.CompletedProcess:
    """`distrl train --address HOST:PORT` from a machine that has only `auth` of token authentication (its
    HOME holds no token). Ray tries a refused connection 20 times a second apart; here 3 times."""
    env = {k: v for k, v in os.environ.items() if k not in AUTH}
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    env.update(auth, HOME=str(home), RAY_NUM_REDIS_GET_RETRIES="3")
    return subprocess.run([sys.executable, "-m", "distrl.cli", "train", PPO, "--mode", "sync", "--workers", "1",
                           "--address", cluster.address, "--run-dir", str(tmp_path / "run"), *args],
                          capture_output=True, text=True, cwd=ROOT, env=env, timeout=300)


@pytest.mark.parametrize("auth, says", [
    ({}, "this driver sent no token (RAY_AUTH_MODE is not token)"),
    ({"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": "not-the-token"}, "the token this driver sent is not the cluster's"),
    ({"RAY_AUTH_MODE": "token"}, "RAY_AUTH_MODE=token, but: Token authentication is enabled but no authentication "
                                 "token was found"),
])
def test_joining_a_token_cluster_without_its_token_is_one_line_saying_what_to_set(cluster, tmp_path, auth, says):
    out = join_as_a_driver(cluster, tmp_path, auth)
    assert out.returncode == 2, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and says in lines[0], out.stderr
    assert "set RAY_AUTH_MODE=token and RAY_AUTH_TOKEN" in lines[0], lines
    assert not (tmp_path / "run").exists()


def test_joining_a_token_cluster_by_host_and_port_with_its_token_trains(cluster, tmp_path):
    wait_until_idle()
    out = join_as_a_driver(cluster, tmp_path, {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": cluster.token},
                           "--set", "stop.max_env_steps=600", "--set", "log.progress=false",
                           "--set", "log.tensorboard=false")
    assert out.returncode == 0, out.stderr
    with open(tmp_path / "run" / "summary.json") as fh:
        assert json.load(fh)["stop_reason"] == "max_env_steps"


def metrics_rows(run_dir: str) -> list[dict]:
    try:
        with open(os.path.join(run_dir, "metrics.csv")) as fh:
            return [{k: float(v or "-inf") for k, v in r.items()
                     if k in ("wall_s", "env_steps", "worker_restarts", "best_eval_return")}
                    for r in csv.DictReader(fh)]
    except FileNotFoundError:
        return []


def wait_for(run_dir: str, what, deadline: float, abandoned: threading.Event | None = None) -> list[dict]:
    while time.time() < deadline and not (abandoned and abandoned.is_set()):
        rows = metrics_rows(run_dir)
        if rows and what(rows):
            return rows
        time.sleep(0.2)
    raise AssertionError(f"{'abandoned' if abandoned and abandoned.is_set() else 'timed out'}; "
                         f"metrics: {metrics_rows(run_dir)[-3:]}")


def join_node(address: str, resources: dict) -> subprocess.Popen:
    """A node joining later, as on a real cluster: `ray start --block` (ends with its node when terminated).
    Cluster.add_node cannot be called here: it installs a signal handler, and this runs in a thread. The
    CLI is run as a module of this interpreter: the Ray the tests import, whatever PATH holds."""
    return subprocess.Popen([sys.executable, "-m", "ray.scripts.scripts", "start", "--address", address,
                             "--num-cpus", "1", "--block", "--resources", json.dumps(resources),
                             "--disable-usage-stats"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def stop_node(proc: subprocess.Popen) -> None:
    """End a node started by `join_node`; one that does not stop in time is killed, so that a stuck
    node neither hangs the test nor replaces the error the test is failing with."""
    proc.terminate()
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=10)


def alive_workers() -> int:
    """RolloutWorker actors whose constructor has finished (the GCS's actor table; Ray's public state
    API needs the dashboard, which these nodes run without)."""
    from ray._private import state

    return sum(a["ActorClassName"] == "RolloutWorker" and a["State"] == "ALIVE" for a in state.actors().values())


SOLVED = 475.0  # CartPole's greedy return the default config calls solved


class NodeEvents(threading.Thread):
    """Node b goes once the run samples; node c joins once its workers are lost; the run is interrupted
    (SIGINT, a clean stop) once a worker came back (three alive), the run sampled on for 6 more seconds and its greedy
    return reached SOLVED (the run does not stop itself when solved: the node events come first).

    What goes wrong is kept in `error` for the test to raise; `abandon()` (the run is over) stops the
    thread before its next cluster change, so no node is removed or started once the test has moved on."""

    def __init__(self, cluster, run_dir: str):
        super().__init__(daemon=True)
        self.cluster, self.run_dir = cluster, run_dir
        self.lost_at: dict | None = None
        self.node_c: subprocess.Popen | None = None
        self.error: BaseException | None = None
        self.abandoned, self.lock = threading.Event(), threading.Lock()

    def run(self) -> None:
        try:
            self._events()
        except BaseException as e:
            self.error = e

    def abandon(self) -> None:
        with self.lock:  # a cluster change under way completes first (node c then is ours to stop)
            self.abandoned.set()

    def _change(self, change):
        with self.lock:
            if self.abandoned.is_set():
                raise AssertionError("abandoned: the run ended first")
            return change()

    def _events(self) -> None:
        run_dir, deadline = self.run_dir, time.time() + 150
        wait_for(run_dir, lambda rows: rows[-1]["env_steps"] > 0, deadline, self.abandoned)
        # Every worker up first: one still being created on node b would be re-created elsewhere after the
        # loss, a first start rather than a restart, and could take node c's slot from a lost one.
        while alive_workers() < 4:
            if time.time() >= deadline or self.abandoned.is_set():
                raise AssertionError(f"{alive_workers()} of 4 workers up; metrics: {metrics_rows(run_dir)[-3:]}")
            time.sleep(0.2)
        self._change(lambda: self.cluster.remove_node(self.cluster.nodes_by_name.pop("b")))
        self.lost_at = metrics_rows(run_dir)[-1]
        time.sleep(2 + 1)  # past fault.worker_timeout_s: both of node b's workers are lost
        self.node_c = self._change(lambda: join_node(self.cluster.address, {"node_c": 1, "worker_slot": 1}))
        # Node b's two workers are counted as restarts the moment Ray sees them die; one is back once three
        # workers are alive again.
        back = wait_for(run_dir, lambda rows: alive_workers() >= 3, deadline, self.abandoned)[-1]["wall_s"]
        # Alive is not yet sampling: the driver gives a worker that came back its first fragment to sample
        # at its next gathers; 6 s of rows covers that on a loaded machine (1.5 s did not, once).
        wait_for(run_dir, lambda rows: rows[-1]["wall_s"] >= back + 6 and rows[-1]["best_eval_return"] >= SOLVED,
                 deadline, self.abandoned)
        stop_as_ctrl_c()


def test_a_lost_node_costs_its_workers_and_a_node_joining_later_takes_them_back(cluster, tmp_path):
    """Node b (two of four workers) goes; node c joins with one worker slot: one worker comes back there,
    the other stays lost (both deaths are restarts Ray began; the one not back is counted as lost in
    summary.json), and the run goes on to solve CartPole and a clean end."""
    run_dir = str(tmp_path / "run")
    events = NodeEvents(cluster, run_dir)
    events.start()
    try:
        summary = train(PPO, run_dir=run_dir, address=cluster.address, overrides=[
            "mode=async", "workers=4", "seed=0", "stop.max_seconds=140", "eval.target_return=null", "eval.episodes=10",
            "log.tensorboard=false", "log.progress=false", "log.trace=true", "checkpoint.interval_s=3",
            "fault.worker_timeout_s=2", "log.interval_s=0.5", "placement.workers={worker_slot: 1}",
            "placement.learner={head_node: 1}", "placement.replay={head_node: 1}",
            "placement.parameter_server={head_node: 1}", "placement.evaluator={node_a: 1}"])
        node_c = next((n["NodeID"][:8] for n in ray.nodes() if n["Alive"] and "node_c" in n["Resources"]), None)
    finally:
        events.abandon()
        events.join(timeout=5)
        if events.node_c is not None:
            stop_node(events.node_c)
        # The node events' own failure explains what the run did after it: it is the error reported
        # (with the run's own error, if any, as its context).
        if events.error is not None:
            raise AssertionError(f"the node events did not complete: {events.error!r}") from events.error
    assert not events.is_alive(), "the node events were still under way when the run ended"
    assert summary["stop_reason"] == "interrupted" and summary["failure"] is None, summary
    counts = {k: summary[k] for k in ("workers_lost", "worker_restarts")}
    assert counts == {"workers_lost": 1, "worker_restarts": 2}, counts
    assert summary["env_steps"] > events.lost_at["env_steps"]  # it kept sampling after the loss
    assert events.lost_at["best_eval_return"] < SOLVED <= summary["best_eval_return"], summary  # and solved after it
    assert_run_dir(run_dir, summary)
    # The one that came back kept its placement (a free worker slot: node c's, not the head's CPUs) and
    # sampled there. Node b's workers keep only what a checkpoint pulled from them before the loss.
    ids = node_ids(cluster)
    workers = [(name, node, did) for name, node, did in traced(run_dir) if name.startswith("worker")]
    survivors = sorted(node for _, node, _ in workers if node in (ids["a"], node_c))
    assert node_c is not None and survivors == sorted([ids["a"], ids["a"], node_c]), (workers, ids, node_c)
    # The rest: node b's two (the lost one and the one that came back on node c), as pulled before the loss
    # (node b is gone from the cluster's names).
    rest = [node for _, node, _ in workers if node not in survivors]
    assert len(rest) <= 2 and len(set(rest)) <= 1 and ids["head"] not in rest and node_c not in rest, workers
    # Every worker still up sampled; a lane of node b's may hold no sample (pulled before its first one ended).
    assert all("sample" in did for _, node, did in workers if node in (ids["a"], node_c)), workers
