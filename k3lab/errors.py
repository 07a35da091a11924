"""The one exception type for user mistakes.

`k3lab.cli` prints a `UserError` as one line and exits with code 2, with no
traceback. Raise it for bad input (files, fields, flags); let real bugs raise
anything else so they keep their traceback.
"""


class UserError(Exception):
    """A mistake in the user's input, reported as `error: <message>`."""


class FieldError(ValueError):
    """Raised by attrs validators: `field` names the offending attribute."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field} {message}")
        self.field = field
        self.message = message
