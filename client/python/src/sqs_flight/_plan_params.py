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
            "ReceiveMessage calls a partition keeps in flight at most. The count\n"
            "grows while receives come back full and shrinks while they do not (an\n"
            "idle queue costs one long poll per partition); past 32 it grows only\n"
            "as far as the round trip needs for 32,000 messages a second (32 calls\n"
            "up to 10 ms, 64 at 20 ms, 128 from 40 ms).\n"
        ),
        default=128,
        limit=128,
        may_be_zero=False,
        spark_option="receiversPerPartition",
    ),
    PlanParam(
        name="read_ahead",
        doc=(
            "Batches received ahead of a consumer's next plan: once every partition\n"
            "of batch N has received, batch N+1 is received with the same plan\n"
            "command (docs/protocol.md, \"Read-ahead\"). Off (0) unless asked for, as\n"
            "a client that does not repeat one plan command would leave those\n"
            "messages hidden until release or lease expiry. The Spark source asks\n"
            "for 1.\n"
        ),
        default=0,
        limit=1,
        may_be_zero=True,
        spark_option="readAhead",
    ),
    PlanParam(
        name="receive_at_plan",
        doc=(
            "1: a new batch's partitions start receiving at its plan, so SQS's round\n"
            "trip overlaps the engine's planning (docs/protocol.md, \"Planning\");\n"
            "0: at their first DoGet. Off (0) unless asked for, as a client that\n"
            "commits without reading every partition would have the unread rows\n"
            "deleted. The Spark source asks for 1.\n"
        ),
        default=0,
        limit=1,
        may_be_zero=True,
        spark_option="receiveAtPlan",
    ),
    PlanParam(
        name="backlog_max_messages",
        doc=(
            "Most messages per partition a batch takes when `max_messages` is left\n"
            "to the built-in default: the queue's last-read depth over the\n"
            "partitions, rounded up, never below `max_messages` (docs/protocol.md,\n"
            "\"Plan parameters\"). Off (0) unless asked for; the Spark source\n"
            "asks for 10000.\n"
        ),
        default=0,
        limit=100000,
        may_be_zero=True,
        spark_option="backlogMaxMessagesPerPartition",
    ),
)
