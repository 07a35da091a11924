"""Tuned kernels as data: a kernel cache's autotune results, moved between machines of one kind.

FLA's Triton kernels spend minutes autotuning each new shape. What they find is a few KB of
JSON per kernel and shape (`<cache>/triton/<hash>/<kernel>.autotune.json`, the hash covering
the kernel's source, the Triton version and the GPU architecture), and it holds on every GPU
of the same kind with the same libraries. An archive of them is therefore data:

    k3lab-tunings.json     manifest: GPU name, torch / Triton / FLA versions, counts
    triton/<hash>/*.autotune.json
    triton/k3lab-warm.json the warm-up record (shapes a sweep need not warm again)

With `--compiled`, an archive also holds the compiled kernels: everything else in the cache's
`triton/` (FLA's and inductor's kernels: cubins and their metadata) and `inductor/`
(torch.compile's FX-graph and AOTAutograd caches). They shorten a trial's first
forward+backward severalfold (`bench/cold_compile.py`, docs/benchmarks.md). They are
imported only where torch's installed version is the one they were compiled with (as its
package metadata says: `2.11.0` for the H200 image's `2.11.0+cu130`). Another build of that
version (another CUDA) misses them harmlessly: torch.compile's cache keys include the CUDA
version and the GPU, Triton's its own version and the GPU's architecture. Triton names each
kernel's files by absolute path (`triton/<hash>/__grp__*.json`); those paths are rewritten to
the importing cache.

`k3lab kernels export FILE` writes one from the machine's cache; `k3lab kernels import FILE`
merges one in after checking that it was measured on this GPU with these versions. k3lab ships
archives for the GPUs it was tuned on (`k3lab/tunings/*.tar.xz`); a GPU process that opens
the cache (`start_from_shipped`) imports those that match, each once.

Archives are tarballs compressed by their name: `.tar.xz` (xz at its strongest preset) or
`.tar.gz`. xz is the one to ship compiled kernels in: torch.compile's FX-graph entries carry
copies of the Triton kernels beside them, and xz's large window finds those repeats where
gzip's small one cannot (the shipped flagship archive is several times smaller as .tar.xz).
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import re
import tarfile
import uuid
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path

from k3lab.errors import UserError

MANIFEST = "k3lab-tunings.json"
SHIPPED_DIR = Path(__file__).resolve().parents[2] / "tunings"  # k3lab/tunings
SHIPPED_RECORD = Path("triton") / "k3lab-shipped.json"  # digests of the shipped archives' manifests imported
WARM_RECORD_NAME = "k3lab-warm.json"
AUTOTUNE_MEMBER = re.compile(r"^triton/[0-9A-Za-z_-]+/[0-9A-Za-z_.-]+\.autotune\.json$")
COMPILED_MEMBER = re.compile(r"^(triton/[0-9A-Za-z_-]+|inductor(/[0-9A-Za-z_-][0-9A-Za-z_.-]*)+)/[0-9A-Za-z_][0-9A-Za-z_.-]*$")
NOT_SHIPPED = re.compile(r"(^|/)(locks?|.*\.lock|.*\.tmp|\..*)$")  # locks, partial writes
GROUP_FILE = re.compile(r"^triton/[0-9A-Za-z_-]+/__grp__[0-9A-Za-z_.-]+\.json$")
COMPRESSIONS = {".tar.xz": "xz", ".tar.gz": "gz"}  # by the archive's name; reading detects either


def toolchain_versions() -> dict[str, str | None]:
    """The library versions a tuning depends on. torch without its local build tag
    (`2.11.0+cu130` -> `2.11.0`): Triton compiles the kernels, not torch's CUDA build."""
    def version(*names: str) -> str | None:
        for name in names:
            try:
                return metadata.version(name)
            except metadata.PackageNotFoundError:
                continue
        return None

    torch = version("torch")
    return {"torch": torch.split("+")[0] if torch else None, "triton": version("triton"),
            "fla": version("fla-core", "flash-linear-attention")}


def mismatch(manifest: dict, gpu: str, versions: dict) -> str | None:
    """Why an archive does not fit this machine (None when it does)."""
    wanted = {"GPU": manifest.get("gpu"), **{name: manifest.get("versions", {}).get(name) for name in versions}}
    here = {"GPU": gpu, **versions}
    differ = [f"{key} {wanted[key]} (here {here[key]})" for key in wanted if wanted[key] != here[key]]
    return ", ".join(differ) or None


# -- export ---------------------------------------------------------------------------------

def export_tunings(cache: Path, file: Path, gpu: str, compiled: bool = False) -> dict:
    """Write `cache`'s autotune results and warm record to `file` (.tar.xz or .tar.gz), and with
    `compiled` its compiled kernels too (see the module docstring); the manifest."""
    check_archive_path(file)  # before any work
    triton = cache / "triton"
    results = sorted(triton.rglob("*.autotune.json")) if triton.is_dir() else []
    if not results:
        raise UserError(f"kernel cache {cache}: no autotune results to export (nothing tuned here yet)")
    warm = triton / WARM_RECORD_NAME
    members = {f"triton/{path.relative_to(triton).as_posix()}": path.read_bytes() for path in results}
    if warm.is_file():
        members[f"triton/{WARM_RECORD_NAME}"] = warm.read_bytes()
    manifest = {"format": 1, "gpu": gpu, "versions": toolchain_versions(), "autotune_results": len(results),
                "kernels": sorted({path.name.removesuffix(".autotune.json") for path in results}),
                "created": datetime.now(timezone.utc).isoformat(timespec="seconds")}
    if compiled:
        kernels = compiled_files(cache)
        members |= kernels
        manifest["compiled"] = {"torch_build": torch_build(), "files": len(kernels),
                                "bytes": sum(len(data) for data in kernels.values())}
    file.parent.mkdir(parents=True, exist_ok=True)
    partial = file.with_name(f".{file.name}.partial")
    try:
        with archive_writer(partial, file) as tar:
            add_member(tar, MANIFEST, json.dumps(manifest, indent=1).encode())
            for name, data in members.items():
                add_member(tar, name, data)
        partial.replace(file)
    finally:  # a write that failed (a full disk, Ctrl-C) leaves no half archive
        partial.unlink(missing_ok=True)
    return manifest


def check_archive_path(file: Path) -> None:
    """`file` can be written as an archive: its name (`compression_of`), and its folder one that is,
    or can be made, and written (a file in its path failed after the work, with a traceback)."""
    from k3lab.runner.runtime.preflight import check_writable

    compression_of(file)
    if file.is_dir():
        raise UserError(f"{file}: is a folder, not an archive file")
    check_writable("archive folder", file.parent)


def compression_of(file: Path) -> str:
    """tarfile's compression for an archive named `file`; another name is the user's mistake."""
    for suffix, compression in COMPRESSIONS.items():
        if file.name.endswith(suffix):
            return compression
    raise UserError(f"{file}: a tunings archive is named *.tar.xz or *.tar.gz")


def archive_writer(path: Path, named: Path) -> tarfile.TarFile:
    """A tarfile writing to `path` (a partial file), compressed as the name `named` says."""
    compression = compression_of(named)
    return tarfile.open(path, f"w:{compression}", **({"preset": 9} if compression == "xz" else {}))


def compiled_files(cache: Path) -> dict[str, bytes]:
    """{member name: bytes} of the cache's compiled kernels: every file of `triton/` and
    `inductor/` but the autotune results, k3lab's records, locks and partial writes."""
    files = {}
    for part in ("triton", "inductor"):
        root = cache / part
        for path in sorted(root.rglob("*")) if root.is_dir() else []:
            name = f"{part}/{path.relative_to(root).as_posix()}"
            if (path.is_file() and COMPILED_MEMBER.match(name) and not NOT_SHIPPED.search(name)
                    and not AUTOTUNE_MEMBER.match(name)):  # k3lab's records sit outside <hash>/ folders
                files[name] = path.read_bytes()
    return files


def torch_build() -> str | None:
    """torch's installed version (its package metadata; a local tag such as +cu130 where the
    wheel carries one): what compiled kernels need to match."""
    try:
        return metadata.version("torch")
    except metadata.PackageNotFoundError:
        return None


def add_member(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mode = len(data), 0o644
    tar.addfile(info, io.BytesIO(data))


# -- import ---------------------------------------------------------------------------------

def read_manifest(file: Path) -> dict:
    """The archive's manifest, its first member, read without unpacking the rest (a shipped
    archive with compiled kernels is megabytes: one that does not fit is not unpacked)."""
    with broken_archive_is_one_line(file), tarfile.open(file, "r|*") as tar:
        first = tar.next()
        if first is None or first.name != MANIFEST:
            raise KeyError(MANIFEST)
        return parse_manifest(tar.extractfile(first).read())


def read_archive(file: Path) -> tuple[dict, dict[str, bytes]]:
    """(manifest, {member: bytes}) of the archive's files k3lab reads (its compiled kernels only
    where torch is the version they were compiled with); a broken archive is one line."""
    with broken_archive_is_one_line(file), tarfile.open(file, "r:*") as tar:
        files = {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}
        manifest = parse_manifest(files.pop(MANIFEST))
    compiled = manifest.get("compiled") or {}
    with_kernels = bool(compiled) and compiled.get("torch_build") == torch_build()
    members = {name: data for name, data in files.items()
               if AUTOTUNE_MEMBER.match(name) or name == f"triton/{WARM_RECORD_NAME}"
               or (with_kernels and COMPILED_MEMBER.match(name))}
    return manifest, members


def parse_manifest(data: bytes) -> dict:
    """The manifest, of the shape the import reads (a list or a string there crashed it); a
    ValueError, which `broken_archive_is_one_line` reports, names what is wrong."""
    try:
        manifest = json.loads(data)
    except ValueError as error:
        raise ValueError(f"{MANIFEST}: not JSON ({error})") from None
    if not isinstance(manifest, dict):
        raise ValueError(f"{MANIFEST}: expected a mapping, got {type(manifest).__name__}")
    for key in ("versions", "compiled"):
        if manifest.get(key) is not None and not isinstance(manifest[key], dict):
            raise ValueError(f"{MANIFEST}: {key}: expected a mapping, got {type(manifest[key]).__name__}")
    return manifest


@contextlib.contextmanager
def broken_archive_is_one_line(file: Path):
    try:
        yield
    except FileNotFoundError:
        raise UserError(f"{file}: no such file") from None
    except (OSError, tarfile.TarError, KeyError, ValueError) as error:
        raise UserError(f"{file}: not a k3lab kernel tunings archive ({error})") from None


def import_tunings(file: Path, cache: Path, gpu: str) -> dict:
    """Merge the archive's autotune results into `cache` (results already there are kept) and
    its warm record into the cache's; refused, with nothing written, when it was measured on
    another GPU or with other versions. Returns {"gpu", "added", "kept", "compiled", "warm_shapes"}."""
    why = mismatch(read_manifest(file), gpu, toolchain_versions())
    if why:
        raise UserError(f"{file}: measured with {why}: nothing imported")
    return merge_into(cache, *read_archive(file))


def merge_into(cache: Path, manifest: dict, members: dict[str, bytes]) -> dict:
    """Write an archive's members into `cache` (see import_tunings); each file whole, by rename,
    so that a process reading the cache (on a shared volume) never sees half a file."""
    added = kept = compiled = 0
    for name, data in sorted(members.items(), key=lambda item: bool(GROUP_FILE.match(item[0]))):
        target = cache / name  # a kernel's group file last: Triton reads its files once it exists
        if name.endswith(WARM_RECORD_NAME):
            continue
        autotune = bool(AUTOTUNE_MEMBER.match(name))
        if target.exists():
            kept += autotune
            continue
        if GROUP_FILE.match(name):
            data = relocated_group(data, target.parent)
        target.parent.mkdir(parents=True, exist_ok=True)
        partial = target.with_name(f".{target.name}.{uuid.uuid4().hex}")
        partial.write_bytes(data)
        partial.replace(target)
        added += autotune
        compiled += not autotune
    try:
        warm = json.loads(members.get(f"triton/{WARM_RECORD_NAME}", b"{}"))
    except ValueError:  # a damaged record only costs a warm-up
        warm = {}
    return {"gpu": manifest.get("gpu"), "added": added, "kept": kept, "compiled": compiled,
            "warm_shapes": merge_warm_record(cache, warm)}


def relocated_group(data: bytes, folder: Path) -> bytes:
    """A Triton kernel's group file with its files' absolute paths moved into `folder`."""
    try:
        group = json.loads(data)
        group["child_paths"] = {name: str(folder / Path(path).name) for name, path in group["child_paths"].items()}
    except (ValueError, KeyError, TypeError, AttributeError):
        return data  # not one Triton wrote: Triton then compiles that kernel again
    return json.dumps(group).encode()


def merge_warm_record(cache: Path, entries: dict) -> int:
    """Add an imported warm record's shapes to the cache's; the number of shapes it brought."""
    if not isinstance(entries, dict) or not entries:
        return 0
    record = cache / "triton" / WARM_RECORD_NAME
    write_json(record, read_json(record) | entries)
    return len(entries)


# -- the tunings k3lab ships ----------------------------------------------------------------

def shipped_archives() -> list[Path]:
    return sorted(path for suffix in COMPRESSIONS for path in SHIPPED_DIR.glob(f"*{suffix}"))


# GPUs of one architecture (compute capability): Triton's cache keys by the architecture, so one's
# autotune results and compiled Triton kernels hold on the others (torch.compile's graphs key by the GPU
# itself and are compiled again, harmlessly)
ARCHITECTURES = {"sm_90": ("NVIDIA H100", "NVIDIA H200", "NVIDIA H800", "NVIDIA H20", "NVIDIA GH200")}


def architecture(gpu: str | None) -> str | None:
    """The architecture of a GPU named as nvidia-smi names it ("NVIDIA H100 80GB HBM3": sm_90), or None."""
    return next((arch for arch, names in ARCHITECTURES.items()
                 if gpu and any(gpu == name or gpu.startswith(f"{name} ") for name in names)), None)


def fits(manifest: dict, gpu: str, versions: dict, same_architecture: bool) -> bool:
    """An archive fits this GPU when measured on it with these versions, or (`same_architecture`)
    on another GPU of its architecture with these versions."""
    if mismatch(manifest, gpu, versions) is None:
        return True
    other_gpu_only = mismatch(manifest, manifest.get("gpu"), versions) is None
    return same_architecture and other_gpu_only and architecture(gpu) is not None \
        and architecture(manifest.get("gpu")) == architecture(gpu)


def start_from_shipped(cache: Path, gpu: str) -> dict | None:
    """Import the shipped archives measured on this GPU with these versions, each once per
    cache; where none was measured on it, those of another GPU of its architecture (a first
    warm-up then compiles, with no autotuning). None when none fits or they were imported
    already; else what import_tunings returned, summed over them, with "archive": their names."""
    done = read_json(cache / SHIPPED_RECORD)
    versions = toolchain_versions()
    manifests = {archive: read_manifest(archive) for archive in shipped_archives()}  # creation time: one export
    own = any(mismatch(manifest, gpu, versions) is None for manifest in manifests.values())
    results, names = [], []
    for archive, manifest in manifests.items():
        digest = hashlib.sha256(json.dumps(manifest, sort_keys=True).encode()).hexdigest()[:16]
        if digest in done or not fits(manifest, gpu, versions, same_architecture=not own):
            continue
        results.append(merge_into(cache, *read_archive(archive)))
        names.append(archive.name)
        done |= {digest: archive.name}
        write_json(cache / SHIPPED_RECORD, done)
    if not results:
        return None
    summed = {key: sum(r[key] for r in results) for key in ("added", "kept", "compiled", "warm_shapes")}
    return summed | {"gpu": results[0]["gpu"], "archive": ", ".join(names)}


def read_json(path: Path) -> dict:
    try:
        value = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}


def write_json(path: Path, value: dict) -> None:
    """Written whole to a uniquely named file and renamed, so that a reader (another process on
    a shared volume) never sees half a file."""
    partial = path.with_name(f".{path.name}.{uuid.uuid4().hex}")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        partial.write_text(json.dumps(value, indent=1, sort_keys=True))
        partial.replace(path)
    finally:
        partial.unlink(missing_ok=True)
