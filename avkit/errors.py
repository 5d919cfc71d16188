"""One error type for everything a user can get wrong; the CLI maps it to exit code 2."""


class AvkitError(Exception):
    """Base class: a one-line message that names the file, column, field or argument and the bad value."""


class ConfigError(AvkitError):
    """An invalid option or configuration value."""


class TraceError(AvkitError):
    """A trace file that is missing, unreadable, truncated or does not match the schema."""


class ModelError(AvkitError):
    """A model path/id that cannot be resolved or loaded, or an unsupported architecture."""


class DataError(AvkitError):
    """Invalid numeric input: NaN, out-of-range probabilities, labels outside {0, 1}, empty arrays."""


def first_line(e: BaseException) -> str:
    """The first line of an exception's message (its type's name when empty): what an error line quotes."""
    return (str(e).strip().splitlines() or [type(e).__name__])[0]
