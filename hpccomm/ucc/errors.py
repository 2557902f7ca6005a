"""UCC's status codes as Python exceptions."""

from __future__ import annotations

from typing import Any


class UCCError(RuntimeError):
    """A UCC call or collective ended with an error status.

    Args:
        status: UCC's status code (negative).
        message: what failed, followed by UCC's own description of the status.

    Attributes:
        status: UCC's status code.
    """

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def describe(binding: Any, status: int) -> str:
    """UCC's text for ``status`` (``ucc_status_string``)."""
    return binding.ffi.string(binding.lib.ucc_status_string(status)).decode()


def check(binding: Any, status: int, what: str) -> None:
    """Raise :class:`UCCError` unless ``status`` is UCC_OK.

    Args:
        binding: the loaded binding (``.ffi``, ``.lib``).
        status: what a UCC call returned.
        what: the call or operation, for the message.
    """
    if status != binding.lib.UCC_OK:
        raise UCCError(status, f"{what}: {describe(binding, status)} (UCC status {status})")
