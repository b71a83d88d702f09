"""A build's record as the tests read it back: its journal read cleanly, its events folded into
the final state, its cancel, its spans, and its events as a recorder that checks nothing (the
C++ monitor's) writes them."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import msgspec

from trt_otel import read_journal
from trt_otel.core.events import Anomaly, CancelRequested, Event
from trt_otel.core.journal import JournalWriter
from trt_otel.core.journal_codec import event_to_dict
from trt_otel.core.journal_reader import Journal
from trt_otel.core.state import BuildState
from trt_otel.views.spans import SpanProjection, SpanRecord

DATA = Path(__file__).parent / "data"
"""Journals recorded from real builds (see its README), and other files the tests read."""


def fold(events: Iterable[Event]) -> BuildState:
    """The state that ``events`` leave, applied in order to a new :class:`BuildState`."""
    state = BuildState()
    for event in events:
        state.apply(event)
    return state


def write_journal(path: Path, events: Sequence[Event]) -> Path:
    """A journal at ``path`` holding ``events``, written as a build's writer writes them."""
    writer = JournalWriter(path)
    writer.handle(events)
    writer.close()
    return path


def final_state(journal: Path) -> BuildState:
    """The state a journal's events leave, however it was read (its problems not checked)."""
    return fold(read_journal(journal).events)


def read_clean(path: Path, *, contiguous: bool = True) -> Journal:
    """The journal at ``path``, which must read without a problem and (where ``contiguous``)
    number its events from 0 without a gap."""
    journal = read_journal(path)
    assert journal.problems == [], [str(p) for p in journal.problems]
    if contiguous:
        seqs = [event.seq for event in journal.events]
        assert seqs == list(range(len(seqs))), "seq must be contiguous from 0"
    return journal


def first_cancel(journal: Path) -> CancelRequested:
    """The first cancel a journal holds (it must hold one)."""
    return next(e for e in read_journal(journal).events if isinstance(e, CancelRequested))


def cancel_record(events: Iterable[Event]) -> dict[str, Any]:
    """The one cancel among ``events`` (there must be exactly one), as the journal holds it."""
    cancels = [event_to_dict(e) for e in events if e.type == "cancel"]
    assert len(cancels) == 1
    return cancels[0]


def spans_of(events: Iterable[Event]) -> list[SpanRecord]:
    """Every span ``events`` project to, the unfinished ones ended."""
    projection = SpanProjection()
    spans = [span for event in events for span in projection.apply(event)]
    return spans + projection.finish()


def unchecked(events: Sequence[Event]) -> list[Event]:
    """``events`` as a recorder that checks nothing writes them: no anomaly, numbered without
    them."""
    kept = [event for event in events if not isinstance(event, Anomaly)]
    return [msgspec.structs.replace(event, seq=seq) for seq, event in enumerate(kept)]
