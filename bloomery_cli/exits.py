"""How a command refuses bad input: one line on stderr naming the thing and what was expected, then exit code 2
(docs/CONTRACT.md, "Errors and exit codes"). Every command module prints its errors through here."""

from __future__ import annotations

from typing import NoReturn

import typer
from rich.console import Console
from rich.markup import escape

from bloomery_gates.errors import EXIT_INPUT, InputError

err = Console(stderr=True)


def print_error(e: InputError, who: str = "") -> None:
    """``error: [who: ]<e>`` on stderr (``who``: the gate a batch command was running)."""
    err.print(f"[bold red]error:[/] {who + ': ' if who else ''}{escape(str(e))}", highlight=False, soft_wrap=True)


def fail_input(e: InputError) -> NoReturn:
    print_error(e)
    raise typer.Exit(EXIT_INPUT)
