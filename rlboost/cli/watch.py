"""`rlboost status --watch`: the status view redrawn every N seconds, like `watch` or `sky status --refresh`.

On a terminal the view redraws in place (rich.live) until Ctrl-C; piped, each refresh prints a new snapshot
after a timestamp line; with `--json`, one JSON object per line per refresh. Ctrl-C ends it with status 0."""

from __future__ import annotations

import io
import json
import time
from collections.abc import Callable
from datetime import datetime, timezone
from typing import Any

from rich.console import Console
from rich.live import Live
from rich.text import Text

from rlboost.cli.state import StateStore

# what waits between refreshes: tests replace it (and pass `count`) rather than wait on real time
sleep: Callable[[float], None] = time.sleep


def stamp(now: float | None = None) -> str:
    """The line that separates piped snapshots."""
    t = datetime.fromtimestamp(time.time() if now is None else now, tz=timezone.utc)
    return f"--- {t:%Y-%m-%d %H:%M:%S} UTC ---"


def _snapshot(render: Callable[[StateStore, str | None, Console], None], store: StateStore, ref: str | None,
              console: Console) -> Text:
    """What `render` prints, captured at the console's width and colours, as one renderable for Live."""
    buf = Console(
        file=io.StringIO(),
        width=console.width,
        force_terminal=console.is_terminal,
        color_system=console.color_system,  # type: ignore[arg-type]
        log_path=False,
    )
    render(store, ref, buf)
    return Text.from_ansi(buf.file.getvalue())  # type: ignore[attr-defined]


def watch_report(
    ref: str | None,
    as_json: bool,
    as_doc: Callable[[StateStore, str | None], dict[str, Any]],
    render: Callable[[StateStore, str | None, Console], None],
    console: Console,
    *,
    interval: float,
    refresh: Callable[[StateStore, str | None], None],
    count: int | None = None,
) -> None:
    """Refresh (`refresh`, then the report) every `interval` seconds, `count` times (None: until Ctrl-C)."""
    store = StateStore()
    done = 0

    def more() -> bool:
        return count is None or done < count

    try:
        if as_json:
            while more():
                refresh(store, ref)
                print(json.dumps(as_doc(store, ref), default=str), flush=True)
                done += 1
                if more():
                    sleep(interval)
        elif console.is_terminal:
            with Live(console=console, auto_refresh=False, screen=False) as live:
                while more():
                    refresh(store, ref)
                    live.update(_snapshot(render, store, ref, console), refresh=True)
                    done += 1
                    if more():
                        sleep(interval)
        else:
            while more():
                refresh(store, ref)
                console.print(stamp(), markup=False, highlight=False)
                render(store, ref, console)
                console.file.flush()
                done += 1
                if more():
                    sleep(interval)
    except KeyboardInterrupt:
        return
