"""A bundle in parts of at most `--part-size` each, for a transfer that caps its size (a lent
machine's carry beside the checkout, a mail attachment, a data diode).

    OUT/manifest.json          the whole bundle: every part's files, and `parts`
    OUT/part-1/                a bundle of its own: wheels/, install.sh, manifest.json
    OUT/part-2/                ... spares/ and the checks in the last part

Each part installs alone (`bash OUT/part-K/install.sh --target DIR`), in order, into one
target; only the last one checks the target's versions and imports the main modules, since
those need every part. Wheels are packed largest first, each into the first part with room.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from k3lab.bundle.install import (INSTALL_SH, MANIFEST, SPARES, WHEELS, file_entry, write_install_script,
                                  write_manifest)
from k3lab.bundle.sizes import human
from k3lab.errors import UserError

PART_RESERVE = 64 * 2**10  # a part's install.sh and manifest.json


def plan_parts(entries: list[dict], part_size: int) -> list[list[dict]]:
    """The bundle's wheels and spares (manifest entries) in parts: first-fit decreasing, spares
    after the wheels, so that every part holds a wheel."""
    budget = part_size - PART_RESERVE
    for entry in entries:
        if entry["size"] > budget:
            raise UserError(f"--part-size {human(part_size)}: {Path(entry['path']).name} alone is "
                            f"{human(entry['size'])} (a part also holds its install.sh and manifest.json)")
    parts: list[list[dict]] = []
    for entry in sorted(entries, key=lambda e: (is_spare(e), -e["size"])):
        room = next((part for part in parts if sum(e["size"] for e in part) + entry["size"] <= budget), None)
        if room is None:
            if is_spare(entry):  # a part of spares alone would install no wheel
                raise UserError(f"--part-size {human(part_size)}: no part has room for the spare "
                                f"{Path(entry['path']).name}; give a larger size")
            parts.append(room := [])
        room.append(entry)
    return parts


def is_spare(entry: dict) -> bool:
    return entry["path"].startswith(SPARES + "/")


def split_bundle(out: Path, manifest: dict, part_size: int) -> dict:
    """Move the bundle built in `out` into part-1, part-2, ... and write its manifest again over
    every part's files; returns that manifest."""
    payload = [e for e in manifest["files"] if e["path"] != INSTALL_SH]
    parts = plan_parts(payload, part_size)
    (out / INSTALL_SH).unlink()
    files = []
    for index, entries in enumerate(parts, 1):
        folder = out / part_name(index)
        for entry in entries:
            dest = folder / entry["path"]
            dest.parent.mkdir(parents=True, exist_ok=True)
            (out / entry["path"]).replace(dest)
        last = index == len(parts)
        part = manifest | {"files": sorted(entries, key=lambda e: e["path"]), "part": {"index": index, "of": len(parts)},
                           "target_requirements": manifest["target_requirements"] if last else {},
                           "imports": manifest["imports"] if last else []}
        write_install_script(folder, part)
        write_manifest(folder, part)
        files += [entry | {"path": f"{folder.name}/{entry['path']}"} for entry in part["files"]]
        files.append(file_entry(out, folder / MANIFEST))
    for name in (WHEELS, SPARES):
        shutil.rmtree(out / name, ignore_errors=True)
    whole = manifest | {"files": files, "parts": [part_name(i) for i in range(1, len(parts) + 1)],
                        "install": " && ".join(f"bash {part_name(i)}/{INSTALL_SH} [--target DIR]"
                                               for i in range(1, len(parts) + 1))}
    write_manifest(out, whole)
    return whole


def part_name(index: int) -> str:
    return f"part-{index}"
