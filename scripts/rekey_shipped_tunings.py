"""Re-key a shipped archive's warm record from the model code's bytes to its code text (one-off).

    python scripts/rekey_shipped_tunings.py k3lab/tunings/nvidia-h200-attnres_block.tar.xz \
        experiments/attnres_block.yaml:gpu

The warm record's keys once hashed the bytes of k3lab/model/*.py; they now hash
its code text (`k3lab.runtime.model_code`), so that an edit of comments or docstrings keeps a
record. A record made under the old rule can be carried over without a GPU where it was made
for this very code: for every kernel shape of the named sweeps, its key under the old rule
(with the versions in the archive's manifest, as the GPU machine computed it) must be in the
record; the same entry is then added under the key of the new rule. Nothing is written when one
is missing: the archive was made for other model code, and only `scripts/tune_shipped.sh` on
the GPU can re-make it. The manifest notes the re-keying, so that caches that imported the
archive before import it again.
"""

from __future__ import annotations

import hashlib
import json
import sys
import tarfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from k3lab.registry.sweep import load_sweep  # noqa: E402
from k3lab.runtime import kernels, tunings  # noqa: E402

RECORD = f"triton/{tunings.WARM_RECORD_NAME}"


def measured_versions(manifest: dict) -> dict:
    """package_version's answers on the machine that made the archive (as tests/test_kernels.py reads them)."""
    versions = manifest["versions"]
    return versions | {"fla-core": versions["fla"], "flash-linear-attention": versions["fla"]}


def bytes_rule_fingerprint() -> str:
    """`kernels.toolchain_fingerprint` as it was: the model files' bytes."""
    versions = {name: kernels.package_version(name) for name in ("torch", "triton", "fla-core", "flash-linear-attention")}
    digest = hashlib.sha256(json.dumps(versions, sort_keys=True).encode())
    for path in sorted(kernels.MODEL_CODE.glob("*.py")):
        digest.update(path.name.encode() + path.read_bytes())
    return digest.hexdigest()[:16]


def rekeyed_record(manifest: dict, record: dict, shapes: list) -> dict:
    kernels.package_version = measured_versions(manifest).get  # this process only computes keys
    old, new = bytes_rule_fingerprint(), kernels.toolchain_fingerprint()
    added = {}
    for shape in shapes:
        old_key = kernels.shape_fingerprint(shape, manifest["gpu"], old)
        if old_key not in record:
            sys.exit(f"{shape.name}: not in the record for this model code (key {old_key}); re-make the archive "
                     "on the GPU with scripts/tune_shipped.sh")
        added[kernels.shape_fingerprint(shape, manifest["gpu"], new)] = record[old_key] | {"rekeyed_from": old_key}
    return record | added


def main() -> None:
    archive, sweeps = Path(sys.argv[1]), sys.argv[2:]
    shapes = []
    for item in sweeps:
        file, _, profile = item.partition(":")
        shapes += kernels.kernel_shapes(load_sweep(file, profile or None))
    with tarfile.open(archive, "r:*") as tar:
        members = [(m.name, tar.extractfile(m).read()) for m in tar.getmembers() if m.isfile()]
    files = dict(members)
    manifest = json.loads(files[tunings.MANIFEST])
    record = rekeyed_record(manifest, json.loads(files[RECORD]), shapes)
    manifest["warm_record"] = "keyed by the model's code text (scripts/rekey_shipped_tunings.py)"
    files |= {tunings.MANIFEST: json.dumps(manifest, indent=1).encode(), RECORD: json.dumps(record, indent=1).encode()}
    partial = archive.with_name(f".{archive.name}.partial")
    with tunings.archive_writer(partial, archive) as tar:
        for name, _ in members:  # the same members in the same order, the manifest first
            tunings.add_member(tar, name, files[name])
    partial.replace(archive)
    print(f"{archive}: {len(shapes)} shapes re-keyed ({len(record)} entries in its record)")


if __name__ == "__main__":
    main()
