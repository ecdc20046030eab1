"""A real `skillbox serve` (the workspace's debug build, or $SKILLBOX_BIN) per test session."""
import hashlib
import os
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.request

import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
ADMIN = "python-client-admin-token"


def _free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


class Server:
    def __init__(self, extra=()):
        self.bin = os.environ.get("SKILLBOX_BIN") or os.path.join(ROOT, "target", "debug", "skillbox")
        self.dir = tempfile.mkdtemp(prefix="skillbox-py-")
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.extra = list(extra)
        self.start()

    def start(self):
        env = dict(os.environ, SKILLBOX_ADMIN_TOKEN=ADMIN, SKILLBOX_LOG="warn")
        self.proc = subprocess.Popen([self.bin, "serve", "--listen", f"127.0.0.1:{self.port}", "--data-dir", self.dir,
                                      *self.extra], env=env)
        for _ in range(600):
            if self.proc.poll() is not None:
                raise RuntimeError("skillbox serve exited")
            try:
                urllib.request.urlopen(self.url + "/healthz")
                return
            except Exception:
                time.sleep(0.05)
        raise RuntimeError("skillbox serve did not start")

    def stop(self):
        self.proc.kill()
        self.proc.wait()

    def cleanup(self):
        self.stop()
        subprocess.run(["sh", "-c", f"grep -o ' {self.dir}[^ ]*' /proc/self/mountinfo | xargs -r -n1 umount --lazy"],
                       check=False)
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture(scope="session")
def server():
    s = Server(["--box", "bwrap"])
    yield s
    s.cleanup()


@pytest.fixture
def workspace(request):
    """A workspace of this test's own: its name, cut short, plus a digest of the whole node
    name, so parametrized variants (`[stdio]`, `[http]`) do not share one."""
    name = request.node.name
    tag = hashlib.sha256(name.encode()).hexdigest()[:8]
    short = name.replace("[", "-").replace("]", "").replace("_", "-")[:32].strip("-")
    return "ws-" + short.replace("--", "-") + "-" + tag


def skill_dir(root, name, says, extra=None):
    os.makedirs(os.path.join(root, "scripts"), exist_ok=True)
    with open(os.path.join(root, "SKILL.md"), "w") as f:
        f.write(f"---\nname: {name}\ndescription: Says {says}.\n---\nRun scripts/run.sh.\n")
    with open(os.path.join(root, "scripts", "run.sh"), "w") as f:
        f.write(f'#!/bin/sh\necho "{says}"\n')
    os.chmod(os.path.join(root, "scripts", "run.sh"), 0o755)
    for path, data in (extra or {}).items():
        full = os.path.join(root, path)
        os.makedirs(os.path.dirname(full), exist_ok=True)
        with open(full, "wb") as f:
            f.write(data)
    return root
