"""`k3lab bundle`: resolution, slimming, manifest, size limit and install.sh, all offline.

Wheels are made here in tmp; a Fetcher whose `_download` picks from an in-memory
index stands in for `pip download`, so nothing touches the network. install.sh is
run for real (pip --no-index) on a bundle of tiny wheels.
"""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import json
import os
import random
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from k3lab import bundle
from k3lab.bundle.parts import PART_RESERVE
from k3lab.bundle import (BundleOptions, Fetcher, Resolver, Target, UserError, WheelInfo, build_bundle, check_size,
                          install_script, parse_excludes, parse_size, slim_wheel)

try:
    from packaging.specifiers import SpecifierSet
    from packaging.version import Version
except ImportError:  # pragma: no cover
    from pip._vendor.packaging.specifiers import SpecifierSet
    from pip._vendor.packaging.version import Version

HERE_PY = "%d.%d" % sys.version_info[:2]


def _hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def make_wheel(directory: Path, name: str, version: str, requires=(), files=None, entry_points=None,
               tag="py3-none-any", compression=zipfile.ZIP_DEFLATED) -> Path:
    """A small valid wheel: a package `name` (dashes as underscores) plus dist-info with RECORD."""
    module = name.replace("-", "_")
    files = dict(files if files is not None else {f"{module}/__init__.py": f"VERSION = {version!r}\n"})
    dist_info = f"{module}-{version}.dist-info"
    metadata = ["Metadata-Version: 2.1", f"Name: {name}", f"Version: {version}"]
    metadata += [f"Requires-Dist: {r}" for r in requires]
    files[f"{dist_info}/METADATA"] = "\n".join(metadata) + "\n"
    files[f"{dist_info}/WHEEL"] = f"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: {tag}\n"
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
    path = directory / f"{module}-{version}-{tag}.whl"
    with zipfile.ZipFile(path, "w", compression=compression) as archive:
        for member, text in files.items():
            archive.writestr(member, text)
    return path


class FakeFetcher(Fetcher):
    """`pip download --no-deps` against an in-memory index: name -> {version: requires}."""

    def __init__(self, index: dict[str, dict[str, list[str]]], target: Target, workdir: Path, sizes=None):
        super().__init__(target, workdir, log=lambda *a: None)
        self.index = index
        self.sizes = sizes or {}
        self.asked: list[dict[str, str]] = []

    def _download(self, wanted):
        self.calls += 1
        self.asked.append(dict(wanted))
        found = {}
        for name, spec in wanted.items():
            versions = [Version(v) for v in self.index.get(name, {}) if Version(v) in SpecifierSet(spec)]
            if not versions:
                raise UserError(f"no wheel of {name}{spec}")
            version = str(max(versions))
            padding = base64.b64encode(random.Random(name).randbytes(self.sizes.get(name, 0))).decode()
            files = {f"{name.replace('-', '_')}/__init__.py": "x = 1\n# " + padding + "\n"}  # does not compress
            path = make_wheel(self.workdir / f"dl{self.calls}", name, version, self.index[name][version], files)
            found[name] = WheelInfo.read(path)
        return found


TARGET = Target("3.12", ("manylinux_2_28_x86_64", "manylinux2014_x86_64"))


def resolve(tmp_path, index, root_requires, extras=(), exclude=None, substitutes=None, with_=(), pins=None):
    root = WheelInfo.read(make_wheel(tmp_path / "root", "k3lab", "0.1.0", root_requires))
    fetcher = FakeFetcher(index, TARGET, tmp_path / "work")
    resolver = Resolver(TARGET, fetcher, exclude or {}, substitutes or {}, log=lambda *a: None, pins=pins)
    return resolver.resolve(root, set(extras), with_), fetcher


# --------------------------------------------------------------------------- small parts


def test_parse_size():
    assert parse_size("64MiB") == 64 * 2**20
    assert parse_size("64M") == 64 * 2**20
    assert parse_size("500MB") == 500 * 10**6
    assert parse_size("1.5GiB") == int(1.5 * 2**30)
    assert parse_size("1234") == 1234
    with pytest.raises(UserError):
        parse_size("lots")


def test_check_size_one_line_error():
    files = {"wheels/a.whl": 40 * 2**20, "wheels/b.whl": 30 * 2**20, "install.sh": 100}
    assert check_size(files, 80 * 2**20) == 70 * 2**20 + 100
    with pytest.raises(UserError) as error:
        check_size(files, 64 * 2**20)
    message = str(error.value)
    assert "\n" not in message and "over --max-size 64.0 MiB" in message and "a.whl 40.0 MiB" in message


def test_parse_excludes_lists_pins_and_files(tmp_path):
    listing = tmp_path / "image.txt"
    listing.write_text("# the image\nnumpy==2.5.2\nPyYAML  # a comment\n\nnvidia_cublas,sympy\n")
    excluded = parse_excludes(["torch==2.11.0,triton", f"@{listing}"])
    assert excluded == {"torch": "==2.11.0", "triton": "", "numpy": "==2.5.2", "pyyaml": "", "nvidia-cublas": "",
                        "sympy": ""}
    with pytest.raises(UserError):
        parse_excludes(["@/no/such/file"])


def test_tidy_specifier_keeps_the_same_versions():
    assert bundle.tidy_specifier("<5,>=4.0.0,>=4.16.0,>=4.5") == "<5,>=4.16.0"
    assert bundle.tidy_specifier(">=3.20,>=5.0,!=5.26.*,<8.0,<8,<=9") in ("!=5.26.*,<8.0,>=5.0", "!=5.26.*,<8,>=5.0")
    assert bundle.tidy_specifier(">1.0,>=1.0") == ">1.0" and bundle.tidy_specifier("") == ""


def test_marker_environment_follows_the_target():
    env = TARGET.marker_environment()
    assert env["python_version"] == "3.12" and env["python_full_version"] == "3.12.0"
    assert env["sys_platform"] == "linux" and env["platform_machine"] == "x86_64"
    assert Target("3.12.3", ("manylinux_2_17_aarch64",)).marker_environment()["platform_machine"] == "aarch64"
    assert TARGET.pip_arguments()[:5] == ["--only-binary=:all:", "--python-version", "3.12", "--implementation", "cp"]
    assert TARGET.pip_arguments().count("--platform") == 2


# --------------------------------------------------------------------------- slimming


RAY_ENTRY_POINTS = """[console_scripts]
ray = ray.scripts.scripts:main
serve = ray.serve.scripts:cli
tune = ray.tune.cli.scripts:cli
"""


def fake_ray(tmp_path: Path) -> Path:
    files = {
        "ray/__init__.py": "import ray.tune\n",
        "ray/tune/__init__.py": "X = 1\n",
        "ray/tune/cli/__init__.py": "",
        "ray/tune/cli/scripts.py": "def cli():\n    return 0\n",
        "ray/scripts/__init__.py": "",
        "ray/scripts/scripts.py": "def main():\n    return 0\n",
        "ray/serve/__init__.py": "S = 1\n",
        "ray/serve/scripts.py": "def cli():\n    return 0\n",
        "ray/jars/ray_dist.jar": os.urandom(50_000),
        "ray/rllib/__init__.py": "R = 1\n" * 1000,
        "ray/rllib_contrib_note.txt": "not under ray/rllib/, kept\n",
    }
    return make_wheel(tmp_path, "ray", "2.60.0", ["click>=7.0"], files, RAY_ENTRY_POINTS,
                      tag="cp312-cp312-manylinux2014_x86_64")


def test_slim_wheel_drops_paths_and_keeps_a_valid_record(tmp_path):
    source = fake_ray(tmp_path / "src")
    dest = tmp_path / "out" / source.name
    result = slim_wheel(source, dest, ["ray/jars", "ray/rllib", "ray/serve/", "ray/llm"])
    assert result.dropped_files == 4 and result.dropped_scripts == ["serve"]
    assert result.size < result.source_size
    with zipfile.ZipFile(dest) as archive:
        names = set(archive.namelist())
        assert not any(n.startswith(("ray/jars/", "ray/rllib/", "ray/serve/")) for n in names)
        assert {"ray/__init__.py", "ray/tune/__init__.py", "ray/rllib_contrib_note.txt"} <= names
        assert all(i.compress_type == zipfile.ZIP_LZMA for i in archive.infolist())
        assert archive.namelist()[-1] == "ray-2.60.0.dist-info/RECORD"
        entry_points = archive.read("ray-2.60.0.dist-info/entry_points.txt").decode()
        assert "serve" not in entry_points and "ray = ray.scripts.scripts:main" in entry_points
        rows = list(csv.reader(io.StringIO(archive.read("ray-2.60.0.dist-info/RECORD").decode())))
        recorded = {row[0] for row in rows}
        assert recorded == names
        for path, digest, size in rows:
            if path.endswith("RECORD"):
                assert digest == "" and size == ""
                continue
            data = archive.read(path)
            assert digest == _hash(data) and int(size) == len(data), path
    assert WheelInfo.read(dest).requires == ["click>=7.0"]


def test_slimmed_lzma_wheel_installs_with_pip(tmp_path):
    """pip reads LZMA members (zip method 14) through zipfile: the slimmed wheel is installable."""
    source = fake_ray(tmp_path / "src")
    dest = tmp_path / "out" / source.name
    slim_wheel(source, dest, ["ray/jars", "ray/rllib", "ray/serve"])
    # pip checks the wheel's tags against this interpreter: re-tag a copy as py3-none-any
    pure = tmp_path / "pure" / "ray-2.60.0-py3-none-any.whl"
    pure.parent.mkdir()
    pure.write_bytes(dest.read_bytes())
    site = tmp_path / "site"
    done = subprocess.run([sys.executable, "-m", "pip", "install", "--no-index", "--no-deps", "--no-compile", "-q",
                           "--disable-pip-version-check", "--target", str(site), str(pure)],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert (site / "ray" / "tune" / "__init__.py").is_file()
    assert not (site / "ray" / "jars").exists() and not (site / "ray" / "serve").exists()
    assert (site / "bin" / "ray").is_file() and not (site / "bin" / "serve").exists()
    check = subprocess.run([sys.executable, "-c", "import ray, importlib.metadata as m; print(m.version('ray'))"],
                           capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(site)})
    assert check.stdout.strip() == "2.60.0", check.stderr


def test_slim_wheel_strips_elf_files_which_still_load_and_match_their_record(tmp_path):
    """A shared library built with debug symbols loses its symbol tables, not what it exports;
    a Python file of the same wheel stays byte for byte."""
    import ctypes
    import shutil

    if not (shutil.which("gcc") and shutil.which("strip")):
        pytest.skip("needs gcc and binutils' strip")
    c_file = tmp_path / "lib.c"
    c_file.write_text("int answer(void) { return 42; }\n")
    library = tmp_path / "lib.so"
    subprocess.run(["gcc", "-g", "-shared", "-fPIC", "-o", str(library), str(c_file)], check=True)
    source = make_wheel(tmp_path / "src", "ray", "2.60.0", files={
        "ray/__init__.py": "x = 1\n", "ray/_raylet.so": library.read_bytes()})
    dest = tmp_path / "out" / source.name
    result = slim_wheel(source, dest, [], strip=shutil.which("strip"))
    assert result.stripped_files == 1 and result.stripped_bytes > 0
    with zipfile.ZipFile(dest) as archive:
        stripped = archive.read("ray/_raylet.so")
        assert stripped[:4] == b"\x7fELF" and len(stripped) == library.stat().st_size - result.stripped_bytes
        assert archive.read("ray/__init__.py") == b"x = 1\n"
        rows = {row[0]: row for row in csv.reader(io.StringIO(archive.read("ray-2.60.0.dist-info/RECORD").decode()))}
        assert rows["ray/_raylet.so"][1:] == [_hash(stripped), str(len(stripped))]
    loaded = tmp_path / "stripped.so"
    loaded.write_bytes(stripped)
    assert ctypes.CDLL(str(loaded)).answer() == 42
    unstripped = slim_wheel(source, tmp_path / "kept" / source.name, [])
    assert unstripped.stripped_files == 0


# --------------------------------------------------------------------------- resolution

INDEX = {
    "ray": {"2.59.0": ["click"], "2.60.0": ["click>=7.0", "numpy", 'pandas; extra == "tune"',
                                             'tensorboardx>=1.9; extra == "tune"', 'redis; extra == "serve"']},
    "click": {"7.0": [], "8.5.1": ['colorama; platform_system == "Windows"']},
    "tensorboardx": {"2.6.5": ["protobuf>=3.20", "numpy"]},
    "protobuf": {"7.36.2": []},
    "mlflow": {"3.18.0": ["mlflow-skinny==3.18.0"]},
    "mlflow-skinny": {"3.17.2": ["click<9"], "3.16.0": ["click<9"]},
    "sqlalchemy": {"2.1.9": ['greenlet>=1; python_version < "3.11"']},
    "alembic": {"1.20.1": ["sqlalchemy>=1.4.0", "mako"]},
    "mako": {"1.4.3": ["markupsafe>=2"]},
    "datasets": {"5.2.0": ["huggingface-hub>=2.0", "fsspec<=2026.9.0"], "5.1.0": ["huggingface-hub>=1.31",
                                                                                  "fsspec<=2026.9.0"]},
    "fsspec": {"2026.9.0": [], "2026.10.0": []},
    "aa": {"1.0": ["cc"]},
    "bb": {"1.0": ["ee"]},
    "cc": {"1.0": [], "2.0": ["dd"]},
    "dd": {"1.0": []},
    "ee": {"1.0": ["cc<2"]},
}


def test_resolution_follows_extras_and_markers_and_skips_excluded(tmp_path):
    resolution, fetcher = resolve(tmp_path, INDEX, ["ray[tune]>=2.50", "torch>=2.9", 'tomli; python_version < "3.11"'],
                                  exclude={"torch": "", "numpy": "", "pandas": "", "markupsafe": ""})
    assert sorted(resolution.wheels) == ["click", "protobuf", "ray", "tensorboardx"]
    assert resolution.wheels["ray"].version == "2.60.0" and resolution.wheels["click"].version == "8.5.1"
    assert sorted(resolution.from_target) == ["numpy", "pandas", "torch"]
    assert {n["required_by"] for n in resolution.from_target["numpy"]} == {"ray 2.60.0", "tensorboardx 2.6.5"}
    assert resolution.required_by["ray"] == ["k3lab 0.1.0"]
    assert "redis" not in str(fetcher.asked) and "colorama" not in str(fetcher.asked)
    assert "torch" not in str(fetcher.asked)  # excluded packages are never downloaded


def test_substitution_bundles_skinny_mlflow_with_its_sql_store(tmp_path):
    resolution, _ = resolve(tmp_path, INDEX, ["mlflow>=3.0"],
                            substitutes={"mlflow": ("mlflow-skinny", ("sqlalchemy>=1.4,<3", "alembic"))},
                            exclude={"markupsafe": ""})
    assert sorted(resolution.wheels) == ["alembic", "click", "mako", "mlflow-skinny", "sqlalchemy"]
    assert resolution.wheels["mlflow-skinny"].version == "3.17.2"
    assert resolution.substituted == {"mlflow": "mlflow-skinny"}
    assert "greenlet" not in resolution.wheels  # python_version < "3.11" is false for 3.12


def test_conflict_restarts_with_a_constraint(tmp_path):
    resolution, _ = resolve(tmp_path, INDEX, ["aa", "bb"])
    assert sorted(resolution.wheels) == ["aa", "bb", "cc", "ee"]  # cc 2.0 (and its dd) dropped for cc 1.0
    assert resolution.wheels["cc"].version == "1.0" and resolution.restarts == 1


def test_a_pinned_exclusion_rejects_versions_that_need_more(tmp_path):
    resolution, _ = resolve(tmp_path, INDEX, ["datasets>=2.18"], exclude={"huggingface-hub": "==1.33.0", "fsspec": ""})
    assert resolution.wheels["datasets"].version == "5.1.0"
    resolution, _ = resolve(tmp_path / "b", INDEX, ["datasets>=2.18"], exclude={"huggingface-hub": "", "fsspec": ""})
    assert resolution.wheels["datasets"].version == "5.2.0"
    with pytest.raises(UserError, match="the target has huggingface-hub 1.0"):
        resolve(tmp_path / "c", INDEX, ["huggingface-hub>=1.31"], exclude={"huggingface-hub": "==1.0"})


def test_constraints_hold_the_bundle_at_the_locked_versions_through_the_substitution(tmp_path):
    """The GPU bundle took mlflow-skinny 3.18.0 while laptops resolved 3.17.2: a store neither could share."""
    index = {**INDEX, "mlflow-skinny": {**INDEX["mlflow-skinny"], "3.18.0": ["click<9"]}}
    skinny = {"mlflow": ("mlflow-skinny", ("sqlalchemy>=1.4,<3", "alembic"))}
    free, _ = resolve(tmp_path / "a", index, ["mlflow>=3.3.0", "ray>=2.51"], substitutes=skinny,
                      exclude={"markupsafe": "", "numpy": ""})
    assert free.wheels["mlflow-skinny"].version == "3.18.0" and free.wheels["ray"].version == "2.60.0"
    locked, _ = resolve(tmp_path / "b", index, ["mlflow>=3.3.0", "ray>=2.51"], substitutes=skinny,
                        exclude={"markupsafe": "", "numpy": ""},
                        pins={"mlflow": "==3.17.2", "ray": "==2.59.0", "not-needed": "==1.0"})
    assert locked.wheels["mlflow-skinny"].version == "3.17.2" and locked.wheels["ray"].version == "2.59.0"
    assert "not-needed" not in locked.wheels  # a constraint narrows, it never adds


def test_a_requirement_the_constraints_rule_out_is_one_line_naming_both(tmp_path):
    with pytest.raises(UserError, match=r"^k3lab 0.1.0 needs ray>=2.60, but the constraints pin ray==2.59.0$"):
        resolve(tmp_path, INDEX, ["ray>=2.60"], exclude={"numpy": ""}, pins={"ray": "==2.59.0"})


def test_parse_constraints_reads_pip_constraints_files_and_names_a_bad_line(tmp_path):
    lock = tmp_path / "constraints.txt"
    lock.write_text("# the lock\nMLflow_Skinny==3.17.2  # the store\n\nray==2.60.0\n")
    assert bundle.parse_constraints([lock]) == {"mlflow-skinny": "==3.17.2", "ray": "==2.60.0"}
    lock.write_text("ray==2.60.0\nray[tune]==2.60.0\n")
    with pytest.raises(UserError, match=rf"^{lock}:2: 'ray\[tune\]==2.60.0': a constraint names a version range only"):
        bundle.parse_constraints([lock])
    with pytest.raises(UserError, match="--constraint /no/such: no such file"):
        bundle.parse_constraints(["/no/such"])


def test_the_manifest_records_the_constraints_the_bundled_wheels_were_held_to(tmp_path):
    index = {"ray": {"2.60.0": ["click>=7"]}, "click": {"8.5.1": []}, "cattrs": {"26.2.1": ["attrs>=25.4"]},
             "attrs": {"26.1.0": [], "25.4.0": []}}
    options, manifest = fake_bundle(tmp_path, index=index,
                                    constraints={"click": "==8.5.1", "attrs": "==25.4.0", "zz": "==1"})
    assert manifest["constraints"] == {"click": "==8.5.1"}  # attrs is the target's, zz not bundled
    spare = next(e for e in manifest["files"] if e.get("spare_for"))  # at the pinned version, installed only
    assert (spare["name"], spare["version"], spare["spare_for"]) == ("attrs", "25.4.0", ">=25.4")  # below the need


def test_unresolvable_requirement_is_a_user_error(tmp_path):
    with pytest.raises(UserError, match="nosuchpkg"):
        resolve(tmp_path, INDEX, ["nosuchpkg>=1"])


# --------------------------------------------------------------------------- the bundle


def fake_bundle(tmp_path, max_size=None, target=None, spare_max=2**20, index=None, root_requires=None, exclude=None,
                part_size=None, include_project=True, constraints=None):
    index = index or {"ray": {"2.60.0": ["click>=7"]}, "click": {"8.5.1": []}, "cattrs": {"26.2.1": ["attrs>=25.4"]},
                      "attrs": {"26.1.0": []}}
    root_requires = root_requires or ["ray[tune]>=2.50", "cattrs>=23.2", "attrs>=23.1", "torch>=2.9"]
    target = target or TARGET
    project_wheel = make_wheel(tmp_path / "project", "k3lab", "0.1.0", root_requires)
    options = BundleOptions(out=tmp_path / "bundle", target=target, exclude=exclude or {"torch": "==2.11.0", "attrs": ""},
                            max_size=max_size, slim={"ray": ("ray/jars",)}, project_wheel=project_wheel,
                            use_cache=False, spare_max=spare_max, substitutes={}, part_size=part_size,
                            include_project=include_project, constraints=constraints or {})
    fetcher = FakeFetcher(index, target, tmp_path / "work", sizes={"ray": 20_000})
    return options, build_bundle(options, log=lambda *a: None, fetcher=fetcher)


def test_manifest_lists_every_file_with_size_and_sha256(tmp_path):
    options, manifest = fake_bundle(tmp_path)
    out = options.out
    on_disk = {p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file()}
    assert on_disk == {e["path"] for e in manifest["files"]} | {"manifest.json"}
    for entry in manifest["files"]:
        path = out / entry["path"]
        assert entry["size"] == path.stat().st_size
        assert entry["sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()
    assert manifest["total_size"] == sum((out / p).stat().st_size for p in on_disk)
    assert json.loads((out / "manifest.json").read_text()) == manifest
    assert manifest["target"] == {"python_version": "3.12", "implementation": "cp",
                                  "platforms": ["manylinux_2_28_x86_64", "manylinux2014_x86_64"]}
    names = {e.get("name") for e in manifest["files"]}
    assert {"k3lab", "ray", "click", "cattrs"} <= names and "torch" not in names
    ray = next(e for e in manifest["files"] if e.get("name") == "ray")
    assert ray["slimmed"]["dropped"] == ["ray/jars"] and ray["slimmed"]["compression"] == "lzma"
    # attrs is excluded but unpinned: a spare for attrs>=25.4 (cattrs' need) rides along
    spare = next(e for e in manifest["files"] if e.get("spare_for"))
    assert spare["name"] == "attrs" and spare["path"].startswith("spares/")
    assert spare["spare_for"] == ">=25.4"
    assert manifest["target_requirements"]["torch"] == [{"specifier": ">=2.9", "required_by": "k3lab 0.1.0"}]
    assert manifest["imports"][:1] == ["k3lab.cli"] and "ray.tune" in manifest["imports"]


def test_bundle_over_max_size_fails_with_one_line(tmp_path):
    with pytest.raises(UserError) as error:
        fake_bundle(tmp_path, max_size=10_000)
    assert "over --max-size" in str(error.value) and "\n" not in str(error.value)
    assert (tmp_path / "bundle" / "manifest.json").is_file()  # left for a look


def test_a_failed_build_leaves_nothing_behind_and_a_second_run_is_not_refused(tmp_path):
    """A download that fails mid-build (here: a requirement no index has) removes the wheels already
    copied and the folder the build created; a rebuild over an old bundle that fails leaves no half."""
    with pytest.raises(UserError, match="nosuchpkg"):
        fake_bundle(tmp_path, root_requires=["ray[tune]>=2.50", "nosuchpkg>=1"])
    assert not (tmp_path / "bundle").exists()
    options, _ = fake_bundle(tmp_path)
    with pytest.raises(UserError, match="nosuchpkg"):
        fake_bundle(tmp_path, root_requires=["ray[tune]>=2.50", "nosuchpkg>=1"])
    assert options.out.is_dir() and not any(options.out.iterdir())
    fake_bundle(tmp_path)
    assert (options.out / "manifest.json").is_file()


def test_rebuild_replaces_an_old_bundle_but_not_a_foreign_folder(tmp_path):
    options, _ = fake_bundle(tmp_path)
    stale = options.out / "wheels" / "stale-1.0-py3-none-any.whl"
    stale.write_bytes(b"x")
    fake_bundle(tmp_path)
    assert not stale.exists()
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine")
    with pytest.raises(UserError, match="not overwriting"):
        bundle.prepare_out_dir(foreign)


def test_a_bundle_in_parts_keeps_each_part_under_the_size_and_installs_in_order(tmp_path):
    """--part-size: every part is a bundle of its own under the size, the parts together hold every
    wheel once, and installing them in order into one folder gives what the whole bundle gives."""
    index = {"ray": {"2.60.0": ["click>=7"]}, "click": {"8.5.1": []}, "cattrs": {"26.2.1": ["zzfakedep>=2"]},
             "zzfakedep": {"2.0": []}}
    settings = dict(target=Target(HERE_PY, ()), index=index, root_requires=["ray>=2.50", "cattrs", "zzfakedep>=1", "torch"],
                    exclude={"torch": "", "zzfakedep": ""})
    _, unsplit = fake_bundle(tmp_path, **settings)
    ray_size = next(e["size"] for e in unsplit["files"] if e.get("name") == "ray")
    options, whole = fake_bundle(tmp_path, **settings, part_size=PART_RESERVE + ray_size + 100)
    out = options.out
    assert whole["parts"] == ["part-1", "part-2"] and not (out / "wheels").exists()
    on_disk = {p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file()}
    assert on_disk == {e["path"] for e in whole["files"]} | {"manifest.json"}
    parts = [json.loads((out / name / "manifest.json").read_text()) for name in whole["parts"]]
    for part in parts:
        assert part["total_size"] <= options.part_size
        assert sum((out / f"part-{part['part']['index']}" / e["path"]).stat().st_size for e in part["files"]) \
            + len((out / f"part-{part['part']['index']}" / "manifest.json").read_bytes()) == part["total_size"]
    wheels = [e["name"] for part in parts for e in part["files"] if e["path"].startswith("wheels/")]
    assert sorted(wheels) == ["cattrs", "click", "k3lab", "ray"]  # each once; ray (20 kB) fills part 1
    assert [e["name"] for e in parts[0]["files"] if e.get("name")] == ["ray"]
    assert parts[0]["imports"] == [] and parts[1]["imports"] == whole["imports"]  # the checks come last
    parts[1]["imports"] = ["k3lab", "cattrs", "ray"]  # the fake wheels hold only these as real modules
    (out / "part-2" / "manifest.json").write_text(json.dumps(parts[1]))
    site = tmp_path / "site"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    said = []
    for name in whole["parts"]:
        done = subprocess.run(["bash", str(out / name / "install.sh"), "--target", str(site), "--python",
                               sys.executable], capture_output=True, text=True, env=env)
        assert done.returncode == 0, done.stdout + done.stderr
        said.append(done.stdout + done.stderr)
    assert "part 1 of 2 installed; part 2 checks" in said[0] and "imported k3lab, cattrs, ray" in said[1]
    installed = {p.name.split("-")[0] for p in site.glob("*.dist-info")}
    assert {"k3lab", "ray", "click", "cattrs", "zzfakedep"} <= installed


def test_a_part_size_smaller_than_a_wheel_is_one_line_naming_it(tmp_path):
    with pytest.raises(UserError) as error:
        fake_bundle(tmp_path, part_size=PART_RESERVE + 10_000)
    assert "--part-size" in str(error.value) and "ray-2.60.0" in str(error.value) and "\n" not in str(error.value)


def test_a_bundle_without_the_project_keeps_its_dependencies_and_does_not_import_it(tmp_path):
    _, manifest = fake_bundle(tmp_path, include_project=False)
    names = {e.get("name") for e in manifest["files"]}
    assert "k3lab" not in names and {"ray", "click", "cattrs"} <= names
    assert "k3lab.cli" not in manifest["imports"] and "ray.tune" in manifest["imports"]


def test_without_strip_on_path_the_bundle_says_so_and_keeps_the_symbols(tmp_path, monkeypatch):
    from k3lab.bundle.build import strip_program

    said = []
    options = BundleOptions(out=tmp_path, target=TARGET)
    monkeypatch.setattr("shutil.which", lambda name: None)
    assert strip_program(options, said.append) is None
    assert said == ["  strip (binutils) is not on PATH: the slimmed wheels keep their ELF symbols"]
    monkeypatch.setattr("shutil.which", lambda name: f"/usr/bin/{name}")
    assert strip_program(options, said.append) == "/usr/bin/strip"
    assert strip_program(BundleOptions(out=tmp_path, target=TARGET, strip=False), said.append) is None
    assert len(said) == 1


def test_install_script_content():
    manifest = {"project": {"name": "k3lab", "version": "0.1.0", "extras": ["gpu"]},
                "target": TARGET.as_json(), "excluded": {"torch": "==2.11.0", "numpy": ""}}
    script = install_script(manifest)
    assert script.startswith("#!/usr/bin/env bash\n") and "set -euo pipefail" in script
    assert "k3lab 0.1.0[gpu]" in script and 'want = "3.12"' in script
    assert "--no-index --no-deps" in script and '--find-links "$here/wheels"' in script
    assert '--target "$target" --upgrade' in script and "--target=*" in script
    assert "PYTHONPATH=" in script and "@@" not in script
    done = subprocess.run(["bash", "-n"], input=script, text=True, capture_output=True)
    assert done.returncode == 0, done.stderr


def test_install_sh_installs_into_a_target_folder_offline(tmp_path):
    """The real install.sh on a bundle of tiny wheels for this Python: --target, spares, checks."""
    index = {"ray": {"2.60.0": ["click>=7"]}, "click": {"8.5.1": []}, "cattrs": {"26.2.1": ["zzfakedep>=2"]},
             "zzfakedep": {"2.0": []}}
    options, manifest = fake_bundle(tmp_path, target=Target(HERE_PY, ()), index=index,
                                    root_requires=["ray>=2.50", "cattrs", "zzfakedep>=1", "torch"],
                                    exclude={"torch": "", "zzfakedep": ""})
    manifest["imports"] = ["k3lab", "cattrs"]  # the fake wheels hold only these as real modules
    (options.out / "manifest.json").write_text(json.dumps(manifest))
    site = tmp_path / "site"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run(["bash", str(options.out / "install.sh"), "--target", str(site), "--python", sys.executable],
                          capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    installed = {p.name.split("-")[0] for p in site.glob("*.dist-info")}
    assert {"k3lab", "ray", "click", "cattrs", "zzfakedep"} <= installed  # zzfakedep: missing here, so its spare
    assert "installing the bundled 2.0" in done.stderr
    assert "imported k3lab, cattrs" in done.stdout and f"PYTHONPATH={site}" in done.stdout
    usage = subprocess.run(["bash", str(options.out / "install.sh"), "--help"], capture_output=True, text=True)
    assert usage.returncode == 0 and "--target DIR" in usage.stdout and "set -e" not in usage.stdout
    wrong = subprocess.run(["bash", str(options.out / "install.sh"), "--bogus"], capture_output=True, text=True)
    assert wrong.returncode == 2 and "unknown argument --bogus" in wrong.stderr


def test_install_sh_leaves_bytecode_where_processes_may_not_write_it(tmp_path):
    """With PYTHONDONTWRITEBYTECODE=1 no import writes bytecode: install.sh must have written it."""
    options, _ = fake_bundle(tmp_path, target=Target(HERE_PY, ()), index={"cattrs": {"26.2.1": []}},
                             root_requires=["cattrs"])
    site = tmp_path / "site"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {"PYTHONDONTWRITEBYTECODE": "1"}
    done = subprocess.run(["bash", str(options.out / "install.sh"), "--target", str(site), "--python", sys.executable,
                           "--no-check"], capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    sources = [p for p in site.rglob("*.py") if "bin" not in p.parts]
    assert sources
    tag = sys.implementation.cache_tag
    assert all((p.parent / "__pycache__" / f"{p.stem}.{tag}.pyc").is_file() for p in sources)


def test_install_sh_refuses_another_python(tmp_path):
    other = "3.9" if HERE_PY != "3.9" else "3.10"
    options, _ = fake_bundle(tmp_path, target=Target(other, ()))
    done = subprocess.run(["bash", str(options.out / "install.sh"), "--target", str(tmp_path / "site"),
                           "--python", sys.executable], capture_output=True, text=True)
    assert done.returncode != 0 and f"this bundle is for Python {other}" in done.stderr
    assert not (tmp_path / "site").exists() or not any((tmp_path / "site").iterdir())


def test_bundle_command_is_registered_and_rejects_bad_sizes(tmp_path, capsys):
    from k3lab.cli import build_parser, main

    args = build_parser().parse_args(["bundle", str(tmp_path / "b"), "--python-version", "3.12",
                                      "--platform", "manylinux_2_28_x86_64", "--exclude", "torch,numpy"])
    assert args.func is bundle.run and args.platform == ["manylinux_2_28_x86_64"] and args.extras == "gpu"
    assert main(["bundle", str(tmp_path / "b"), "--max-size", "lots"]) == 2
    assert capsys.readouterr().err.startswith("error: cannot read the size 'lots'")
    assert main(["bundle", str(tmp_path / "b"), "--python-version", "twelve"]) == 2


@pytest.mark.parametrize("argv, message", [
    (["--extras", "gpu,nosuch"], "--extras nosuch: not an extra of k3lab (extras: compose, gpu, hf, test, tokenizers)"),
    (["--part-size", "0"], "--part-size 0: must be at least 1MiB"),
    (["--project", "{tmp}"], "--project {tmp}: not a k3lab source tree"),
])
def test_bundle_options_are_checked_before_anything_is_downloaded_or_written(tmp_path, capsys, argv, message):
    from k3lab.cli import main

    argv = [a.format(tmp=tmp_path) for a in argv]
    assert main(["bundle", str(tmp_path / "b"), *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {message.format(tmp=tmp_path)}") and err.count("\n") == 1
    assert not (tmp_path / "b").exists()
