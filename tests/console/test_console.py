"""The web console (SPEC §10, §8.14) in headless Chromium against a real server: sign in,
publish by file upload, browse, diff, roll back (and see a conflict), live events, role-aware
controls, a refused token, runs and administration."""
import io
import os
import subprocess
import tarfile

import skillbox_client as sb
from conftest import ADMIN, shot, sign_in, skill_dir


def tar_gz_of(directory):
    """The package directory as a .tar.gz, its files at the archive's root."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as t:
        for root, _, files in os.walk(directory):
            for f in sorted(files):
                full = os.path.join(root, f)
                t.add(full, arcname=os.path.relpath(full, directory))
    return buf.getvalue()


def publish_in_page(page, name, archive_path):
    page.click("#nav a[data-nav=publish]")
    page.fill("#skill-name", name)
    page.set_input_files("#archive-file", archive_path)
    page.click("#publish-button")


def test_publish_browse_diff_and_roll_back(page, server, workspace, tmp_path):
    c = sb.Client(server.url, ADMIN, workspace=workspace)
    sign_in(page, server, c.create_token("admin"))
    page.wait_for_selector("#skills")

    # publish v1 by uploading a .tar.gz; the new revision opens, SKILL.md rendered
    v1 = tmp_path / "hello-v1.tar.gz"
    v1.write_bytes(tar_gz_of(skill_dir(str(tmp_path / "h1"), "hello", "v1")))
    publish_in_page(page, "hello", str(v1))
    page.wait_for_selector("#skill-md")
    assert "hello r1" in page.inner_text("h1")
    assert "Run scripts/run.sh." in page.inner_text("#skill-md")
    shot(page, "revision")
    assert "Says v1." in page.inner_text("table.frontmatter")
    page.click("nav.tree a[data-path='scripts/run.sh']")
    page.wait_for_selector("#file-text")
    assert 'echo "v1"' in page.inner_text("#file-text")

    # v2 through the page too
    v2 = tmp_path / "hello-v2.tar.gz"
    v2.write_bytes(tar_gz_of(skill_dir(str(tmp_path / "h2"), "hello", "v2", {"data.bin": b"\x00\x01binary"})))
    publish_in_page(page, "hello", str(v2))
    page.wait_for_selector("text=hello r2")

    # diff r1 → r2: the changed line, and the per-file summary
    page.select_option("#diff-against", "1")
    page.click("#diff-go")
    # files are diffed one after another (SKILL.md first): wait for the one checked below
    run_sh = "section[id='diff-scripts/run.sh'] table.diff"
    page.wait_for_selector(run_sh)
    summary = page.inner_text("#diff-summary")
    assert "scripts/run.sh" in summary and "modified" in summary and "data.bin" in summary and "added" in summary
    added = page.locator(f"{run_sh} tr.add").all_inner_texts()
    removed = page.locator(f"{run_sh} tr.del").all_inner_texts()
    assert any('echo "v2"' in t for t in added), added
    assert any('echo "v1"' in t for t in removed), removed
    shot(page, "diff-unified")
    page.click("text=Side by side")
    page.wait_for_selector(f"{run_sh}.side")
    assert any('echo "v2"' in t for t in page.locator(f"{run_sh}.side td.add").all_inner_texts())

    # roll back to r1: the pointer moves
    page.goto(f"{server.url}/ui/#/skills/hello")
    page.wait_for_selector("#current-revision")
    assert page.inner_text("#current-revision") == "r2"
    page.click("button[data-rollback='1']")
    page.wait_for_selector("#current-revision:text-is('r1')")
    assert c.skill("hello").current_revision == 1

    # a conflicting rollback: the pointer moves elsewhere after the page loaded
    c.rollback("hello", 2, base_revision=1)
    page.click("button[data-rollback='2']")
    conflict = page.wait_for_selector("#conflict")
    assert "Conflict" in conflict.inner_text() and "r2" in conflict.inner_text()
    assert c.skill("hello").current_revision == 2  # nothing changed by the refused rollback


def test_an_invalid_package_lists_its_problems(page, server, workspace, tmp_path):
    c = sb.Client(server.url, ADMIN, workspace=workspace)
    sign_in(page, server, c.create_token("author"))
    page.wait_for_selector("#skills")
    bad = skill_dir(str(tmp_path / "bad"), "bad", "x")
    with open(os.path.join(bad, "SKILL.md"), "w") as f:
        f.write("---\nname: Not A Name\n---\nno description\n")
    archive = tmp_path / "bad.tar.gz"
    archive.write_bytes(tar_gz_of(bad))
    publish_in_page(page, "bad", str(archive))
    page.wait_for_selector("#problems")
    text = page.inner_text("#problems")
    assert "SKILL.md" in text and "name" in text, text
    assert "invalid_package" in page.inner_text("#publish-result")
    assert c.skills() == []


def test_an_event_published_from_the_cli_appears_live(page, server, workspace, tmp_path):
    c = sb.Client(server.url, ADMIN, workspace=workspace)
    sign_in(page, server, c.create_token("reader"))
    page.wait_for_selector("#skills")
    page.click("#nav a[data-nav=events]")
    page.wait_for_selector("#stream-state:text-is('live')")
    assert page.locator("#events li").count() == 0
    subprocess.run([server.bin, "publish", skill_dir(str(tmp_path / "live"), "live-one", "hi"), "--url", server.url,
                    "--token", ADMIN, "-w", workspace], check=True, capture_output=True)
    item = page.wait_for_selector("#events li[data-kind='skill.published']")
    assert "live-one" in item.inner_text() and "r1" in item.inner_text()
    # the filter hides what does not match, without a reload
    page.fill("#event-skill", "other")
    assert page.locator("#events li").count() == 0


def test_a_reader_sees_no_publish_or_admin_controls(page, server, workspace, tmp_path):
    c = sb.Client(server.url, ADMIN, workspace=workspace)
    c.publish("hello", skill_dir(str(tmp_path / "h"), "hello", "v1"))
    c.publish("hello", skill_dir(str(tmp_path / "h"), "hello", "v2"))
    sign_in(page, server, c.create_token("reader"))
    page.wait_for_selector("#skills a[href='#/skills/hello']")
    for nav in ("publish", "runs", "admin"):
        assert not page.is_visible(f"#nav a[data-nav={nav}]"), nav
    assert page.locator("a.button[href='#/publish']").count() == 0
    page.click("#skills a[href='#/skills/hello']")
    page.wait_for_selector("#revisions")
    assert page.locator("button[data-rollback]").count() == 0
    assert page.locator("text=Delete skill").count() == 0 and page.locator("text=Revoke").count() == 0
    page.goto(f"{server.url}/ui/#/admin")
    page.wait_for_selector("text=Not available")


def test_a_wrong_token_is_refused_with_a_clear_message(page, server):
    sign_in(page, server, "sbx_not_a_token")
    message = page.wait_for_selector("#signin-error").inner_text()
    assert "refused" in message and "unauthorized" in message, message
    assert page.is_visible("#token") and not page.is_visible("#nav")


def test_runs_and_administration(page, server, workspace, tmp_path):
    c = sb.Client(server.url, ADMIN, workspace=workspace)
    c.publish("hello", skill_dir(str(tmp_path / "h"), "hello", "v1"))
    run = c.create_run()
    run.activate("hello")
    run.exec(command="true", skill="hello")
    sign_in(page, server, ADMIN)
    page.wait_for_selector("#workspace-picker")
    page.select_option("#workspace-picker", workspace)
    page.click("#nav a[data-nav=runs]")
    row = page.wait_for_selector(f"#runs tr[data-run='{run.id}']")
    assert "hello r1" in row.inner_text() and "bwrap" in row.inner_text(), row.inner_text()
    page.once("dialog", lambda d: d.accept())
    page.click(f"#runs tr[data-run='{run.id}'] button")
    page.wait_for_selector(f"#runs tr[data-run='{run.id}']", state="detached")
    assert run.state()["state"] == "finished"

    page.click("#nav a[data-nav=admin]")
    page.fill("#token-workspace", workspace)
    page.select_option("#token-role", "reader")
    page.click("text=Create token")
    token = page.wait_for_selector("#new-token").inner_text().strip()
    assert sb.Client(server.url, token, workspace=workspace).skills()[0].name == "hello"
    page.click("#gc-dry")
    assert "Would collect" in page.wait_for_selector("#gc-result p:not(.muted)").inner_text()
    page.click("#fsck-run")
    assert page.wait_for_selector("#fsck-result p.success").inner_text().startswith("OK")
    assert "No execution nodes" in page.wait_for_selector("#nodes p.muted").inner_text()
    page.wait_for_selector("#metrics table")


def test_a_narrow_window_and_the_keyboard(page, server, workspace, tmp_path):
    c = sb.Client(server.url, ADMIN, workspace=workspace)
    c.publish("hello", skill_dir(str(tmp_path / "h"), "hello", "v1"))
    page.set_viewport_size({"width": 390, "height": 800})
    page.goto(f"{server.url}/ui/")
    page.wait_for_selector("#token")
    assert page.evaluate("document.activeElement.id") == "token"  # ready to paste
    page.keyboard.type(c.create_token("reader"))
    page.keyboard.press("Enter")
    page.wait_for_selector("#skills a[href='#/skills/hello']")
    # the keyboard reaches the skill: Tab through the page, Enter follows the link
    for _ in range(12):
        page.keyboard.press("Tab")
        if page.evaluate("document.activeElement.getAttribute('href')") == "#/skills/hello":
            break
    page.keyboard.press("Enter")
    page.wait_for_selector("#revisions")
    width = page.evaluate("document.documentElement.scrollWidth")
    assert width <= 390, f"the page scrolls sideways at 390 px: {width}"
    page.click("#nav a[data-nav=skills]")
    # The list arrives after the page is drawn: search it once it is there.
    page.wait_for_selector("#skills a[href='#/skills/hello']")
    page.fill("#search", "nothing-matches")
    assert "No skill matches" in page.inner_text("#skills")


def test_a_long_list_draws_every_skill_and_searches_them_all(page, server, workspace, tmp_path):
    # More skills than the first screenful the page draws before the rest.
    c = sb.Client(server.url, ADMIN, workspace=workspace)
    names = [f"skill-{i:03d}" for i in range(75)]
    for name in names:
        c.publish(name, skill_dir(str(tmp_path / name), name, "v1"))
    sign_in(page, server, c.create_token("reader"))
    page.wait_for_selector(f"#skills tbody tr:nth-child({len(names)})", state="attached")
    rows = page.eval_on_selector_all("#skills tbody tr td:first-child", "cells => cells.map((c) => c.innerText)")
    assert rows == names  # every skill once, in order
    assert page.inner_text("#skill-count") == f"{len(names)} of {len(names)}"
    page.fill("#search", "skill-072")
    assert page.eval_on_selector_all("#skills tbody tr td:first-child", "cells => cells.map((c) => c.innerText)") == ["skill-072"]
    assert page.inner_text("#skill-count") == f"1 of {len(names)}"
    shot(page, "long-list-search")
