"""Errors a user can act on. The CLI prints them as one line and exits 2; no traceback unless --verbose."""


class FullgraphError(Exception):
    """Bad input or an unusable environment: the message names the problem and the fix."""


class UsageError(FullgraphError, ValueError):
    """An argument that cannot be used as given."""
