"""The chat UI's files: which paths are the UI's, and the status page link in ``/``."""

from __future__ import annotations

import gzip

from node_agent.api.chat_ui import STATUS_LINK, Asset, KeptAssets, is_ui_path, with_status_link

HTML = b"<html><body><div id=app></div></body></html>"


def test_ui_paths() -> None:
    for path in ("/", "/index.html", "/_app/immutable/bundle.x.js", "/favicon.svg", "/sw.js"):
        assert is_ui_path(path), path
    for path in ("/models", "/v1/models", "/v1/chat/completions", "/ui", "/a/b.js", "/health"):
        assert not is_ui_path(path), path


def test_the_status_link_goes_before_the_end_of_the_body() -> None:
    headers = (("Content-Type", "text/html"), ("Content-Encoding", "gzip"), ("ETag", '"1"'))
    linked = with_status_link(Asset(200, headers, gzip.compress(HTML)))
    assert gzip.decompress(linked.body) == HTML.replace(b"</body>", STATUS_LINK + b"</body>")
    # Its bytes changed: the binary's ETag no longer names them.
    assert dict(linked.headers) == {"Content-Type": "text/html", "Content-Encoding": "gzip"}
    plain = with_status_link(Asset(200, (("Content-Type", "text/html"),), HTML))
    assert plain.body.endswith(STATUS_LINK + b"</body></html>")


def test_a_page_without_a_body_is_left_alone() -> None:
    asset = Asset(200, (), b"no body here")
    assert with_status_link(asset) is asset


def test_only_file_shaped_paths_as_sent_are_the_uis() -> None:
    # Issue 26, rows 7 and 19: a decoded %3F (a query for the UI server), a climb, a dot file,
    # a path too long for any of the UI's files.
    for path in ("/%3Fx.js", "/?x.js", "/health?.x", "/_app/../health", "/.env", "/_app/"):
        assert not is_ui_path(path), path
    assert not is_ui_path("/" + "a" * 300 + ".js")
    assert is_ui_path("/_app/immutable/assets/bundle.opWWFVFD.css")


def test_the_kept_files_are_bounded_in_number_and_bytes() -> None:
    # Issue 26, row 7: every 200 was kept, under every path a client made up.
    kept = KeptAssets(max_assets=3, max_bytes=10)
    for i in range(5):
        kept.keep(f"/f{i}.js", Asset(200, (), b"1234"))
    assert kept.statistics() == {"assets": 2, "bytes": 8}  # a third would pass 10 bytes
    kept.keep("/small.js", Asset(200, (), b"12"))
    kept.keep("/more.js", Asset(200, (), b""))
    assert kept.statistics() == {"assets": 3, "bytes": 10}
    assert kept.get("/f0.js") is not None and kept.get("/f4.js") is None
