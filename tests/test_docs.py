"""The README and the docs site cannot rot silently.

Every ``laxflow ...`` command shown in README.md and docs/ must name a real
subcommand and real flags of the typer app; the config page must name every
key and typed field; the metrics page every metric the code registers, and
no other. ``make test`` also runs ``mkdocs build --strict`` (broken links,
missing pages); these checks are what a strict build cannot see.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = ROOT / "docs"


def _hook():
    """docs/_hooks/cli_reference.py, the module mkdocs runs to write the CLI reference."""
    spec = importlib.util.spec_from_file_location("cli_reference", DOCS / "_hooks" / "cli_reference.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


@pytest.fixture(scope="module")
def commands() -> dict[tuple[str, ...], set[str]]:
    """Command path (without 'laxflow') -> its option names, for every command and group."""
    tree = {}
    for path, cmd, _ctx in _hook().command_tree():
        opts = {o for p in cmd.params for o in (*getattr(p, "opts", ()), *getattr(p, "secondary_opts", ()))
                if o.startswith("-")}
        tree[tuple(path[1:])] = opts | {"--help"}
    return tree


def _pages() -> list[Path]:
    return [README, *sorted(DOCS.rglob("*.md"))]


_FENCE = re.compile(r"^(```|~~~)[^\n]*\n(.*?)^\1[ \t]*$", re.S | re.M)
_INLINE = re.compile(r"`([^`\n]+)`")
# ``laxflow`` where a command starts: a line (after a prompt or sudo), after ; & | ( or after `` -- ``
# (``kubectl exec POD -- laxflow ...``); not an argument such as ``kubectl -n laxflow``.
_CALL = re.compile(r"(?:^[ \t]*(?:\$\s+)?(?:sudo\s+)?|[;&|(]\s*|\s--\s+)laxflow(?=\s|$)(.*)$", re.M)


def _shown_commands(text: str) -> list[str]:
    """The text after each ``laxflow`` invocation in fenced blocks and inline code spans."""
    found = []
    for block in _FENCE.finditer(text):
        body = re.sub(r"\\\n\s*", " ", block.group(2))  # shell line continuations
        found += [m.group(1) for m in _CALL.finditer(body)]
    prose = _FENCE.sub("", text)
    for span in _INLINE.finditer(prose):
        found += [m.group(1) for m in _CALL.finditer(span.group(1))]
    return found


def _check(rest: str, commands: dict[tuple[str, ...], set[str]]) -> str | None:
    """None when ``laxflow <rest>`` names a real command with real flags, else what is wrong."""
    rest = re.split(r"\s--(?:\s|$)|[|#;]|&&", rest)[0]  # the job's own command line, pipes, comments
    tokens = rest.split()
    path: tuple[str, ...] = ()
    i = 0
    while i < len(tokens) and re.fullmatch(r"[a-z][a-z0-9-]*", tokens[i]) and path + (tokens[i],) in commands:
        path += (tokens[i],)
        i += 1
    if not path and i < len(tokens) and re.fullmatch(r"[a-z][a-z0-9-]*", tokens[i]):
        return f"no subcommand {tokens[i]!r}"
    if path and i < len(tokens) and re.fullmatch(r"[a-z][a-z0-9-]*", tokens[i]):
        group_has_subs = any(len(p) == len(path) + 1 and p[:len(path)] == path for p in commands)
        if group_has_subs:
            return f"no subcommand {tokens[i]!r} of 'laxflow {' '.join(path)}'"
    for token in tokens[i:]:
        flag = token.split("=")[0]
        if re.fullmatch(r"--[a-z][a-z0-9-]*", flag) and flag not in commands[path]:
            return f"no flag {flag} of 'laxflow {' '.join(path)}'"
    return None


def test_readme_is_short_and_opens_with_the_two_commands():
    lines = README.read_text().splitlines()
    assert len(lines) <= 200, f"README.md has {len(lines)} lines (at most 200)"
    long = [(n, len(line)) for n, line in enumerate(lines, 1) if len(line) > 200]
    assert not long, f"README.md lines over 200 characters: {long}"
    first_block = _FENCE.search("\n".join(lines) + "\n")
    assert first_block is not None and first_block.start() < 200, "README.md must open with a code block"
    body = first_block.group(2)
    assert "make demo" in body and "make test" in body, "README.md's first code block must show make demo and make test"


def test_the_checker_catches_made_up_commands(commands):
    assert _check(" sim serve --preset demo --plot out/demo.png", commands) is None
    assert _check(" run --dscp 46 -- python train.py --bogus", commands) is None
    assert _check(" sim server --preset demo", commands) is not None
    assert _check(" daemon --no-such-flag 1", commands) is not None
    assert _check(" frobnicate", commands) is not None
    assert _shown_commands("```\nkubectl -n laxflow get pods\nkubectl exec p -- laxflow status --json\n```\n") == [
        " status --json"]


@pytest.mark.parametrize("page", _pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_command_shown_exists(page, commands):
    shown = _shown_commands(page.read_text())
    bad = [f"laxflow{rest.rstrip()}: {why}" for rest in shown if (why := _check(rest, commands))]
    assert not bad, f"{page.relative_to(ROOT)}: " + "; ".join(bad)


def test_docs_show_commands_at_all():
    shown = [rest for page in _pages() for rest in _shown_commands(page.read_text())]
    assert len(shown) > 50  # the extractor still finds the commands the pages show


def test_cli_reference_lists_every_command_and_flag(commands):
    page = _hook().render()
    for path, opts in commands.items():
        assert f"`{' '.join(('laxflow',) + path)}`" in page
        for opt in opts - {"--help"}:
            assert f"`{opt}`" in page, f"{opt} of laxflow {' '.join(path)} missing from the CLI reference"


def test_config_page_names_every_key_and_field():
    from laxflow.daemon import config as daemon_config
    from laxflow.daemon.core import CoreConfig
    from laxflow.policy.config import MfsConfig

    page = (DOCS / "reference" / "config.md").read_text()
    names = set(daemon_config._FILE_KEYS)
    names |= {f.name for cls in (daemon_config.DaemonConfig, CoreConfig, MfsConfig) for f in dataclasses.fields(cls)}
    names |= {"name", "gbps", "rate", "counter", "window"}  # ports-file entries (laxflow.daemon.ports)
    names -= {"core"}
    missing = sorted(n for n in names if f"`{n}`" not in page)
    assert not missing, f"docs/reference/config.md does not name: {missing}"


def _registered_metrics() -> set[str]:
    text = "".join(p.read_text() for p in (ROOT / "src" / "laxflow").rglob("*.py"))
    return set(re.findall(r"(?:Counter|Gauge|Histogram)\(\s*\"(laxflow_[a-z_]+)\"", text))


def test_operate_page_lists_every_metric_and_no_other():
    registered = _registered_metrics()
    assert len(registered) > 20
    page = (DOCS / "operate.md").read_text()
    for name in registered:
        assert f"`{name}" in page, f"metric {name} is not on docs/operate.md"
    shown = set()
    for page_path in _pages():
        for name in re.findall(r"laxflow_(?:daemon|coordinator)_[a-z_]+", page_path.read_text()):
            shown.add(re.sub(r"_(total|bucket|sum|count)$", "", name))
    unknown = sorted(shown - registered)
    assert not unknown, f"the docs name metrics the code does not register: {unknown}"
