"""One generator for every config-driven command: a flag per dataclass field, help from the field docstrings."""

from __future__ import annotations

import dataclasses
import inspect
import re
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import typer
from rich.markup import escape as markup_escape

from lcft.cli.common import user_errors
from lcft.cli.help import HelpCommand
from lcft.config import ConfigError, doc, format_size, is_size
from lcft.config_build import from_layers, load_layer


@dataclass(frozen=True)
class Opt:
    """How one field appears on the command line where the generated default does not fit."""

    flag: str | None = None
    """The long option instead of --field-name (e.g. --checkpoint for the field `checkpoints`)."""
    aliases: tuple[str, ...] = ()
    """Extra option names, e.g. ("-c",)."""
    metavar: str | None = None
    """Placeholder in the help instead of the one derived from the type (N, FLOAT, SIZE, a|b, TEXT)."""
    note: str = ""
    """Text appended to the field docstring in the help."""
    commas: bool = False
    """A tuple field given once as 'a,b' instead of by repeating the option."""
    panel: str | None = None
    """The help panel (section) the option is listed in; None: the command's plain Options panel."""
    once: str = ""
    """What to do instead, said when an option of one value is given more than once (e.g. how to join files);
    an option of `commas` says by default to give several as a,b."""


@dataclass(frozen=True)
class Extra:
    """A command option that is not a config field (e.g. --quiet); passed to `run` by name."""

    names: tuple[str, ...]
    help: str
    default: Any = False
    annotation: Any = bool
    in_config: bool = False
    """Also a key of the command's --config table (a flag given wins); never a field of the saved config."""


# The progress bar of a command that is not a config field (train's is: `progress`, in its TOML too): the same
# option, --[no-]progress, wherever a command shows one
PROGRESS = Extra(("--progress/--no-progress",), "Show the progress bars (default: on).", default=True,
                 in_config=True)

# The widest `a|b|c` metavar the help shows; longer choice lists show CHOICE and are named in the help text,
# so that an 80-column terminal keeps room for the option names and their help
CHOICES_WIDTH = 14


def flag_name(name: str) -> str:
    return "--" + name.replace("_", "-")


def _shown(value: Any, size: bool) -> str:
    """A default the way a user would type it: 512K, chr1,chr2, on/off; '' when there is nothing to show."""
    if value is None or value in ("", ()):
        return ""
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, tuple | list):
        return ",".join(_shown(v, size) for v in value)
    return format_size(value) if size and isinstance(value, int) else str(value)


def _choices(tp: Any) -> tuple[str, ...]:
    """The values of a Literal type (or of the Literal in an optional one); () for any other type."""
    for arg in (tp, *typing.get_args(tp)):
        if typing.get_origin(arg) is typing.Literal:
            return tuple(map(str, typing.get_args(arg)))
    return ()


def _metavar(tp: Any) -> str:
    if choices := _choices(tp):
        shown = "|".join(choices)
        return shown if len(shown) <= CHOICES_WIDTH else "CHOICE"
    if is_size(tp):
        return "SIZE"
    kinds = {int, float} & {tp, *typing.get_args(tp)}
    return "N" if kinds == {int} else "FLOAT" if kinds else "TEXT"


def _is_tuple(tp: Any) -> bool:
    return typing.get_origin(tp) in (tuple, list)


def _field_parameter(cls: type, f: dataclasses.Field, tp: Any, opt: Opt) -> inspect.Parameter:
    """A keyword parameter whose typer default is None (= not given: the TOML value or the default applies)."""
    default = f.default if f.default is not dataclasses.MISSING else (
        f.default_factory() if f.default_factory is not dataclasses.MISSING else None)  # type: ignore[misc]
    shown = _shown(default, is_size(tp))
    text = " ".join(t for t in (doc(cls, f.name), opt.note) if t)
    choices = _choices(tp)
    if opt.metavar is None and _metavar(tp) == "CHOICE" and not all(re.search(rf"\b{re.escape(c)}\b", text)
                                                                    for c in choices):
        text += f" One of: {', '.join(choices)}."  # the metavar does not name them
    help_text = markup_escape(text + (f" (default: {shown})" if shown else ""))  # rich help reads [..] as markup
    flag = opt.flag or flag_name(f.name)
    if tp is bool:
        option = typer.Option(None, f"{flag}/--no-{flag[2:]}", *opt.aliases, help=help_text, show_default=False,
                              rich_help_panel=opt.panel)
        ann: Any = bool | None
    else:
        repeat = _is_tuple(tp) and not opt.commas
        metavar = opt.metavar or _metavar(typing.get_args(tp)[0] if _is_tuple(tp) else tp)
        if repeat and not opt.note:
            help_text = help_text.replace(text, text + " Repeat the option.", 1)
        option = typer.Option(None, flag, *opt.aliases, help=help_text, show_default=False, metavar=metavar,
                              rich_help_panel=opt.panel)
        ann = list[str] | None if repeat else str | None
    return inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, default=option, annotation=ann)


def _fields(cls: type) -> list[dataclasses.Field]:
    """The fields of `cls`: its own first, then those of each base config (e.g. ParallelConfig) in MRO order."""
    fields = dataclasses.fields(cls)
    rank = {k: i for i, k in enumerate(c for c in cls.__mro__ if dataclasses.is_dataclass(c))}
    owner = {f.name: next(c for c in cls.__mro__ if f.name in c.__dict__.get("__annotations__", {})) for f in fields}
    return sorted(fields, key=lambda f: rank[owner[f.name]])  # stable: declaration order within a class


def config_parameters(cls: type, options: Mapping[str, Opt], config_help: str) -> list[inspect.Parameter]:
    """--config, then one parameter per field of `cls` (its own fields first)."""
    hints = typing.get_type_hints(cls, include_extras=True)
    params = [inspect.Parameter("config", inspect.Parameter.KEYWORD_ONLY, annotation=str | None,
                                default=typer.Option(None, "--config", metavar="TOML", help=config_help))]
    for f in _fields(cls):
        params.append(_field_parameter(cls, f, hints[f.name], options.get(f.name, Opt())))
    return params


def command_from_config(app: typer.Typer, name: str, cls: type, run: Callable[..., None], *, help: str,
                        epilog: str | None = None, options: Mapping[str, Opt] | None = None,
                        extras: Mapping[str, Extra] | None = None, table: str | None = None,
                        resumes: bool = False) -> None:
    """Register `name` on `app`: flags for every field of `cls` (plus `extras`), resolved as
    defaults < --config TOML (flat, or under a [table] named `table`, default the command) < flags,
    then `run(cfg, **extras)`. `resumes`: run again after a Ctrl-C, it goes on where it stopped (user_errors)."""
    options, extras, table = options or {}, extras or {}, table or name
    config_help = markup_escape(f"TOML file with any of these options (same names, underscores; flat or under its "
                                f"[{table}] table); flags override it.")
    params = config_parameters(cls, options, config_help)
    params.append(inspect.Parameter(CONTEXT, inspect.Parameter.KEYWORD_ONLY, annotation=typer.Context))
    for key, ex in extras.items():
        params.append(inspect.Parameter(key, inspect.Parameter.KEYWORD_ONLY, annotation=ex.annotation,
                                        default=typer.Option(ex.default, *ex.names, help=ex.help, show_default=False)))

    def command(**kwargs: Any) -> None:
        ctx = kwargs.pop(CONTEXT)
        config = kwargs.pop("config", None)
        given = {k: kwargs.pop(k) for k in extras}
        flags = {k: _flag_value(v, options.get(k, Opt())) for k, v in kwargs.items()}
        toml = load_layer(config, cls, table, config_tables(ctx.find_root().command))
        toml = _config_extras(ctx, table, extras, toml, given)
        try:
            run(from_layers(cls, toml, flags, where=f"{table} config"), **given)
        except ConfigError as e:  # the checks name fields; the user typed flags or TOML keys
            e.args = (as_given(str(e), cls, options, flags, toml), *e.args[1:])
            raise

    wrapped = user_errors(command, resumes)
    wrapped.config_table = table  # type: ignore[attr-defined]  # typer copies it onto the command's callback
    wrapped.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
    wrapped.__annotations__ = {p.name: p.annotation for p in params}
    wrapped.__doc__ = help
    once = {k: opt.once or (f"give several comma separated, as {opt.flag or flag_name(k)} a,b" if opt.commas else "")
            for k, opt in options.items()}
    app.command(name, epilog=epilog, cls=type("GeneratedCommand", (HelpCommand,), {"once": once}))(wrapped)


def _config_extras(ctx: typer.Context, table: str, extras: Mapping[str, Extra], toml: Mapping[str, Any],
                   given: dict[str, Any]) -> dict[str, Any]:
    """The TOML layer without the extras it may set (`Extra.in_config`), each taken into `given` where its flag was
    not given on the command line."""
    for key, ex in extras.items():
        if not ex.in_config or key not in toml:
            continue
        if not isinstance(toml[key], ex.annotation):
            raise ConfigError(f"{table} config key {key!r} must be {ex.annotation.__name__}, "
                              f"not {type(toml[key]).__name__} {toml[key]!r}")
        # (by name: typer's own copy of click, or click itself, defines the enum)
        if getattr(ctx.get_parameter_source(key), "name", None) == "DEFAULT":
            given[key] = toml[key]
    return {k: v for k, v in toml.items() if not (k in extras and extras[k].in_config)}


# The parameter a generated command receives its click context in (no config field has this name)
CONTEXT = "lcft_context"


def config_tables(cli: Any) -> set[str]:
    """The [table] of every config-driven command of `cli` (a click group or command), each declared where the
    command is built (`command_from_config`'s `table`): in a `--config` TOML a command reads its own and passes over
    the others', so one file configures several commands; any other table is refused naming the closest."""
    own = getattr(cli.callback, "config_table", None)
    return {own} - {None} | {t for sub in getattr(cli, "commands", {}).values() for t in config_tables(sub)}


def as_given(message: str, cls: type, options: Mapping[str, Opt], flags: Mapping[str, Any],
             toml: Mapping[str, Any]) -> str:
    """A config error's message with each option of `cls` it names (by field name or by flag) spelled as the user
    gave it: its TOML key where the --config file set it and no flag did, else its flag (the way to set one left
    at its default). A one-word field name (length, seed) is read as the option only where the message starts
    with it; quoted text (a value, an unknown key) is left as it is."""
    spelled: dict[str, str] = {}
    for f in dataclasses.fields(cls):
        flag = options.get(f.name, Opt()).flag or flag_name(f.name)
        spelled[flag] = f.name if f.name in toml and flags.get(f.name) is None else flag
        if "_" in f.name:
            spelled[f.name] = spelled[flag]
        elif re.match(rf"{re.escape(f.name)}(?=[ :=])", message):
            message = spelled[flag] + message[len(f.name):]
    names = "|".join(map(re.escape, sorted(spelled, key=len, reverse=True)))
    return re.sub(rf"(?<![\w'\"./-])({names})(?![\w'\"/-]|\.\w)", lambda m: spelled[m.group(1)], message)


def _flag_value(value: Any, opt: Opt) -> Any:
    """A repeated option typer left empty is 'not given' (None), like every other unset flag."""
    if isinstance(value, list | tuple):
        return list(value) or None
    return value
