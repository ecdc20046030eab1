"""The console's tests: a real `skillbox serve` (the Python client tests' Server) and Debian's
Chromium driven by Playwright (no browser download). Each test saves a screenshot under
$SKILLBOX_TEST_OUTPUT (default target/test-output/console/)."""
import importlib.util
import os
import re

import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
_spec = importlib.util.spec_from_file_location(
    "client_conftest", os.path.join(ROOT, "clients", "python", "tests", "conftest.py"))
client_conftest = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(client_conftest)
Server, ADMIN, skill_dir = client_conftest.Server, client_conftest.ADMIN, client_conftest.skill_dir

playwright = pytest.importorskip("playwright.sync_api")
CHROMIUM = os.environ.get("SKILLBOX_CHROMIUM", "/usr/bin/chromium")
OUTPUT = os.environ.get("SKILLBOX_TEST_OUTPUT", os.path.join(ROOT, "target", "test-output", "console"))


@pytest.fixture(scope="session")
def server():
    s = Server(["--box", "bwrap"])
    yield s
    s.cleanup()


@pytest.fixture(scope="session")
def browser():
    with playwright.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=["--no-sandbox"])
        yield b
        b.close()


@pytest.fixture
def workspace(request):
    return "ui-" + re.sub(r"[^a-z0-9]+", "-", request.node.name.lower()).strip("-")[:40].strip("-")


@pytest.fixture
def page(browser, request):
    """A fresh tab at 1280×800; page errors fail the test; a screenshot is saved at the end."""
    context = browser.new_context(viewport={"width": 1280, "height": 800}, accept_downloads=True)
    p = context.new_page()
    p.set_default_timeout(15000)
    errors = []
    p.on("pageerror", lambda e: errors.append(str(e)))
    yield p
    os.makedirs(OUTPUT, exist_ok=True)
    p.screenshot(path=os.path.join(OUTPUT, f"{request.node.name}.png"), full_page=True)
    context.close()
    assert not errors, f"errors in the page: {errors}"


def shot(page, name):
    """A screenshot of the page as it is now, beside the tests' own (the README shows some)."""
    os.makedirs(OUTPUT, exist_ok=True)
    page.screenshot(path=os.path.join(OUTPUT, f"{name}.png"))


def sign_in(page, server, token):
    page.goto(f"{server.url}/ui/")
    page.fill("#token", token)
    page.click("form button[type=submit]")
