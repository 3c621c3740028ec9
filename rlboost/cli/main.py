"""`rlboost`: the app, its error handling, and its commands (one module each, rlboost/cli/commands/)."""

from __future__ import annotations

import contextlib
import faulthandler
import signal
from typing import Annotated, Any

import typer
from rich.markup import escape
from typer.core import TyperGroup

from rlboost.cli.argv_envs import reexec_without_env_values
from rlboost.cli.commands import (
    check,
    controller_process,
    cost_report,
    down,
    gc,
    launch,
    logs,
    rm,
    simulate,
    status,
)
from rlboost.cli.output import console, err


def _unlabel_flags(params: list[Any]) -> list[Any]:
    """typer labels a flag `<bool>` in --help as if it took a value (`--dryrun=true` is an error): no label."""
    for p in params:
        if getattr(p, "is_flag", False) and p.metavar is None:
            p.metavar = ""
    return params


class _Commands(TyperGroup):
    """The app's group: its own and its commands' --help show flags without a type."""

    def get_params(self, ctx: Any) -> list[Any]:
        return _unlabel_flags(super().get_params(ctx))

    def get_command(self, ctx: Any, cmd_name: str) -> Any:
        cmd = super().get_command(ctx, cmd_name)
        if cmd is not None:
            _unlabel_flags(cmd.get_params(ctx))
        return cmd


class _App(typer.Typer):
    """The CLI's entry point (the `rlboost` script and `python -m rlboost.cli.main` both call it): an
    error of the state store or the disk under it (rlboost/cli/errors.py) is one line and exit 1,
    never a traceback; RLBOOST_DEBUG=1 shows the traceback."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        from rlboost.cli.errors import debug, user_message

        try:
            return super().__call__(*args, **kwargs)
        except Exception as e:
            msg = user_message(e)
            if msg is None or debug():
                raise
            with contextlib.suppress(Exception):  # stderr may be a full disk (a detached controller's log)
                err.print(f"[bold red]error:[/] {escape(msg)}", highlight=False, soft_wrap=True)
            raise SystemExit(1) from None


# `kill -USR1 PID` prints every thread's stack to the process's stderr (a detached controller's: its
# controller.log): what a stuck command is waiting on, without a debugger
if hasattr(signal, "SIGUSR1"):
    faulthandler.register(signal.SIGUSR1, all_threads=True)

app = _App(
    cls=_Commands,
    add_completion=True,  # --install-completion / --show-completion [bash|zsh|fish|powershell]
    pretty_exceptions_show_locals=False,  # a crash's traceback must not print job tokens held in locals
    no_args_is_help=True,
    help="RL post-training on an on-demand trainer plus harvested spot GPUs.",
)


def _version(value: bool) -> None:
    if value:
        from importlib.metadata import PackageNotFoundError, version

        try:
            console.print(f"rlboost {version('rlboost')}", highlight=False)
        except PackageNotFoundError:  # running from a source tree that was never installed
            console.print("rlboost (not installed: no version metadata)", highlight=False)
        raise typer.Exit()


@app.callback()
def _main(
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="print rlboost's version and exit")
    ] = False,
) -> None:
    """RL post-training on an on-demand trainer plus harvested spot GPUs."""


# in --help's order
app.command()(check.check)
app.command(epilog=launch.EXAMPLES)(launch.launch)
app.command("_controller", hidden=True)(controller_process.run_detached_controller)
app.command("_node-controller", hidden=True)(controller_process.run_node_controller)
app.command(epilog=status.EXAMPLES)(status.status)
app.command("cost-report", epilog=cost_report.EXAMPLES)(cost_report.cost_report)
app.command(epilog=down.EXAMPLES)(down.down)
app.command(epilog=gc.EXAMPLES)(gc.gc)
app.command()(rm.rm)
app.command(epilog=logs.EXAMPLES)(logs.logs)
app.command(epilog=simulate.EXAMPLES)(simulate.simulate)


if __name__ == "__main__":
    reexec_without_env_values()  # `launch --env NAME=VALUE`: the value leaves the command line first
    app(prog_name="rlboost")  # `python -m rlboost.cli.main` completes and names itself as the installed script
