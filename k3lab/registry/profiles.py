"""Profiles: named partial overrides of a sweep document (e.g. `cpu`, `gpu`).

A profile may set `base`, `axes`, `variants`, `seeds`, `baseline`, `budget`, `train`,
`metric`, `resources`, `scheduler` and `match`. Merging, on the raw YAML document:
- `train`, `metric`, `resources`, `scheduler`, `match`, `budget`: key by key over the
  top-level section (`scheduler: asha` counts as `{kind: asha}`); `match:
  null` turns matching off.
- `base`: a string replaces the base; a mapping merges key by key over it
  (`base: tiny` counts as `{preset: tiny}`), unless it names another preset: then it
  replaces the base too, as the file's overrides were written for the file's preset.
- `axes`: axis by axis; an axis set to null is dropped.
- `variants`, `seeds`, `baseline`: replaced.
Problems in the merged document that come from the profile are reported at
their path inside the profile, e.g. `profiles.cpu.train.steps`.
"""

from __future__ import annotations

from typing import Any

from k3lab.registry.convert import describe
from k3lab.registry.keypath import Path, SpecError
from k3lab.registry.sections import NAME_MAX, NAME_PATTERN

PROFILE_KEYS = ("base", "axes", "variants", "seeds", "baseline", "budget", "train", "metric", "resources", "scheduler",
                "match", "compute")
_SECTIONS = ("train", "metric", "resources", "match", "budget")
RESERVED = ("auto", "none")  # --profile's own choices: a profile named so could never be picked


def profile_names(document: dict[str, Any]) -> list[str]:
    profiles = document.get("profiles") or {}
    return list(profiles) if isinstance(profiles, dict) else []


def check_profiles(document: dict[str, Any]) -> None:
    """The `profiles` section is a mapping of name -> mapping of known keys."""
    profiles = document.get("profiles")
    if profiles is None:
        return
    if not isinstance(profiles, dict):
        raise SpecError(("profiles",), f"expected a mapping of profile names to overrides, got {describe(profiles)}")
    for name, profile in profiles.items():
        check_profile_name(name)
        if not isinstance(profile, dict):
            raise SpecError(("profiles", name), f"expected a mapping of overrides, got {describe(profile)}")
        for key in profile:
            if key not in PROFILE_KEYS:
                raise SpecError(("profiles", name, key), f"unknown key (a profile may set {', '.join(PROFILE_KEYS)})")


def apply_profile(document: dict[str, Any], name: str) -> dict[str, Any]:
    """The document with profile `name` merged in (and without `profiles`)."""
    profile = document["profiles"][name]
    merged = {k: v for k, v in document.items() if k != "profiles"}
    for key, value in profile.items():
        merged[key] = _merge(key, merged.get(key), value)
    return merged


def _merge(key: str, old: Any, new: Any) -> Any:
    if key == "scheduler" and isinstance(new, dict):
        old = {"kind": old} if isinstance(old, str) else old
    if key == "base" and isinstance(new, dict):
        old = {"preset": old} if isinstance(old, str) else old
        if isinstance(old, dict) and "preset" in new and new["preset"] != old.get("preset"):
            return new
    if key in _SECTIONS + ("scheduler", "base") and isinstance(old, dict) and isinstance(new, dict):
        return {**old, **new}
    if key == "axes" and isinstance(old, dict) and isinstance(new, dict):
        merged = {**old, **new}
        return {axis: values for axis, values in merged.items() if values is not None}
    return new


def locate(path: Path, profile: dict[str, Any], name: str) -> Path:
    """`path` (in the merged document) as a path inside profile `name` when the
    profile supplied the value there; else unchanged."""
    node: Any = profile
    for part in path:
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and isinstance(part, int) and 0 <= part < len(node):
            node = node[part]
        elif isinstance(node, dict):  # a key the profile did not set: it comes from the top level
            return path
        else:  # the profile replaced this value wholesale (a list or a scalar)
            break
    return ("profiles", name) + path if path else path


def check_profile_name(name: Any) -> None:
    """A profile's name joins the sweep's in file names (`<sweep>-<profile>`, its folder and store
    paths), so it follows the sweep name's rule; `auto` and `none` are `--profile`'s own choices."""
    if not isinstance(name, str):
        raise SpecError(("profiles", name), "profile names must be strings")
    if not NAME_PATTERN.match(name):
        raise SpecError(("profiles", name), "a profile name must be letters, digits, '_', '.' or '-' (it names files)")
    if len(name) > NAME_MAX:
        raise SpecError(("profiles", name[:20] + "..."), f"a profile name must be at most {NAME_MAX} characters, "
                                                          f"got {len(name)}")
    if name in RESERVED:
        meaning = "the gpu or cpu profile" if name == "auto" else "the top-level settings"
        raise SpecError(("profiles", name), f"--profile {name} means {meaning}, so a profile named {name!r} "
                                            f"could never be picked: rename it")
