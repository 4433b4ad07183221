"""The command line's own parse errors as one line: ``error: <click's message>`` on stderr, exit 2.

typer renders click's usage errors (``--seed abc``, an unknown option, a missing argument) as a boxed usage panel
of five or more lines; the exit-2 promise (docs/ARCHITECTURE.md, "Errors and exit codes") is one line naming the
flag. ``OneLineGroup`` is the root group's class: it runs typer's own main in non-standalone mode, prints a
``click.ClickException`` as that one line and maps typer's return of an ``Exit`` code back to ``sys.exit``;
Ctrl-C is ``error: interrupted`` and exit 130.
"""

from __future__ import annotations

import sys
from typing import Any

import click
from typer.core import TyperGroup

from bloomery_gates.errors import EXIT_INPUT

from .exits import err

try:                                   # typer >= 0.2x vendors click as typer._click; older typer raises click's own
    from typer import _click as _vendored
    _CLICKS: tuple[Any, ...] = (click, _vendored)
except ImportError:                    # pragma: no cover - depends on the installed typer
    _CLICKS = (click,)


def _classes(name: str) -> tuple[type, ...]:
    return tuple(getattr(c.exceptions, name) for c in _CLICKS if hasattr(c.exceptions, name))


_NO_ARGS, _CLICK_EXC, _USAGE, _ABORT = (_classes("NoArgsIsHelpError"), _classes("ClickException"),
                                        _classes("UsageError"), _classes("Abort"))



INTERRUPTED = 130                      # typer's exit code for a KeyboardInterrupt (the shell's 128 + SIGINT)


def one_line(e: Any) -> str:
    """click's message with its newlines folded: the parameter it names stays in the line."""
    return " ".join(e.format_message().split())


class OneLineGroup(TyperGroup):
    def main(self, args: Any = None, prog_name: str | None = None, complete_var: str | None = None,
             standalone_mode: bool = True, **extra: Any) -> Any:
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        try:
            rv = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        except _NO_ARGS as e:     # `bloomery`, `bloomery gate`: the help, as asked
            click.echo(e.ctx.get_help() if e.ctx is not None else e.format_message(), err=True)
            sys.exit(EXIT_INPUT)
        except _CLICK_EXC as e:
            err.print(f"[bold red]error:[/] {one_line(e)}", markup=True, highlight=False, soft_wrap=True)
            sys.exit(EXIT_INPUT if isinstance(e, _USAGE) else e.exit_code)
        except _ABORT:            # EOF at a prompt
            sys.exit(1)
        if rv == INTERRUPTED:     # Ctrl-C: typer returns Exit(130) for a KeyboardInterrupt; say so on one line
            err.print("[bold red]error:[/] interrupted", markup=True, highlight=False, soft_wrap=True)
        sys.exit(rv if isinstance(rv, int) else 0)
