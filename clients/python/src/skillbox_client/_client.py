"""`Client` and `AsyncClient`: each API call is written once, as a generator that yields the
request it needs and turns the answer into a result; the sync and async clients only differ in
how they send it."""
from __future__ import annotations

import json
import os
import time
from typing import Any, AsyncIterator, Dict, Generator, Iterator, List, Optional, Sequence, Union
from urllib.parse import quote

import httpx

from ._errors import SkillboxError, Unavailable, error_from
from ._models import Activation, Draft, Event, ExecResult, Revision, Skill
from ._pack import pack_dir, sniff_content_type

Source = Union[str, os.PathLike, bytes]


class _Request:
    def __init__(self, method: str, path: str, json_body: Any = None, content: Optional[bytes] = None,
                 headers: Optional[Dict[str, str]] = None, params: Optional[Dict[str, Any]] = None,
                 raw: bool = False):
        self.method, self.path, self.json_body, self.content = method, path, json_body, content
        self.headers, self.params, self.raw = headers or {}, params, raw


# A call: yields the requests it needs, is sent each parsed answer (or thrown its error).
Call = Generator[_Request, Any, Any]


def _q(segment: str) -> str:
    return quote(str(segment), safe="")


def _answer(resp: httpx.Response, raw: bool) -> Any:
    if resp.status_code >= 400:
        try:
            body = resp.json()
        except ValueError:
            body = resp.text
        raise error_from(resp.status_code, body)
    if raw:
        return resp.content
    return resp.json() if resp.content else None


def _archive(source: Source) -> tuple:
    """(bytes, content type) of a publish source: a directory, an archive path, or bytes."""
    if isinstance(source, bytes):
        return source, sniff_content_type(source)
    path = os.fspath(source)
    if os.path.isdir(path):
        return pack_dir(path), "application/gzip"
    with open(path, "rb") as f:
        data = f.read()
    return data, sniff_content_type(data)


class _Api:
    """The calls, transport-free."""

    def __init__(self, url: Optional[str], token: Optional[str], workspace: Optional[str]):
        url = url or os.environ.get("SKILLBOX_URL") or "http://127.0.0.1:7420"
        token = token or os.environ.get("SKILLBOX_TOKEN")
        if not token:
            raise ValueError("a token is needed: pass token= or set SKILLBOX_TOKEN")
        self.url = url.rstrip("/")
        self.token = token
        self.workspace = workspace or os.environ.get("SKILLBOX_WORKSPACE") or "default"

    def ws(self, rest: str) -> str:
        return f"/v1/workspaces/{_q(self.workspace)}/{rest}"

    # skills and revisions
    def skills(self) -> Call:
        return [Skill(s) for s in (yield _Request("GET", self.ws("skills")))["skills"]]

    def skill(self, name: str) -> Call:
        return Skill((yield _Request("GET", self.ws(f"skills/{_q(name)}"))))

    def revisions(self, name: str) -> Call:
        return [Revision(r) for r in (yield _Request("GET", self.ws(f"skills/{_q(name)}/revisions")))["revisions"]]

    def revision(self, name: str, revision: Union[int, str] = "current") -> Call:
        return Revision((yield _Request("GET", self.ws(f"skills/{_q(name)}/revisions/{revision}"))))

    def read(self, name: str, path: str, revision: Union[int, str] = "current") -> Call:
        return (yield _Request("GET", self.ws(f"skills/{_q(name)}/revisions/{revision}/files/{quote(path)}"), raw=True))

    def archive(self, name: str, revision: Union[int, str] = "current") -> Call:
        return (yield _Request("GET", self.ws(f"skills/{_q(name)}/revisions/{revision}/archive"), raw=True))

    def publish(self, name: str, source: Source, base_revision: Optional[int] = None) -> Call:
        data, ctype = _archive(source)
        if base_revision is None:
            try:
                base_revision = (yield _Request("GET", self.ws(f"skills/{_q(name)}")))["current_revision"]
            except SkillboxError as e:
                if e.code != "not_found":
                    raise
                base_revision = 0
        answer = yield _Request("POST", self.ws(f"skills/{_q(name)}/revisions"), content=data,
                                headers={"content-type": ctype}, params={"base_revision": base_revision})
        return Revision(answer)

    def rollback(self, name: str, revision: int, base_revision: int) -> Call:
        return Skill((yield _Request("PUT", self.ws(f"skills/{_q(name)}/current"),
                                     {"revision": revision, "base_revision": base_revision})) or {})

    def delete(self, name: str) -> Call:
        return (yield _Request("DELETE", self.ws(f"skills/{_q(name)}")))

    def revoke(self, name: str, revision: int, reason: str) -> Call:
        return (yield _Request("POST", self.ws(f"skills/{_q(name)}/revisions/{revision}/revoke"), {"reason": reason}))

    # drafts
    def create_draft(self, skill: str, base_revision: Optional[int] = None) -> Call:
        body: Dict[str, Any] = {"skill": skill}
        if base_revision is not None:
            body["base_revision"] = base_revision
        return Draft((yield _Request("POST", self.ws("drafts"), body)))

    def draft(self, draft_id: str) -> Call:
        return Draft((yield _Request("GET", self.ws(f"drafts/{_q(draft_id)}"))))

    def read_draft_file(self, draft_id: str, path: str) -> Call:
        return (yield _Request("GET", self.ws(f"drafts/{_q(draft_id)}/files/{quote(path)}"), raw=True))

    def put_draft_file(self, draft_id: str, path: str, content: Union[bytes, str]) -> Call:
        data = content.encode() if isinstance(content, str) else content
        return (yield _Request("PUT", self.ws(f"drafts/{_q(draft_id)}/files/{quote(path)}"), content=data,
                               headers={"content-type": "application/octet-stream"}))

    def delete_draft_file(self, draft_id: str, path: str) -> Call:
        return (yield _Request("DELETE", self.ws(f"drafts/{_q(draft_id)}/files/{quote(path)}")))

    def publish_draft(self, draft_id: str) -> Call:
        return Revision((yield _Request("POST", self.ws(f"drafts/{_q(draft_id)}/publish"))))

    def delete_draft(self, draft_id: str) -> Call:
        return (yield _Request("DELETE", self.ws(f"drafts/{_q(draft_id)}")))

    # runs
    def create_run(self, skills: Optional[Sequence[str]] = None, ttl_seconds: Optional[int] = None) -> Call:
        body: Dict[str, Any] = {}
        if skills is not None:
            body["skills"] = list(skills)
        if ttl_seconds is not None:
            body["ttl_seconds"] = ttl_seconds
        return (yield _Request("POST", self.ws("runs"), body))

    def run_info(self, run_id: str) -> Call:
        return (yield _Request("GET", self.ws(f"runs/{_q(run_id)}")))

    def activate(self, run_id: str, name: str, revision: Optional[int] = None) -> Call:
        body: Dict[str, Any] = {"skill": name}
        if revision is not None:
            body["revision"] = revision
        return Activation((yield _Request("POST", self.ws(f"runs/{_q(run_id)}/activations"), body)))

    def run_read(self, run_id: str, name: str, path: str) -> Call:
        return (yield _Request("GET", self.ws(f"runs/{_q(run_id)}/skills/{_q(name)}/files/{quote(path)}"), raw=True))

    def exec(self, run_id: str, argv: Optional[Sequence[str]] = None, command: Optional[str] = None,
             skill: Optional[str] = None, cwd: Optional[str] = None, env: Optional[Dict[str, str]] = None,
             stdin: Optional[str] = None, timeout_ms: Optional[int] = None) -> Call:
        if (argv is None) == (command is None):
            raise ValueError("give exactly one of argv or command")
        body: Dict[str, Any] = {"argv": list(argv)} if argv is not None else {"command": command}
        for key, value in (("skill", skill), ("cwd", cwd), ("env", env), ("stdin", stdin), ("timeout_ms", timeout_ms)):
            if value is not None:
                body[key] = value
        return ExecResult((yield _Request("POST", self.ws(f"runs/{_q(run_id)}/exec"), body)))

    def prompt(self, run_id: str) -> Call:
        return (yield _Request("GET", self.ws(f"runs/{_q(run_id)}/prompt")))["prompt"]

    def heartbeat(self, run_id: str) -> Call:
        return (yield _Request("POST", self.ws(f"runs/{_q(run_id)}/heartbeat")))

    def finish(self, run_id: str) -> Call:
        return (yield _Request("DELETE", self.ws(f"runs/{_q(run_id)}")))

    def create_run_draft(self, run_id: str, skill: str, base_revision: Optional[int] = None) -> Call:
        body: Dict[str, Any] = {"skill": skill}
        if base_revision is not None:
            body["base_revision"] = base_revision
        return Draft((yield _Request("POST", self.ws(f"runs/{_q(run_id)}/drafts"), body)))

    # tokens and administration
    def whoami(self) -> Call:
        return (yield _Request("GET", "/v1/whoami"))

    def create_token(self, role: str, workspace: Optional[str] = None) -> Call:
        body: Dict[str, Any] = {"role": role}
        if role != "node":
            body["workspace"] = workspace or self.workspace
        return (yield _Request("POST", "/v1/admin/tokens", body))["token"]

    def gc(self, dry_run: bool = False, grace_seconds: Optional[int] = None) -> Call:
        body: Dict[str, Any] = {"dry_run": dry_run}
        if grace_seconds is not None:
            body["grace_seconds"] = grace_seconds
        return (yield _Request("POST", "/v1/admin/gc", body))

    def fsck(self) -> Call:
        return (yield _Request("POST", "/v1/admin/fsck"))


def _advance(call: Call, req: _Request, resp: httpx.Response) -> _Request:
    """Hands `resp` (its parsed answer, or its error) to the call; the next request it needs.
    Raises `StopIteration` with the call's result when it is done."""
    try:
        result = _answer(resp, req.raw)
    except SkillboxError as e:
        return call.throw(e)
    return call.send(result)


class _SseParser:
    """Events out of Server-Sent Events lines, fed one line at a time."""

    def __init__(self) -> None:
        self._data: List[str] = []

    def feed(self, line: str) -> Optional[Event]:
        if line == "":
            data, self._data = self._data, []
            return Event(json.loads("\n".join(data))) if data else None
        if line.startswith("data:"):
            self._data.append(line[5:].lstrip(" "))
        return None


class _Base:
    _http: Any
    url: str

    def _unreachable(self, e: Exception) -> Unavailable:
        return Unavailable("unavailable", 0, f"cannot reach {self.url}: {e}")

    def _build(self, req: _Request) -> httpx.Request:
        return self._http.build_request(req.method, req.path, json=req.json_body if req.content is None else None,
                                        content=req.content, headers=req.headers, params=req.params)


class Client(_Base):
    """A synchronous client of one workspace.

    `Client(url, token, workspace="default")`; omitted arguments come from `SKILLBOX_URL`,
    `SKILLBOX_TOKEN` and `SKILLBOX_WORKSPACE`."""

    def __init__(self, url: Optional[str] = None, token: Optional[str] = None, workspace: Optional[str] = None,
                 timeout: float = 120.0):
        self._api = _Api(url, token, workspace)
        self.url, self.workspace = self._api.url, self._api.workspace
        self._http = httpx.Client(base_url=self._api.url, timeout=timeout,
                                  headers={"authorization": f"Bearer {self._api.token}"})

    def _drive(self, call: Call) -> Any:
        try:
            req = next(call)
            while True:
                try:
                    resp = self._http.send(self._build(req))
                except httpx.TransportError as e:
                    raise self._unreachable(e) from e
                req = _advance(call, req, resp)
        except StopIteration as done:
            return done.value

    def skills(self) -> List[Skill]:
        return self._drive(self._api.skills())  # type: ignore[no-any-return]

    def skill(self, name: str) -> Skill:
        return self._drive(self._api.skill(name))  # type: ignore[no-any-return]

    def revisions(self, name: str) -> List[Revision]:
        return self._drive(self._api.revisions(name))  # type: ignore[no-any-return]

    def revision(self, name: str, revision: Union[int, str] = "current") -> Revision:
        return self._drive(self._api.revision(name, revision))  # type: ignore[no-any-return]

    def read(self, name: str, path: str, revision: Union[int, str] = "current") -> bytes:
        """A file of a revision (`"current"` or a number)."""
        return self._drive(self._api.read(name, path, revision))  # type: ignore[no-any-return]

    def archive(self, name: str, revision: Union[int, str] = "current") -> bytes:
        return self._drive(self._api.archive(name, revision))  # type: ignore[no-any-return]

    def publish(self, name: str, source: Source, base_revision: Optional[int] = None) -> Revision:
        """Publishes `source` (a directory, an archive path, or bytes) as a new revision of `name`;
        `base_revision=None` means the skill's current revision as read just before (0 for a new skill)."""
        return self._drive(self._api.publish(name, source, base_revision))  # type: ignore[no-any-return]

    def rollback(self, name: str, revision: int, base_revision: int) -> Skill:
        """Moves the current pointer to `revision` if it is still `base_revision` (compare-and-swap)."""
        return self._drive(self._api.rollback(name, revision, base_revision))  # type: ignore[no-any-return]

    def delete(self, name: str) -> Any:
        return self._drive(self._api.delete(name))  # type: ignore[no-any-return]

    def revoke(self, name: str, revision: int, reason: str) -> Any:
        return self._drive(self._api.revoke(name, revision, reason))  # type: ignore[no-any-return]

    def create_draft(self, skill: str, base_revision: Optional[int] = None) -> Draft:
        return self._drive(self._api.create_draft(skill, base_revision))  # type: ignore[no-any-return]

    def draft(self, draft_id: str) -> Draft:
        return self._drive(self._api.draft(draft_id))  # type: ignore[no-any-return]

    def read_draft_file(self, draft_id: str, path: str) -> bytes:
        return self._drive(self._api.read_draft_file(draft_id, path))  # type: ignore[no-any-return]

    def put_draft_file(self, draft_id: str, path: str, content: Union[bytes, str]) -> Any:
        return self._drive(self._api.put_draft_file(draft_id, path, content))  # type: ignore[no-any-return]

    def delete_draft_file(self, draft_id: str, path: str) -> Any:
        return self._drive(self._api.delete_draft_file(draft_id, path))  # type: ignore[no-any-return]

    def publish_draft(self, draft_id: str) -> Revision:
        return self._drive(self._api.publish_draft(draft_id))  # type: ignore[no-any-return]

    def delete_draft(self, draft_id: str) -> Any:
        return self._drive(self._api.delete_draft(draft_id))  # type: ignore[no-any-return]

    def whoami(self) -> Dict[str, Any]:
        return self._drive(self._api.whoami())  # type: ignore[no-any-return]

    def create_token(self, role: str, workspace: Optional[str] = None) -> str:
        """Mints a token of `role` for `workspace` (this client's by default); admin only."""
        return self._drive(self._api.create_token(role, workspace))  # type: ignore[no-any-return]

    def gc(self, dry_run: bool = False, grace_seconds: Optional[int] = None) -> Dict[str, Any]:
        return self._drive(self._api.gc(dry_run, grace_seconds))  # type: ignore[no-any-return]

    def fsck(self) -> Dict[str, Any]:
        return self._drive(self._api.fsck())  # type: ignore[no-any-return]

    def create_run(self, skills: Optional[Sequence[str]] = None, ttl_seconds: Optional[int] = None) -> "Run":
        """A run (a context manager that finishes it on exit)."""
        return Run(self, self._drive(self._api.create_run(skills, ttl_seconds)))

    def run(self, run_id: str) -> "Run":
        """An existing run by id."""
        return Run(self, self._drive(self._api.run_info(run_id)))

    def events(self, after: int = 0, follow: bool = True, retry_seconds: float = 1.0) -> Iterator[Event]:
        """The event log from `after` on; with `follow`, waits for new events and resumes after a
        dropped connection from the last event it gave."""
        last = after
        while True:
            try:
                with self._http.stream("GET", self._api.ws("events"),
                                       params={"after": last, "follow": str(follow).lower()},
                                       timeout=httpx.Timeout(30.0, read=None)) as resp:
                    if resp.status_code >= 400:
                        resp.read()
                        _answer(resp, False)
                    parser = _SseParser()
                    for line in resp.iter_lines():
                        event = parser.feed(line)
                        if event is not None:
                            last = event.seq
                            yield event
                if not follow:
                    return
            except httpx.TransportError:
                if not follow:
                    raise
            time.sleep(retry_seconds)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class Run:
    """A run of a `Client`: pins skills at activation; `with` finishes it on exit."""

    def __init__(self, client: Client, info: Dict[str, Any]):
        self._c = client
        self.id: str = info["run_id"] if "run_id" in info else info["id"]
        self.info = info

    def activate(self, name: str, revision: Optional[int] = None) -> Activation:
        return self._c._drive(self._c._api.activate(self.id, name, revision))

    def read(self, name: str, path: str) -> bytes:
        return self._c._drive(self._c._api.run_read(self.id, name, path))

    def exec(self, argv: Optional[Sequence[str]] = None, command: Optional[str] = None, skill: Optional[str] = None,
             cwd: Optional[str] = None, env: Optional[Dict[str, str]] = None, stdin: Optional[str] = None,
             timeout_ms: Optional[int] = None) -> ExecResult:
        return self._c._drive(self._c._api.exec(self.id, argv, command, skill, cwd, env, stdin, timeout_ms))

    def prompt(self) -> str:
        return self._c._drive(self._c._api.prompt(self.id))

    def heartbeat(self) -> Any:
        return self._c._drive(self._c._api.heartbeat(self.id))

    def create_draft(self, skill: str, base_revision: Optional[int] = None) -> Draft:
        return self._c._drive(self._c._api.create_run_draft(self.id, skill, base_revision))

    def state(self) -> Dict[str, Any]:
        return self._c._drive(self._c._api.run_info(self.id))

    def finish(self) -> Any:
        return self._c._drive(self._c._api.finish(self.id))

    def __enter__(self) -> "Run":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.finish()


class AsyncClient(_Base):
    """The asynchronous twin of `Client`: the same names, awaited."""

    def __init__(self, url: Optional[str] = None, token: Optional[str] = None, workspace: Optional[str] = None,
                 timeout: float = 120.0):
        self._api = _Api(url, token, workspace)
        self.url, self.workspace = self._api.url, self._api.workspace
        self._http = httpx.AsyncClient(base_url=self._api.url, timeout=timeout,
                                       headers={"authorization": f"Bearer {self._api.token}"})

    async def _drive(self, call: Call) -> Any:
        try:
            req = next(call)
            while True:
                try:
                    resp = await self._http.send(self._build(req))
                except httpx.TransportError as e:
                    raise self._unreachable(e) from e
                req = _advance(call, req, resp)
        except StopIteration as done:
            return done.value

    async def skills(self) -> List[Skill]:
        return await self._drive(self._api.skills())  # type: ignore[no-any-return]

    async def skill(self, name: str) -> Skill:
        return await self._drive(self._api.skill(name))  # type: ignore[no-any-return]

    async def revisions(self, name: str) -> List[Revision]:
        return await self._drive(self._api.revisions(name))  # type: ignore[no-any-return]

    async def revision(self, name: str, revision: Union[int, str] = "current") -> Revision:
        return await self._drive(self._api.revision(name, revision))  # type: ignore[no-any-return]

    async def read(self, name: str, path: str, revision: Union[int, str] = "current") -> bytes:
        """A file of a revision (`"current"` or a number)."""
        return await self._drive(self._api.read(name, path, revision))  # type: ignore[no-any-return]

    async def archive(self, name: str, revision: Union[int, str] = "current") -> bytes:
        return await self._drive(self._api.archive(name, revision))  # type: ignore[no-any-return]

    async def publish(self, name: str, source: Source, base_revision: Optional[int] = None) -> Revision:
        """Publishes `source` (a directory, an archive path, or bytes) as a new revision of `name`;
        `base_revision=None` means the skill's current revision as read just before (0 for a new skill)."""
        return await self._drive(self._api.publish(name, source, base_revision))  # type: ignore[no-any-return]

    async def rollback(self, name: str, revision: int, base_revision: int) -> Skill:
        """Moves the current pointer to `revision` if it is still `base_revision` (compare-and-swap)."""
        return await self._drive(self._api.rollback(name, revision, base_revision))  # type: ignore[no-any-return]

    async def delete(self, name: str) -> Any:
        return await self._drive(self._api.delete(name))  # type: ignore[no-any-return]

    async def revoke(self, name: str, revision: int, reason: str) -> Any:
        return await self._drive(self._api.revoke(name, revision, reason))  # type: ignore[no-any-return]

    async def create_draft(self, skill: str, base_revision: Optional[int] = None) -> Draft:
        return await self._drive(self._api.create_draft(skill, base_revision))  # type: ignore[no-any-return]

    async def draft(self, draft_id: str) -> Draft:
        return await self._drive(self._api.draft(draft_id))  # type: ignore[no-any-return]

    async def read_draft_file(self, draft_id: str, path: str) -> bytes:
        return await self._drive(self._api.read_draft_file(draft_id, path))  # type: ignore[no-any-return]

    async def put_draft_file(self, draft_id: str, path: str, content: Union[bytes, str]) -> Any:
        return await self._drive(self._api.put_draft_file(draft_id, path, content))  # type: ignore[no-any-return]

    async def delete_draft_file(self, draft_id: str, path: str) -> Any:
        return await self._drive(self._api.delete_draft_file(draft_id, path))  # type: ignore[no-any-return]

    async def publish_draft(self, draft_id: str) -> Revision:
        return await self._drive(self._api.publish_draft(draft_id))  # type: ignore[no-any-return]

    async def delete_draft(self, draft_id: str) -> Any:
        return await self._drive(self._api.delete_draft(draft_id))  # type: ignore[no-any-return]

    async def whoami(self) -> Dict[str, Any]:
        return await self._drive(self._api.whoami())  # type: ignore[no-any-return]

    async def create_token(self, role: str, workspace: Optional[str] = None) -> str:
        """Mints a token of `role` for `workspace` (this client's by default); admin only."""
        return await self._drive(self._api.create_token(role, workspace))  # type: ignore[no-any-return]

    async def gc(self, dry_run: bool = False, grace_seconds: Optional[int] = None) -> Dict[str, Any]:
        return await self._drive(self._api.gc(dry_run, grace_seconds))  # type: ignore[no-any-return]

    async def fsck(self) -> Dict[str, Any]:
        return await self._drive(self._api.fsck())  # type: ignore[no-any-return]

    async def create_run(self, skills: Optional[Sequence[str]] = None, ttl_seconds: Optional[int] = None) -> "AsyncRun":
        return AsyncRun(self, await self._drive(self._api.create_run(skills, ttl_seconds)))

    async def run(self, run_id: str) -> "AsyncRun":
        return AsyncRun(self, await self._drive(self._api.run_info(run_id)))

    async def events(self, after: int = 0, follow: bool = True, retry_seconds: float = 1.0) -> AsyncIterator[Event]:
        import asyncio
        last = after
        while True:
            try:
                async with self._http.stream("GET", self._api.ws("events"),
                                             params={"after": last, "follow": str(follow).lower()},
                                             timeout=httpx.Timeout(30.0, read=None)) as resp:
                    if resp.status_code >= 400:
                        await resp.aread()
                        _answer(resp, False)
                    parser = _SseParser()
                    async for line in resp.aiter_lines():
                        event = parser.feed(line)
                        if event is not None:
                            last = event.seq
                            yield event
                if not follow:
                    return
            except httpx.TransportError:
                if not follow:
                    raise
            await asyncio.sleep(retry_seconds)

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> "AsyncClient":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.aclose()


class AsyncRun:
    """A run of an `AsyncClient`; `async with` finishes it on exit."""

    def __init__(self, client: AsyncClient, info: Dict[str, Any]):
        self._c = client
        self.id: str = info["run_id"] if "run_id" in info else info["id"]
        self.info = info

    async def activate(self, name: str, revision: Optional[int] = None) -> Activation:
        return await self._c._drive(self._c._api.activate(self.id, name, revision))

    async def read(self, name: str, path: str) -> bytes:
        return await self._c._drive(self._c._api.run_read(self.id, name, path))

    async def exec(self, argv: Optional[Sequence[str]] = None, command: Optional[str] = None,
                   skill: Optional[str] = None, cwd: Optional[str] = None, env: Optional[Dict[str, str]] = None,
                   stdin: Optional[str] = None, timeout_ms: Optional[int] = None) -> ExecResult:
        return await self._c._drive(self._c._api.exec(self.id, argv, command, skill, cwd, env, stdin, timeout_ms))

    async def prompt(self) -> str:
        return await self._c._drive(self._c._api.prompt(self.id))

    async def heartbeat(self) -> Any:
        return await self._c._drive(self._c._api.heartbeat(self.id))

    async def create_draft(self, skill: str, base_revision: Optional[int] = None) -> Draft:
        return await self._c._drive(self._c._api.create_run_draft(self.id, skill, base_revision))

    async def state(self) -> Dict[str, Any]:
        return await self._c._drive(self._c._api.run_info(self.id))

    async def finish(self) -> Any:
        return await self._c._drive(self._c._api.finish(self.id))

    async def __aenter__(self) -> "AsyncRun":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.finish()
