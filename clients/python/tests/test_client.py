"""The Python client against a real server: every method, every error class, sync and async."""
import json
import os
import subprocess
import sys
import threading
import time

import pytest

import skillbox_client as sb
from conftest import ADMIN, ROOT, Server, skill_dir


def admin(server, workspace):
    return sb.Client(server.url, ADMIN, workspace=workspace)


def test_environment_defaults(server, monkeypatch):
    monkeypatch.setenv("SKILLBOX_URL", server.url)
    monkeypatch.setenv("SKILLBOX_TOKEN", ADMIN)
    monkeypatch.setenv("SKILLBOX_WORKSPACE", "envws")
    c = sb.Client()
    assert (c.url, c.workspace) == (server.url, "envws")
    assert c.whoami()["role"] == "admin"
    monkeypatch.delenv("SKILLBOX_TOKEN")
    with pytest.raises(ValueError):
        sb.Client(server.url)


def test_publish_read_revisions_rollback(server, workspace, tmp_path):
    c = admin(server, workspace)
    d = skill_dir(str(tmp_path / "hello"), "hello", "v1", {"notes/a.txt": b"alpha", ".git/HEAD": b"x",
                                                          "cache.pyc": b"x", ".skillignore": b"secret.txt\n",
                                                          "secret.txt": b"no"})
    r1 = c.publish("hello", d)
    assert (r1.revision, r1.digest.startswith("sha256:")) == (1, True)
    # the same packing as the CLI: the same digest
    out = subprocess.run([os.path.join(ROOT, "target", "debug", "skillbox"), "--json", "digest", d],
                         capture_output=True, text=True, check=True)
    assert json.loads(out.stdout)["digest"] == r1.digest
    files = {f["path"] for f in c.revision("hello", 1).manifest}
    assert files == {"SKILL.md", "scripts/run.sh", "notes/a.txt", ".skillignore"}
    assert c.read("hello", "notes/a.txt") == b"alpha"
    # deterministic: the same directory packs to the same bytes
    assert sb.pack_dir(d) == sb.pack_dir(d)

    skill_dir(d, "hello", "v2")
    r2 = c.publish("hello", d)  # base: the current revision, read just before
    assert r2.revision == 2
    archive = c.archive("hello", 1)
    r3 = c.publish("hello", archive, base_revision=2)  # bytes
    assert (r3.revision, r3.digest) == (3, r1.digest)
    path = tmp_path / "v1.tar"
    path.write_bytes(archive)
    with pytest.raises(sb.RevisionConflict) as e:
        c.publish("hello", str(path), base_revision=1)
    assert e.value.current_revision == 3 and e.value.status == 409
    assert [r.revision for r in c.revisions("hello")] == [3, 2, 1]  # newest first
    assert [s.name for s in c.skills()] == ["hello"]
    assert c.skill("hello").current_revision == 3
    c.rollback("hello", 2, base_revision=3)
    assert c.skill("hello").current_revision == 2
    assert c.read("hello", "scripts/run.sh", revision=1) == b'#!/bin/sh\necho "v1"\n'
    with pytest.raises(sb.RevisionConflict):
        c.rollback("hello", 1, base_revision=3)


def test_runs_pin_read_exec_prompt_finish(server, workspace, tmp_path):
    c = admin(server, workspace)
    c.publish("hello", skill_dir(str(tmp_path / "h"), "hello", "v1"))
    with c.create_run(ttl_seconds=600) as run:
        a = run.activate("hello")
        assert (a.revision, a.mount_path.startswith("/skills/")) == (1, True)
        assert "Run scripts/run.sh" in a.instructions
        c.publish("hello", skill_dir(str(tmp_path / "h"), "hello", "v2"))
        assert b"v1" in run.read("hello", "scripts/run.sh")
        r = run.exec(command="./scripts/run.sh", skill="hello")
        assert (r.exit_code, r.stdout, r.timed_out) == (0, "v1\n", False)
        r = run.exec(argv=["cat"], stdin="piped", env={"X": "1"})
        assert r.stdout == "piped"
        assert "<available_skills>" in run.prompt()
        run.heartbeat()
        assert run.state()["state"] == "active"
        with pytest.raises(ValueError):
            run.exec()
    with pytest.raises(sb.SkillboxError):
        run.exec(argv=["true"])  # finished on exit
    with c.create_run(skills=["hello"]) as fresh:
        assert fresh.activate("hello").revision == 2


def test_drafts(server, workspace, tmp_path):
    c = admin(server, workspace)
    c.publish("hello", skill_dir(str(tmp_path / "h"), "hello", "v1"))
    d = c.create_draft("hello", base_revision=1)
    assert c.draft(d.draft_id).base_revision == 1
    c.put_draft_file(d.draft_id, "scripts/run.sh", '#!/bin/sh\necho "drafted"\n')
    c.put_draft_file(d.draft_id, "extra.txt", b"x")
    assert c.read_draft_file(d.draft_id, "extra.txt") == b"x"
    c.delete_draft_file(d.draft_id, "extra.txt")
    r = c.publish_draft(d.draft_id)
    assert r.revision == 2
    assert b"drafted" in c.read("hello", "scripts/run.sh")
    d2 = c.create_draft("hello")
    c.delete_draft(d2.draft_id)
    with pytest.raises(sb.NotFound):
        c.draft(d2.draft_id)
    with c.create_run() as run:
        rd = run.create_draft("hello")
        assert rd.path.startswith("/workspace/skill-drafts/")


def test_every_error_class(server, workspace, tmp_path):
    c = admin(server, workspace)
    c.publish("hello", skill_dir(str(tmp_path / "h"), "hello", "v1"))
    c.publish("other", skill_dir(str(tmp_path / "o"), "other", "o"))
    with pytest.raises(sb.NotFound) as e:
        c.skill("nope")
    assert (e.value.code, e.value.status) == ("not_found", 404)
    with pytest.raises(sb.Unauthorized):
        sb.Client(server.url, "wrong-token", workspace=workspace).skills()
    reader = sb.Client(server.url, c.create_token("reader"), workspace=workspace)
    with pytest.raises(sb.Forbidden):
        reader.publish("hello", skill_dir(str(tmp_path / "h"), "hello", "v9"))
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "SKILL.md").write_text("no frontmatter\n")
    with pytest.raises(sb.InvalidPackage) as e:
        c.publish("bad", str(bad))
    assert e.value.problems and e.value.status == 422
    with pytest.raises(ValueError):
        c.publish("hello", b"not an archive at all" * 20)  # refused before sending
    with c.create_run(skills=["hello"]) as run:
        with pytest.raises(sb.SkillNotAuthorized):
            run.activate("other")
        with pytest.raises(sb.NotActivated):
            run.read("hello", "SKILL.md")
        run.activate("hello")
        with pytest.raises(sb.BadRequest):
            run.exec(argv=[])
        c.publish("hello", skill_dir(str(tmp_path / "h"), "hello", "v2"))
        with pytest.raises(sb.ActivationConflict):
            run.activate("hello", revision=2)
        c.revoke("hello", 1, "leaked")
        with pytest.raises(sb.RevisionRevoked):
            run.read("hello", "SKILL.md")
    with c.create_run(skills=["other"]) as run:
        run.activate("other")
        c.delete("other")
        assert run.read("other", "SKILL.md")  # pinned runs keep working
        with c.create_run() as later:
            with pytest.raises((sb.NotFound, sb.SkillDeleted, sb.SkillNotAuthorized)):
                later.activate("other")
    with pytest.raises(sb.Unavailable):
        sb.Client("http://127.0.0.1:9", ADMIN).skills()
    # The codes a test cannot provoke on one healthy server map to their classes the same way.
    for code, status, cls in [("sandbox_lost", 410, sb.SandboxLost), ("too_large", 413, sb.TooLarge),
                              ("pinned_revision_unavailable", 410, sb.PinnedRevisionUnavailable),
                              ("internal", 500, sb.Internal), ("timeout", 503, sb.Timeout)]:
        err = sb.error_from(status, {"error": {"code": code, "message": "m", "node": "n1"}})
        assert type(err) is cls and err.status == status and issubclass(cls, sb.SkillboxError)
    assert sb.error_from(410, {"error": {"code": "sandbox_lost", "message": "m", "node": "n1"}}).node == "n1"


def test_box_unavailable_without_a_box(tmp_path):
    s = Server(["--box", "none"])
    try:
        c = sb.Client(s.url, ADMIN, workspace="nobox")
        c.publish("hello", skill_dir(str(tmp_path / "h"), "hello", "v1"))
        with c.create_run() as run:
            run.activate("hello")
            with pytest.raises(sb.BoxUnavailable) as e:
                run.exec(argv=["true"])
            assert e.value.status == 503
    finally:
        s.cleanup()


def test_events_resume_after_a_dropped_connection(tmp_path):
    s = Server(["--box", "none"])
    try:
        c = sb.Client(s.url, ADMIN, workspace="ev")
        c.publish("hello", skill_dir(str(tmp_path / "h"), "hello", "v1"))
        seen = []
        done = threading.Event()

        def follow():
            for event in c.events(after=0, follow=True, retry_seconds=0.2):
                seen.append(event)
                if len(seen) == 3:
                    done.set()
                    return

        t = threading.Thread(target=follow, daemon=True)
        t.start()
        deadline = time.time() + 20
        while not seen and time.time() < deadline:
            time.sleep(0.05)
        s.stop()  # the connection drops; the iterator resumes from the last event it gave
        s.start()
        c.publish("hello", skill_dir(str(tmp_path / "h"), "hello", "v2"))
        c.publish("hello", skill_dir(str(tmp_path / "h"), "hello", "v3"))
        assert done.wait(30), [e.raw for e in seen]
        assert [e.seq for e in seen] == [seen[0].seq, seen[0].seq + 1, seen[0].seq + 2]
        assert [e.kind for e in seen] == ["skill.published"] * 3
        assert seen[2].data["revision"] == 3
        backlog = list(c.events(after=0, follow=False))
        assert [e.seq for e in backlog][-3:] == [e.seq for e in seen]
    finally:
        s.cleanup()


async def test_async_client(server, workspace, tmp_path):
    async with sb.AsyncClient(server.url, ADMIN, workspace=workspace) as c:
        r = await c.publish("hello", skill_dir(str(tmp_path / "h"), "hello", "v1"))
        assert r.revision == 1
        assert [s.name for s in await c.skills()] == ["hello"]
        async with await c.create_run() as run:
            assert (await run.activate("hello")).revision == 1
            out = await run.exec(command="./scripts/run.sh", skill="hello")
            assert out.stdout == "v1\n"
            assert b"v1" in await run.read("hello", "scripts/run.sh")
            assert "<available_skills>" in await run.prompt()
        with pytest.raises(sb.NotFound):
            await c.skill("nope")
        events = [e async for e in c.events(after=0, follow=False)]
        assert events and events[0].kind == "skill.published"


def test_installs_in_a_fresh_virtualenv_and_the_agent_loop_runs(server, tmp_path):
    """`pip install ./clients/python` in a new virtualenv, then examples/agent_loop.py."""
    venv = tmp_path / "venv"
    subprocess.run([os.environ.get("SKILLBOX_PYTHON", "python3"), "-m", "venv", str(venv)], check=True)
    package = os.path.join(ROOT, "clients", "python")
    subprocess.run([str(venv / "bin" / "pip"), "install", "-q", package], check=True)
    env = dict(os.environ, SKILLBOX_URL=server.url, SKILLBOX_TOKEN=ADMIN, SKILLBOX_WORKSPACE="agent-demo")
    out = subprocess.run([str(venv / "bin" / "python"), os.path.join(package, "examples", "agent_loop.py"), "--demo",
                          "please greet the user"], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "<available_skills>" in out.stdout
    assert "activated greeter r1" in out.stdout
    assert "Hello, Ada! (from greeter)" in out.stdout
    assert "[run finished]" in out.stdout
    c = sb.Client(server.url, ADMIN, workspace="agent-demo")
    assert c.skill("greeter").current_revision == 1


def test_the_package_type_checks():
    """Typed: mypy finds nothing in the package (its public calls are annotated, `py.typed` ships)."""
    package = os.path.join(ROOT, "clients", "python", "src", "skillbox_client")
    assert os.path.exists(os.path.join(package, "py.typed"))
    out = subprocess.run([sys.executable, "-m", "mypy", package], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr


def test_admin_calls_and_runs_by_id(server, workspace, tmp_path):
    c = admin(server, workspace)
    c.publish("hello", skill_dir(str(tmp_path / "h"), "hello", "v1"))
    run = c.create_run()
    again = c.run(run.id)
    assert again.id == run.id and again.activate("hello").revision == 1
    run.finish()
    assert c.run(run.id).state()["state"] != "active"
    report = c.fsck()
    assert (report["ok"], report["problems"]) == (True, []) and report["revisions_checked"] >= 1
    assert "revisions" in c.gc(dry_run=True, grace_seconds=0)
    runner = sb.Client(server.url, c.create_token("runner"), workspace=workspace)
    assert runner.whoami()["role"] == "runner"
    with pytest.raises(sb.Forbidden):
        runner.gc(dry_run=True)
