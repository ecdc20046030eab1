"""`skillbox mcp` (SPEC §9.1, §8.13, stdio) driven by the official MCP Python SDK: the session
is one run whose pins hold while new revisions are published; tools per role; errors are tool
errors carrying the SPEC code; the session's end finishes its run."""
import os

import anyio
import pytest

mcp = pytest.importorskip("mcp")
from mcp import ClientSession, StdioServerParameters  # noqa: E402
from mcp.client.stdio import stdio_client  # noqa: E402

import skillbox_client as sb  # noqa: E402
from conftest import ADMIN, skill_dir  # noqa: E402


def params(server, token, workspace, *extra):
    return StdioServerParameters(command=server.bin, args=["mcp", "--url", server.url, "--token", token,
                                                           "-w", workspace, *extra],
                                 env=dict(os.environ, SKILLBOX_LOG="warn"))


def text(result):
    return result.content[0].text if result.content else ""


async def test_a_session_keeps_its_pins_and_ends_its_run(server, workspace, tmp_path):
    c = sb.Client(server.url, ADMIN, workspace=workspace)
    c.publish("hello", skill_dir(str(tmp_path / "h"), "hello", "v1"))
    c.publish("other", skill_dir(str(tmp_path / "o"), "other", "o"))
    notified = anyio.Event()

    async def on_message(message):
        if type(getattr(message, "root", message)).__name__ == "ResourceListChangedNotification":
            notified.set()

    async with stdio_client(params(server, ADMIN, workspace, "--skill", "hello")) as (read, write):
        async with ClientSession(read, write, message_handler=on_message) as session:
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
    assert c.run(run_id).state()["state"] != "active"

    # a new session sees v2
    async with stdio_client(params(server, ADMIN, workspace)) as (read, write):
        async with ClientSession(read, write) as session:
            await session.initialize()
            a = await session.call_tool("activate_skill", {"name": "hello"})
            assert a.structured_content["revision"] == 2
            # An unknown skill is outside the run's authorized set (every skill at its start).
            e = await session.call_tool("activate_skill", {"name": "nope"})
            assert e.is_error and text(e).startswith("skill_not_authorized"), text(e)


async def test_tools_are_listed_per_role(server, workspace, tmp_path):
    """A reader's session has no run: it lists skills (its instructions carry the index);
    a runner's has every tool (the server has a box)."""
    c = sb.Client(server.url, ADMIN, workspace=workspace)
    c.publish("hello", skill_dir(str(tmp_path / "h"), "hello", "v1"))
    everything = {"list_skills", "activate_skill", "read_skill_file", "run_command", "create_skill_draft",
                  "publish_skill_draft"}
    for role, expected in [("reader", {"list_skills"}), ("author", {"list_skills"}), ("runner", everything)]:
        token = c.create_token(role)
        async with stdio_client(params(server, token, workspace)) as (read, write):
            async with ClientSession(read, write) as session:
                init = await session.initialize()
                assert "<name>hello</name>" in init.instructions, (role, init.instructions)
                names = {t.name for t in (await session.list_tools()).tools}
                assert names == expected, (role, names)
                listed = (await session.call_tool("list_skills", {})).structured_content["skills"]
                assert [s["name"] for s in listed] == ["hello"]


async def test_a_session_drafts_and_publishes_a_revision(server, workspace, tmp_path):
    c = sb.Client(server.url, ADMIN, workspace=workspace)
    c.publish("hello", skill_dir(str(tmp_path / "h"), "hello", "v1"))
    async with stdio_client(params(server, ADMIN, workspace)) as (read, write):
        async with ClientSession(read, write) as session:
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
