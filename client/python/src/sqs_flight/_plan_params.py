"""The plan parameters, as schemas/src/plan.rs defines them (its
`plan_params!` list). Written by `SQSF_BLESS=1 cargo test --workspace --lib
plan::tests`; a test fails when this file differs from the list. Do not edit.
"""

from __future__ import annotations

from typing import NamedTuple


class PlanParam(NamedTuple):
    """One plan parameter: its plan-command field (also its `[limits]` and
    `[tables.NAME]` key), meaning, built-in default and limit, whether a plan
    may set it to 0, and the Spark source's option that sets it."""

    name: str
    doc: str
    default: int
    limit: int
    may_be_zero: bool
    spark_option: str


#: Every plan parameter, in the server's order.
PLAN_PARAMS = (
    PlanParam(
        name="partitions",
        doc=(
            "Partitions (endpoints) per batch unless the command or table says otherwise.\n"
        ),
        default=2,
        limit=64,
        may_be_zero=False,
        spark_option="partitions",
    ),
    PlanParam(
        name="max_messages",
        doc=(
            "Messages per partition of a batch.\n"
        ),
        default=1000,
        limit=100000,
        may_be_zero=False,
        spark_option="maxMessagesPerPartition",
    ),
    PlanParam(
        name="max_wait_ms",
        doc=(
            "Idle time without a message after which a partition's stream ends.\n"
        ),
        default=1000,
        limit=20000,
        may_be_zero=True,
        spark_option="maxWaitMs",
    ),
    PlanParam(
        name="max_bytes",
        doc=(
            "Bytes per partition of a batch.\n"
        ),
        default=67108864,
        limit=268435456,
        may_be_zero=False,
        spark_option="maxBytesPerPartition",
    ),
    PlanParam(
        name="max_duration_ms",
        doc=(
            "Time after which a partition's stream ends however busy the queue is.\n"
        ),
        default=30000,
        limit=300000,
        may_be_zero=False,
        spark_option="maxDurationMs",
    ),
    PlanParam(
        name="receivers",
        doc=(
            "ReceiveMessage calls a partition keeps in flight at most. It grows\n"
            "while receives come back full and shrinks while they do not, so an\n"
            "idle queue costs one long poll per partition whatever this is; past 32\n"
            "it grows only as far as the round trip calls for (32,000 messages a\n"
            "second a partition: 32 calls up to 10 ms, 64 at 20 ms, 128 from\n"
            "40 ms). Why 32 on loopback: \"Choosing the defaults\" in\n"
            "benches/results/2026-12-01-round5-ddbdb76.md (figure 3 at 8, 16 and\n"
            "32 through a 20 ms proxy, and at 0 ms); past it: figure 8 at 20 and\n"
            "50 ms.\n"
        ),
        default=128,
        limit=128,
        may_be_zero=False,
        spark_option="receiversPerPartition",
    ),
    PlanParam(
        name="read_ahead",
        doc=(
            "Batches a consumer's next plan is received ahead: once every partition\n"
            "of batch N has received, the server receives batch N+1\n"
            "in the background, with the same plan command, so that plan finds its\n"
            "rows ready (docs/protocol.md, \"Read-ahead\"). Off (0) unless asked for:\n"
            "a client that does not plan batch after batch with one command would\n"
            "leave what is read ahead hidden until its release or lease expiry. The\n"
            "Spark source asks for 1.\n"
        ),
        default=0,
        limit=1,
        may_be_zero=True,
        spark_option="readAhead",
    ),
    PlanParam(
        name="receive_at_plan",
        doc=(
            "Whether the partitions of a new batch start receiving at its plan (1)\n"
            "or at their first DoGet (0). With 1 the server makes the first read of\n"
            "each partition itself as soon as the batch is planned, as it does for\n"
            "a batch received ahead, so SQS's round trip overlaps the engine's\n"
            "planning and task launch (docs/protocol.md, \"Planning\"). Off (0)\n"
            "unless asked for: a client that commits a batch without reading all\n"
            "of its partitions would have the rows of the others deleted unread.\n"
            "The Spark source asks for 1.\n"
        ),
        default=0,
        limit=1,
        may_be_zero=True,
        spark_option="receiveAtPlan",
    ),
    PlanParam(
        name="backlog_max_messages",
        doc=(
            "Most messages per partition a batch takes from the backlog when\n"
            "`max_messages` is left to the built-in default: the queue's depth as\n"
            "the server last read it, over the partitions, rounded up, never fewer\n"
            "than `max_messages` (docs/protocol.md, \"Plan parameters\"). Off (0)\n"
            "unless asked for; the Spark source asks for 10000.\n"
        ),
        default=0,
        limit=100000,
        may_be_zero=True,
        spark_option="backlogMaxMessagesPerPartition",
    ),
)
