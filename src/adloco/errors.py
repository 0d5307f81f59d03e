"""Errors a user can cause and fix: reported as one line, exit code 2, no traceback (unless --debug)."""


class UserError(Exception):
    """Bad input: a config field, a file, an impossible size. The message names it and what is allowed."""


class PeerFailed(UserError):
    """Another rank failed at start-up and already said why; this one exits quietly."""
