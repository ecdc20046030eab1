"""The MCP server (SPEC §9.1, §8.13) driven by the official MCP Python SDK, over stdio
(`skillbox mcp`) and over Streamable HTTP (`/v1/workspaces/{ws}/mcp`): the session is one run
whose pins hold while new revisions are published; tools per role; errors are tool errors
carrying the SPEC code; the session's end finishes its run. The stateless protocol
(2026-07-28) carries `run_id` from call to call."""
import contextlib
import os
import time

import anyio
import pytest

mcp = pytest.importorskip("mcp")
import httpx2  # noqa: E402
from mcp import ClientSession, StdioServerParameters  # noqa: E402
from mcp.client.stdio import stdio_client  # noqa: E402
from mcp.client.streamable_http import streamable_http_client  # noqa: E402

import skillbox_client as sb  # noqa: E402
from conftest import ADMIN, skill_dir  # noqa: E402

TRANSPORTS = ["stdio", "http"]


def http_client(token):
    return httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"},
                              timeout=httpx2.Timeout(30, read=300))


@contextlib.asynccontextmanager
async def connect(transport, server, token, workspace, skills=(), message_handler=None):
    """An MCP client session (not yet initialized) with the server over `transport`."""
    if transport == "stdio":
        args = ["mcp", "--url", server.url, "--token", token, "-w", workspace]
        for s in skills:
            args += ["--skill", s]
        streams = stdio_client(StdioServerParameters(command=server.bin, args=args,
                                                     env=dict(os.environ, SKILLBOX_LOG="warn")))
    else:
        query = "&".join(f"skill={s}" for s in skills)
        url = f"{server.url}/v1/workspaces/{workspace}/mcp" + (f"?{query}" if query else "")
        streams = streamable_http_client(url, http_client=http_client(token))
    async with streams as (read, write, *_):
        async with ClientSession(read, write, message_handler=message_handler) as session:
            yield session


def text(result):
    return result.content[0].text if result.content else ""


def eventually_finished(c, run_id):
    """Over HTTP the client's DELETE ends the session, and the server then finishes its run."""
    deadline = time.monotonic() + 20
    while c.run(run_id).state()["state"] == "active" and time.monotonic() < deadline:
        time.sleep(0.1)
    return c.run(run_id).state()["state"]


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_a_session_keeps_its_pins_and_ends_its_run(transport, server, workspace, tmp_path):
    c = sb.Client(server.url, ADMIN, workspace=workspace)
    c.publish("hello", skill_dir(str(tmp_path / "h"), "hello", "v1"))
    c.publish("other", skill_dir(str(tmp_path / "o"), "other", "o"))
    notified = anyio.Event()

    async def on_message(message):
        if type(getattr(message, "root", message)).__name__ == "ResourceListChangedNotification":
            notified.set()

    async with connect(transport, server, ADMIN, workspace, ["hello"], on_message) as session:
        init = await session.initialize()
        assert "<available_skills>" in init.instructions and "hello" in init.instructions
        assert "other" not in init.instructions
        tools = {t.name: t for t in (await session.list_tools()).tools}
        assert set(tools) == {"list_skills", "activate_skill", "read_skill_file", "run_command",
                              "create_skill_draft", "publish_skill_draft"}
        assert tools["activate_skill"].input_schema["properties"]["name"]["type"] == "string"

        a = await session.call_tool("activate_skill", {"name": "hello"})
        assert not a.is_error, text(a)
        assert a.structured_content["revision"] == 1
        run_id = a.structured_content["run_id"]
        uris = {str(r.uri) for r in (await session.list_resources()).resources}
        assert uris == {"skill://hello/1/SKILL.md", "skill://hello/1/scripts/run.sh"}, uris
        templates = (await session.list_resource_templates()).resource_templates
        assert [t.uri_template for t in templates] == ["skill://{name}/{revision}/{path}"]
        c.publish("hello", skill_dir(str(tmp_path / "h"), "hello", "v2"))
        with anyio.fail_after(20):
            await notified.wait()  # notifications/resources/list_changed
        read_back = await session.read_resource("skill://hello/1/scripts/run.sh")
        assert "v1" in read_back.contents[0].text
        uris = {str(r.uri) for r in (await session.list_resources()).resources}
        assert "skill://hello/1/SKILL.md" in uris and not any("/2/" in u for u in uris), "a pin moved"
        with pytest.raises(Exception):
            await session.read_resource("skill://hello/2/scripts/run.sh")  # not pinned here
        r = await session.call_tool("read_skill_file", {"name": "hello", "path": "scripts/run.sh"})
        assert "v1" in r.structured_content["text"]
        r = await session.call_tool("run_command", {"command": "./scripts/run.sh", "skill": "hello"})
        assert (r.structured_content["exit_code"], r.structured_content["stdout"]) == (0, "v1\n")
        listed = (await session.call_tool("list_skills", {})).structured_content["skills"]
        assert [(s["name"], s["current_revision"], s.get("pinned_revision")) for s in listed] == [("hello", 2, 1)]

        e = await session.call_tool("activate_skill", {"name": "other"})
        assert e.is_error and text(e).startswith("skill_not_authorized"), text(e)
        assert e.structured_content["error"]["code"] == "skill_not_authorized"
        c.revoke("hello", 1, "leaked")
        e = await session.call_tool("read_skill_file", {"name": "hello", "path": "SKILL.md"})
        assert e.is_error and text(e).startswith("revision_revoked"), text(e)
    # the session ended: its run is finished
    assert eventually_finished(c, run_id) != "active"

    # a new session sees v2
    async with connect(transport, server, ADMIN, workspace) as session:
        await session.initialize()
        a = await session.call_tool("activate_skill", {"name": "hello"})
        assert a.structured_content["revision"] == 2
        # An unknown skill is outside the run's authorized set (every skill at its start).
        e = await session.call_tool("activate_skill", {"name": "nope"})
        assert e.is_error and text(e).startswith("skill_not_authorized"), text(e)


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_tools_are_listed_per_role(transport, server, workspace, tmp_path):
    """A reader's session has no run: it lists skills (its instructions carry the index);
    a runner's has every tool (the server has a box)."""
    c = sb.Client(server.url, ADMIN, workspace=workspace)
    c.publish("hello", skill_dir(str(tmp_path / "h"), "hello", "v1"))
    everything = {"list_skills", "activate_skill", "read_skill_file", "run_command", "create_skill_draft",
                  "publish_skill_draft"}
    for role, expected in [("reader", {"list_skills"}), ("author", {"list_skills"}), ("runner", everything)]:
        token = c.create_token(role)
        async with connect(transport, server, token, workspace) as session:
            init = await session.initialize()
            assert "<name>hello</name>" in init.instructions, (role, init.instructions)
            names = {t.name for t in (await session.list_tools()).tools}
            assert names == expected, (role, names)
            listed = (await session.call_tool("list_skills", {})).structured_content["skills"]
            assert [s["name"] for s in listed] == ["hello"]


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_a_session_drafts_and_publishes_a_revision(transport, server, workspace, tmp_path):
    c = sb.Client(server.url, ADMIN, workspace=workspace)
    c.publish("hello", skill_dir(str(tmp_path / "h"), "hello", "v1"))
    async with connect(transport, server, ADMIN, workspace) as session:
        await session.initialize()
        d = await session.call_tool("create_skill_draft", {"name": "hello"})
        assert not d.is_error, text(d)
        path = d.structured_content["path"]
        edit = f"printf '#!/bin/sh\\necho drafted\\n' > {path}/scripts/run.sh"
        r = await session.call_tool("run_command", {"command": edit})
        assert r.structured_content["exit_code"] == 0, r.structured_content
        p = await session.call_tool("publish_skill_draft", {"draft_id": d.structured_content["draft_id"]})
        assert not p.is_error and p.structured_content["revision"] == 2, text(p)
    assert c.read("hello", "scripts/run.sh") == b"#!/bin/sh\necho drafted\n"


def mcp_url(server, workspace):
    return f"{server.url}/v1/workspaces/{workspace}/mcp"


def rpc(http, url, token, method, params, session_id=None, id=1):
    """One raw JSON-RPC request to the Streamable HTTP endpoint: (HTTP response, its message)."""
    headers = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json",
               "MCP-Protocol-Version": "2025-06-18"}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    if session_id:
        headers["Mcp-Session-Id"] = session_id
    r = http.post(url, headers=headers, json={"jsonrpc": "2.0", "id": id, "method": method, "params": params})
    if r.headers.get("content-type", "").startswith("application/json") and r.status_code == 200:
        return r, r.json()  # one JSON answer instead of an SSE stream
    message = None
    for line in r.text.splitlines():
        if line.startswith("data:") and line[5:].strip():
            message = __import__("json").loads(line[5:])
    return r, message


def test_http_sessions_are_bound_to_their_token(server, workspace, tmp_path):
    """The endpoint takes a workspace token like every route (no token, a wrong one, another
    workspace's: 401, 401, and `not_found` as SPEC §4.11 says), and a session answers only the token that opened it."""
    import httpx
    c = sb.Client(server.url, ADMIN, workspace=workspace)
    c.publish("hello", skill_dir(str(tmp_path / "h"), "hello", "v1"))
    url = mcp_url(server, workspace)
    init = {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}}
    with httpx.Client(timeout=30) as http:
        r, _ = rpc(http, url, None, "initialize", init)
        assert r.status_code == 401 and r.json()["error"]["code"] == "unauthorized", r.text
        r, _ = rpc(http, url, "sbx_wrong", "initialize", init)
        assert r.status_code == 401 and r.json()["error"]["code"] == "unauthorized", r.text
        other = sb.Client(server.url, ADMIN, workspace=workspace + "-other").create_token("runner")
        r, _ = rpc(http, url, other, "initialize", init)
        assert r.status_code == 404 and r.json()["error"]["code"] == "not_found", r.text

        runner, reader = c.create_token("runner"), c.create_token("reader")
        r, m = rpc(http, url, runner, "initialize", init)
        assert r.status_code == 200 and "<name>hello</name>" in m["result"]["instructions"], r.text
        session = r.headers["mcp-session-id"]
        rpc(http, url, runner, "notifications/initialized", {}, session)
        _, m = rpc(http, url, runner, "tools/list", {}, session, id=2)
        assert "activate_skill" in {t["name"] for t in m["result"]["tools"]}, m
        # the reader's token is valid for the workspace, but the session is the runner's
        _, m = rpc(http, url, reader, "tools/call", {"name": "activate_skill", "arguments": {"name": "hello"}},
                   session, id=3)
        assert "error" in m and "another token" in m["error"]["message"], m
        _, m = rpc(http, url, reader, "tools/call", {"name": "read_skill_file",
                                                     "arguments": {"name": "hello", "path": "SKILL.md"}},
                   session, id=4)
        assert "error" in m and "another token" in m["error"]["message"], m
        r = http.delete(url, headers={"Authorization": f"Bearer {runner}", "Mcp-Session-Id": session,
                                      "MCP-Protocol-Version": "2025-06-18"})
        assert r.status_code == 204, r.text


async def test_stateless_calls_carry_their_run(server, workspace, tmp_path):
    """On the stateless protocol (2026-07-28) there is no session: `activate_skill` answers a
    `run_id`, later calls carry it and see that run's pins; a call without one gets a fresh run."""
    from mcp.client.client import Client as McpClient
    c = sb.Client(server.url, ADMIN, workspace=workspace)
    c.publish("hello", skill_dir(str(tmp_path / "h"), "hello", "v1"))
    transport = streamable_http_client(mcp_url(server, workspace), http_client=http_client(ADMIN))
    async with McpClient(transport, mode="2026-07-28") as client:
        names = {t.name for t in (await client.list_tools()).tools}
        assert "activate_skill" in names and "run_command" in names, names
        a = await client.call_tool("activate_skill", {"name": "hello"})
        assert not a.is_error, text(a)
        run_id = a.structured_content["run_id"]
        assert a.structured_content["revision"] == 1
        c.publish("hello", skill_dir(str(tmp_path / "h"), "hello", "v2"))
        r = await client.call_tool("read_skill_file", {"name": "hello", "path": "scripts/run.sh", "run_id": run_id})
        assert not r.is_error and "v1" in r.structured_content["text"], text(r)
        r = await client.call_tool("run_command", {"command": "./scripts/run.sh", "skill": "hello", "run_id": run_id})
        assert r.structured_content["stdout"] == "v1\n", r.structured_content
        listed = (await client.call_tool("list_skills", {"run_id": run_id})).structured_content["skills"]
        assert [(s["name"], s.get("pinned_revision")) for s in listed] == [("hello", 1)]
        # no run_id: a fresh run, where nothing is activated yet
        r = await client.call_tool("read_skill_file", {"name": "hello", "path": "SKILL.md"})
        assert r.is_error and r.structured_content["error"]["code"] == "not_activated", text(r)
        fresh = await client.call_tool("activate_skill", {"name": "hello"})
        assert fresh.structured_content["revision"] == 2 and fresh.structured_content["run_id"] != run_id
    assert c.run(run_id).state()["state"] == "active"  # a stateless run lives by its lease


def test_an_http_session_lives_while_used_and_ends_with_its_lease(server, workspace, tmp_path):
    """`?ttl_seconds=N` is the lease of the session's run: calls keep the session and its run
    alive past it (file reads too, which the endpoint answers as one JSON message each), and a
    session idle for a whole lease ends — its id is unknown (404) and its run is over."""
    import httpx
    c = sb.Client(server.url, ADMIN, workspace=workspace)
    c.publish("hello", skill_dir(str(tmp_path / "h"), "hello", "v1", {"docs/my notes é.md": "héllo\n".encode()}))
    url = mcp_url(server, workspace) + "?ttl_seconds=3"
    init = {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}}
    read = {"name": "read_skill_file", "arguments": {"name": "hello", "path": "scripts/run.sh"}}
    with httpx.Client(timeout=30) as http:
        r, _ = rpc(http, url, ADMIN, "initialize", init)
        session = r.headers["mcp-session-id"]
        rpc(http, url, ADMIN, "notifications/initialized", {}, session)
        _, m = rpc(http, url, ADMIN, "tools/call", {"name": "activate_skill", "arguments": {"name": "hello"}},
                   session, id=2)
        run_id = m["result"]["structuredContent"]["run_id"]
        assert c.run(run_id).state()["ttl_seconds"] == 3
        # a path that must be percent-encoded on its way to the API
        odd = {"name": "read_skill_file", "arguments": {"name": "hello", "path": "docs/my notes é.md"}}
        _, m = rpc(http, url, ADMIN, "tools/call", odd, session, id=5)
        assert m["result"]["structuredContent"].get("text") == "héllo\n", m
        started = time.monotonic()
        i = 10
        while time.monotonic() - started < 7:  # more than two leases
            r, m = rpc(http, url, ADMIN, "tools/call", read, session, id=i)
            assert r.headers["content-type"].startswith("application/json"), r.headers
            assert m["id"] == i and not m["result"].get("isError"), m
            assert m["result"]["structuredContent"] == {"name": "hello", "path": "scripts/run.sh",
                                                         "text": '#!/bin/sh\necho "v1"\n'}, m
            assert m["result"]["content"][0]["type"] == "text", m
            i += 1
            time.sleep(0.3)
        assert c.run(run_id).state()["state"] == "active"
        _, m = rpc(http, url, ADMIN, "tools/list", {}, session, id=3)
        assert "read_skill_file" in {t["name"] for t in m["result"]["tools"]}, m
        time.sleep(5)  # idle: a whole lease and the endpoint's check
        r, _ = rpc(http, url, ADMIN, "tools/call", read, session, id=4)
        assert r.status_code == 404, (r.status_code, r.text)
    assert eventually_finished(c, run_id) != "active"
