"""The errors a user can cause, each carrying one line that names the problem and the fix.

Command-line entry points catch `UserError` and print its message alone (no traceback),
then exit with status 2; everything already written to disk stays there.
"""


class UserError(Exception):
    """Base class: bad input from the user, not a bug in the library."""


class ConfigError(UserError, ValueError):
    """An impossible or unknown model/experiment configuration."""


class DataError(UserError, RuntimeError):
    """The corpus is missing, corrupt, or cannot be fetched."""


class CheckpointError(UserError, RuntimeError):
    """A checkpoint does not match the model or run it is restored into."""
