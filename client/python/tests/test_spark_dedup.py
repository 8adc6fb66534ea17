"""SQS's at-least-once deliveries under a Structured Streaming query: real
PySpark in local mode, the real server binary, rustack as SQS behind the
Rust harness's fault proxy (``sqsf-fault-proxy``), which hands a share of
the messages received to a second receive with a new receipt, as SQS now
and then does. Only the newest receipt works from then on (tests/src/faults.rs).

The server deduplicates by message id (issue 33): the query lands each
message once, and the newest receipt of each message deletes it."""

from __future__ import annotations

import time
from collections import Counter
from typing import List, Tuple

from conftest import bodies
from support import run_available_now, source


def test_a_stream_over_duplicate_receives_lands_each_message_once(spark, rustack, start_server, fault_proxy, tmp_path):
    n = 300
    qurl = rustack.new_queue("dup")
    sent = bodies(n, "dup")
    sent_ids: List[str] = []
    assert rustack.send(qurl, sent, ids=sent_ids) == n
    proxy = fault_proxy(rustack, "duplicate-receives", share=0.3, seed=33)
    server = start_server(proxy, {"orders": qurl})
    landed: List[Tuple[str, str]] = []

    def sink(df, batch_id: int) -> None:
        landed.extend((r.message_id, r.body) for r in df.select("message_id", "body").collect())

    stream = source(spark, server.url, "orders", partitions=2, maxRowsPerBatch=100, maxWaitMs=500)
    run_available_now(stream.writeStream.foreachBatch(sink), tmp_path / "ck")
    # Receives still in flight when a batch's read ended can bring a
    # duplicate after that batch committed: the server then deletes it with
    # its new receipt (the committed window). Wait for those.
    deadline = time.monotonic() + 30
    while proxy.total("new receipt") < proxy.count("ReceiveMessage", "duplicated") and time.monotonic() < deadline:
        time.sleep(0.2)
    counts = proxy.counts()
    twice = {i: k for i, k in Counter(i for i, _ in landed).items() if k > 1}
    stale = proxy.total("stale receipt")
    print(
        f"{len(landed)} rows landed, {len(set(i for i, _ in landed))} distinct of {n}; "
        f"landed more than once: {len(twice)}; old receipts used after the new one: {stale}; "
        f"proxy: {counts}"
    )

    assert counts["ReceiveMessage"].get("duplicated", 0) > 0, "the proxy duplicated nothing"
    assert {i for i, _ in landed} == set(sent_ids), "every message landed"
    assert sorted(set(b for _, b in landed)) == sorted(sent)
    assert rustack.counts(qurl) == {"visible": 0, "in_flight": 0}
    assert not twice, f"{len(twice)} messages landed more than once: {list(twice)[:3]}..."
    # The newest receipt of every message handed twice deleted it. An older
    # one is used only by a commit that ran before the server saw the newer
    # (the proxy counts from when it hands the copy out, a moment earlier);
    # never after, which tests/it/dedup.rs checks where reads are ordered.
    assert proxy.total("new receipt") == counts["ReceiveMessage"]["duplicated"], counts
