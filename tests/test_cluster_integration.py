"""The local cluster's topology as processes, end to end: PostgreSQL -> MLflow server with
served artifacts, a Ray head without CPUs plus one Ray worker, token authentication, a shared
folder; then `k3lab sweep --address ... --tracking-uri http://...` of a two-trial CPU sweep.

It runs `scripts/cluster_local.sh up` / `down --purge` (the same topology that
docker-compose.yml runs in containers), then asserts through the MLflow server's REST API and
in PostgreSQL itself: one parent run plus one nested run per trial, FINISHED, with metrics and
artifacts, every trial on the worker node (the head offers no CPUs). It also runs the compose
file's health-check commands against these processes. Skips when PostgreSQL is not installed.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from conftest import mini_sweep, mlflow_api
import yaml

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "cluster_local.sh"
BIN = Path(sys.executable).parent  # this environment's ray, mlflow and k3lab

SWEEP = mini_sweep("cluster_mini", "two variants of a very small model, on the worker node")


def postgres_missing() -> str | None:
    """Why the PostgreSQL topology cannot run here, or None."""
    if not any(Path(p).is_file() for p in
               [*map(str, Path("/usr/lib/postgresql").glob("*/bin/initdb")), shutil.which("initdb") or ""]):
        return "PostgreSQL server binaries (initdb, pg_ctl) not installed: apt-get install postgresql"
    if os.geteuid() == 0:
        import pwd

        try:
            pwd.getpwnam(os.environ.get("K3LAB_PG_OS_USER", "postgres"))
        except KeyError:
            return "running as root without a 'postgres' OS user for PostgreSQL (initdb refuses root)"
        if shutil.which("runuser") is None:
            return "running as root without runuser to start PostgreSQL as another user"
    if shutil.which("setsid") is None:
        return "setsid not found (util-linux)"
    try:
        import psycopg2  # noqa: F401
    except ImportError:
        return "psycopg2 not installed (pip install psycopg2-binary)"
    return None


def free_ports(count: int, consecutive: int = 1) -> list[int]:
    """`count` free TCP ports; each is the first of `consecutive` free ports."""
    ports: list[int] = []
    while len(ports) < count:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            base = probe.getsockname()[1]
        block = range(base, base + consecutive)
        if base + consecutive < 65535 and all(_free(p) for p in block) and not set(block) & set(ports):
            ports.append(base)
    return ports


def _free(port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind(("0.0.0.0", port))
            return True
        except OSError:
            return False


def read_env(path: Path) -> dict[str, str]:
    env = {}
    for line in path.read_text().splitlines():
        if line.startswith("export "):
            key, _, value = line[len("export "):].partition("=")
            env[key] = value
    return env


def kill_leftovers(cluster_dir: Path) -> None:
    """Safety net after `down`: the process groups the script started, by their pid files."""
    for pidfile in (cluster_dir / "pids").glob("*"):
        try:
            os.killpg(int(pidfile.read_text()), signal.SIGKILL)
        except (ValueError, ProcessLookupError, PermissionError):
            pass


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, data_dir):
    reason = postgres_missing()
    if reason:
        pytest.skip(reason)
    work = tmp_path_factory.mktemp("cluster")
    pg, mlflow, ray, dashboard = free_ports(4)
    (agent,) = free_ports(1, consecutive=2)  # the head's agent port, then the worker's
    ray_temp = tempfile.mkdtemp(prefix="k3ray-")  # short: Ray's unix socket paths live under it
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("RAY_", "MLFLOW_", "K3LAB_", "PG")) and k not in ("POSTGRES_PASSWORD",)}
    env |= {
        "PATH": f"{BIN}{os.pathsep}{env.get('PATH', '')}",
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")])),  # this checkout's k3lab
        "K3LAB_CLUSTER_DIR": str(work / "cluster"), "K3LAB_RAY_TEMP_DIR": ray_temp,
        "K3LAB_PG_PORT": str(pg), "K3LAB_MLFLOW_PORT": str(mlflow), "K3LAB_RAY_PORT": str(ray),
        "K3LAB_DASHBOARD_PORT": str(dashboard), "K3LAB_AGENT_PORT": str(agent),
        "K3LAB_WORKERS": "1", "K3LAB_WORKER_CPUS": "2", "K3LAB_OBJECT_STORE_BYTES": str(150 * 2**20),
    }
    cluster_dir = work / "cluster"
    try:
        up = subprocess.run(["bash", str(SCRIPT), "up"], env=env, capture_output=True, text=True, timeout=420)
        logs = "".join(f"\n--- {p.name}\n{p.read_text()[-3000:]}" for p in sorted((cluster_dir / "logs").glob("*")))
        assert up.returncode == 0, up.stdout + up.stderr + logs
        yield {"env": env, "dir": cluster_dir, "work": work, "agent": agent, "data_dir": data_dir,
               "cluster_env": read_env(cluster_dir / "env"), "ray_port": ray, "mlflow_port": mlflow}
    finally:
        down = subprocess.run(["bash", str(SCRIPT), "down", "--purge"], env=env, capture_output=True, text=True,
                              timeout=300)
        kill_leftovers(cluster_dir)
        shutil.rmtree(ray_temp, ignore_errors=True)
        assert down.returncode == 0, down.stdout + down.stderr


@pytest.fixture(scope="module")
def sweep(cluster):
    """`k3lab sweep` submitted to the cluster as a user would: the env file, then explicit flags."""
    cenv = cluster["cluster_env"]
    sweep_file = cluster["work"] / "cluster_mini.yaml"
    sweep_file.write_text(SWEEP)
    env = cluster["env"] | {k: cenv[k] for k in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN")}
    env["K3LAB_DATA_DIR"] = str(cluster["data_dir"])  # the session's token cache: tokenize once per run
    args = [str(BIN / "k3lab"), "sweep", str(sweep_file), "--address", cenv["RAY_ADDRESS"],
            "--tracking-uri", cenv["MLFLOW_TRACKING_URI"], "--storage", cenv["K3LAB_STORAGE"], "--no-live"]
    out = subprocess.run(args, env=env, capture_output=True, text=True, timeout=600, cwd=cluster["work"])
    assert out.returncode == 0, out.stdout[-5000:] + out.stderr[-5000:]
    return out


def ray_nodes(cluster) -> list[dict]:
    code = ("import json, sys, ray; ray.init(address=sys.argv[1], logging_level='ERROR'); "
            "print(json.dumps([{'id': n['NodeID'], 'resources': n['Resources']} for n in ray.nodes() if n['Alive']]))")
    env = cluster["env"] | {k: cluster["cluster_env"][k] for k in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN")}
    out = subprocess.run([sys.executable, "-c", code, cluster["cluster_env"]["RAY_ADDRESS"]], env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_runs_land_in_the_server_one_parent_and_one_nested_run_per_trial(cluster, sweep):
    base = cluster["cluster_env"]["MLFLOW_TRACKING_URI"]
    experiment = mlflow_api(base, "/api/2.0/mlflow/experiments/get-by-name?experiment_name=cluster_mini")["experiment"]
    runs = mlflow_api(base, "/api/2.0/mlflow/runs/search",
               {"experiment_ids": [experiment["experiment_id"]], "max_results": 100})["runs"]
    tags = [{t["key"]: t["value"] for t in run["data"].get("tags", [])} for run in runs]
    parents = [run for run, tag in zip(runs, tags) if tag.get("k3lab.kind") == "sweep"]
    variants = [tag for tag in tags if tag.get("k3lab.kind") == "variant"]  # the compared variant's mean and band
    baselines = [tag for tag in tags if tag.get("k3lab.kind") == "baseline"]  # the baseline's throughput line
    assert len(parents) == 1 and [tag["k3lab.variant_name"] for tag in variants] == ["attnres_bs1"]
    assert [tag["k3lab.variant_name"] for tag in baselines] == ["attnres_off"] and len(runs) == 5
    parent_id = parents[0]["info"]["run_id"]
    trials = [(run, tag) for run, tag in zip(runs, tags) if tag.get("k3lab.kind") == "trial"]
    assert sorted(tag["k3lab.variant_name"] for _, tag in trials) == ["attnres_bs1", "attnres_off"]
    for run, tag in [*trials, (parents[0], {})]:
        assert run["info"]["status"] == "FINISHED"
    for run, tag in trials:
        assert tag["mlflow.parentRunId"] == parent_id
        metrics = {m["key"]: m for m in run["data"]["metrics"]}
        assert {"train_loss", "val_loss", "final_val_loss", "params_total"} <= set(metrics)
        assert metrics["val_loss"]["step"] == 8
        history = mlflow_api(base, f"/api/2.0/mlflow/metrics/get-history?run_id={run['info']['run_id']}&metric_key=train_loss")
        assert sorted(m["step"] for m in history["metrics"]) == list(range(1, 9))
    # the parent's artifacts went through the server (--serve-artifacts) into its destination folder
    listed = mlflow_api(base, f"/api/2.0/mlflow/artifacts/list?run_id={parent_id}")
    assert {"cluster_mini.yaml", "report"} <= {f["path"] for f in listed["files"]}
    stored = list((cluster["dir"] / "mlartifacts").rglob("cluster_mini.yaml"))
    assert stored and stored[0].read_text() == SWEEP


def test_the_runs_are_stored_in_postgresql(cluster, sweep):
    import psycopg2

    password = (cluster["dir"] / "secrets" / "POSTGRES_PASSWORD").read_text()
    with psycopg2.connect(host="127.0.0.1", port=int(cluster["env"]["K3LAB_PG_PORT"]), user="k3lab",
                          password=password, dbname="mlflow") as connection, connection.cursor() as cursor:
        cursor.execute("SELECT r.status, count(*) FROM runs r JOIN experiments e ON r.experiment_id = e.experiment_id "
                       "WHERE e.name = 'cluster_mini' GROUP BY r.status")
        assert dict(cursor.fetchall()) == {"FINISHED": 5}  # the parent, two trials, one variant run, one baseline run


def test_trials_ran_on_the_worker_node(cluster, sweep):
    nodes = ray_nodes(cluster)
    workers = [n["id"] for n in nodes if "worker" in n["resources"]]
    head = [n for n in nodes if "node:__internal_head__" in n["resources"]]
    assert len(workers) == 1 and len(head) == 1 and head[0]["resources"].get("CPU", 0) == 0
    base = cluster["cluster_env"]["MLFLOW_TRACKING_URI"]
    experiment = mlflow_api(base, "/api/2.0/mlflow/experiments/get-by-name?experiment_name=cluster_mini")["experiment"]
    runs = mlflow_api(base, "/api/2.0/mlflow/runs/search", {"experiment_ids": [experiment["experiment_id"]],
                                                      "filter": "tags.`k3lab.kind` = 'trial'"})["runs"]
    nodes_of_trials = {next(t["value"] for t in run["data"]["tags"] if t["key"] == "k3lab.node") for run in runs}
    assert nodes_of_trials == set(workers)
    # Tune's experiment state and checkpoints are in the shared storage folder
    storage = Path(cluster["cluster_env"]["K3LAB_STORAGE"])
    assert (storage / "cluster_mini.k3lab.json").is_file() and (storage / "cluster_mini").is_dir()


def test_ray_refuses_a_client_without_the_token(cluster):
    address = cluster["cluster_env"]["RAY_ADDRESS"]
    for token in (cluster["cluster_env"]["RAY_AUTH_TOKEN"], "0" * 64):
        env = cluster["env"] | {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": token, "HOME": str(cluster["work"])}
        out = subprocess.run([str(BIN / "ray"), "health-check", "--address", address], env=env,
                             capture_output=True, text=True, timeout=120)
        if token == "0" * 64:
            assert out.returncode != 0 and "AuthenticationError" in out.stderr
        else:
            assert out.returncode == 0, out.stderr


def compose_healthcheck(service: str, ports: dict[int, int]) -> list[str]:
    """docker-compose.yml's health-check command of a service, with this cluster's ports."""
    test = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"][service]["healthcheck"]["test"]
    assert test[0] == "CMD"
    command = []
    for item in test[1:]:
        for old, new in ports.items():
            item = item.replace(f"localhost:{old}", f"127.0.0.1:{new}")
        command.append(item)
    return command


def test_the_compose_health_checks_pass_against_the_processes(cluster):
    env = cluster["env"] | {k: cluster["cluster_env"][k] for k in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN")}
    ports = {6379: cluster["ray_port"], 5000: cluster["mlflow_port"]}
    for service in ("ray-head", "mlflow"):
        command = compose_healthcheck(service, ports)
        out = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, f"{shlex.join(command)}: {out.stderr}"
    # ray-worker's check asks the worker's dashboard agent, which needs ray[default] (the images have it)
    try:
        import ray.dashboard.optional_deps  # noqa: F401  (what Ray checks before starting the agent's HTTP server)
    except ImportError:
        return
    command = compose_healthcheck("ray-worker", {52365: cluster["agent"] + 1})
    deadline = time.time() + 60
    while subprocess.run(command, env=env, capture_output=True).returncode != 0:
        assert time.time() < deadline, shlex.join(command)
        time.sleep(2)
