"""Errors: one class per SPEC error code, all `SkillboxError`s."""
from __future__ import annotations

from typing import Any, Dict, List, Optional, Type


class SkillboxError(Exception):
    """An error answer of the server (or a transport failure, code `unavailable`)."""

    def __init__(self, code: str, status: int, message: str, details: Optional[Dict[str, Any]] = None):
        super().__init__(f"{code} ({status}): {message}")
        self.code = code
        self.status = status
        self.message = message
        self.details: Dict[str, Any] = details or {}


class BadRequest(SkillboxError): pass
class Unauthorized(SkillboxError): pass
class Forbidden(SkillboxError): pass
class SkillNotAuthorized(SkillboxError): pass
class NotFound(SkillboxError): pass
class NotActivated(SkillboxError): pass
class ActivationConflict(SkillboxError): pass
class SkillDeleted(SkillboxError): pass
class RevisionRevoked(SkillboxError): pass
class PinnedRevisionUnavailable(SkillboxError): pass
class TooLarge(SkillboxError): pass
class BoxUnavailable(SkillboxError): pass
class Internal(SkillboxError): pass
class Timeout(SkillboxError): pass
class Unavailable(SkillboxError): pass


class RevisionConflict(SkillboxError):
    """The base revision was not current: `.current_revision` is."""

    @property
    def current_revision(self) -> Optional[int]:
        return self.details.get("current_revision")


class InvalidPackage(SkillboxError):
    """The package was refused: `.problems` lists each problem (path, field, message)."""

    @property
    def problems(self) -> List[Dict[str, Any]]:
        return list(self.details.get("problems") or [])


class SandboxLost(SkillboxError):
    """The run's sandbox was on a node that is lost: `.node` names it."""

    @property
    def node(self) -> Optional[str]:
        return self.details.get("node")


ERRORS: Dict[str, Type[SkillboxError]] = {
    "bad_request": BadRequest,
    "unauthorized": Unauthorized,
    "forbidden": Forbidden,
    "skill_not_authorized": SkillNotAuthorized,
    "not_found": NotFound,
    "not_activated": NotActivated,
    "revision_conflict": RevisionConflict,
    "activation_conflict": ActivationConflict,
    "skill_deleted": SkillDeleted,
    "revision_revoked": RevisionRevoked,
    "pinned_revision_unavailable": PinnedRevisionUnavailable,
    "too_large": TooLarge,
    "invalid_package": InvalidPackage,
    "box_unavailable": BoxUnavailable,
    "sandbox_lost": SandboxLost,
    "internal": Internal,
    "timeout": Timeout,
    "unavailable": Unavailable,
}


def error_from(status: int, body: Any) -> SkillboxError:
    """The exception for an error answer (`{"error": {"code", "message", ...}}`)."""
    err = body.get("error") if isinstance(body, dict) else None
    if not isinstance(err, dict):
        return SkillboxError("http_error", status, f"HTTP {status}: {str(body)[:200]}")
    details = {k: v for k, v in err.items() if k not in ("code", "message")}
    code = str(err.get("code", "unknown"))
    return ERRORS.get(code, SkillboxError)(code, status, str(err.get("message", "")), details)
