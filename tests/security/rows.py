# ruff: noqa: E501  (a table: one row a line reads best)
"""Every row of the three security rounds, and the test that holds it (the list an attacker
checks next: tests/security/README.md shows it as a table, test_rows.py checks it is whole
and that each test exists).

Round 1 is issue 16, round 2 issue 26, round 3 issue 50. Most rows of rounds 1 and 2 are held
by tests that live with the code they guard (an operator test in tests/operator, a unit test
of the redaction...): they are named here, not copied. Round 3's live in this folder.
"""

from __future__ import annotations

from typing import NamedTuple


class Row(NamedTuple):
    round: int
    row: int
    attack: str
    test: str  # a pytest node id; "" while the row is open (``open`` says why)
    open: str = ""


SEC = "tests/security"
ATTACKS = "tests/integration/test_attacks_http.py"
TOOLS = "tests/integration/test_tools_attacks.py"
FILES = "tests/integration/test_model_file_attacks.py"
TRUST = "tests/unit/test_preset_trust.py"
LINKS = "tests/integration/test_security_connections.py"
DOWNLOADS = "tests/integration/test_download_security.py"

ROWS: tuple[Row, ...] = (
    Row(1, 1, "a preset's mcp-servers-json runs a command", f"{TRUST}::test_rows_1_to_3_attacks_are_refused_by_the_operator_and_the_crd"),
    Row(1, 2, "chat-template-file = /proc/self/environ", "tests/integration/test_security_presets.py::test_one_bad_preset_never_takes_the_node_down"),
    Row(1, 3, "file-writing and program-running options in a ModelPreset", f"{TRUST}::test_rows_1_to_3_attacks_are_refused_by_the_operator_and_the_crd"),
    Row(1, 4, "one ModelPreset's '#' takes every model of the node down", f"{TRUST}::test_row_4_comment_characters_round_trip"),
    Row(1, 5, "newlines in source fields inject INI sections", f"{TRUST}::test_row_5_line_breaks_in_source_fields_are_refused_by_the_operator"),
    Row(1, 6, "idle, slow-header and slow-body connections", f"{LINKS}::test_row_6_slow_and_idle_connections_are_closed_and_health_keeps_answering"),
    Row(1, 7, "clients that stream and never read", f"{LINKS}::test_row_7_a_client_that_does_not_read_is_queued_and_cut_off"),
    Row(1, 8, "a 60 MB body parsed on the loop", f"{LINKS}::test_row_8_a_large_body_does_not_stall_other_clients"),
    Row(1, 9, "a download that redirects elsewhere or never ends", f"{DOWNLOADS}::test_row9_an_endless_body_stops_at_the_size_cap"),
    Row(1, 10, "tokens and signed URLs shown in listings, errors and logs", f"{DOWNLOADS}::test_row10_secrets_show_nowhere"),
    Row(1, 11, "an empty --api-key leaves everything open", "tests/unit/test_config.py::test_an_api_key_list_with_no_key_is_an_error"),
    Row(1, 12, "a child's port reached directly", "tests/integration/test_security_children.py::test_a_child_answers_only_the_agent"),
    Row(1, 13, "DNS rebinding (Host: evil.rebind.example)", "tests/integration/test_compat.py::test_a_rebound_host_name_is_refused"),
    Row(1, 14, "/ui without CSP, X-Frame-Options, nosniff", "tests/integration/test_status_page.py::test_status_page_runs_under_its_content_security_policy"),
    Row(1, 15, "a cross-site text/plain POST unloads a model", "tests/integration/test_compat.py::test_a_cross_site_simple_post_cannot_change_state"),
    Row(1, 16, "keep_alive NaN, 1e400 from any client", "tests/unit/test_keep_alive.py::test_bad_keep_alive_is_a_clear_400"),
    Row(1, 17, "a crafted GGUF header allocates the file's size", "tests/unit/test_gguf_header_bounds.py::test_crafted_counts_are_refused_at_once"),
    Row(1, 18, "the operator's RBAC", "tests/operator/test_operator.py::test_row_18_configmap_writes_are_limited_to_the_presets_configmap"),
    Row(2, 1, "a backtracking grep pattern freezes the loop", f"{TOOLS}::test_a_backtracking_pattern_neither_freezes_the_agent_nor_runs_for_long"),
    Row(2, 2, "a 32 KB Host header (quadratic redaction)", f"{ATTACKS}::test_row_2_a_huge_host_is_refused_at_once_and_echoed_short"),
    Row(2, 3, "a 32 KB Origin header", f"{ATTACKS}::test_row_3_a_huge_origin_is_logged_short"),
    Row(2, 4, "a 40 KB model name", f"{ATTACKS}::test_row_4_a_huge_model_name_is_not_found_at_once_and_echoed_short"),
    Row(2, 5, "raw request paths as metric labels", f"{ATTACKS}::test_row_5_metrics_label_routes_not_paths"),
    Row(2, 6, "a header's block_count of 20,000,000", f"{FILES}::test_row6_row8_crafted_headers_never_freeze_or_break_the_list"),
    Row(2, 7, "the chat UI's cache keyed by client paths", f"{ATTACKS}::test_rows_7_and_19_only_the_ui_files_reach_the_ui_server"),
    Row(2, 8, "a header's block_count of inf", f"{FILES}::test_row8_a_downloaded_inf_model_is_one_model_with_its_reason"),
    Row(2, 9, "a ModelPreset alias equal to a node model's name", "tests/integration/test_preset_clashes.py::test_row9_row10_a_clashing_operator_preset_is_refused_alone"),
    Row(2, 10, "a ModelPreset named like a node model replaces it", "tests/integration/test_preset_clashes.py::test_row9_row10_a_clashing_operator_preset_is_refused_alone"),
    Row(2, 11, "an MCP server's 8 MiB stderr line", f"{TOOLS}::test_an_mcp_server_writing_a_huge_stderr_line_keeps_working"),
    Row(2, 12, "a hub file path holding NUL", f"{FILES}::test_row12_a_hub_path_with_nul_is_refused_up_front_and_nothing_hangs"),
    Row(2, 13, "setsid sleep survives the tool and the agent", f"{TOOLS}::test_a_commands_processes_die_with_it_setsid_ones_too"),
    Row(2, 14, "200 edits on a 10 MB file, a long glob", f"{TOOLS}::test_many_edits_on_a_large_file_are_quick_and_bounded"),
    Row(2, 15, "4,000 distinct 30 KB conversation ids", f"{ATTACKS}::test_row_15_a_conversation_id_is_bounded"),
    Row(2, 16, "a child writes 40 MB to stderr", f"{ATTACKS}::test_row_16_a_childs_long_stderr_lines_are_kept_cut"),
    Row(2, 17, "SIGTERM with everything open", f"{ATTACKS}::test_row_17_the_shutdown_timeout_holds_with_everything_open"),
    Row(2, 18, "headers a child names in Connection:", "tests/unit/test_proxy_headers.py::test_the_headers_connection_names_are_dropped_with_the_fixed_hop_by_hop_set"),
    Row(2, 19, "/health%3F.x through the chat UI", f"{ATTACKS}::test_rows_7_and_19_only_the_ui_files_reach_the_ui_server"),
    Row(2, 20, "a cross-site GET that loads a model", f"{ATTACKS}::test_row_20_a_cross_site_get_does_not_load_a_model"),
    Row(3, 1, "a client's own 500s kill the child under another's stream", f"{SEC}/test_round3_wedge.py::test_a_clients_own_bad_requests_never_cut_another_clients_stream"),
    Row(3, 2, "a self-looping link in --models-dir kills hot reload", f"{SEC}/test_round3_models_dir.py::test_links_that_loop_or_lead_out_never_stop_the_watch"),
    Row(3, 3, "a declared size that does not bound a download", f"{SEC}/test_round3_downloads.py::test_a_length_over_the_declared_size_is_refused_and_nothing_kept"),
    Row(3, 4, "a tree listing in two reads refused as not JSON", f"{SEC}/test_round3_downloads.py::test_a_listing_that_arrives_in_two_reads_is_read_whole"),
    Row(3, 5, "another client's prompt tested through the prompt cache", f"{SEC}/test_round3_warm.py::test_a_saved_cache_is_restored_only_for_the_key_that_made_it"),
    Row(3, 6, "a corrupted warm-cache file aborts the child", f"{SEC}/test_round3_warm.py::test_a_damaged_saved_cache_is_deleted_unread"),
    Row(3, 7, "10,000 model files push /health to 852 ms", f"{SEC}/test_round3_scale.py::test_health_answers_beside_listings_of_10000_models"),
    Row(3, 8, "a pull that made a model answers 500, and other low rows", f"{SEC}/test_round3_low.py::test_a_pull_that_made_a_model_succeeds_and_the_name_serves"),
)  # fmt: skip
