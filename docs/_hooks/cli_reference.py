"""mkdocs hook: writes ``reference/cli.md`` from the ``laxflow`` command definitions.

mkdocs calls :func:`on_files` once per build, before any page is read; the
page is generated there, never kept in git, so every subcommand and flag it
lists is the one ``laxflow.cli`` defines at build time. ``tests/test_docs.py``
imports :func:`command_tree` to check the commands the docs show.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Iterator

_SRC = Path(__file__).resolve().parents[2] / "src"
if str(_SRC) not in sys.path:  # a checkout without `pip install -e .`
    sys.path.insert(0, str(_SRC))

PAGE = "reference/cli.md"


def _root_command() -> Any:
    """The click command behind the typer app, with every family assembled."""
    import typer

    import laxflow.cli as cli

    return typer.main.get_command(cli.app)


def command_tree() -> Iterator[tuple[list[str], Any, Any]]:
    """Yield (path, command, context) for ``laxflow`` and every subcommand, depth first, in CLI order."""
    root = _root_command()
    ctx_cls = type(root).context_class
    root_ctx = ctx_cls(root, info_name="laxflow")

    def walk(cmd: Any, path: list[str], ctx: Any) -> Iterator[tuple[list[str], Any, Any]]:
        yield path, cmd, ctx
        if hasattr(cmd, "list_commands"):
            for name in cmd.list_commands(ctx):
                sub = cmd.get_command(ctx, name)
                if sub is None or getattr(sub, "hidden", False):
                    continue
                yield from walk(sub, path + [name], ctx_cls(sub, info_name=name, parent=ctx))

    yield from walk(root, ["laxflow"], root_ctx)


def _cell(text: str) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def _type_name(param: Any) -> str:
    """The value's type as click or typer (whose vendored click has no ``param.type``) names it."""
    if getattr(param, "type", None) is not None:
        return str(getattr(param.type, "name", "value")).upper()
    bare = getattr(param, "bare_type", None)
    if callable(bare):
        try:
            return str(bare()).upper()
        except TypeError:
            pass
    return "VALUE"


def _param_row(param: Any) -> str | None:
    if getattr(param, "hidden", False):
        return None
    if param.param_type_name == "argument":
        name = f"`{(param.metavar or param.name).upper()}`"
        kind = _type_name(param) + " argument" + ("" if param.required else " (optional)")
    else:
        opts = list(param.opts) + list(param.secondary_opts)
        name = ", ".join(f"`{o}`" for o in opts)
        kind = "flag" if param.is_flag else _type_name(param)
    default = param.default
    if callable(default) or default in (None, (), [], False) or getattr(param, "is_flag", False):
        shown = ""
    else:
        shown = f"`{default}`"
    if param.required:
        shown = "required"
    return f"| {name} | {kind} | {shown} | {_cell(getattr(param, 'help', '') or '')} |"


def render() -> str:
    """The whole CLI reference page as Markdown."""
    out = [
        "# CLI reference",
        "",
        "Generated at docs build time from the command definitions in `laxflow.cli`",
        "(`docs/_hooks/cli_reference.py`): every subcommand and flag the installed `laxflow`",
        "accepts. `laxflow COMMAND --help` prints the same from the terminal.",
        "",
    ]
    for path, cmd, ctx in command_tree():
        level = min(len(path) + 1, 4)
        out.append(f"{'#' * level} `{' '.join(path)}`")
        out.append("")
        text = (cmd.help or cmd.short_help or "").strip()
        if text:
            out.append(" ".join(text.split("\b")).strip())
            out.append("")
        usage = " ".join(cmd.collect_usage_pieces(ctx))
        out.append("```")
        out.append(f"{' '.join(path)} {usage}".rstrip())
        out.append("```")
        out.append("")
        rows = [r for r in (_param_row(p) for p in cmd.params) if r]
        if rows:
            out.append("| name | type | default | meaning |")
            out.append("|---|---|---|---|")
            out.extend(rows)
            out.append("")
        subs = [n for n in cmd.list_commands(ctx)] if hasattr(cmd, "list_commands") else []
        if subs:
            out.append("Subcommands: " + ", ".join(f"`{' '.join(path + [n])}`" for n in subs) + ".")
            out.append("")
    return "\n".join(out) + "\n"


def on_files(files: Any, config: Any) -> Any:
    """mkdocs event: add the generated page (replacing any file of that name)."""
    from mkdocs.structure.files import File

    old = files.get_file_from_path(PAGE)
    if old is not None:
        files.remove(old)
    files.append(File.generated(config, PAGE, content=render()))
    return files


# --- message tables of reference/protocol.md, from the typed message classes ---

MESSAGES_MARKER = "<!-- laxflow:messages -->"


def _type_text(tp: Any) -> str:
    text = tp if isinstance(tp, str) else getattr(tp, "__name__", None) or str(tp)
    return str(text).replace("typing.", "").replace("laxflow.protocol.messages.", "").replace("|", "\\|")


def message_tables() -> str:
    """One table per message family: type string, class and fields, read from the dataclasses."""
    import dataclasses

    import laxflow.protocol.hooks as hooks_messages
    import laxflow.protocol.messages as control_messages

    out: list[str] = []
    for title, module in (("Control plane (`laxflow.protocol.messages`)", control_messages),
                          ("Hooks (`laxflow.protocol.hooks`)", hooks_messages)):
        rows = []
        for name in sorted(vars(module)):
            cls = getattr(module, name)
            if not (isinstance(cls, type) and dataclasses.is_dataclass(cls) and isinstance(getattr(cls, "TYPE", None), str)):
                continue
            if cls.__module__ != module.__name__:
                continue
            fields = ", ".join(f"`{f.name}`: {_type_text(f.type)}" for f in dataclasses.fields(cls)) or "none"
            doc = " ".join((cls.__doc__ or "").strip().split("\n\n")[0].split())
            if doc.startswith(f"{name}("):  # the signature dataclasses write when there is no docstring
                doc = ""
            rows.append(f"| `{cls.TYPE}` | `{name}` | {fields} | {doc.replace('|', '/')} |")
        out += [f"### {title}", "", "| `type` | class | body fields | what |", "|---|---|---|---|", *rows, ""]
    return "\n".join(out)


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    """mkdocs event: fill the protocol page's message tables at build time."""
    if MESSAGES_MARKER in markdown:
        return markdown.replace(MESSAGES_MARKER, message_tables())
    return markdown
