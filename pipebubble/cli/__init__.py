"""The command line: a thin typer app. Each subcommand lives in a small module of this package;
only this package prints, writes files and exits."""

from __future__ import annotations

import sys

import click
import typer
from typer._click import exceptions as click_errors  # typer vendors its own click

from pipebubble.errors import PipebubbleError

app = typer.Typer(
    name="pipebubble",
    help="Find the bubbles in pipeline-parallel training and LLM serving traces.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _version(value: bool) -> None:
    if value:
        from pipebubble import __version__

        print(f"pipebubble {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="Show the version."),
) -> None:
    """Find the bubbles in pipeline-parallel training and LLM serving traces."""


_registered = False


def _register() -> None:
    """Add the subcommands once (tests call this as well as ``main``)."""
    global _registered
    if _registered:
        return
    _registered = True
    from pipebubble.cli import analyze, capture, check, diff, export, theory

    for module in (analyze, theory, capture, export, check, diff):
        module.register(app)


def main() -> None:
    """Entry point: turns PipebubbleError into one line on stderr and exit code 2."""
    _register()
    try:
        code = app(standalone_mode=False)
    except PipebubbleError as exc:
        print(f"pipebubble: error: {exc}", file=sys.stderr)
        sys.exit(2)
    except (typer.Exit, click.exceptions.Exit) as exc:
        sys.exit(exc.exit_code)
    except (click_errors.ClickException, click.ClickException) as exc:
        exc.show()
        sys.exit(2)
    except (typer.Abort, click.exceptions.Abort, KeyboardInterrupt):
        sys.exit(130)
    sys.exit(code if isinstance(code, int) else 0)
