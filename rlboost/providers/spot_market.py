"""A replayed spot market: how many spot instances the "cloud" lets us hold at trace time t.

Pure and clock-injected: callers pass the trace time; nothing here reads a clock or touches the
network, so the local provider and the simulator replay exactly the same market.

Three trace formats are read by `load_trace` (see traces/SOURCES.md in the shared data):
- Bamboo CSV, one membership event per line: `t_ms,add|remove,nodeK` (CRLF or LF). Capacity is the
  number of live nodes after all events at that instant.
- GCP fleet counts: `YYYY-MM-DD, HH:MM:SS, N` lines; time counts from the first line. Files that
  join several runs jump backwards in time: such a jump starts a new run, which we place one median
  sampling interval after the previous sample, so trace time stays monotonic and no sample is lost.
- JSON count series: `{"metadata": {"gap_seconds": G}, "data": [n0, n1, ...]}`, n_i held for G s.
"""

from __future__ import annotations

import bisect
import csv
import itertools
import json
import math
import random
import statistics
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from rlboost.contracts.bundled_data import local_file


class TraceError(ValueError):
    """A malformed trace; the message names the file and line."""


@dataclass(frozen=True)
class AvailabilityTrace:
    """Capacity as a step function: counts[i] holds from times[i] until times[i+1].

    After the last point the last value holds forever (a run longer than the trace keeps the final
    capacity rather than wrapping around and causing a burst of artificial preemptions).
    """

    times: list[float]  # seconds from 0, non-decreasing, times[0] == 0
    counts: list[int]
    source: str = "inline"

    def __post_init__(self) -> None:
        if not self.times or len(self.times) != len(self.counts):
            raise TraceError(f"{self.source}: times and counts must be non-empty and of equal length")
        if self.times[0] != 0:
            raise TraceError(f"{self.source}: the first point must be at time 0, got {self.times[0]}")
        if any(b < a for a, b in itertools.pairwise(self.times)):
            raise TraceError(f"{self.source}: times must be non-decreasing")
        if any(c < 0 for c in self.counts):
            raise TraceError(f"{self.source}: counts must be >= 0")

    def capacity_at(self, t: float) -> int:
        i = bisect.bisect_right(self.times, t) - 1
        return self.counts[max(i, 0)]

    @property
    def duration(self) -> float:
        """Trace seconds covered by the data (the time of the last point)."""
        return self.times[-1]

    @property
    def max_count(self) -> int:
        return max(self.counts)

    def next_change(self, t: float) -> float | None:
        """The first time > t at which capacity differs from capacity_at(t), or None."""
        cur = self.capacity_at(t)
        i = bisect.bisect_right(self.times, t)
        for tj in self.times[i:]:
            if self.capacity_at(tj) != cur:  # capacity_at resolves points sharing one instant
                return tj
        return None

    def scaled(self, factor: float) -> AvailabilityTrace:
        """Counts × factor, rounded half up (e.g. 32 trace nodes -> 3 local workers)."""
        if not math.isfinite(factor) or factor < 0:
            raise ValueError(f"scale factor must be a finite number >= 0, got {factor}")
        counts = [max(0, math.floor(c * factor + 0.5)) for c in self.counts]
        return AvailabilityTrace(list(self.times), counts, f"{self.source} x{factor:g}")


# ---- loading -----------------------------------------------------------------------------


def load_trace(path: str | Path) -> AvailabilityTrace:
    """A trace file, or a shipped one named `bundled:traces/<file>` (its name is kept as the source)."""
    p = Path(path)
    try:
        text = local_file(path).read_text(encoding="utf-8-sig")
    except OSError as e:
        raise TraceError(f"{p}: cannot read trace ({e.strerror or e})") from None
    except UnicodeDecodeError:
        raise TraceError(f"{p}: not a text file (expected CSV, GCP count lines or JSON)") from None
    if text.lstrip().startswith("{"):
        return _parse_json(text, str(p))
    lines = text.splitlines()  # handles CRLF
    first = next(_csv_rows(lines, str(p)), None)
    if first is None:
        raise TraceError(f"{p}: empty trace")
    lineno, parts = first
    if len(parts) == 3 and parts[1] in ("add", "remove"):
        return _parse_bamboo(lines, str(p))
    if len(parts) == 3 and _parse_stamp(parts[0], parts[1]) is not None:
        return _parse_gcp(lines, str(p))
    raise TraceError(
        f"{p}:{lineno}: unrecognised trace line {lines[lineno - 1].strip()!r} (expected `t_ms,add|remove,nodeK`, "
        "`YYYY-MM-DD, HH:MM:SS, N`, or a JSON object with metadata.gap_seconds and data)"
    )


def _csv_rows(lines: list[str], src: str) -> Iterator[tuple[int, list[str]]]:
    """(line number, fields stripped of spaces) of each non-blank line, read as CSV with no header."""
    reader = csv.reader(lines, skipinitialspace=True, strict=True)  # bad quoting is an error
    while True:
        try:
            fields = next(reader)
        except StopIteration:
            return
        except csv.Error as e:
            raise TraceError(f"{src}:{reader.line_num}: not a CSV line ({e})") from None
        if any(f.strip() for f in fields):
            yield reader.line_num, [f.strip() for f in fields]


def _parse_bamboo(lines: list[str], src: str) -> AvailabilityTrace:
    live: set[str] = set()
    times: list[float] = []
    counts: list[int] = []
    last_t = -math.inf
    for lineno, parts in _csv_rows(lines, src):
        if len(parts) != 3 or parts[1] not in ("add", "remove") or not parts[2]:
            raise TraceError(f"{src}:{lineno}: expected `t_ms,add|remove,nodeK`, got {lines[lineno - 1].strip()!r}")
        try:
            t = float(parts[0]) / 1000.0
        except ValueError:
            raise TraceError(f"{src}:{lineno}: time {parts[0]!r} is not a number of milliseconds") from None
        if not math.isfinite(t) or t < 0:
            raise TraceError(f"{src}:{lineno}: time {parts[0]!r} must be >= 0")
        if t < last_t:
            raise TraceError(f"{src}:{lineno}: time goes backwards ({parts[0]} ms after {last_t * 1000:g} ms)")
        node = parts[2]
        if parts[1] == "add":
            if node in live:
                raise TraceError(f"{src}:{lineno}: {node} added twice without a remove")
            live.add(node)
        else:
            if node not in live:
                raise TraceError(f"{src}:{lineno}: {node} removed but it is not live")
            live.remove(node)
        if times and times[-1] == t:
            counts[-1] = len(live)  # several events at one instant: keep the final count
        else:
            times.append(t)
            counts.append(len(live))
        last_t = t
    if not times:
        raise TraceError(f"{src}: empty trace")
    if times[0] > 0:  # nothing is live before the first event
        times.insert(0, 0.0)
        counts.insert(0, 0)
    return AvailabilityTrace(times, counts, src)


def _parse_stamp(date: str, clock: str) -> datetime | None:
    try:
        return datetime.strptime(f"{date} {clock}", "%Y-%m-%d %H:%M:%S")
    except ValueError:
        return None


def _parse_gcp(lines: list[str], src: str) -> AvailabilityTrace:
    stamps: list[tuple[int, datetime, int]] = []
    for lineno, parts in _csv_rows(lines, src):
        stamp = _parse_stamp(parts[0], parts[1]) if len(parts) == 3 else None
        if stamp is None:
            raise TraceError(f"{src}:{lineno}: expected `YYYY-MM-DD, HH:MM:SS, N`, got {lines[lineno - 1].strip()!r}")
        try:
            n = int(parts[2])
        except ValueError:
            raise TraceError(f"{src}:{lineno}: count {parts[2]!r} is not an integer") from None
        if n < 0:
            raise TraceError(f"{src}:{lineno}: count {n} must be >= 0")
        stamps.append((lineno, stamp, n))
    # Positive gaps between consecutive samples: the typical interval used to splice runs.
    gaps = [(b[1] - a[1]).total_seconds() for a, b in itertools.pairwise(stamps)]
    pos = [g for g in gaps if g > 0]
    splice = statistics.median(pos) if pos else 1.0
    times = [0.0]
    counts = [stamps[0][2]]
    for gap, (_, _, n) in zip(gaps, stamps[1:], strict=True):
        t = times[-1] + (gap if gap >= 0 else splice)  # backwards jump = a new run starts
        if t == times[-1]:
            counts[-1] = n
        else:
            times.append(t)
            counts.append(n)
    return AvailabilityTrace(times, counts, src)


def _parse_json(text: str, src: str) -> AvailabilityTrace:
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as e:
        raise TraceError(f"{src}:{e.lineno}: invalid JSON ({e.msg})") from None
    meta = doc.get("metadata") if isinstance(doc, dict) else None
    gap = meta.get("gap_seconds") if isinstance(meta, dict) else None
    if isinstance(gap, bool) or not isinstance(gap, (int, float)) or not math.isfinite(gap) or gap <= 0:
        raise TraceError(f"{src}: metadata.gap_seconds must be a number > 0, got {gap!r}")
    data = doc.get("data")
    if not isinstance(data, list) or not data:
        raise TraceError(f"{src}: `data` must be a non-empty list of instance counts")
    counts: list[int] = []
    for i, n in enumerate(data):
        if isinstance(n, bool) or not isinstance(n, (int, float)) or n != int(n) or n < 0:
            raise TraceError(f"{src}: data[{i}] = {n!r} is not a count (integer >= 0)")
        counts.append(int(n))
    times = [i * float(gap) for i in range(len(counts))]
    # A closing point so that duration covers the last tick (n_last holds for G seconds).
    times.append(len(counts) * float(gap))
    counts.append(counts[-1])
    return AvailabilityTrace(times, counts, src)


def constant_trace(count: int, hours: float = 1000.0) -> AvailabilityTrace:
    """`count` instances available the whole time (what-if runs at a fixed number of spot workers)."""
    if count < 0:
        raise TraceError(f"constant capacity must be >= 0, got {count}")
    return AvailabilityTrace([0.0, hours * 3600.0], [count, count], f"constant {count}")


# ---- the built-in default ----------------------------------------------------------------

# (minute, capacity): ~3 h of trace time wandering between 0 and 3 workers with 3 drops (at 35,
# 75 and 135 min). At the local default time_scale of 60, a ~3-minute run sees them at ~35 s,
# 75 s and 135 s of wall time: one drop of two workers, one to zero, one of two.
_BUILTIN_POINTS = [(0, 2), (10, 3), (35, 1), (50, 2), (75, 0), (85, 2), (110, 3), (135, 1), (150, 3)]
_BUILTIN_POINTS.append((180, 3))  # closing point: duration = 3 h
BUILTIN_TRACE = AvailabilityTrace([m * 60.0 for m, _ in _BUILTIN_POINTS], [c for _, c in _BUILTIN_POINTS], "builtin")


# ---- the market --------------------------------------------------------------------------


class SpotMarket:
    """Decides which running spot instances lose their capacity, and which get a notice first."""

    def __init__(self, trace: AvailabilityTrace, *, notice_fraction: float, seed: int) -> None:
        if not 0.0 <= notice_fraction <= 1.0:
            raise ValueError(f"notice_fraction must be in [0, 1], got {notice_fraction}")
        self.trace = trace
        self.notice_fraction = notice_fraction
        self.seed = seed
        # Error-diffusion accumulator with a seeded phase: over any run the share of noticed
        # preemptions tracks notice_fraction closely (0.5 alternates), unlike independent coin
        # flips that can give all-abrupt runs; the phase makes it differ per seed.
        self._acc = random.Random(seed).random()

    def capacity(self, t: float) -> int:
        return self.trace.capacity_at(t)

    def choose_victims(self, t: float, running: list[str]) -> list[tuple[str, bool]]:
        """(instance_id, gets_notice) for each instance to preempt when capacity(t) < len(running).

        `running` must hold only instances not already chosen. The victims are a seeded draw that
        depends only on (seed, t, running); the notice flags advance the accumulator.
        """
        ids = sorted(set(running))
        excess = len(ids) - self.capacity(t)
        if excess <= 0:
            return []
        rng = random.Random(f"{self.seed}:{t!r}")  # str seeds hash deterministically (sha512)
        out: list[tuple[str, bool]] = []
        for iid in rng.sample(ids, excess):
            self._acc += self.notice_fraction
            notice = self._acc >= 1.0
            if notice:
                self._acc -= 1.0
            out.append((iid, notice))
        return out
