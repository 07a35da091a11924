"""Property tests: random mutations of the shipped sweep files either load or fail
with a one-line UserError, never with another exception."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from k3lab.cli import main
from k3lab.errors import UserError
from k3lab.registry import Sweep, load_sweep

EXPERIMENTS = sorted((Path(__file__).resolve().parents[1] / "experiments").glob("*.yaml"))
DOCUMENTS = {p.stem: yaml.safe_load(p.read_text()) for p in EXPERIMENTS}
KEYS = ["name", "base", "axes", "train", "steps", "seeds", "preset", "layer_schedule", "attn_res_block_size",
        "num_layers", "match", "adjust", "profiles", "cpu", "gpu", "kind", "junk"]

scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-3, 64), st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=8), st.sampled_from(["off", "full", "3:1", "all", "tiny", "small", "asha", "dense", "KKM"]),
)
values = st.one_of(scalars, st.lists(scalars, max_size=3), st.dictionaries(st.sampled_from(KEYS), scalars, max_size=2))


def paths(node, prefix=()):
    """Every key path inside a YAML document."""
    yield prefix
    items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
    for key, child in items:
        yield from paths(child, prefix + (key,))


def mutate(document, data):
    """Apply 1-4 random mutations: drop a key or element, replace a value, add a key."""
    for _ in range(data.draw(st.integers(1, 4))):
        path = data.draw(st.sampled_from(list(paths(document))))
        if not path:
            continue
        parent = document
        for part in path[:-1]:
            parent = parent[part]
        action = data.draw(st.sampled_from(["drop", "replace", "replace", "add"]))
        if action == "drop":
            del parent[path[-1]]
        elif action == "replace":
            parent[path[-1]] = data.draw(values)
        elif isinstance(parent, dict):
            parent[data.draw(st.sampled_from(KEYS))] = data.draw(values)
    return document


def load_mutated(data, directory: Path) -> tuple[Path, str | None]:
    name = data.draw(st.sampled_from(sorted(DOCUMENTS)))
    document = mutate(json.loads(json.dumps(DOCUMENTS[name])), data)
    path = directory / f"{name}.yaml"
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    return path, data.draw(st.sampled_from([None, "cpu", "gpu", "nope"]))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_mutated_sweeps_load_or_raise_user_error(data):
    with tempfile.TemporaryDirectory() as directory:
        path, profile = load_mutated(data, Path(directory))
        try:
            sweep = load_sweep(path, profile)
        except UserError as error:
            message = str(error)
            assert message.startswith(f"{path}: ") and "\n" not in message
        else:
            assert isinstance(sweep, Sweep) and sweep.valid_variants


@settings(max_examples=15, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_mutated_sweeps_through_the_cli(capsys, data):
    with tempfile.TemporaryDirectory() as directory:
        path, profile = load_mutated(data, Path(directory))
        capsys.readouterr()
        code = main(["variants", str(path), "--json", *(["--profile", profile] if profile else [])])
        out, err = capsys.readouterr()
        if code == 0:
            assert json.loads(out) and err == ""
        else:
            assert code == 2 and out == "" and err.startswith("error: ") and err.count("\n") == 1


@pytest.mark.parametrize("text", ["", "~", "[]", "name: x\nbase: [tiny]\n", "name: x\nbase: tiny\naxes: {num_layers: [.nan]}\n",
                                  "name: x\nbase: tiny\nvariants: [{}]\ntrain: {lr: .inf}\n",
                                  "name: x\nbase: tiny\nvariants: [3]\n", "name: x\nbase: tiny\nprofiles: [cpu]\n",
                                  "name: x\nbase: tiny\nvariants: [{}]\nprofiles: {cpu: {axes: [1]}}\n",
                                  "\t- bad", "name: x\nbase: tiny\naxes: {1: [2]}\n"])
def test_odd_documents_raise_user_error(text, tmp_path):
    path = tmp_path / "odd.yaml"
    path.write_text(text)
    with pytest.raises(UserError) as raised:
        load_sweep(path)
    assert str(raised.value).startswith(f"{path}: ") and "\n" not in str(raised.value)
