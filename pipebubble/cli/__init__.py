"""The command line: a thin typer app. Each subcommand lives in a small module of this package;
only this package prints, writes files and exits.

Exit codes: 0 success, 1 a failed gate, 2 bad input or an unusable output path (one line on stderr naming
the file), 3 an internal error (one line and a request to report it; the traceback with ``--debug``).
"""

from __future__ import annotations

import atexit
import os
import sys
import threading
import traceback
from pathlib import Path

import typer

from pipebubble.errors import OutputError, PipebubbleError, ReaderLeft

OK, GATE_FAILED, BAD_INPUT, INTERNAL = 0, 1, 2, 3

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


def _debug(value: bool) -> None:
    if value:
        os.environ["PIPEBUBBLE_DEBUG"] = "1"


@app.callback()
def _root(
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="Show the version."),
    debug: bool = typer.Option(
        False, "--debug", callback=_debug, is_eager=True, help="Show the traceback of an internal error."
    ),
) -> None:
    """Find the bubbles in pipeline-parallel training and LLM serving traces."""


COMMANDS = ("analyze", "theory", "capture", "export", "check", "diff")  # in the order --help lists them
READS_TRACES = ("analyze", "export", "check", "diff")
_registered: set[str] = set()


def _register(argv: list[str] | None = None) -> None:
    """Add the subcommands (tests call this as well as ``main``). A command line that names one, as in
    ``pipebubble analyze ...``, imports and builds only that one; anything else (``--help``, a typo) gets
    them all, so that typer can list them or say which names exist. A command that reads paths, run
    without them, says what it needs in two lines (``NEEDS_PATHS``), never its whole help."""
    import importlib

    named = _named(argv)
    for name in (named,) if named in COMMANDS else COMMANDS:
        if name not in _registered:
            _registered.add(name)
            importlib.import_module(f"pipebubble.cli.{name}").register(app)
    for info in app.registered_commands:  # without its paths, a command says so (``_missing_paths``), not its help
        if (info.name or getattr(info.callback, "__name__", None)) in NEEDS_PATHS:
            info.no_args_is_help = False


def _named(argv: list[str] | None) -> str | None:
    return next((a for a in argv if not a.startswith("-")), None) if argv else None


def _warm(argv: list[str]) -> None:
    """A command that reads traces named on its line gets its workers' fork server started now, while this
    process loads the rest (``executor.warm``), where they look like work for a pool
    (``ingest.may_need_a_pool``) and the line leaves them to the local pool (no ``--workers 1``, no other
    ``--executor``)."""
    named = _named(argv)
    if named in READS_TRACES and _option(argv, "--workers") != "1" and _option(argv, "--executor") in (None, "local"):
        from pipebubble import executor, ingest

        paths = [a for a in argv if not a.startswith("-") and a != named]
        if any(map(ingest.may_need_a_pool, paths)):
            executor.warm()


def _option(argv: list[str], flag: str) -> str | None:
    """The value given to ``flag`` on the line (``--flag V`` or ``--flag=V``, the last one given), else None."""
    value = None
    for k, arg in enumerate(argv):
        if arg == flag and k + 1 < len(argv):
            value = argv[k + 1]
        elif arg.startswith(f"{flag}="):
            value = arg.partition("=")[2]
    return value


def _as_module() -> None:
    """Started by the ``pipebubble`` script, run as ``python -m pipebubble`` does: a pool's spawned workers
    import their parent's main module first, which for the script is the whole command line interface,
    but skip one named ``pipebubble.__main__``."""
    main = sys.modules.get("__main__")
    script = Path(getattr(main, "__file__", None) or "").name == "pipebubble"
    if main is not None and script and getattr(main, "__spec__", None) is None:
        import importlib.util

        main.__spec__ = importlib.util.find_spec("pipebubble.__main__")


def entry() -> None:
    """The ``pipebubble`` command and ``python -m pipebubble``: ``main``, then an exit that skips the
    interpreter's teardown (freeing every object and module one by one took a tenth of a second after a big
    trace, and a sixth of a tiny trace's run). Output is flushed, other threads are waited for and the
    exit handlers run first, as at any exit; a library caller's ``main`` exits as usual."""
    try:
        main()
        code: object = OK
    except SystemExit as done:
        code = done.code
    if code is not None and not isinstance(code, int):  # a message, as sys.exit takes one: printed, status 1
        print(code, file=sys.stderr)
        code = 1
    status = _flushed(code or OK)
    for thread in threading.enumerate():
        if thread is not threading.main_thread() and not thread.daemon:
            thread.join()
    atexit._run_exitfuncs()
    os._exit(status)


def _flushed(status: int) -> int:
    """``status``, once what is still buffered for stdout and stderr is written; 2 when stdout cannot take
    it (a full disk: said once, unless the command failed already), ``status`` as it was when its reader
    has left (``... | head``)."""
    try:
        sys.stdout.flush()
    except BrokenPipeError:
        pass
    except OSError as exc:
        if status == OK:
            status = BAD_INPUT
            print(f"pipebubble: error: {OutputError('<stdout>', exc.strerror or str(exc))}", file=sys.stderr)
    except ValueError:  # closed
        pass
    try:
        sys.stderr.flush()
    except (OSError, ValueError):
        pass
    return status


def main(argv: list[str] | None = None) -> None:
    """Entry point: every outcome becomes one of the documented exit codes."""
    from pipebubble import _worker

    _worker.keep_freed_memory()
    _as_module()
    args = sys.argv[1:] if argv is None else argv
    try:
        _warm(args)
        _register(args)
        code = app(args=argv, standalone_mode=False)
    except PipebubbleError as exc:
        print(f"pipebubble: error: {exc}", file=sys.stderr)
        sys.exit(BAD_INPUT)
    except typer.Exit as exc:
        sys.exit(exc.exit_code)
    except typer.TyperException as exc:  # usage errors: typer prints them with the command's usage line
        missing = _missing_paths(exc)
        if missing is not None:
            print(missing, file=sys.stderr)
            sys.exit(BAD_INPUT)
        show = getattr(exc, "show", None)
        if show is not None:
            show()
        else:
            print(f"pipebubble: error: {exc.format_message()}", file=sys.stderr)
        sys.exit(BAD_INPUT)
    except (typer.Abort, KeyboardInterrupt):
        sys.exit(130)
    except (BrokenPipeError, ReaderLeft):  # `pipebubble analyze ... | head`: the reader left, nothing went wrong
        sys.stderr.close()
        sys.exit(OK)
    except OSError as exc:  # a file a command had to read or write and could not: bad input or output
        if exc.filename is None:
            _internal_error(exc)
            sys.exit(INTERNAL)
        print(f"pipebubble: error: {exc.filename}: {exc.strerror or exc}", file=sys.stderr)
        sys.exit(BAD_INPUT)
    except Exception as exc:  # noqa: BLE001 - the one place an unexpected error becomes exit 3
        _internal_error(exc)
        sys.exit(INTERNAL)
    sys.exit(code if isinstance(code, int) else OK)


#: What a command that reads paths needs, and one example, said when it is run without them.
NEEDS_PATHS = {
    "analyze": ("a trace file, a folder of per-rank traces or a saved JSON report", "pipebubble analyze traces/"),
    "check": ("the run to gate: a trace file, a folder of per-rank traces or a saved JSON report",
              "pipebubble check traces/ --max-bubble 30%"),
    "diff": ("two paths, the baseline and the run to judge: saved JSON reports, trace files or folders",
             "pipebubble diff baseline.json traces/"),
    "export": ("a trace file or a folder of per-rank traces", "pipebubble export traces/ -o annotated.pftrace"),
}


def _missing_paths(exc: Exception) -> str | None:
    """A command of NEEDS_PATHS run without its paths (no arguments at all, or options only): the error in one
    line and one example, not the whole help or typer's usage lines; None for any other usage error."""
    ctx = getattr(exc, "ctx", None)
    command = getattr(ctx, "info_name", None)
    kinds = {kind.__name__ for kind in type(exc).__mro__}  # typer's bundled click names them; it exports neither
    argument = getattr(getattr(exc, "param", None), "param_type_name", None) == "argument"
    if command not in NEEDS_PATHS or not ("NoArgsIsHelpError" in kinds or ("MissingParameter" in kinds and argument)):
        return None
    what, example = NEEDS_PATHS[command]
    return f"pipebubble: error: {command} needs {what}\n  e.g. {example}   (pipebubble {command} -h for every option)"


def _internal_error(exc: BaseException) -> None:
    """One line and a request to report it; the whole traceback under ``--debug`` or PIPEBUBBLE_DEBUG."""
    if os.environ.get("PIPEBUBBLE_DEBUG"):
        traceback.print_exception(exc, file=sys.stderr)
    where = traceback.extract_tb(exc.__traceback__)[-1:] if exc.__traceback__ else []
    at = f" at {os.path.basename(where[0].filename)}:{where[0].lineno}" if where else ""
    message = " ".join(str(exc).split())[:300]
    hint = "" if os.environ.get("PIPEBUBBLE_DEBUG") else "; rerun with --debug for the traceback"
    print(
        f"pipebubble: internal error: {type(exc).__name__}: {message}{at}{hint}; please report it "
        "with the command and `pipebubble --version`",
        file=sys.stderr,
    )
