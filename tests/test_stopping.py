"""Stopping a process from outside (control/stopping.py), on real processes and signals."""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from trt_otel.control.stopping import (
    GoneWithin,
    holds_write_lock,
    owned_by_this_user,
    polling,
    process_running,
    stop_process,
)

IGNORES_SIGTERM = (
    "import signal, sys, time\n"
    "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
    "print('ready', flush=True)\n"
    "time.sleep(600)\n"
)


Start = Callable[[str], "subprocess.Popen[str]"]


@pytest.fixture
def start() -> Iterator[Start]:
    """Starts Python processes that say when they are ready; none outlives the test."""
    started: list[subprocess.Popen[str]] = []

    def starting(code: str) -> subprocess.Popen[str]:
        process = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
        started.append(process)
        assert process.stdout is not None and process.stdout.readline() == "ready\n"
        return process

    yield starting
    for process in started:
        process.kill()
        process.wait()
        assert process.stdout is not None
        process.stdout.close()


def reaping(process: subprocess.Popen[str]) -> GoneWithin:
    def gone_within(timeout_s: float) -> bool:
        try:
            process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            return False
        return True

    return gone_within


@pytest.mark.e2e
def test_a_process_that_ends_on_sigterm_is_not_killed(start: Start) -> None:
    process = start("import time\nprint('ready', flush=True)\ntime.sleep(600)")
    assert stop_process(process.pid, reaping(process), kill_after_s=30) == "SIGTERM"
    assert process.returncode == -15


@pytest.mark.e2e
def test_one_that_ignores_sigterm_is_killed_after_the_wait(start: Start) -> None:
    process = start(IGNORES_SIGTERM)
    assert stop_process(process.pid, reaping(process), kill_after_s=0.5) == "SIGKILL"
    assert process.returncode == -9


@pytest.mark.e2e
def test_one_already_gone_is_not_signalled(start: Start) -> None:
    process = start("print('ready', flush=True)")
    process.wait()
    assert process_running(process.pid) is False
    assert stop_process(process.pid, polling(process.pid), kill_after_s=1) is None


@pytest.mark.e2e
def test_a_process_not_our_child_is_waited_for_by_polling(start: Start) -> None:
    process = start(IGNORES_SIGTERM)
    gone = polling(process.pid)
    assert gone(0.2) is False
    process.kill()
    process.wait()
    assert gone(5.0) is True


def test_only_this_users_processes_are_ours_to_stop() -> None:
    assert owned_by_this_user(os.getpid()) is True
    assert owned_by_this_user(2**22 + 12345) is False, "no such process is no one's to stop"


def test_only_a_descriptor_open_for_writing_with_the_lock_is_the_writers(tmp_path: Path) -> None:
    """The journal's writer holds its write lock on a descriptor open for writing: a reader
    that takes the same exclusive lock on a read-only descriptor (opened, as Python opens
    files, with O_CLOEXEC among its flags) is not the writer."""
    journal = tmp_path / "build.jsonl"
    journal.write_text("")
    reader = os.open(journal, os.O_RDONLY | os.O_CLOEXEC)
    try:
        fcntl.flock(reader, fcntl.LOCK_EX | fcntl.LOCK_NB)
        assert holds_write_lock(os.getpid(), journal) is False, "locked, but only read"
    finally:
        os.close(reader)
    writer = os.open(journal, os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC)
    try:
        assert holds_write_lock(os.getpid(), journal) is False, "written, but not locked"
        fcntl.flock(writer, fcntl.LOCK_EX | fcntl.LOCK_NB)
        assert holds_write_lock(os.getpid(), journal) is True
    finally:
        os.close(writer)


def test_a_writer_that_opened_its_journal_to_read_and_write_is_the_writer(tmp_path: Path) -> None:
    journal = tmp_path / "build.jsonl"
    journal.write_text("")
    both = os.open(journal, os.O_RDWR | os.O_CLOEXEC)
    try:
        fcntl.flock(both, fcntl.LOCK_EX | fcntl.LOCK_NB)
        assert holds_write_lock(os.getpid(), journal) is True
    finally:
        os.close(both)


@pytest.mark.e2e
def test_a_process_that_is_gone_is_not_the_writer(tmp_path: Path) -> None:
    """Gone (no /proc entry): provably not the writer, not "cannot tell"."""
    journal = tmp_path / "build.jsonl"
    journal.write_text("")
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    assert not os.path.exists(f"/proc/{gone.pid}")
    assert holds_write_lock(gone.pid, journal) is False


def test_a_shared_lock_on_a_descriptor_open_for_writing_is_not_the_writers(tmp_path: Path) -> None:
    """The writer's lock is exclusive: a descriptor open for writing that holds only a shared
    ``flock`` (``FLOCK ADVISORY READ``) is not the journal's writer, until it takes it."""
    journal = tmp_path / "build.jsonl"
    journal.write_text("")
    writer = os.open(journal, os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC)
    try:
        fcntl.flock(writer, fcntl.LOCK_SH | fcntl.LOCK_NB)
        assert holds_write_lock(os.getpid(), journal) is False, "written, but the lock is shared"
        fcntl.flock(writer, fcntl.LOCK_EX | fcntl.LOCK_NB)
        assert holds_write_lock(os.getpid(), journal) is True
    finally:
        os.close(writer)
