"""Answers as objects: every field of the JSON answer is an attribute (unknown ones too)."""
from __future__ import annotations

from typing import Any, Dict


class Record:
    """A JSON object whose fields read as attributes; `.raw` is the object itself."""

    def __init__(self, raw: Dict[str, Any]):
        self.raw = raw

    def __getattr__(self, name: str) -> Any:
        try:
            return self.raw[name]
        except KeyError:
            raise AttributeError(name) from None

    def __getitem__(self, name: str) -> Any:
        return self.raw[name]

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.raw!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Record) and self.raw == other.raw


class Skill(Record):
    """A skill: `.name`, `.description`, `.current_revision`, `.current_digest`, `.state`, …"""


class Revision(Record):
    """A revision: `.revision`, `.digest`, and what the answer carries (`.manifest`, …)."""


class Activation(Record):
    """A pinned activation: `.skill`, `.revision`, `.digest`, `.instructions`, `.files`, `.mount_path`."""


class ExecResult(Record):
    """An execution: `.exit_code`, `.stdout`, `.stderr`, `.timed_out`, `.backend`, `.packages`, …"""


class Draft(Record):
    """A draft: `.draft_id`, `.skill`, `.base_revision` (a run draft also `.path`)."""


class Event(Record):
    """An event of the log: `.seq`, `.kind`, `.at`, `.data` (the event's JSON object)."""
