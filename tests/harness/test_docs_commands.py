"""Every command README.md and docs/*.md show runs as written, so the docs cannot drift from the code.

The commands are read from the Markdown, never copied here: each ```sh / ```bash block, a line at a time
(backslash continuations joined). A block runs, command by command in document order, in a fresh copy of the
repository's files (what a clone has) with an empty HOME, unless the HTML comment on the line before its
fence says otherwise, with directives joined by "; ":

    <!-- docs-test: not run: REASON -->        cluster-only (ray up, a bucket, GPU machines): parsed, not run
    <!-- docs-test: server URL -->              a simulated server on a free port stands in for URL
    <!-- docs-test: replace "OLD" "NEW" -->     the block's documented short form: OLD becomes NEW

A command must exit 0, or N where its comment says `exit N`. Run or not, every command must also name what
exists: each `specsweep ...` (also after `ray job submit ... --`, or quoted in `ray exec`) parses with the
real argparse parser, each `make TARGET` is a Makefile target, and each path under one of the repository's
own top-level entries (examples/, tests/, cluster.yaml, ...) is in the repository. The commands run
through bash: they are shell text in the docs, and bash is what reads them there.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from harness.cli import build_parser
from harness.demo import EXAMPLE_INPUTS, write_example_inputs

REPO = Path(__file__).resolve().parents[2]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
SHELL_FENCE = re.compile(r"^```(?:sh|bash|shell)$", re.M)
BLOCK = re.compile(
    r"^(?:<!-- docs-test: (?P<marker>[^\n]*) -->\n)?```(?:sh|bash|shell)\n(?P<body>.*?)^```$", re.M | re.S
)
SEPARATORS = {"&&", "||", ";", "|", "&"}
SIM_TARGET = "examples/inputs/kimi-k25-tiny"  # the simulated server's --model-path, as the README gives it
COMMAND_TIMEOUT_S = 600


@dataclass(frozen=True)
class DocCommand:
    """One logical command line of a doc's shell block: its shell text and its trailing comment."""

    doc: str
    line: int
    code: str
    comment: str

    @property
    def expected_exit(self) -> int:
        """0 unless the comment states the exit code (`# exit 3, adjusted: ...`)."""
        stated = re.search(r"\bexit (\d+)\b", self.comment)
        return int(stated.group(1)) if stated else 0

    def __str__(self) -> str:
        return f"{self.doc}:{self.line}"


@dataclass(frozen=True)
class DocBlock:
    """A shell block and what its marker says: why it is not run, the server it needs, its short form."""

    doc: str
    line: int
    commands: tuple[DocCommand, ...]
    not_run: str | None
    server: str | None
    replacements: tuple[tuple[str, str], ...]


def _split_comment(text: str) -> tuple[str, str]:
    """Shell text and its trailing comment: a ``#`` outside quotes that starts a word."""
    quote = ""
    for i, char in enumerate(text):
        if quote:
            quote = "" if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char == "#" and (i == 0 or text[i - 1].isspace()):
            return text[:i].strip(), text[i + 1 :].strip()
    return text.strip(), ""


def _commands(doc: str, first_line: int, body: str) -> Iterator[DocCommand]:
    pending: list[str] = []
    start = first_line
    for number, raw in enumerate(body.splitlines(), first_line):
        if not pending:
            start = number
        if raw.rstrip().endswith("\\"):
            pending.append(raw.rstrip()[:-1])
            continue
        code, comment = _split_comment(" ".join([*pending, raw]))
        pending = []
        if code:
            yield DocCommand(doc, start, code, comment)


def _directives(marker: str, where: str) -> tuple[str | None, str | None, tuple[tuple[str, str], ...]]:
    not_run = server = None
    replacements = []
    for directive in (d.strip() for d in marker.split(";") if d.strip()):
        if directive.startswith("not run: "):
            not_run = directive.removeprefix("not run: ")
        elif directive.startswith("server "):
            server = directive.removeprefix("server ")
        elif directive.startswith("replace ") and len(words := shlex.split(directive)) == 3:
            replacements.append((words[1], words[2]))
        else:
            raise ValueError(f"{where}: unknown docs-test directive {directive!r}")
    return not_run, server, tuple(replacements)


def doc_blocks(path: Path) -> list[DocBlock]:
    """The shell blocks of one Markdown file, in order."""
    text = path.read_text(encoding="utf-8")
    doc = str(path.relative_to(REPO))
    blocks = []
    for match in BLOCK.finditer(text):
        body_line = text.count("\n", 0, match.start("body")) + 1
        not_run, server, replacements = _directives(match["marker"] or "", f"{doc}:{body_line - 1}")
        commands = tuple(_commands(doc, body_line, match["body"]))
        blocks.append(DocBlock(doc, body_line - 1, commands, not_run, server, replacements))
    return blocks


def example_comment_commands(path: Path) -> list[DocCommand]:
    """The commands an example spec's comments show (`#   specsweep plan ...`), continuations joined."""
    kept, continued = [], False
    for line in path.read_text(encoding="utf-8").splitlines():
        text = line.removeprefix("#").strip() if line.startswith("#") else ""
        is_command = continued or text.startswith(("specsweep ", "ray "))
        kept.append(text if is_command else "")
        continued = is_command and text.endswith("\\")
    return list(_commands(str(path.relative_to(REPO)), 1, "\n".join(kept)))


BLOCKS = [block for doc in DOCS for block in doc_blocks(doc)]
EXAMPLE_SPECS = sorted((REPO / "examples").glob("*.yaml"))
COMMANDS = [command for block in BLOCKS for command in block.commands] + [
    command for spec in EXAMPLE_SPECS for command in example_comment_commands(spec)
]
RUN_DOCS = sorted({block.doc for block in BLOCKS if block.not_run is None})


def _tracked_files() -> list[str]:
    """The repository's files as a clone has them: tracked, or new and not ignored."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=REPO,
        capture_output=True,
        check=True,
    )
    return [name for name in listed.stdout.decode().split("\0") if name and (REPO / name).is_file()]


TRACKED = _tracked_files()
TOP_LEVEL = {name.split("/")[0] for name in TRACKED}
MAKE_TARGETS = set(re.findall(r"^([\w.-]+):", (REPO / "Makefile").read_text(), flags=re.M))


def _segments(code: str) -> list[list[str]]:
    """The simple commands of a shell line as word lists (redirections dropped)."""
    lexer = shlex.shlex(code, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    segments: list[list[str]] = [[]]
    words = iter(lexer)
    for word in words:
        if word in SEPARATORS:
            segments.append([])
        elif word in {">", ">>", "<", "2>"}:
            next(words, None)
        else:
            segments[-1].append(word)
    return [segment for segment in segments if segment]


def _without_assignments(segment: list[str]) -> list[str]:
    """The command's words after its leading environment assignments (`RAY_AUTH_MODE=token ray start`)."""
    for index, word in enumerate(segment):
        if not re.fullmatch(r"[A-Za-z_]\w*=.*", word):
            return segment[index:]
    return []


def _specsweep_argvs(segment: list[str]) -> Iterator[list[str]]:
    """specsweep's arguments wherever the words run it: directly, after `--`, or quoted (`ray exec`)."""
    if "specsweep" in segment:
        yield segment[segment.index("specsweep") + 1 :]
    for word in segment:
        if word.startswith("specsweep "):
            yield shlex.split(word)[1:]


def _repo_paths(words: list[str]) -> Iterator[str]:
    """The words that name something under the repository's own top-level entries."""
    for word in words:
        value = word.split("=", 1)[1] if word.startswith("--") and "=" in word else word
        if value.startswith("-") or "://" in value:
            continue
        if value.rstrip("/").split("/")[0] in TOP_LEVEL:
            yield value


def _parse_problem(argv: list[str]) -> str | None:
    """What argparse says about ``specsweep ARGV``, or None when it parses."""
    stderr = io.StringIO()
    try:
        with contextlib.redirect_stderr(stderr), contextlib.redirect_stdout(io.StringIO()):
            build_parser().parse_args(argv)
    except SystemExit as exit_:
        return f"exit {exit_.code}: {stderr.getvalue().strip()}"
    return None


@pytest.mark.parametrize("command", COMMANDS, ids=str)
def test_doc_command_names_real_flags_and_shipped_paths_when_parsed(command: DocCommand) -> None:
    """Every command the docs and the example specs' comments show (cluster-only ones too) parses with
    specsweep's own argparse parser, names existing Makefile targets, and every repository path it names
    ships with the repository."""
    for segment in _segments(command.code):
        for argv in _specsweep_argvs(segment):
            problem = _parse_problem(argv)
            assert problem is None, f"{command}: `specsweep {shlex.join(argv)}` does not parse: {problem}"
        words = _without_assignments(segment)
        if words and words[0] == "make":
            targets = [w for w in words[1:] if "=" not in w and not w.startswith("-")]
            assert set(targets) <= MAKE_TARGETS, f"{command}: no such make target in {targets}"
        quoted = [w for word in segment if word.startswith("specsweep ") for w in shlex.split(word)]
        for path in _repo_paths(segment + quoted):
            assert (REPO / path).exists(), f"{command}: {path} is not in the repository"


def test_doc_markers_cover_every_shell_block_when_read() -> None:
    """Each shell fence of the docs is one block read here (none slips past the reader), every
    `docs-test` marker belongs to a block, each short form still matches its block's text, and the
    README's quick tour is among the commands that run."""
    for doc in DOCS:
        text = doc.read_text(encoding="utf-8")
        blocks = [b for b in BLOCKS if b.doc == str(doc.relative_to(REPO))]
        assert len(SHELL_FENCE.findall(text)) == len(blocks), f"{doc}: a shell block was not read"
        markers = sum(1 for b in blocks if b.not_run or b.server or b.replacements)
        assert len(re.findall(r"^<!-- docs-test:", text, flags=re.M)) == markers, (
            f"{doc}: a docs-test marker is not before a block"
        )
    for block in BLOCKS:
        text = "\n".join(command.code for command in block.commands)
        for old, _ in block.replacements:
            assert old in text, f"{block.doc}:{block.line}: the short form's {old!r} is not in the block"
    run = [c.code for b in BLOCKS if b.not_run is None and b.doc == "README.md" for c in b.commands]
    assert any(code.startswith("specsweep run examples/sweep.yaml --ray-address local") for code in run)


def test_example_inputs_are_the_generators_when_regenerated(tmp_path: Path) -> None:
    """examples/inputs/ (the README's drafter, target config and prompts) is byte for byte what
    harness.demo.write_example_inputs writes, so it can be regenerated and never drifts from the fixtures."""
    write_example_inputs(tmp_path)
    made = {p.relative_to(tmp_path): p.read_bytes() for p in sorted(tmp_path.rglob("*")) if p.is_file()}
    shipped = {
        p.relative_to(EXAMPLE_INPUTS): p.read_bytes()
        for p in sorted(EXAMPLE_INPUTS.rglob("*"))
        if p.is_file()
    }
    fix = "regenerate: python -c 'from harness.demo import *; write_example_inputs(EXAMPLE_INPUTS)'"
    assert shipped.keys() == made.keys(), fix
    assert all(shipped[name] == made[name] for name in made), fix


def _fresh_copy(root: Path) -> Path:
    """The repository's files (as a clone has them) under ``root``; its venvs are not copied."""
    for name in TRACKED:
        target = root / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / name, target)
    return root


def _run_shell(code: str, cwd: Path, env: dict[str, str]) -> tuple[int, str]:
    """Run one doc command in bash in its own process group; whatever it leaves behind is ended."""
    process = subprocess.Popen(
        ["bash", "-c", code],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        output, _ = process.communicate(timeout=COMMAND_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        output, _ = process.communicate()
        return -1, f"timed out after {COMMAND_TIMEOUT_S} s\n{output}"
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    return process.returncode, output


@contextlib.contextmanager
def _server_for(block: DocBlock, copy: Path) -> Iterator[tuple[tuple[str, str], ...]]:
    """The text replacements ``block`` runs with: its short form and, while it runs, its URL -> the URL of
    a simulated server on a free port."""
    if block.server is None:
        yield block.replacements
        return
    from workers.node.launcher import start_sim

    args = ["--model-path", str(copy / SIM_TARGET), "--tp-size", "8"]
    with start_sim(args, log_path=copy / "docs-test-sim.log", healthy_within_s=120) as server:
        yield ((block.server, server.url), *block.replacements)


@pytest.mark.ray
@pytest.mark.timeout(1800)
@pytest.mark.parametrize("doc", RUN_DOCS)
def test_doc_blocks_run_as_written_when_executed_in_a_fresh_copy(
    doc: str, tmp_path: Path, sglang_python: str
) -> None:
    """Each runnable block of the doc runs in document order in a fresh copy of the repository with an
    empty HOME and specsweep on PATH, and every command exits with the code its doc states (0 unless
    its comment says `exit N`)."""
    copy = _fresh_copy(tmp_path / "repo")
    env = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
        "HOME": str(tmp_path / "home"),
        "SPECSWEEP_SGLANG_PYTHON": sglang_python,
        "SPECSWEEP_DRAFTER_CACHE": str(tmp_path / "drafters"),
        "SPECSWEEP_STATE_DIR": str(tmp_path / "state"),
        "SPECSWEEP_PID_DIR": str(tmp_path / "pids"),
    }
    (tmp_path / "home").mkdir()
    for block in (b for b in BLOCKS if b.doc == doc and b.not_run is None):
        with _server_for(block, copy) as replacements:
            for command in block.commands:
                code = command.code
                for old, new in replacements:
                    code = code.replace(old, new)
                started = time.monotonic()
                code_, output = _run_shell(code, copy, env)
                print(f"{command}: exit {code_} in {time.monotonic() - started:.1f} s: {code}")
                assert code_ == command.expected_exit, (
                    f"{command}: `{code}` exited {code_}, the doc says {command.expected_exit}:\n{output[-4000:]}"
                )
