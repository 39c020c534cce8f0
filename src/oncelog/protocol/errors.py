"""Kafka error codes (from kio, generated from Kafka's own definitions) and protocol exceptions."""

from __future__ import annotations

from kio.schema.errors import ErrorCode

__all__ = ["ErrorCode", "MalformedRequestError", "UnknownApiKeyError", "UnsupportedVersionError"]


class MalformedRequestError(Exception):
    """A request frame that cannot be parsed; the connection is closed (Kafka does the same)."""


class UnsupportedVersionError(Exception):
    """A known API at a version we do not serve. Answered with UNSUPPORTED_VERSION where possible."""

    def __init__(self, api_key: int, api_version: int, correlation_id: int) -> None:
        super().__init__(f"api_key {api_key} version {api_version} is not supported")
        self.api_key = api_key
        self.api_version = api_version
        self.correlation_id = correlation_id


class UnknownApiKeyError(UnsupportedVersionError):
    """An API key we do not implement at all."""
