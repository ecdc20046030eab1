"""Packing a package directory as the CLI does: the default excludes and `.skillignore`
(gitignore syntax), files in canonical order, a deterministic tar (mode 0644/0755, uid/gid 0,
mtime 0, no names). The same directory gives the same bytes, and the same digest as
`skillbox digest DIR`."""
from __future__ import annotations

import gzip
import io
import os
import re
import stat
import tarfile
from typing import List, Tuple

DEFAULT_EXCLUDES = [".git/", "__pycache__/", "*.pyc", ".DS_Store", "node_modules/", ".venv/"]
SKILLIGNORE = ".skillignore"


class _Rule:
    def __init__(self, line: str):
        self.negate = line.startswith("!")
        if self.negate:
            line = line[1:]
        self.dir_only = line.endswith("/")
        line = line.rstrip("/")
        self.anchored = "/" in line
        line = line.lstrip("/")
        parts = []
        i = 0
        while i < len(line):
            if line.startswith("**/", i):
                parts.append("(?:.*/)?"); i += 3
            elif line.startswith("/**", i) and i + 3 == len(line):
                parts.append("/.*"); i += 3
            elif line[i] == "*":
                parts.append("[^/]*"); i += 1
            elif line[i] == "?":
                parts.append("[^/]"); i += 1
            elif line[i] == "[":
                j = line.find("]", i + 1)
                if j < 0:
                    parts.append(re.escape(line[i])); i += 1
                else:
                    parts.append("[" + line[i + 1:j].replace("!", "^", 1) + "]"); i = j + 1
            else:
                parts.append(re.escape(line[i])); i += 1
        self.regex = re.compile("^" + "".join(parts) + "$")

    def matches(self, rel: str, is_dir: bool) -> bool:
        if self.dir_only and not is_dir:
            return False
        if self.anchored:
            return bool(self.regex.match(rel))
        return bool(self.regex.match(rel.rsplit("/", 1)[-1]))


def _rules(root: str) -> List[_Rule]:
    lines = list(DEFAULT_EXCLUDES)
    path = os.path.join(root, SKILLIGNORE)
    if os.path.isfile(path):
        with open(path, encoding="utf-8") as f:
            for line in f.read().splitlines():
                line = line.rstrip()
                if line and not line.startswith("#"):
                    lines.append(line.replace("\\#", "#"))
    return [_Rule(l) for l in lines]


def _ignored(rules: List[_Rule], rel: str, is_dir: bool) -> bool:
    ignored = False
    for r in rules:
        if r.matches(rel, is_dir):
            ignored = not r.negate
    return ignored


def package_files(root: str) -> List[Tuple[str, str, bool]]:
    """(package path, file on disk, executable) of every file the package holds, in canonical
    order (by the path's UTF-8 bytes)."""
    rules = _rules(root)
    found: List[Tuple[str, str, bool]] = []

    def walk(dir_abs: str, dir_rel: str) -> None:
        for name in sorted(os.listdir(dir_abs)):
            abs_path = os.path.join(dir_abs, name)
            rel = f"{dir_rel}/{name}" if dir_rel else name
            st = os.lstat(abs_path)
            if stat.S_ISDIR(st.st_mode):
                if not _ignored(rules, rel, True):
                    walk(abs_path, rel)
            elif stat.S_ISREG(st.st_mode):
                if not _ignored(rules, rel, False):
                    found.append((rel, abs_path, bool(st.st_mode & 0o111)))
            elif not _ignored(rules, rel, False):
                raise ValueError(f"{rel}: only regular files and directories can be published (not a link or device)")

    walk(root, "")
    found.sort(key=lambda f: f[0].encode("utf-8"))
    return found


def pack_dir(root: str) -> bytes:
    """The directory as a gzip-compressed deterministic tar."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.GNU_FORMAT) as tar:
        for rel, abs_path, executable in package_files(root):
            with open(abs_path, "rb") as f:
                data = f.read()
            info = tarfile.TarInfo(rel)
            info.size = len(data)
            info.mode = 0o755 if executable else 0o644
            info.mtime = 0
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            tar.addfile(info, io.BytesIO(data))
    return gzip.compress(buf.getvalue(), mtime=0)


def sniff_content_type(data: bytes) -> str:
    """The content type of an archive by its first bytes: zip, gzip or tar."""
    if data[:4] == b"PK\x03\x04":
        return "application/zip"
    if data[:2] == b"\x1f\x8b":
        return "application/gzip"
    if len(data) >= 262 and data[257:262] == b"ustar":
        return "application/x-tar"
    raise ValueError("not a zip, tar or tar.gz archive")


