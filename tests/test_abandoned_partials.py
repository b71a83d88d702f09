"""The temporary file of an engine whose writer was killed mid-write (a supervisor SIGKILLed takes
its worker with it) is removed by the next write of the same engine, and nothing anyone may
still be writing is: a live pid, a held lock, a recent change, another user's file or another
name are each kept."""

from __future__ import annotations

import fcntl
import os
import time
from pathlib import Path

import pytest

from cli import run_cli
from trt_otel.core.files import ABANDONED_AFTER_S, remove_abandoned_partials, write_atomically


def no_such_pid() -> int:
    """A pid no process can have: above the kernel's largest."""
    return int(Path("/proc/sys/kernel/pid_max").read_text()) + 1


def left_by(engine: Path, pid: int, *, age_s: float = ABANDONED_AFTER_S + 60) -> Path:
    """A temporary file of ``engine`` as a writer ``pid`` killed mid-write leaves it."""
    partial = engine.parent / f".{engine.name}.{pid}.0badc0de.partial"
    partial.write_bytes(b"half an engine")
    then = time.time() - age_s
    os.utime(partial, (then, then))
    return partial


def test_an_abandoned_partial_is_removed_by_the_next_write(tmp_path: Path) -> None:
    engine = tmp_path / "model.engine"
    abandoned = left_by(engine, no_such_pid())
    write_atomically(engine, b"a whole engine")
    assert engine.read_bytes() == b"a whole engine"
    assert not abandoned.exists()
    assert list(tmp_path.iterdir()) == [engine]


def test_what_may_still_be_written_is_kept(tmp_path: Path) -> None:
    engine = tmp_path / "model.engine"
    alive = left_by(engine, os.getpid())
    recent = left_by(engine, no_such_pid() + 1, age_s=0)
    other_name = left_by(tmp_path / "other.engine", no_such_pid())
    not_ours = tmp_path / f".{engine.name}.{no_such_pid()}.notours.partial"
    not_ours.write_bytes(b"")
    os.utime(not_ours, (0, 0))
    someone_elses = left_by(engine, no_such_pid() + 3)
    if os.geteuid() == 0:  # as root, a file of the user nobody (else that user's own file)
        os.chown(someone_elses, 65534, 65534)
    locked = left_by(engine, no_such_pid() + 2)
    with locked.open("rb") as held:  # a writer in another pid namespace holds its lock
        fcntl.flock(held.fileno(), fcntl.LOCK_EX)
        assert remove_abandoned_partials(engine) == []
    assert all(p.exists() for p in (alive, recent, other_name, not_ours, locked))
    expected = [locked] if os.geteuid() == 0 else sorted([locked, someone_elses])
    assert sorted(remove_abandoned_partials(engine)) == expected


def test_a_link_named_as_a_partial_is_not_followed(tmp_path: Path) -> None:
    engine = tmp_path / "model.engine"
    precious = tmp_path / "precious"
    precious.write_bytes(b"keep")
    link = tmp_path / f".{engine.name}.{no_such_pid()}.0badc0de.partial"
    link.symlink_to(precious)
    assert remove_abandoned_partials(engine) == []
    assert link.is_symlink() and precious.read_bytes() == b"keep"


def test_a_name_with_glob_characters_is_matched_literally(tmp_path: Path) -> None:
    engine = tmp_path / "model[fp16].engine"
    lookalike = left_by(tmp_path / "modelf.engine", no_such_pid())
    abandoned = left_by(engine, no_such_pid())
    assert remove_abandoned_partials(engine) == [abandoned]
    assert lookalike.exists()


@pytest.mark.e2e
def test_a_build_of_the_same_engine_removes_what_a_killed_one_left(tmp_path: Path) -> None:
    engine = tmp_path / "demo.engine"
    abandoned = left_by(engine, no_such_pid())
    result = run_cli("demo", "--speed", "0", "-o", engine)
    assert result.returncode == 0, result.stderr
    assert engine.stat().st_size > 0
    assert not abandoned.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["demo.engine"]
