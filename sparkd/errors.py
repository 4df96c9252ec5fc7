"""One error tree for the supervisor. Messages say "could not <verb> <object>: <cause>"."""


class SparkdError(Exception):
    """Base of every error sparkd reports to a user; str(err) is the whole message."""


class PolicyError(SparkdError):
    """The policy file is missing, malformed or invalid."""


class PlacementError(SparkdError):
    """A placement backend could not create, start, stop or inspect a service."""


class GuardRefusal(SparkdError):
    """A start guard refused to start a service; `culprits` lists what decided it."""

    def __init__(self, message: str, culprits: list[dict] | None = None):
        super().__init__(message)
        self.culprits = culprits or []


class ControlError(SparkdError):
    """The control socket could not be reached or answered with an error."""
