"""The one exception type for mistakes a user can fix (bad flags, missing files, bad input)."""


class UserError(Exception):
    """Raised for bad input; the CLI prints its message on one line and exits non-zero."""
