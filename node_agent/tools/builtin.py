"""llama.cpp's seven built-in tools: their definitions (byte for byte what ``GET /tools``
shows) and what a call does (``server-tools.cpp``; limits, messages and result keys are
llama.cpp's). A tool gets its IO from the call (``io.tools_io``) and answers a JSON object: the
result, or ``{"error": …}`` for what the model should read (a 200, as in llama.cpp).
"""

from __future__ import annotations

import asyncio
import base64
import os
import re
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from node_agent.tools.edits import EditError, apply_edits
from node_agent.tools.globs import path_glob_match
from node_agent.tools.grep import (
    GREP_MAX_OUTPUT,
    GREP_TIMEOUT,
    GrepError,
    Matcher,
    matcher,
    timed_out,
)
from node_agent.tools.grep_worker import as_text, split_lines
from node_agent.tools.io import Entry, Kind, tools_io
from node_agent.tools.params import (
    as_str,
    at,
    opt_bool,
    opt_int,
    opt_str,
    required_str,
)
from node_agent.tools.process import OnChunk
from node_agent.tools.threads import in_thread

READ_MAX = 16 * 1024
READ_MAX_BASE64 = 32 * 1024 * 1024
SEARCH_MAX_RESULTS = 100
GREP_MAX_RESULTS = 100
EXEC_MAX_OUTPUT = 16 * 1024
EXEC_MAX_TIMEOUT = 60
INFO_MAX_OUTPUT = 4096
INFO_TIMEOUT = 5
TRUNCATED_TEXT = "[output truncated]"
# Bounds of ours (llama.cpp has none): a tool thread's work is bounded in size and time.
GLOB_MAX_PATTERN = 256  # characters of an include or exclude glob (a 600-token one took 4.7 s)
GLOB_TIMEOUT = 5.0  # seconds to match one listing against include and exclude
EDIT_MAX_EDITS = 1000  # edits in one edit_file call
EDIT_TIMEOUT = 10.0  # seconds for one edit_file call's matching and replacing

Result = dict[str, Any]
Invoke = Callable[[Any, OnChunk | None], Awaitable[Result]]


@dataclass(frozen=True, slots=True)
class Tool:
    name: str
    display_name: str
    description: str
    properties: dict[str, Any]
    required: tuple[str, ...] | None
    invoke: Invoke
    write: bool = False
    streams: bool = False

    def entry(self) -> dict[str, Any]:
        """The ``GET /tools`` entry (llama.cpp's ``server_tool::to_json``)."""
        parameters: dict[str, Any] = {"type": "object", "properties": self.properties}
        if self.required is not None:
            parameters["required"] = list(self.required)
        return {
            "display_name": self.display_name,
            "tool": self.name,
            "type": "server",
            "permissions": {"write": self.write},
            "uses_cwd": True,
            "definition": {
                "type": "function",
                "function": {
                    "name": self.name,
                    "description": self.description,
                    "parameters": parameters,
                },
            },
        }


def _prop(kind: str, description: str) -> dict[str, Any]:
    return {"type": kind, "description": description}


# --- read_file ---------------------------------------------------------------------------


async def read_file(params: Any, _: OnChunk | None) -> Result:
    path = required_str(params, "path")
    start_line = opt_int(params, "start_line", 1)
    end_line = opt_int(params, "end_line", -1)  # -1: to the end
    append_loc = opt_bool(params, "append_loc", False)
    as_base64 = opt_str(params, "resp_type", "") == "base64"  # X-Resp-Type, not the model
    io = tools_io(params)
    size = await io.file_size(path)
    if size is None:
        return {"error": f"cannot stat file: {path}"}
    if as_base64:
        if size > READ_MAX_BASE64:
            return {"error": f"file too large ({size} bytes, max {READ_MAX_BASE64})"}
        content = await io.read_file(path)
        if content is None:
            return {"error": f"failed to open file: {path}"}
        return {"base64": base64.b64encode(content).decode(), "size_bytes": len(content)}
    if size > READ_MAX and end_line == -1:
        return {
            "error": f"file too large ({size} bytes, max {READ_MAX}). Use start_line/end_line "
            "to read a portion."
        }
    content = await io.read_file(path)
    if content is None:
        return {"error": f"failed to open file: {path}"}
    text = await in_thread(_line_range, content, start_line, end_line, append_loc)
    return {"plain_text_response": text}


def _line_range(content: bytes, start_line: int, end_line: int, append_loc: bool) -> str:
    out = bytearray()
    for lineno, line in enumerate(split_lines(content), 1):
        if lineno < start_line:
            continue
        if end_line != -1 and lineno > end_line:
            break
        piece = (f"{lineno}\u2192".encode() if append_loc else b"") + line + b"\n"
        if len(out) + len(piece) > READ_MAX:
            out += TRUNCATED_TEXT.encode()
            break
        out += piece
    return as_text(bytes(out))


# --- file_glob_search --------------------------------------------------------------------


def _glob_error(include: str, exclude: str) -> Result | None:
    for name, pattern in (("include", include), ("exclude", exclude)):
        if len(pattern) > GLOB_MAX_PATTERN:
            return {
                "error": f"{name} pattern too long ({len(pattern)} characters, max "
                f"{GLOB_MAX_PATTERN})"
            }
    return None


def _matching(entries: list[Entry], include: str, exclude: str) -> list[Entry] | None:
    """The entries that ``include`` matches and ``exclude`` does not; None when that takes
    longer than GLOB_TIMEOUT (a long pattern on a long listing)."""
    deadline = time.monotonic() + GLOB_TIMEOUT
    found = []
    for e in entries:
        if time.monotonic() >= deadline:
            return None
        if path_glob_match(include, e.rel) and not (exclude and path_glob_match(exclude, e.rel)):
            found.append(e)
    return found


def _glob_timed_out(entries: list[Entry]) -> Result:
    return {
        "error": f"glob matching timed out after {GLOB_TIMEOUT:g} s ({len(entries)} entries): "
        "narrow the path or simplify the include/exclude patterns"
    }


async def file_glob_search(params: Any, _: OnChunk | None) -> Result:
    io = tools_io(params)
    path = required_str(params, "path")
    base = io.resolve(path)
    include = opt_str(params, "include", "**")
    exclude = opt_str(params, "exclude", "")
    kind_name = opt_str(params, "type", "file")
    max_depth = max(0, opt_int(params, "max_depth", 0))
    limit = opt_int(params, "limit", SEARCH_MAX_RESULTS)
    if limit < 1:
        return {"error": f"invalid limit: {limit} (expected 1 or more)"}
    limit = min(limit, SEARCH_MAX_RESULTS)
    kind = next((k for k in Kind if k.value == kind_name), None)
    if kind is None:
        return {"error": f'invalid type: {kind_name} (expected "file", "dir" or "all")'}
    if (error := _glob_error(include, exclude)) is not None:
        return error
    listing = await io.list_entries(base, max_depth, kind)
    if listing.err:
        return {"error": f"{listing.err}: {path}"}
    matches = await in_thread(_matching, listing.entries, include, exclude)
    if matches is None:
        return _glob_timed_out(listing.entries)
    shown = matches[:limit]
    text = "".join(f"{e.rel}{'/' if e.is_dir else ''}\n" for e in shown)
    text += f"\n---\nTotal matches: {len(matches)}\n"
    if len(matches) > len(shown):
        text += (
            f"[{len(shown)} results limit reached ({len(matches)} total matches). Refine the "
            "glob pattern to narrow the search.]\n"
        )
    if listing.truncated:
        text += "[results truncated: time budget or unreadable directory]\n"
    # ``base`` is absolute, so a client (the web UI's file picker) can join the entries to it.
    entries = [{"path": e.rel, "type": "dir" if e.is_dir else "file"} for e in shown]
    return {"plain_text_response": text, "entries": entries, "base": base}


# --- grep_search -------------------------------------------------------------------------


async def grep_search(params: Any, _: OnChunk | None) -> Result:
    path = required_str(params, "path")
    pattern = required_str(params, "pattern")
    include = opt_str(params, "include", "**")
    exclude = opt_str(params, "exclude", "")
    show_lineno = opt_bool(params, "return_line_numbers", False)
    literal = opt_bool(params, "literal", False)
    ignore_case = opt_bool(params, "ignore_case", False)
    context = max(0, opt_int(params, "context_lines", 0))
    if (error := _glob_error(include, exclude)) is not None:
        return error
    try:
        # The pattern is compiled and matched in a process of its own, bounded in time (grep).
        async with matcher() as worker:
            await worker.compile(
                re.escape(pattern) if literal else pattern,
                ignore_case,
                show_lineno or context > 0,
                context,
            )
            return await _grep(worker, params, path, include, exclude)
    except GrepError as exc:
        return {"error": str(exc)}


async def _grep(worker: Matcher, params: Any, path: str, include: str, exclude: str) -> Result:
    io = tools_io(params)
    absolute = io.resolve(path)
    files: list[tuple[str, str]] = []  # (absolute path, the path shown)
    if await io.is_regular_file(absolute):
        files.append((absolute, path))
    elif await io.is_directory(absolute):
        listing = await io.list_entries(absolute, 0, Kind.FILES)
        if listing.err:
            return {"error": f"{listing.err}: {path}"}
        matching = await in_thread(_matching, listing.entries, include, exclude)
        if matching is None:
            return _glob_timed_out(listing.entries)
        files.extend((f"{absolute}/{e.rel}", e.rel) for e in matching)
    else:
        return {"error": f"path does not exist: {path}"}
    out: list[str] = []
    total = size = searched = 0
    full = truncated = False
    try:
        async with asyncio.timeout(GREP_TIMEOUT):
            for absolute_file, shown in files:
                if full or truncated:
                    break
                content = await io.read_file(absolute_file)
                room = GREP_MAX_RESULTS - total, GREP_MAX_OUTPUT - size
                found = None if content is None else await worker.grep(content, shown, *room)
                searched += 1
                if found is not None:
                    out.extend(found.lines)
                    size += sum(map(len, found.lines))
                    total += found.matches
                    full, truncated = found.full, found.truncated
    except TimeoutError:
        raise timed_out(searched, len(files)) from None
    text = "".join(out)
    if truncated:
        text += TRUNCATED_TEXT + "\n"
    text += f"\n---\nTotal matches: {total}\n"
    if full:
        text += (
            f"[{GREP_MAX_RESULTS} matches limit reached. Narrow the path/pattern/include to see "
            "more.]\n"
        )
    return {"plain_text_response": text}


# --- exec_shell_command ------------------------------------------------------------------


async def exec_shell_command(params: Any, on_chunk: OnChunk | None) -> Result:
    # The one tool that runs a shell on the model's words: the user turned it on by name.
    command = required_str(params, "command")
    timeout = min(opt_int(params, "timeout", 10), EXEC_MAX_TIMEOUT)
    max_output = opt_int(params, "max_output_size", EXEC_MAX_OUTPUT)
    max_output = EXEC_MAX_OUTPUT if max_output < 0 else min(max_output, EXEC_MAX_OUTPUT)
    io = tools_io(params)
    res = await io.run(["sh", "-c", command], max_output, timeout, on_chunk)
    tail = f"\n[exit code: {res.exit_code}]"
    if res.timed_out:
        tail += " [exit due to timed out]"
    if on_chunk is not None:
        await on_chunk(tail.encode())
        return {}
    return {"plain_text_response": as_text(res.output) + tail}


# --- write_file / edit_file --------------------------------------------------------------


async def write_file(params: Any, _: OnChunk | None) -> Result:
    path = required_str(params, "path")
    content = required_str(params, "content").encode()
    if not await tools_io(params).write_file(path, content):
        return {"error": f"failed to write file: {path}"}
    return {"result": "file written successfully", "path": path, "bytes": len(content)}


async def edit_file(params: Any, _: OnChunk | None) -> Result:
    path = required_str(params, "path")
    edits_json = at(params, "edits")
    if not isinstance(edits_json, list) or not edits_json:
        return {"error": '"edits" must be a non-empty array'}
    if len(edits_json) > EDIT_MAX_EDITS:
        return {"error": f"too many edits ({len(edits_json)}, max {EDIT_MAX_EDITS} per call)"}
    edits: list[tuple[str, str]] = []
    for i, edit in enumerate(edits_json):
        old, new = as_str(at(edit, "old_text")), as_str(at(edit, "new_text"))
        if not old:
            return {"error": f"edits[{i}].old_text must not be empty"}
        edits.append((old, new))
    io = tools_io(params)
    original = await io.read_file(path)
    if original is None:
        return {"error": f"failed to open file: {path}"}
    try:
        edited = await in_thread(_edit, original, edits, path)
    except EditError as exc:
        return {"error": str(exc)}
    if not await io.write_file(path, edited):
        return {"error": f"failed to write file: {path}"}
    return {"result": "file edited successfully", "path": path, "edits_applied": len(edits)}


def _edit(original: bytes, edits: list[tuple[str, str]], path: str) -> bytes:
    """In a tool thread, decoding included (megabytes: not on the loop). surrogateescape:
    bytes that are not UTF-8 come back unchanged."""
    text = original.decode("utf-8", "surrogateescape")
    return apply_edits(text, edits, path, EDIT_TIMEOUT).encode("utf-8", "surrogateescape")


# --- get_info ----------------------------------------------------------------------------


async def get_info(params: Any, _: OnChunk | None) -> Result:
    io = tools_io(params)
    res = await io.run(["uname", "-a"], INFO_MAX_OUTPUT, INFO_TIMEOUT)
    ok = res.exit_code == 0 and not res.timed_out
    # A failed start or a timeout leaves a diagnostic in the output, which is no OS name.
    os_info = as_text(res.output).strip() if ok else "unknown"
    cwd = opt_str(params, "cwd", "")
    if not cwd and not opt_str(params, "runtime", ""):
        cwd = os.getcwd()
    elif not cwd:
        pwd = await io.run(["pwd"], INFO_MAX_OUTPUT, INFO_TIMEOUT)
        cwd = as_text(pwd.output).strip() if pwd.exit_code == 0 and not pwd.timed_out else "unknown"
    return {"os": os_info, "cwd": cwd}


TOOLS = (
    Tool(
        "read_file",
        "Read file",
        "Read the contents of a file. Optionally specify a 1-based line range. If append_loc "
        'is true, each line is prefixed with its line number (e.g. "1\u2192...").',
        {
            "path": _prop("string", "Path to the file"),
            "start_line": _prop("integer", "First line to read, 1-based (default: 1)"),
            "end_line": _prop(
                "integer", "Last line to read, 1-based inclusive (default: end of file)"
            ),
            "append_loc": _prop("boolean", "Prefix each line with its line number"),
        },
        ("path",),
        read_file,
    ),
    Tool(
        "file_glob_search",
        "File search",
        "Recursively search for files matching a glob pattern under a directory. "
        "Automatically skips files ignored by .gitignore (when the directory is inside a git "
        "repo) and common junk directories (.git, node_modules, build, dist, etc.) otherwise. "
        "A pattern with no '/' (e.g. \"*.cpp\") matches the file's basename at any depth. "
        "A pattern containing '/' matches the full relative path; unless already anchored "
        'with "**/" or a leading \'/\', it is automatically prefixed with "**/". '
        'Use type="dir" or "all" to also list directories; directory entries are suffixed '
        "with '/' in the output. Note: directory listings do not apply .gitignore filtering.",
        {
            "path": _prop("string", "Base directory to search in"),
            "include": _prop(
                "string",
                'Glob pattern for files to include (e.g. "*.cpp" or "src/**/*.cpp"). Default: **',
            ),
            "exclude": _prop("string", "Glob pattern for files to exclude"),
            "type": _prop("string", 'Entry type to return: "file" (default), "dir" or "all"'),
            "max_depth": _prop(
                "integer",
                "Maximum depth to descend into subdirectories (default: 0 = unlimited; 1 = "
                "direct children only)",
            ),
            "limit": _prop(
                "integer",
                f"Maximum number of results to return, capped at {SEARCH_MAX_RESULTS} (default "
                f"{SEARCH_MAX_RESULTS})",
            ),
        },
        ("path",),
        file_glob_search,
    ),
    Tool(
        "grep_search",
        "Grep search",
        "Search for a pattern in files under a path. Returns matching lines with file paths "
        "(and, unless searching a single file, paths relative to the given directory). "
        "Automatically skips files ignored by .gitignore (when the directory is inside a git "
        "repo) and common junk directories (.git, node_modules, build, dist, etc.) otherwise. "
        "include/exclude: a pattern with no '/' matches the basename at any depth; a pattern "
        "containing '/' matches the full relative path (auto-anchored with \"**/\" unless "
        "already anchored).",
        {
            "path": _prop("string", "File or directory to search in"),
            "pattern": _prop(
                "string", "Pattern to search for (regular expression unless literal is true)"
            ),
            "include": _prop("string", "Glob pattern to filter files (default: **)"),
            "exclude": _prop("string", "Glob pattern to exclude files"),
            "return_line_numbers": _prop("boolean", "If true, include line numbers in results"),
            "literal": _prop(
                "boolean",
                "Treat pattern as a literal string instead of a regular expression (default: "
                "false)",
            ),
            "ignore_case": _prop("boolean", "Case-insensitive search (default: false)"),
            "context_lines": _prop(
                "integer",
                "Number of lines of context to show before and after each match (default: 0)",
            ),
        },
        ("path", "pattern"),
        grep_search,
    ),
    Tool(
        "exec_shell_command",
        "Execute shell command",
        "Execute a shell command and return its output (stdout and stderr combined).",
        {
            "command": _prop("string", "Shell command to execute"),
            "timeout": _prop("integer", f"Timeout in seconds (default 10, max {EXEC_MAX_TIMEOUT})"),
            "max_output_size": _prop(
                "integer", f"Maximum output size in bytes (default {EXEC_MAX_OUTPUT})"
            ),
        },
        ("command",),
        exec_shell_command,
        write=True,
        streams=True,
    ),
    Tool(
        "write_file",
        "Write file",
        "Write content to a file, creating it (including parent directories) if it does not "
        "exist. May use with edit_file for more complex edits.",
        {
            "path": _prop("string", "Path of the file to write"),
            "content": _prop("string", "Content to write"),
        },
        ("path", "content"),
        write_file,
        write=True,
    ),
    Tool(
        "edit_file",
        "Edit file",
        "Edit a file using exact text replacement. Each edits[].old_text must be unique in the "
        "file and is matched against the original content, not incrementally. Merge nearby "
        "changes into one edit instead of overlapping edits. Use write_file to replace the "
        "whole file.",
        {
            "path": _prop("string", "Path to the file to edit"),
            "edits": {
                "type": "array",
                "description": "One or more exact text replacements to apply",
                "items": {
                    "type": "object",
                    "properties": {
                        "old_text": _prop(
                            "string",
                            "Exact text to find; must be unique in the file and must not "
                            "overlap with other edits",
                        ),
                        "new_text": _prop("string", "Text to replace old_text with"),
                    },
                    "required": ["old_text", "new_text"],
                },
            },
        },
        ("path", "edits"),
        edit_file,
        write=True,
    ),
    Tool(
        "get_info",
        "Get Runtime Info",
        "Returns runtime info: the OS name/version and the current working directory",
        {},
        None,
        get_info,
    ),
)
