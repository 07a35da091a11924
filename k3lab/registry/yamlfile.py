"""Reading YAML files safely (`yaml.safe_load` only) with one-line errors."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from k3lab.registry.keypath import SpecError


class Loader(yaml.SafeLoader):
    """yaml.SafeLoader that reads `1e-3` as a number, as YAML 1.2 and Python do (PyYAML follows
    YAML 1.1, where a float needs a dot: `lr: 1e-3` was the string '1e-3'), and refuses a key
    written twice in one mapping (PyYAML keeps the last: a second `axes:` silently replaced the
    first). Keys a `<<:` merge brings in may still be overridden."""

    def construct_mapping(self, node, deep=False):
        if isinstance(node, yaml.MappingNode):
            first_line = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue
                key = self.construct_object(key_node, deep=deep)
                if not isinstance(key, (str, int, float, bool)) and key is not None:
                    continue  # an unhashable key: SafeLoader's own error
                if key in first_line:
                    raise yaml.constructor.ConstructorError(
                        None, None, f"key {key!r} written twice in one mapping (first at line {first_line[key]})",
                        key_node.start_mark)
                first_line[key] = key_node.start_mark.line + 1
        return super().construct_mapping(node, deep=deep)


Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*(?:\.[0-9_]*)?|\.[0-9_]+)[eE][-+]?[0-9]+$"),  # 1e9, 2.0e9: the forms YAML 1.1
    list("-+.0123456789"))  # lacks (its exponent needs a sign); SafeLoader's own rules still apply


def load_text(text: str) -> Any:
    """`text` parsed by `Loader`."""
    return yaml.load(text, Loader=Loader)  # noqa: S506 - Loader is a SafeLoader


def read_yaml(path: Path) -> Any:
    """The parsed document; `SpecError` (without a key path) when the file is
    missing, unreadable or not valid YAML."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise SpecError((), "file not found") from None
    except IsADirectoryError:
        raise SpecError((), "is a directory, not a YAML file") from None
    except (OSError, UnicodeDecodeError) as error:
        raise SpecError((), f"cannot read: {error}") from None
    try:
        return load_text(text)
    except yaml.YAMLError as error:
        raise SpecError((), _describe_yaml_error(error)) from None


def _describe_yaml_error(error: yaml.YAMLError) -> str:
    mark = getattr(error, "problem_mark", None)
    problem = getattr(error, "problem", None) or str(error).splitlines()[0]
    where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
    return f"invalid YAML{where}: {problem}"
