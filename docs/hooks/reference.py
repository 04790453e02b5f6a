"""An mkdocs hook: the reference pages' tables, generated from the code each time the site is built.

A page asks for a table with a marker line, which is replaced by what the code says now:

- `<!-- reference: run-config -->`: every key of the run config, a table per section
  (`fedqueue.fl.config.config_sections`, each anchored by its class's name less "Section": `#fedasync`): key, type,
  default, meaning;
- `<!-- reference: dfkd -->`: every knob of the run config's `dfkd` table (`fedqueue.fl.ml.distill.dfkd_defaults`,
  from `ReviveSettings` and `fedqueue.fl.ml.synthesis.SynthesisSettings`);
- `<!-- reference: settings -->`: every setting of `fedqueue.config.Settings`, by its environment variable;
- `<!-- reference: cli -->`: every command of `fedqueue`, with its arguments and options.

A field's meaning is its attribute docstring: the string on the line under it, which mkdocstrings reads
too. A field without one fails the build, naming the field, as does a setting whose docstring does not
start with the variables `Settings.from_env` reads for it.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import json
import re
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from mkdocs.config.defaults import MkDocsConfig
from mkdocs.exceptions import PluginError
from mkdocs.structure.files import Files
from mkdocs.structure.pages import Page

ROOT = Path(__file__).resolve().parents[2]

MARKER = re.compile(r"^<!-- reference: ([a-z-]+) -->$", re.MULTILINE)
# The torch modules whose dataclasses make the `dfkd` table: read from source, not imported (torch takes seconds).
DFKD_CLASSES = (
    (ROOT / "fedqueue" / "fl" / "ml" / "distill.py", "ReviveSettings"),
    (ROOT / "fedqueue" / "fl" / "ml" / "synthesis.py", "SynthesisSettings"),
)
# A setting's docstring starts with the environment variables it is read from: "FEDQUEUE_X: what it is".
SETTING_DOC = re.compile(r"^(FEDQUEUE_[A-Z_]+(?:, FEDQUEUE_[A-Z_]+)*): (.+)$")


@dataclasses.dataclass(frozen=True)
class SourceField:
    """A class-level annotated assignment as the source has it, with the docstring under it."""

    name: str
    annotation: str
    value: ast.expr | None
    doc: str


def source_fields(path: Path, class_name: str) -> list[SourceField]:
    """The annotated fields of class `class_name` in `path`, in order, each with its docstring ("" if none)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    found = [node for node in ast.walk(tree) if isinstance(node, ast.ClassDef) and node.name == class_name]
    if not found:
        raise PluginError(f"{path.name}: no class {class_name}")
    body = found[0].body
    result = []
    for node, after in zip(body, [*body[1:], None], strict=True):
        if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
            continue
        doc = ""
        if isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant) and isinstance(after.value.value, str):
            doc = " ".join(inspect.cleandoc(after.value.value).split())
        result.append(SourceField(node.target.id, ast.unparse(node.annotation), node.value, doc))
    return result


def _described(owner: str, items: list[SourceField]) -> dict[str, SourceField]:
    missing = [item.name for item in items if not item.doc]
    if missing:
        raise PluginError(
            f"{owner}: no description for {', '.join(missing)}: write a docstring on the line under each field"
        )
    return {item.name: item for item in items}


def toml_value(value: Any) -> str:
    """A default as a config file writes it."""
    if value is None:
        return "none"
    if isinstance(value, bool):
        return "`true`" if value else "`false`"
    if isinstance(value, str | list | dict):
        return f"`{json.dumps(value)}`"
    return f"`{value!r}`"


def type_words(annotation: str) -> str:
    """`int | None` as `int` or `None`: a code span in a table cell cannot hold an escaped `|`."""
    return " or ".join(f"`{part}`" for part in annotation.split(" | "))


def table(headers: tuple[str, ...], rows: Sequence[tuple[str, ...]]) -> str:
    def cell(text: str) -> str:
        return text.replace("|", "\\|")

    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(cell(text) for text in row) + " |" for row in rows]
    return "\n".join(lines)


def run_config_table() -> str:
    """One table per section of the run config (fedqueue.fl.config.config_sections), each under its heading."""
    from fedqueue.fl import config
    from fedqueue.fl.sections.base import default_of

    parts = []
    for heading, section, keys in config.config_sections():
        source = Path(inspect.getfile(section))
        docs = _described(
            section.__name__, [item for item in source_fields(source, section.__name__) if item.name in keys]
        )
        types = {spec.name: str(spec.type) for spec in dataclasses.fields(section)}
        rows = [
            (f"`{key}`", type_words(types[key]), toml_value(default_of(section, key)), docs[key].doc) for key in keys
        ]
        # A section's anchor is its class's name less "Section" (FedAsyncSection: #fedasync), for pages to link to.
        anchor = (
            f" {{ #{section.__name__.removesuffix('Section').lower()} }}"
            if section.__name__.endswith("Section")
            else ""
        )
        parts.append(f"### {heading}{anchor}\n\n" + table(("key", "type", "default", "meaning"), rows))
    return "\n\n".join(parts)


def dfkd_table() -> str:
    rows = []
    for path, class_name in DFKD_CLASSES:
        for item in _described(class_name, source_fields(path, class_name)).values():
            default = ast.literal_eval(item.value) if item.value is not None else None
            rows.append((f"`{item.name}`", type_words(item.annotation), toml_value(default), item.doc))
    return table(("`dfkd` key", "type", "default", "meaning"), rows)


class _AskedFor(dict[str, str]):
    """An empty environment that notes every variable read from it."""

    def __init__(self) -> None:
        super().__init__()
        self.asked: list[str] = []

    def get(self, key: str, default: Any = None) -> Any:
        self.asked.append(key)
        return default


def settings_table() -> str:
    from fedqueue import config

    docs = _described("Settings", source_fields(Path(config.__file__), "Settings"))
    environment = _AskedFor()
    config.Settings.from_env(environment)
    read = set(environment.asked)
    named: set[str] = set()
    rows = []
    for spec in dataclasses.fields(config.Settings):
        match = SETTING_DOC.match(docs[spec.name].doc)
        if match is None:
            raise PluginError(f"Settings.{spec.name}: its docstring must start with its variable: 'FEDQUEUE_X: ...'")
        variables = match.group(1).split(", ")
        named.update(variables)
        default = spec.default_factory() if callable(spec.default_factory) else spec.default
        shown = "none" if default in (None, ()) else f"`{default}`"
        meaning = match.group(2)[:1].upper() + match.group(2)[1:]
        rows.append((", ".join(f"`{name}`" for name in variables), f"`{spec.name}`", shown, meaning))
    if named != read:
        raise PluginError(
            f"Settings: the docstrings name {sorted(named - read)} that from_env does not read, "
            f"and from_env reads {sorted(read - named)} that no docstring names"
        )
    return table(("variable", "`Settings` field", "default", "meaning"), rows)


def _paragraphs(text: str) -> str:
    return "\n\n".join(" ".join(block.split()) for block in inspect.cleandoc(text).split("\n\n"))


def _usage(path: str, command: Any) -> str:
    pieces = [path]
    if any(param.param_type_name == "option" and not param.hidden for param in command.params):
        pieces.append("[OPTIONS]")
    for param in command.params:
        if param.param_type_name == "argument":
            name = (param.metavar or param.name).upper()
            pieces.append(name if param.required else f"[{name}]")
    if hasattr(command, "commands"):
        pieces.append("COMMAND [ARGS]...")
    return " ".join(pieces)


def _param_row(param: Any) -> tuple[str, str, str]:
    if param.param_type_name == "argument":
        names = f"`{(param.metavar or param.name).upper()}`"
    else:
        names = ", ".join(f"`{name}`" for name in [*param.opts, *param.secondary_opts])
    if param.required:
        default = "required"
    elif param.default is None or param.default == [] or (param.multiple and not param.default):
        default = ""
    else:
        default = toml_value(param.default)
    meaning = " ".join((param.help or "").split())
    if param.envvar:
        meaning += f" Also set by `{param.envvar}`."
    if not meaning:
        raise PluginError(f"{names}: an option without help")
    return names, default, meaning


def _commands(path: str, command: Any) -> Iterator[tuple[str, Any]]:
    yield path, command
    for name, sub in getattr(command, "commands", {}).items():
        if not sub.hidden:
            yield from _commands(f"{path} {name}", sub)


def cli_reference() -> str:
    import typer.main

    from fedqueue.cli.commands import app

    sections = []
    for path, command in _commands("fedqueue", typer.main.get_command(app)):
        if not command.help:
            raise PluginError(f"{path}: a command without help")
        lines = [f"## `{path}`", "", _paragraphs(command.help), "", "```", _usage(path, command), "```", ""]
        rows = [_param_row(param) for param in command.params if not getattr(param, "hidden", False)]
        if rows:
            lines += [table(("argument or option", "default", "meaning"), rows), ""]
        subcommands = [f"{path} {name}" for name, sub in getattr(command, "commands", {}).items() if not sub.hidden]
        if subcommands:
            links = (f"[`{sub}`](#{sub.replace(' ', '-')})" for sub in subcommands)
            lines.append("Commands: " + ", ".join(links) + ".")
        sections.append("\n".join(lines))
    return "\n\n".join(sections)


GENERATORS: dict[str, Callable[[], str]] = {
    "run-config": run_config_table,
    "dfkd": dfkd_table,
    "settings": settings_table,
    "cli": cli_reference,
}


def on_config(config: MkDocsConfig) -> MkDocsConfig:
    """The checkout being documented comes first, before any installed copy of fedqueue (mkdocs puts sys.path
    back as it was after loading a hook, so this is done here)."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    return config


def on_page_markdown(markdown: str, page: Page, config: MkDocsConfig, files: Files) -> str:
    def generated(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in GENERATORS:
            raise PluginError(f"{page.file.src_uri}: unknown reference table {name!r} (known: {', '.join(GENERATORS)})")
        return GENERATORS[name]()

    return MARKER.sub(generated, markdown)
