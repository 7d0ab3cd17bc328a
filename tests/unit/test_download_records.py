"""The record of unfinished downloads: what a restarted agent resumes."""

from __future__ import annotations

import json
import os
from pathlib import Path

from node_agent.runtime.download_records import MAX_RECORD_BYTES, DownloadRecords


def test_a_download_is_recorded_until_crossed_out(tmp_path: Path) -> None:
    records = DownloadRecords(tmp_path / "downloads")
    assert oct(os.stat(tmp_path / "downloads").st_mode & 0o777) == "0o700"
    records.add("org/repo:Q8_0")
    records.add("org/other")
    assert sorted(records.names()) == ["org/other", "org/repo:Q8_0"]
    records.remove("org/repo:Q8_0")
    assert records.names() == ["org/other"]
    assert not list((tmp_path / "downloads").glob("*.tmp"))


def test_a_record_that_is_not_one_is_deleted_not_followed(tmp_path: Path) -> None:
    records = DownloadRecords(tmp_path)
    records.add("org/repo")
    (good,) = tmp_path.glob("*.json")
    bad = {
        "garbage.json": b"not json",
        "big.json": b" " * (MAX_RECORD_BYTES + 1),
        "renamed.json": good.read_bytes(),  # a name's record under another file name
        "bad-name.json": json.dumps({"model": "../../etc/passwd"}).encode(),
    }
    for name, data in bad.items():
        (tmp_path / name).write_bytes(data)
    assert records.names() == ["org/repo"]
    assert sorted(p.name for p in tmp_path.glob("*.json")) == [good.name]
