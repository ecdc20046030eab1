"""skillbox client: a versioned registry of Agent Skills whose runs see exactly one immutable
revision of each skill, for instructions, reads and sandboxed execution alike.

    from skillbox_client import Client
    c = Client("http://127.0.0.1:7420", token, workspace="acme")
    c.publish("hello", "./hello")             # a directory, an archive path, or bytes
    with c.create_run() as run:
        run.activate("hello")
        print(run.exec(command="./scripts/run.sh", skill="hello").stdout)
"""
from ._client import AsyncClient, AsyncRun, Client, Run
from ._errors import *  # noqa: F401,F403 — one class per SPEC error code
from ._errors import ERRORS, SkillboxError, error_from
from ._models import Activation, Draft, Event, ExecResult, Record, Revision, Skill
from ._pack import pack_dir

__all__ = ["Client", "AsyncClient", "Run", "AsyncRun", "SkillboxError", "ERRORS", "error_from", "Activation", "Draft", "Event",
           "ExecResult", "Record", "Revision", "Skill", "pack_dir"] + [c.__name__ for c in ERRORS.values()]
__version__ = "0.1.0"
