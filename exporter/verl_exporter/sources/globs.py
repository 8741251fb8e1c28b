"""Globs expanded within bounds: the paths a source pattern matches, at most ``MAX_MATCHES`` of
them and ``MAX_GLOB_DIRS`` directories looked into per expansion; ``**`` never follows a symbolic
link to a directory and enters each directory once."""

from __future__ import annotations

import fnmatch
import glob
import os

MAX_MATCHES = 10_000  # files one pattern follows
MAX_GLOB_DIRS = 100_000  # directories one poll of a ``**`` pattern looks into


def is_literal(pattern: str) -> bool:
    """Whether ``pattern`` names one path: it has no glob characters, or a file of that very name
    exists (``run[1].log``): such a path is followed as it is, not matched as a glob."""
    return not glob.has_magic(pattern) or os.path.lexists(pattern)


def expand(pattern: str, max_matches: int = MAX_MATCHES, max_dirs: int = MAX_GLOB_DIRS) -> tuple[list[str], bool]:
    """(the paths ``pattern`` matches, whether a cap stopped the expansion). Like ``glob`` (names
    starting with a dot only where the pattern's part does), but ``**`` never follows a symbolic
    link to a directory and enters each directory once, so links to ``.`` or loops end; at most
    ``max_matches`` paths and ``max_dirs`` directories looked into."""
    if "**" not in pattern:
        found: list[str] = []
        for path in glob.iglob(pattern):
            if len(found) == max_matches:
                return found, True
            found.append(path)
        return found, False
    parts = pattern.split(os.sep)
    start = 0
    while start < len(parts) and not glob.has_magic(parts[start]):
        start += 1
    base = os.sep.join(parts[:start]) or (os.sep if pattern.startswith(os.sep) else "")
    found, seen, dirs = [], set(), 0
    stack: list[tuple[str, int]] = [(base, start)]
    while stack:
        folder, index = stack.pop()
        if index == len(parts):
            if len(found) == max_matches:
                return found, True
            found.append(folder)
            continue
        part = parts[index]
        if not glob.has_magic(part):
            path = os.path.join(folder, part)
            if os.path.lexists(path):
                stack.append((path, index + 1))
            continue
        if dirs == max_dirs:
            return found, True
        dirs += 1
        try:
            with os.scandir(folder or ".") as entries:
                children = [entry for entry in entries if part.startswith(".") or not entry.name.startswith(".")]
        except OSError:
            continue
        if part == "**":
            try:
                st = os.stat(folder or ".")
            except OSError:
                continue
            if (st.st_dev, st.st_ino, index) in seen:
                continue
            seen.add((st.st_dev, st.st_ino, index))
            stack.append((folder, index + 1))  # ** matching no directory
            stack.extend((os.path.join(folder, entry.name), index) for entry in children
                         if _is_dir(entry, follow=False))
            continue
        last = index == len(parts) - 1
        stack.extend((os.path.join(folder, entry.name), index + 1) for entry in children
                     if fnmatch.fnmatchcase(entry.name, part) and (last or _is_dir(entry, follow=True)))
    return found, False


def _is_dir(entry: os.DirEntry, follow: bool) -> bool:
    try:
        return entry.is_dir(follow_symlinks=follow)
    except OSError:
        return False
