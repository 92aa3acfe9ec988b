"""The one error type of the command line."""


class CLIError(Exception):
    """A user-facing error: printed as ``minivllm: error: <message>``, exit status 2."""
