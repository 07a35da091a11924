"""scripts/bundle/: what pip does not do for the offline bundle (the target's packages left out, ray
slimmed, the parts, the check after the last one), offline. One build runs for real: pip resolves,
downloads and installs wheels made here, from a local folder, with no package index."""

from __future__ import annotations

import base64
import csv
import hashlib
import importlib.util
import io
import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = ROOT / "scripts" / "bundle"
spec = importlib.util.spec_from_file_location("bundle_script", SCRIPTS / "bundle.py")
bundle = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bundle)


def _hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def make_wheel(directory: Path, name: str, version: str, requires=(), files=None, entry_points=None) -> Path:
    """A small valid py3-none-any wheel: a package `name` (dashes as underscores), dist-info with RECORD."""
    module = name.replace("-", "_")
    files = dict(files if files is not None else {f"{module}/__init__.py": f"VERSION = {version!r}\n"})
    dist_info = f"{module}-{version}.dist-info"
    metadata = ["Metadata-Version: 2.1", f"Name: {name}", f"Version: {version}"]
    metadata += [f"Provides-Extra: {e}" for e in sorted(set(re.findall(r'extra == "([^"]+)"', " ".join(requires))))]
    files[f"{dist_info}/METADATA"] = "\n".join(metadata + [f"Requires-Dist: {r}" for r in requires]) + "\n"
    files[f"{dist_info}/WHEEL"] = "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    if entry_points is not None:
        files[f"{dist_info}/entry_points.txt"] = entry_points
    record = io.StringIO()
    writer = csv.writer(record, lineterminator="\n")
    for path, text in files.items():
        data = text.encode() if isinstance(text, str) else text
        writer.writerow([path, _hash(data), len(data)])
    writer.writerow([f"{dist_info}/RECORD", "", ""])
    files[f"{dist_info}/RECORD"] = record.getvalue()
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{module}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        for member, text in files.items():
            archive.writestr(member, text)
    return path


RAY_ENTRY_POINTS = """[console_scripts]
ray = ray.scripts.scripts:main
serve = ray.serve.scripts:cli
"""


def fake_ray(directory: Path, requires=("click>=7.0",), jar_size=50_000) -> Path:
    files = {
        "ray/__init__.py": "",
        "ray/tune/__init__.py": "X = 1\n",
        "ray/scripts/__init__.py": "",
        "ray/scripts/scripts.py": "def main():\n    return 0\n",
        "ray/serve/__init__.py": "S = 1\n",
        "ray/serve/scripts.py": "def cli():\n    return 0\n",
        "ray/jars/ray_dist.jar": os.urandom(jar_size),
        "ray/rllib/__init__.py": "R = 1\n" * 1000,
        "ray/rllib_contrib_note.txt": "not under ray/rllib/, kept\n",
    }
    return make_wheel(directory, "ray", "2.60.0", requires, files, RAY_ENTRY_POINTS)


def pip_env() -> dict[str, str]:
    """This environment without pip's configuration (this machine's indexes, find-links, constraints)."""
    return {k: v for k, v in os.environ.items() if not k.startswith("PIP_") and k != "PYTHONPATH"} | {
        "PIP_CONFIG_FILE": os.devnull}


def test_slimmed_wheel_drops_paths_keeps_a_valid_record_and_installs_with_pip(tmp_path):
    source = fake_ray(tmp_path / "src")
    dest = tmp_path / "out" / source.name
    dest.parent.mkdir()
    bundle.slim_wheel(source, dest, ("ray/jars", "ray/rllib", "ray/serve"), strip=None)
    assert dest.stat().st_size < source.stat().st_size
    with zipfile.ZipFile(dest) as archive:
        names = set(archive.namelist())
        assert not any(n.startswith(("ray/jars/", "ray/rllib/", "ray/serve/")) for n in names)
        assert {"ray/tune/__init__.py", "ray/rllib_contrib_note.txt"} <= names
        assert all(info.compress_type == zipfile.ZIP_LZMA for info in archive.infolist())
        assert archive.namelist()[-1] == "ray-2.60.0.dist-info/RECORD"
        entry_points = archive.read("ray-2.60.0.dist-info/entry_points.txt").decode()
        assert "serve" not in entry_points and "ray = ray.scripts.scripts:main" in entry_points
        rows = list(csv.reader(io.StringIO(archive.read("ray-2.60.0.dist-info/RECORD").decode())))
        assert {row[0] for row in rows} == names
        for path, digest, size in rows:
            if not path.endswith("RECORD"):
                assert digest == _hash(archive.read(path)) and int(size) == len(archive.read(path)), path
    site = tmp_path / "site"
    done = subprocess.run([sys.executable, "-m", "pip", "install", "--no-index", "--no-deps", "-q", "--target",
                           str(site), str(dest)], capture_output=True, text=True, env=pip_env())
    assert done.returncode == 0, done.stderr
    assert (site / "ray" / "tune" / "__init__.py").is_file() and not (site / "ray" / "serve").exists()
    assert (site / "bin" / "ray").is_file() and not (site / "bin" / "serve").exists()


def test_slimming_strips_elf_files_which_still_load_and_match_their_record(tmp_path):
    import ctypes

    if not (shutil.which("gcc") and shutil.which("strip")):
        pytest.skip("needs gcc and binutils' strip")
    (tmp_path / "lib.c").write_text("int answer(void) { return 42; }\n")
    library = tmp_path / "lib.so"
    subprocess.run(["gcc", "-g", "-shared", "-fPIC", "-o", str(library), str(tmp_path / "lib.c")], check=True)
    source = make_wheel(tmp_path / "src", "ray", "2.60.0", files={
        "ray/__init__.py": "x = 1\n", "ray/_raylet.so": library.read_bytes()})
    dest = tmp_path / source.name
    bundle.slim_wheel(source, dest, (), strip=shutil.which("strip"))
    with zipfile.ZipFile(dest) as archive:
        stripped = archive.read("ray/_raylet.so")
        assert stripped[:4] == b"\x7fELF" and len(stripped) < library.stat().st_size
        assert archive.read("ray/__init__.py") == b"x = 1\n"
        rows = {row[0]: row for row in csv.reader(io.StringIO(archive.read("ray-2.60.0.dist-info/RECORD").decode()))}
        assert rows["ray/_raylet.so"][1:] == [_hash(stripped), str(len(stripped))]
    loaded = tmp_path / "stripped.so"
    loaded.write_bytes(stripped)
    assert ctypes.CDLL(str(loaded)).answer() == 42


def test_parts_are_packed_largest_first_and_each_fits():
    budget = 100
    sizes = {"ray.whl": 90, "a.whl": 40, "b.whl": 30, "c.whl": 10, "d.whl": 25}
    parts = bundle.plan_parts(sizes, bundle.PART_RESERVE + budget)
    assert parts == [["ray.whl", "c.whl"], ["a.whl", "b.whl", "d.whl"]]
    assert all(sum(sizes[n] for n in part) <= budget for part in parts)
    with pytest.raises(bundle.BundleError, match=r"^ray.whl is .* over a part's room"):
        bundle.plan_parts(sizes, bundle.PART_RESERVE + 80)


def test_sizes_and_package_lists_are_read_or_named_in_one_line(tmp_path):
    assert bundle.parse_size("28MiB") == 28 * 2**20 and bundle.parse_size("500MB") == 500 * 10**6
    with pytest.raises(bundle.BundleError, match="--part-size '28 parsecs'"):
        bundle.parse_size("28 parsecs")
    listed = tmp_path / "pre.txt"
    listed.write_text("# the image's\nTorch==2.11.0\nnvidia_ml.py\n\n")
    assert bundle.read_names(listed) == {"torch": "2.11.0", "nvidia-ml-py": ""}
    with pytest.raises(bundle.BundleError, match=r"pre.txt:3: 'nvidia_ml.py': write name==version$"):
        bundle.read_names(listed, pinned_only=True)
    listed.write_text("torch>=2\n")
    with pytest.raises(bundle.BundleError, match=r"pre.txt:1: 'torch>=2': write a name or name==version$"):
        bundle.read_names(listed)


def test_project_requirements_bundle_mlflow_as_its_tracking_client_and_sql_store(tmp_path):
    (tmp_path / "pyproject.toml").write_text(
        '[project]\nname = "p"\ndependencies = ["mlflow>=3.17.0", "numpy"]\n'
        '[project.optional-dependencies]\ngpu = ["ray[tune]>=2.51"]\n')
    assert bundle.project_requirements(tmp_path / "pyproject.toml", ["gpu"]) == [
        "mlflow-skinny>=3.17.0", "sqlalchemy", "alembic", "numpy", "ray[tune]>=2.51"]
    with pytest.raises(bundle.BundleError, match=r"pyproject.toml: no extra 'cuda' \(extras: gpu\)"):
        bundle.project_requirements(tmp_path / "pyproject.toml", ["cuda"])


def item(name, version, requires=(), requested=False, extras=None) -> dict:
    entry = {"metadata": {"name": name, "version": version, "requires_dist": list(requires)}, "requested": requested}
    return entry | ({"requested_extras": extras} if extras else {})


def test_the_bundle_is_what_the_requirements_reach_through_packages_the_target_lacks():
    report = {"install": [
        item("ray", "2.60.0", ["click", 'tensorboardX; extra == "tune"', 'redis; extra == "serve"'], True, ["tune"]),
        item("tensorboardX", "2.6.5", ["protobuf", "numpy"]),
        item("torch", "2.11.0+target", [], True),
        item("pandas", "3.1.1", ['tzdata; sys_platform == "win32"', "pytz"]),  # the target's
        item("pytz", "2026.1"),  # needed by pandas only: pandas's business
        item("datasets", "5.2.0", ["pandas", "dill", 'zzwin; sys_platform == "nonesuch"'], True),
        item("dill", "0.4.1"), item("click", "8.5.1"), item("protobuf", "7.36.2"), item("numpy", "2.5.2+target"),
        item("redis", "6.0"), item("zzwin", "1.0"),
    ]}
    preinstalled = {"torch": "2.11.0", "numpy": "2.5.2", "pandas": "", "click": ""}
    wheels, spares = bundle.bundled(report, preinstalled)
    assert wheels == {"datasets": "5.2.0", "dill": "0.4.1", "protobuf": "7.36.2", "ray": "2.60.0",
                      "tensorboardx": "2.6.5"}
    assert spares == {"click": "8.5.1", "pandas": "3.1.1"}  # unpinned on the target, needed by the bundle


def test_the_check_reports_pip_check_lines_about_the_bundled_packages_only():
    output = ("ray 2.60.0 has requirement packaging>=24.0, but you have packaging 23.0.\n"
              "jax 0.11.2 requires jaxlib, which is not installed.\n"
              "Mlflow_Skinny 3.17.2 requires click, which is not installed.\n")
    assert bundle.pip_check_problems(output, {"ray", "mlflow-skinny"}) == [
        "ray 2.60.0 has requirement packaging>=24.0, but you have packaging 23.0.",
        "Mlflow_Skinny 3.17.2 requires click, which is not installed."]


@pytest.mark.parametrize("argv, message", [
    (["build", "{tmp}/out", "--part-size", "lots"], "bundle.py: --part-size 'lots': write e.g. 28MiB or 500MB\n"),
    (["build", "{tmp}/out", "--preinstalled", "{tmp}/none.txt"], "bundle.py: {tmp}/none.txt: no such file\n"),
    (["check", "{tmp}", "--target", "{tmp}/site"],
     "bundle.py: {tmp}/part.json: no such file (a part of the bundle holds one)\n"),
])
def test_bad_input_is_one_line_and_a_failing_exit(tmp_path, capsys, argv, message):
    assert bundle.main([a.format(tmp=tmp_path) for a in argv]) == 1
    assert capsys.readouterr().err == message.format(tmp=tmp_path)


def test_install_sh_refuses_a_folder_that_is_not_a_part_in_one_line(tmp_path):
    done = subprocess.run(["bash", str(SCRIPTS / "install.sh"), str(tmp_path), str(tmp_path / "site")],
                          capture_output=True, text=True)
    assert done.returncode == 2 and not (tmp_path / "site").exists()
    assert done.stderr == f"install.sh: {tmp_path}/part.json: no such file (not a part of the bundle)\n"


def test_an_output_folder_holding_other_files_is_not_overwritten(tmp_path):
    (tmp_path / "notes.txt").write_text("mine\n")
    with pytest.raises(bundle.BundleError, match="holds files other than an earlier bundle's parts"):
        bundle.prepare_out(tmp_path)
    assert (tmp_path / "notes.txt").read_text() == "mine\n"


def local_index(folder: Path) -> None:
    """Wheels for a project that needs alpha, mlflow, torchy (the target's: its real wheel needs a
    package no index has) and ray[tune]; click and zzold are the target's too (unpinned)."""
    make_wheel(folder, "alpha", "1.0", ["beta>=1", "zzold>=2"], files={"alpha/__init__.py": "import zzold\n"})
    make_wheel(folder, "zzold", "2.0")  # the target's, too old there: its spare
    make_wheel(folder, "beta", "1.0")
    make_wheel(folder, "beta", "2.0")  # held at 1.0 by the constraints
    make_wheel(folder, "mlflow-skinny", "3.17.2", ["click<9"])
    make_wheel(folder, "sqlalchemy", "2.1.9")
    make_wheel(folder, "alembic", "1.20.1", ["sqlalchemy>=1.4", 'tzdata; extra == "tz"'])
    make_wheel(folder, "torchy", "2.0", ["cuda-nowhere==9.9"])
    make_wheel(folder, "click", "8.5.1")
    make_wheel(folder, "tensorboardx", "2.6.5")
    fake_ray(folder, ["click>=7.0", 'tensorboardx; extra == "tune"'], jar_size=0)
    for name in ("ballast", "padding"):  # 200 kB each, two to a part of 320 kB: two parts
        make_wheel(folder, name, "1.0", files={f"{name}/__init__.py": "", f"{name}/blob.bin": os.urandom(200_000)})


def test_a_real_build_from_local_wheels_installs_part_by_part_and_checks(tmp_path):
    """bundle.py build with pip against a local folder, then install.sh part by part into one folder."""
    local_index(tmp_path / "index")
    (tmp_path / "project").mkdir()
    (tmp_path / "project" / "pyproject.toml").write_text(
        '[project]\nname = "k3"\ndependencies = ["alpha", "mlflow>=3", "torchy>=2", "padding", "ballast"]\n'
        '[project.optional-dependencies]\ngpu = ["ray[tune]"]\n')
    (tmp_path / "pre.txt").write_text("torchy==2.0\nclick\nzzold\n")
    (tmp_path / "constraints.txt").write_text("beta==1.0\nclick==8.5.1\n")
    out, site = tmp_path / "bundle", tmp_path / "site"
    build = [sys.executable, str(SCRIPTS / "bundle.py"), "build", str(out), "--project", str(tmp_path / "project"),
             "--extras", "gpu", "--preinstalled", str(tmp_path / "pre.txt"), "--constraint",
             str(tmp_path / "constraints.txt"), "--part-size", f"{(bundle.PART_RESERVE + 320_000) / 2**20}MiB",
             "--import", "alpha", "--import", "ray.tune", "--pip-arg=--no-index",
             f"--pip-arg=--find-links={tmp_path / 'index'}"]
    done = subprocess.run(build, capture_output=True, text=True, env=pip_env(), timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    parts = sorted(out.iterdir())
    assert [p.name for p in parts] == ["part-1", "part-2"]
    wheels = sorted(p.name.split("-")[0] for part in parts for p in part.glob("*.whl"))
    assert wheels == ["alembic", "alpha", "ballast", "beta", "mlflow_skinny", "padding", "ray", "sqlalchemy",
                      "tensorboardx"]
    assert all(sum(f.stat().st_size for f in part.rglob("*") if f.is_file()) <= bundle.PART_RESERVE + 320_000
               for part in parts)
    said = []
    for part in parts:
        env = pip_env() | {"PYTHON": sys.executable}
        done = subprocess.run(["bash", str(SCRIPTS / "install.sh"), str(part), str(site)], capture_output=True,
                              text=True, env=env, timeout=300)
        assert done.returncode == 0, done.stdout + done.stderr
        said.append(done.stdout)
    assert "part 1 of 2 installed; part 2 checks" in said[0] and "imported alpha, ray.tune" in said[1]
    assert "installing the bundled zzold in place of the target's" in said[1]  # not here: its spare
    assert "installing the bundled click" not in said[1]  # this environment's click will do
    assert sorted(p.name for p in (parts[1] / "spares").iterdir()) == ["click-8.5.1-py3-none-any.whl",
                                                                  "zzold-2.0-py3-none-any.whl"]
    assert (site / "beta" / "__init__.py").read_text() == "VERSION = '1.0'\n"
    assert not (site / "ray" / "jars").exists() and not (site / "torchy").exists()
