#!/usr/bin/env python3
"""An agent platform's integration with skillbox, end to end, as a Python agent framework would
wire it (the model's decisions are stubbed by keyword matching, so the example runs without an
LLM):

1. a run per conversation, its system prompt from the run's `<available_skills>` index;
2. when the task calls for a skill, activate it: its instructions (and every later read and
   execution) come from the revision pinned then, whatever is published meanwhile;
3. read the skill's files and run its script in the run's sandbox;
4. finish the run when the conversation ends.

    SKILLBOX_URL=http://127.0.0.1:7420 SKILLBOX_TOKEN=… SKILLBOX_WORKSPACE=demo \\
        python examples/agent_loop.py "please greet the user"

`--demo` first publishes a small `greeter` skill into the workspace if it has none.
"""
import io
import re
import sys
import tarfile

from skillbox_client import Client, SkillboxError


def demo_package() -> bytes:
    files = {
        "SKILL.md": b"---\nname: greeter\ndescription: Greets the user by name. Use when asked to greet someone.\n---\n"
                    b"Run `scripts/greet.sh NAME` and repeat its output.\n",
        "scripts/greet.sh": b'#!/bin/sh\necho "Hello, ${1:-friend}! (from greeter)"\n',
    }
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for path, data in files.items():
            info = tarfile.TarInfo(path)
            info.size, info.mode = len(data), 0o755 if path.endswith(".sh") else 0o644
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def choose_skill(index: str, task: str):
    """The model's choice, stubbed: the skill whose description shares the most words with the task."""
    skills = re.findall(r"<name>(.*?)</name>\s*<description>(.*?)</description>", index, re.S)
    words = set(re.findall(r"[a-z]+", task.lower()))
    scored = [(len(words & set(re.findall(r"[a-z]+", desc.lower()))), name) for name, desc in skills]
    scored.sort(reverse=True)
    return scored[0][1] if scored and scored[0][0] > 0 else None


def main() -> int:
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    task = args[0] if args else "please greet the user"
    client = Client()
    if "--demo" in sys.argv and not client.skills():
        client.publish("greeter", demo_package())

    with client.create_run(ttl_seconds=600) as run:
        system_prompt = "You are a helpful agent.\n\n" + run.prompt()
        print(f"[system prompt]\n{system_prompt}\n")
        print(f"[user] {task}")
        name = choose_skill(system_prompt, task)
        if name is None:
            print("[agent] no skill fits; answering directly")
            return 0
        activation = run.activate(name)
        print(f"[agent] activated {name} r{activation.revision} ({activation.digest}) at {activation.mount_path}")
        print(f"[instructions]\n{activation.instructions.strip()}\n")
        scripts = [f["path"] if isinstance(f, dict) else f for f in activation.files]
        script = next((p for p in scripts if str(p).startswith("scripts/")), None)
        if script is None:
            print("[agent] the skill has no script; following its instructions only")
            return 0
        print(f"[agent] reads {script}:\n{run.read(name, script).decode().strip()}\n")
        try:
            result = run.exec(argv=[f"./{script}", "Ada"], skill=name, timeout_ms=30_000)
        except SkillboxError as e:
            print(f"[agent] could not run it: {e.code}: {e.message}")
            return 1
        print(f"[tool] exit {result.exit_code}: {result.stdout.strip()}")
        print(f"[agent] {result.stdout.strip()}")
    print("[run finished]")
    return 0 if result.exit_code == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
