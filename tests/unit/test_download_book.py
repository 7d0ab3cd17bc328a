"""The pure book of downloads under way: what may start, which progress is reported, how
many wait (``core.downloads``)."""

from __future__ import annotations

from node_agent.core.download_book import REPORT_SECONDS, DownloadBook, Refusal

A, B = frozenset({"/hub/blobs/a"}), frozenset({"/hub/blobs/b"})


def test_a_second_download_of_a_name_is_refused_as_existing() -> None:
    book = DownloadBook()
    assert book.begin("org/r:Q8_0", A) is None
    assert book.begin("org/r:Q8_0", B) == (Refusal.EXISTS, "org/r:Q8_0")


def test_a_download_sharing_a_file_is_refused_naming_the_other() -> None:
    book = DownloadBook()
    book.begin("org/r:Q8_0", A | B)
    assert book.begin("org/r:q8_0", A) == (Refusal.SHARES, "org/r:Q8_0")
    assert book.begin("org/r:F16", frozenset({"/hub/blobs/c"})) is None
    assert book.names() == ["org/r:F16", "org/r:Q8_0"]


def test_once_over_the_files_are_free_again() -> None:
    book = DownloadBook()
    book.begin("x/y", A)
    book.end("x/y")
    assert not book.active("x/y")
    assert book.check("x/z", A) is None


def test_progress_is_throttled_but_first_and_last_always_reported() -> None:
    book = DownloadBook()
    book.begin("x/y", A)
    assert book.progress("x/y", "u1", 0, 100, now=0.0) == {"u1": {"done": 0, "total": 100}}
    assert book.progress("x/y", "u1", 10, 100, now=0.01) is None  # within REPORT_SECONDS
    later = book.progress("x/y", "u1", 20, 100, now=REPORT_SECONDS)
    assert later == {"u1": {"done": 20, "total": 100}}
    assert book.progress("x/y", "u1", 100, 100, now=REPORT_SECONDS + 0.01) == {
        "u1": {"done": 100, "total": 100}
    }
    # A second file's first report carries both (llama.cpp sends every file's progress).
    both = book.progress("x/y", "u2", 0, None, now=REPORT_SECONDS + 0.02)
    assert both == {"u1": {"done": 100, "total": 100}, "u2": {"done": 0, "total": 0}}


def test_progress_of_an_unknown_download_is_ignored() -> None:
    assert DownloadBook().progress("nope/x", "u", 1, 2, now=0.0) is None


def test_waiters_are_bounded_by_max_queue() -> None:
    book = DownloadBook()
    book.begin("x/y", A)
    assert book.join("x/y", max_queue=2) and book.join("x/y", max_queue=2)
    assert not book.join("x/y", max_queue=2)
    assert book.statistics().waiters == 2
    book.leave("x/y")
    assert book.waiters("x/y") == 1
    assert book.join("x/y", max_queue=None)
    book.end("x/y")
    book.leave("x/y")  # a waiter leaving after the end changes nothing
    assert book.statistics().downloads == 0 and book.waiters("x/y") == 0
