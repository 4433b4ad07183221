"""``--help`` paragraphs that the terminal wraps.

A command's docstring is wrapped at 120 columns in the source (ruff), but typer's rich help keeps a paragraph's
single newlines, so at 80 columns a sentence broke in the middle of a line. ``reflow(app)`` joins each paragraph of
every registered command's docstring into one line, once, after the commands are registered; paragraphs stay apart
(blank line), and the terminal does the wrapping.
"""

from __future__ import annotations

import inspect

import typer


def paragraphs(doc: str) -> str:
    """doc with each paragraph on one line (its whitespace runs made one space), paragraphs kept apart."""
    return "\n\n".join(" ".join(p.split()) for p in inspect.cleandoc(doc).split("\n\n") if p.strip())


def reflow(app: typer.Typer) -> None:
    """Every command of app and of its sub-apps: its callback's docstring as ``paragraphs`` (a command given its
    help explicitly keeps it)."""
    for info in app.registered_commands:
        if info.callback is not None and info.callback.__doc__ and info.help is None:
            info.callback.__doc__ = paragraphs(info.callback.__doc__)
    for group in app.registered_groups:
        if group.typer_instance is not None:
            reflow(group.typer_instance)
