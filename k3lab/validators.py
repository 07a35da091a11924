"""attrs validators of k3lab's spec classes; each raises `FieldError`, which names the field."""

from __future__ import annotations

from k3lab.errors import FieldError


def positive(instance, attribute, value) -> None:
    if value is not None and not value > 0:
        raise FieldError(attribute.name, f"must be positive, got {value!r}")


def non_negative(instance, attribute, value) -> None:
    if value is not None and not value >= 0:
        raise FieldError(attribute.name, f"must be non-negative, got {value!r}")


def one_of(*choices):
    def check(instance, attribute, value) -> None:
        if value not in choices:
            shown = ", ".join("null" if c is None else str(c) for c in choices)
            raise FieldError(attribute.name, f"must be one of {shown}, got {value!r}")

    return check


def unit_interval(instance, attribute, value) -> None:
    if not 0 <= value <= 1:
        raise FieldError(attribute.name, f"must lie in [0, 1], got {value!r}")


def open_unit_interval(why: str = ""):
    """A validator for a fraction strictly between 0 and 1; `why` is added to its message."""
    def check(instance, attribute, value) -> None:
        if not 0 < value < 1:
            raise FieldError(attribute.name, f"must lie in (0, 1){why}, got {value!r}")

    return check


def non_empty(instance, attribute, value) -> None:
    if not value:
        raise FieldError(attribute.name, "must not be empty")
