"""lcft's command and group classes: how --help lists parameters (a flag --x/--no-x as one `--[no-]x` entry, a
value's placeholder in upper case: its metavar, else its type, TEXT, PATH, INTEGER, FLOAT; a plain flag none), and an
option of one value given twice refused."""

from __future__ import annotations

import copy
import inspect
from collections.abc import Mapping
from typing import Any

import typer
from typer.core import TyperCommand, TyperGroup, TyperOption

from lcft.cli.common import fail

# typer's type names (`<str>`, `<path>`) as click spells them in upper case, the way lcft's own metavars read
TYPE_WORDS = {"str": "TEXT", "int": "INTEGER", "float": "FLOAT", "bool": "BOOLEAN", "path": "PATH"}


def placeholder(param: Any, ctx: Any) -> str | None:
    """What --help shows for the value `param` takes: its metavar, else its type in upper case (TEXT, PATH: typer's
    own `<str>`, `<path>` stood beside lcft's PATH and DIR); None for a flag, which takes no value."""
    if isinstance(param, TyperOption):
        if param.is_flag or param.count:
            return None
        if param.metavar:
            return param.metavar
    label = param.display_type(ctx).strip("<>")
    return TYPE_WORDS.get(label, label.upper())


def shown(param: Any, ctx: Any) -> Any:
    """`param` as the help lists it: its placeholder, and --x with the secondary name --no-x shown as --[no-]x
    (given a column of their own, the --no-x names left an 80-column terminal too little room, and typer cut the
    option names with '…')."""
    out = copy.copy(param)  # only the help's view: parsing keeps both names of every flag
    word = placeholder(param, ctx)
    out.display_type_rich = lambda ctx: word  # type: ignore[attr-defined]
    opts, negative = getattr(param, "opts", []), getattr(param, "secondary_opts", [])
    long = [o for o in opts if o.startswith("--")]
    if len(long) == 1 and negative == ["--no-" + long[0][2:]]:
        out.opts = ["--[no-]" + long[0][2:] if o == long[0] else o for o in opts]
        out.secondary_opts = []
    return out


def paragraphs(text: str | None) -> str | None:
    """A command's help with each paragraph on one line: typer's rich help keeps a docstring's line breaks, so the
    listing of commands broke mid-sentence where the source line ended (rich wraps each paragraph itself)."""
    if not text:
        return text
    return "\n\n".join(" ".join(p.split()) for p in inspect.cleandoc(text).split("\n\n"))


class HelpCommand(TyperCommand):
    """The class of every lcft command: its --help lists its parameters (--help included) as `shown`, its help as
    `paragraphs`; an option of one value given more than once is refused in one line (click keeps the last one, so
    `--fasta a.fa --fasta b.fa` read b.fa alone), `once` mapping a parameter's name to what the refusal adds. A
    repeated --x/--no-x flag keeps click's rule, the last one given wins: a flag added to override an earlier one."""

    once: Mapping[str, str] = {}

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.help = paragraphs(self.help)

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        if args and not ctx.resilient_parsing:  # (none: the help; resilient: shell completion)
            _, _, order = self.make_parser(ctx).parse_args(args=list(args))  # order: one entry per occurrence
            for param in dict.fromkeys(order):
                n = order.count(param)
                if n > 1 and param.param_type_name == "option" and not param.multiple and not param.is_flag:
                    name = next((o for o in param.opts if o.startswith("--")), param.opts[0])
                    hint = self.once.get(param.name or "", "")
                    raise fail(f"{name} is given {n} times; it takes one value" + (f": {hint}" if hint else ""))
        return super().parse_args(ctx, args)

    def format_help(self, ctx: Any, formatter: Any) -> None:
        view = copy.copy(self)
        view.get_params = lambda ctx: [shown(p, ctx) for p in TyperCommand.get_params(self, ctx)]  # type: ignore[method-assign]
        TyperCommand.format_help(view, ctx, formatter)


class HelpGroup(TyperGroup):
    """A command group whose --help lists its own options (--help, --version) as `shown`, its help as `paragraphs`."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.help = paragraphs(self.help)

    def format_help(self, ctx: Any, formatter: Any) -> None:
        view = copy.copy(self)
        view.get_params = lambda ctx: [shown(p, ctx) for p in TyperGroup.get_params(self, ctx)]  # type: ignore[method-assign]
        TyperGroup.format_help(view, ctx, formatter)


class Typer(typer.Typer):
    """typer.Typer whose groups and commands list their parameters as `shown`."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(cls=HelpGroup, **kwargs)

    def command(self, *args: Any, cls: type[TyperCommand] | None = None, **kwargs: Any) -> Any:
        return super().command(*args, cls=cls or HelpCommand, **kwargs)
