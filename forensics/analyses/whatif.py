"""What the straggler costs: each step replayed with one rank running like the median rank, from ordinary traces.

The model follows the what-if analysis of Lin et al., "Understanding Stragglers in Large Model Training Using
What-if Analysis" (OSDI '25): a collective ends when its last rank arrives plus its transfer time, so a rank's
lateness is everybody's wait; replaying the trace with the late rank's own work replaced by its peers' gives the
step time without it. Their simulator needs framework-level op traces; here the input is what any Kineto (or
Nsight) trace holds, per rank:

- the *lane*: the union of its compute and memory activity, with its gaps. A gap that ends after one of the
  rank's collectives ended is a *wait* (the stream, or the host, waited for that collective); any other gap is
  the rank's own host time (data loading, Python, launches).
- its collectives, matched across ranks by process group and order, each with its *arrival* (kernel start), its
  *readiness* (the end of the last compute launched before it: CUDA correlation ids grow in launch order, and
  the collective's stream waits for them) and its *tail* (end minus the last rank's arrival: the transfer).

Between two readiness marks a rank does its own work: busy time and host gaps. The replay walks every rank's
lane, advancing by that work and jumping to a collective's replayed end at each wait; a collective's replayed
end is its last replayed arrival plus its tail. With nothing changed the replay reproduces the trace exactly.

Counterfactuals scale a rank's own work segment by segment: "without rank r" brings each of its segments down to
the median of the other ranks' (never up), "balanced" does so for every rank against the median of all; the
split replaces only its busy time (its own extra compute) or only its host gaps. Two effects of real traces are
modelled because they decide the answer on them:
- *contention*: a rank waiting in a collective has the collective's kernel spinning beside its compute, which
  then runs slower (35-40 % on H200 with NCCL's LL protocol). When the wait goes away so does the slowdown:
  busy time overlapped by a rank's own waiting is brought down to the same segment on ranks that did not wait.
- *clocks*: ranks on different hosts have different clocks; each rank is shifted by the median difference of
  its collectives' ends from the others' (collectives end together).
Not modelled: the host's own timeline (when the GPU gets faster the host may become the bottleneck and hidden
launch gaps reappear), and data imbalance unless per-rank work differs in the trace itself.
"""

from __future__ import annotations

import itertools
import statistics
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from forensics.sources.gputrace import DeviceTrace, SyncTimeline

CONTENDED_SHARE = 0.1  # a segment whose busy time is more than this much under the rank's own waiting
CANDIDATES = 4  # "without rank r" is replayed for the ranks the others waited for most
END = ("", -1)  # the segment after a rank's last collective
_READY, _PROBE, _WAIT = 0, 1, 2  # event kinds, in the order they are taken at one instant


@dataclass
class _Event:
    time: int
    kind: int
    key: tuple[str, int] | None = None  # READY: the collective; WAIT: the collective waited for
    resume: int = 0  # WAIT: where the lane resumes (gap end)
    released: int = 0  # WAIT: the collective's actual end on this rank
    probe: int = -1  # PROBE: the step index whose end this is
    busy: int = 0  # own busy time since the previous event
    host: int = 0  # own host-gap time since the previous event
    segment: tuple[str, int] = END


@dataclass
class _Collective:
    start: int
    end: int
    ready: int
    stream: int
    launch: int  # arrival minus max(readiness, the stream's previous collective end): host lateness
    previous: tuple[str, int] | None  # the previous collective on the same stream


@dataclass
class _Rank:
    rank: int
    first: int
    events: list[_Event]
    collectives: dict[tuple[str, int], _Collective]
    busy: dict[tuple[str, int], int]  # per segment
    host: dict[tuple[str, int], int]
    contended: dict[tuple[str, int], int]  # busy time under its own waiting, per segment
    step_collectives: dict[int, list[tuple[str, int]]]  # step index -> collectives started in it
    step_first: dict[int, int]  # step index -> its first lane activity

    def __post_init__(self) -> None:
        self.ready_index = {e.key: i for i, e in enumerate(self.events) if e.kind == _READY}


@dataclass
class Scale:
    """A counterfactual: per rank and segment, factors for busy time and host gaps; launch lateness overrides."""

    busy: dict[int, dict[tuple[str, int], float]] = field(default_factory=dict)
    host: dict[int, dict[tuple[str, int], float]] = field(default_factory=dict)
    launch: dict[int, dict[tuple[str, int], int]] = field(default_factory=dict)


@dataclass
class Replay:
    step_ends: list[int]
    start: int

    def step_times(self) -> list[int]:
        ends = [self.start, *self.step_ends]
        return [b - a for a, b in itertools.pairwise(ends)]

    @property
    def mean(self) -> float:
        """The mean step time (the window's length without steps)."""
        return (self.step_ends[-1] - self.start) / len(self.step_ends)


def _cumulative(starts: np.ndarray, ends: np.ndarray, times: np.ndarray) -> np.ndarray:
    """Length of the union intervals [starts, ends) that lies before each time."""
    lengths = ends - starts
    before = np.concatenate(([0], np.cumsum(lengths)))
    j = np.searchsorted(starts, times, side="right") - 1
    inside = np.where(j >= 0, np.clip(times - starts[np.maximum(j, 0)], 0, lengths[np.maximum(j, 0)]), 0)
    return np.where(j >= 0, before[np.maximum(j, 0)] + inside, 0)


def clock_offsets(timelines: dict[int, SyncTimeline]) -> dict[int, int]:
    """Per rank, the median of (its collective end - the median end of that collective over ranks)."""
    ends: dict[tuple[str, int], dict[int, int]] = {}
    for rank, t in timelines.items():
        for key, end in zip(t.keys, t.coll_end.tolist(), strict=True):
            ends.setdefault(key, {})[rank] = end
    offsets = {}
    for rank in timelines:
        diffs = [e[rank] - statistics.median(e.values()) for e in ends.values() if rank in e and len(e) > 1]
        offsets[rank] = int(statistics.median(diffs)) if diffs else 0
    return offsets


def _steps_in_common(timelines: dict[int, SyncTimeline]) -> list[int]:
    if not timelines:
        return []
    return sorted(set.intersection(*({s for s, _, _ in t.steps} for t in timelines.values())))


def _prepare(rank: int, t: SyncTimeline, shift: int, last_arrival: dict, steps: list[int], origin: int) -> _Rank:
    """A rank's events, its collectives and its own work per segment (times shifted onto the common clock).
    Every rank starts at `origin`, the earliest step start: the time before its first activity is its own."""
    lane_s, lane_e = t.lane_start - shift, t.lane_end - shift
    c_s, c_e, c_r = t.coll_start - shift, t.coll_end - shift, t.coll_ready - shift
    keys = t.keys
    collectives: dict[tuple[str, int], _Collective] = {}
    previous_on: dict[int, tuple[str, int]] = {}
    for i, key in enumerate(keys):
        stream = int(t.coll_stream[i])
        prev = previous_on.get(stream)
        prev_end = collectives[prev].end if prev is not None else None
        base = max(int(c_r[i]), prev_end) if prev_end is not None else int(c_r[i])
        collectives[key] = _Collective(int(c_s[i]), int(c_e[i]), int(c_r[i]), stream, max(0, int(c_s[i]) - base), prev)
        previous_on[stream] = key
    # lane gaps; a gap that holds the end of one of the rank's collectives is a wait for the latest of them
    gap_s, gap_e = lane_e[:-1], lane_s[1:]
    by_end = np.argsort(c_e, kind="stable")
    ends_sorted = c_e[by_end]
    j = np.searchsorted(ends_sorted, gap_e, side="right") - 1
    waited = (j >= 0) & (ends_sorted[np.maximum(j, 0)] > gap_s) if ends_sorted.size else np.zeros(gap_s.size, bool)
    own_gap = np.where(waited, 0, gap_e - gap_s)
    host_before = np.concatenate(([0], np.cumsum(own_gap)))  # own gap time before gap i

    def host_at(times: np.ndarray) -> np.ndarray:
        """Own host-gap time before each time (gaps after lane interval i are gap i)."""
        i = np.searchsorted(lane_e[:-1], times, side="right") - 1  # the last gap that starts at or before
        part = np.where(i >= 0, np.clip(times - gap_s[np.maximum(i, 0)], 0, own_gap[np.maximum(i, 0)]), 0)
        return np.where(i >= 0, host_before[np.maximum(i, 0)] + part, 0)

    events: list[_Event] = [_Event(int(c_r[i]), _READY, key=k) for i, k in enumerate(keys)]
    for g in np.flatnonzero(waited).tolist():
        key = keys[int(by_end[j[g]])]
        events.append(_Event(int(gap_s[g]), _WAIT, key=key, resume=int(gap_e[g]), released=int(ends_sorted[j[g]])))
    step_collectives: dict[int, list[tuple[str, int]]] = {}
    step_first: dict[int, int] = {}
    windows = {s: (a - shift, b - shift) for s, a, b in t.steps}
    for index, step in enumerate(steps):
        lo, hi = windows[step]
        inside = np.flatnonzero((lane_s >= lo) & (lane_s < hi))
        if inside.size:
            events.append(_Event(int(lane_e[inside[-1]]), _PROBE, probe=index))
            step_first[index] = int(lane_s[inside[0]])
        step_collectives[index] = [k for k, c in collectives.items() if lo <= c.start < hi]
    events.append(_Event(int(lane_e[-1]) if lane_e.size else 0, _PROBE, probe=-1))
    events.sort(key=lambda e: (e.time, e.kind))
    # own work between events: a stretch runs from the previous event (or the resume point of a wait) to this one
    starts = np.array([origin] + [e.resume if e.kind == _WAIT else e.time for e in events[:-1]])
    times = np.array([e.time for e in events])
    starts = np.minimum(starts, times)
    busy = _cumulative(lane_s, lane_e, times) - _cumulative(lane_s, lane_e, starts)
    host = host_at(times) - host_at(starts)
    host[0] += max(0, min(int(times[0]), int(lane_s[0])) - origin)  # before its first activity
    # segments: a stretch belongs to the next readiness mark
    label: tuple[str, int] = END
    for e in reversed(events):
        e.segment = label
        if e.kind == _READY:
            label = e.key
    seg_busy: dict[tuple[str, int], int] = {}
    seg_host: dict[tuple[str, int], int] = {}
    for e, b, h in zip(events, busy.tolist(), host.tolist(), strict=True):
        e.busy, e.host = b, h
        seg_busy[e.segment] = seg_busy.get(e.segment, 0) + b
        extra = (e.resume - e.released) if e.kind == _WAIT else 0
        seg_host[e.segment] = seg_host.get(e.segment, 0) + h + extra
    for key, c in collectives.items():
        seg_host[key] = seg_host.get(key, 0) + c.launch
    contended = _contention(lane_s, lane_e, collectives, last_arrival, events)
    return _Rank(rank, origin, events, collectives, seg_busy, seg_host, contended, step_collectives, step_first)


def _contention(
    lane_s: np.ndarray,
    lane_e: np.ndarray,
    collectives: dict[tuple[str, int], _Collective],
    last_arrival: dict[tuple[str, int], int],
    events: list[_Event],
) -> dict[tuple[str, int], int]:
    """Per segment, the busy time that ran while this rank waited in a collective for a later rank."""
    blocked = sorted((c.start, last_arrival[k]) for k, c in collectives.items() if last_arrival[k] > c.start)
    if not blocked:
        return {}
    merged: list[list[int]] = []
    for s, e in blocked:
        if merged and s <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], e)
        else:
            merged.append([s, e])
    b_s = np.array([m[0] for m in merged])
    b_e = np.array([m[1] for m in merged])
    # busy time inside the blocked union before t, for segment bounds
    bounds = [events[0].time] + [e.time for e in events if e.kind == _READY] + [events[-1].time]
    labels = [e.key for e in events if e.kind == _READY] + [END]
    t = np.array(bounds)
    lane_cum = _cumulative(lane_s, lane_e, np.concatenate((b_s, b_e)))
    inside_each = lane_cum[len(b_s) :] - lane_cum[: len(b_s)]
    before = np.concatenate(([0], np.cumsum(inside_each)))
    k = np.searchsorted(b_s, t, side="right") - 1
    ks = np.maximum(k, 0)
    partial = _cumulative(lane_s, lane_e, np.minimum(t, b_e[ks])) - _cumulative(lane_s, lane_e, b_s[ks])
    under = np.where(k >= 0, before[ks] + np.maximum(partial, 0), 0)
    return {label: int(b - a) for label, a, b in zip(labels, under[:-1].tolist(), under[1:].tolist(), strict=True)}


def _replayable(t: SyncTimeline | None) -> bool:
    return t is not None and bool(t.coll_start.size) and bool(t.lane_start.size)


class WhatIf:
    """The ranks' timelines on one clock, ready to be replayed under counterfactuals."""

    def __init__(self, units: list[DeviceTrace]):
        timelines = {u.rank: u.timeline for u in units if u.rank is not None and _replayable(u.timeline)}
        self.offsets = clock_offsets(timelines)
        self.steps = _steps_in_common(timelines)
        arrivals: dict[tuple[str, int], list[int]] = {}
        for rank, t in timelines.items():
            for key, start in zip(t.keys, t.coll_start.tolist(), strict=True):
                arrivals.setdefault(key, []).append(start - self.offsets[rank])
        self.last_arrival = {k: max(v) for k, v in arrivals.items()}
        self.participants = {k: len(v) for k, v in arrivals.items()}
        self.origin = self._origin(timelines)
        self.ranks = {
            r: _prepare(r, t, self.offsets[r], self.last_arrival, self.steps, self.origin)
            for r, t in sorted(timelines.items())
        }
        self.order = sorted(self.last_arrival, key=lambda k: (self.last_arrival[k], k))
        self.segments = sorted({s for r in self.ranks.values() for s in r.busy} | {END})

    def candidates(self) -> list[int]:
        """The ranks the others waited for most: per rank, the time between the second-last arrival and its own
        at the collectives where it arrived last."""
        caused = dict.fromkeys(self.ranks, 0)
        for key in self.order:
            arrivals = sorted((c.start, r) for r, rk in self.ranks.items() if (c := rk.collectives.get(key)))
            if len(arrivals) > 1:
                caused[arrivals[-1][1]] += arrivals[-1][0] - arrivals[-2][0]
        return sorted(caused, key=lambda r: (-caused[r], r))[:CANDIDATES]

    def waited(self) -> dict[int, float]:
        """Per rank, the time per step (or over the window) it sat in collectives waiting for a later rank."""
        per = len(self.steps) or 1
        return {
            r: sum(max(0, min(self.last_arrival[k], c.end) - c.start) for k, c in rk.collectives.items()) / per
            for r, rk in self.ranks.items()
        }

    @property
    def usable(self) -> bool:
        return len(self.ranks) > 1 and any(n > 1 for n in self.participants.values())

    def replay(self, scale: Scale | None = None) -> Replay:
        """Every collective in the order of its actual last arrival; each rank's lane walked up to its readiness."""
        scale = scale or Scale()
        ends: dict[int, dict[tuple[str, int], int]] = {r: {} for r in self.ranks}
        ready: dict[int, dict[tuple[str, int], int]] = {r: {} for r in self.ranks}
        probes: dict[int, dict[int, int]] = {r: {} for r in self.ranks}
        cursor = {r: 0 for r in self.ranks}
        lane = {r: rk.first for r, rk in self.ranks.items()}
        factors = {
            r: (
                [scale.busy.get(r, {}).get(e.segment, 1.0) for e in rk.events],
                [scale.host.get(r, {}).get(e.segment, 1.0) for e in rk.events],
            )
            for r, rk in self.ranks.items()
        }

        def walk(r: int, upto: int) -> None:
            """Advance rank r's lane through its events up to index `upto` (inclusive)."""
            events, (fb, fh) = self.ranks[r].events, factors[r]
            i, y, done = cursor[r], lane[r], ends[r]
            while i <= upto:
                e = events[i]
                y = y + e.busy * fb[i] + e.host * fh[i]
                if e.kind == _READY:
                    ready[r][e.key] = round(y)
                elif e.kind == _PROBE:
                    probes[r][e.probe] = round(y)
                else:
                    y = max(y, done.get(e.key, e.released)) + (e.resume - e.released) * fh[i]
                y = round(y)
                i += 1
            cursor[r], lane[r] = i, y

        for key in self.order:
            arrival: dict[int, int] = {}
            for r, rk in self.ranks.items():
                c = rk.collectives.get(key)
                if c is None:
                    continue
                walk(r, rk.ready_index[key])
                prev_end = ends[r].get(c.previous) if c.previous is not None else None
                base = ready[r].get(key, c.ready)
                base = max(base, prev_end) if prev_end is not None else base
                arrival[r] = base + scale.launch.get(r, {}).get(key, c.launch)
            last = max(arrival.values())
            for r, a in arrival.items():
                c = self.ranks[r].collectives[key]
                ends[r][key] = max(a, last + c.end - self.last_arrival[key])
        for r, rk in self.ranks.items():
            walk(r, len(rk.events) - 1)
        return Replay(self._step_ends(ends, probes), self.origin)

    def _origin(self, timelines: dict[int, SyncTimeline]) -> int:
        """The earliest start of the first common step on any rank (its first activity, if earlier or no steps)."""
        starts = []
        for r, t in timelines.items():
            first = [a for s, a, _ in t.steps if self.steps and s == self.steps[0]]
            starts.append(min([*first, int(t.lane_start[0])]) - self.offsets[r])
        return min(starts) if starts else 0

    def _step_ends(self, ends: dict[int, dict[tuple[str, int], int]], probes: dict[int, dict[int, int]]) -> list[int]:
        """Per step, the last replayed end on any rank of what started in it (a single window without steps)."""
        if not self.steps:
            return [max(max([probes[r].get(-1, 0), *ends[r].values()]) for r in self.ranks)]
        out = []
        for index in range(len(self.steps)):
            per_rank = []
            for r, rk in self.ranks.items():
                values = [ends[r][k] for k in rk.step_collectives.get(index, []) if k in ends[r]]
                if index in probes[r]:
                    values.append(probes[r][index])
                if values:
                    per_rank.append(max(values))
            out.append(max(per_rank) if per_rank else (out[-1] if out else self.origin))
        return out


# --- counterfactuals -------------------------------------------------------------------------------


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def _decontended(w: WhatIf) -> dict[int, dict[tuple[str, int], float]]:
    """Each rank's busy time per segment with the slowdown of its own waiting removed (see the module doc)."""
    free: dict[tuple[str, int], list[int]] = {}
    for rk in w.ranks.values():
        for seg, busy in rk.busy.items():
            if rk.contended.get(seg, 0) <= CONTENDED_SHARE * busy:
                free.setdefault(seg, []).append(busy)
    out: dict[int, dict[tuple[str, int], float]] = {}
    for r, rk in w.ranks.items():
        out[r] = {}
        for seg, busy in rk.busy.items():
            reference = _median(free.get(seg, []))
            contended = rk.contended.get(seg, 0) > CONTENDED_SHARE * busy
            out[r][seg] = min(busy, reference) if contended and reference is not None else busy
    return out


def counterfactual(w: WhatIf, slow: list[int], peers: str, busy: bool = True, host: bool = True) -> Scale:
    """Ranks `slow` run like the median of their peers ("others": every other rank; "all": every rank), in busy
    time, host gaps or both, never slower than they did; every rank's waiting-induced slowdown is removed."""
    work = _decontended(w)
    scale = Scale()
    for r, rk in w.ranks.items():
        scale.busy[r] = {seg: (work[r][seg] / b if b else 1.0) for seg, b in rk.busy.items()}
    for r in slow:
        rk = w.ranks[r]
        group = [q for q in w.ranks if q != r] if peers == "others" else list(w.ranks)
        if busy:
            for seg, b in rk.busy.items():
                target = _median([work[q].get(seg, 0.0) for q in group])
                if b and target is not None:
                    scale.busy[r][seg] = min(work[r][seg], target) / b
        if host:
            scale.host[r], scale.launch[r] = {}, {}
            for seg, h in rk.host.items():
                target = _median([w.ranks[q].host.get(seg, 0) for q in group])
                if h and target is not None:
                    scale.host[r][seg] = min(1.0, target / h)
            for key, c in rk.collectives.items():
                launches = [w.ranks[q].collectives[key].launch for q in group if key in w.ranks[q].collectives]
                scale.launch[r][key] = min(c.launch, round(_median(launches))) if launches else c.launch
    return scale


def _ms(ns: float) -> float:
    return round(ns / 1e6, 3)


def _pct(measured: float, predicted: float) -> float:
    return round(100 * (1 - predicted / measured), 1) if measured else 0.0


def what_if(units: list[DeviceTrace]) -> dict[str, Any] | None:
    """Measured and replayed step times: without each rank, balanced; the split for the costliest rank."""
    w = WhatIf(units)
    if not w.usable:
        return None
    actual = w.replay()
    measured = actual.mean
    without = {r: w.replay(counterfactual(w, [r], "others")) for r in w.candidates()}
    balanced = w.replay(counterfactual(w, list(w.ranks), "all"))
    worst = min(without, key=lambda r: (without[r].mean, r))
    compute = w.replay(counterfactual(w, [worst], "others", host=False))
    hosts = w.replay(counterfactual(w, [worst], "others", busy=False))
    saved = measured - without[worst].mean
    return {
        "basis": "per step" if w.steps else "over the window",
        "steps": [
            {
                "step": step,
                "measured_ms": _ms(m),
                "without_ms": _ms(p),
                "compute_only_ms": _ms(c),
                "balanced_ms": _ms(b),
            }
            for step, m, p, c, b in zip(
                w.steps or [None],
                actual.step_times(),
                without[worst].step_times(),
                compute.step_times(),
                balanced.step_times(),
                strict=True,
            )
        ],
        "measured_ms": _ms(measured),
        "balanced_ms": _ms(balanced.mean),
        "balanced_faster_pct": _pct(measured, balanced.mean),
        "ranks": [
            {"rank": r, "without_ms": _ms(rep.mean), "faster_pct": _pct(measured, rep.mean)}
            for r, rep in sorted(without.items())
        ],
        "worst": {
            "rank": worst,
            "without_ms": _ms(without[worst].mean),
            "faster_pct": _pct(measured, without[worst].mean),
            "saved_ms": _ms(saved),
            "compute_only_ms": _ms(compute.mean),
            "compute_faster_pct": _pct(measured, compute.mean),
            "host_only_ms": _ms(hosts.mean),
            "host_faster_pct": _pct(measured, hosts.mean),
        },
        "clock_offsets_us": {str(r): round(o / 1e3, 1) for r, o in sorted(w.offsets.items())},
        "waited_ms": {str(r): _ms(waited) for r, waited in w.waited().items()},
    }
