"""A retried failure is said at its start, once a minute while it lasts, and at its end
(outage_log.py): the node agent's deliveries and the Slurm bridge's polls."""

from __future__ import annotations

import logging

import pytest

from gpuledger.outage_log import OutageLog, error_text, span


def test_a_failure_retried_every_5_s_is_said_three_times_in_two_minutes(
        caplog: pytest.LogCaptureFixture) -> None:
    now = [0.0]
    outage = OutageLog(logging.getLogger("gpuledger.test"), "poll of Slurm",
                       clock=lambda: now[0])
    with caplog.at_level("WARNING", logger="gpuledger.test"):
        outage.worked("fine")                     # nothing failed: nothing to say
        for i in range(25):
            now[0] = 5.0 * i
            outage.failed("slurm_load_jobs error: Unable to contact slurm controller",
                          "nothing changed")
        now[0] = 190.0
        outage.worked("jobs and nodes read again")
        outage.worked("jobs and nodes read again")   # said once
    assert [r.getMessage() for r in caplog.records] == [
        "poll of Slurm failed (slurm_load_jobs error: Unable to contact slurm controller); "
        "nothing changed, retrying (said again each minute while it fails)",
        "poll of Slurm still failing after 60 s (13 tries; the last: slurm_load_jobs error: "
        "Unable to contact slurm controller); nothing changed",
        "poll of Slurm still failing after 2.0 min (25 tries; the last: slurm_load_jobs "
        "error: Unable to contact slurm controller); nothing changed",
        "poll of Slurm works again after 3.2 min (25 tries failed); jobs and nodes read "
        "again"]


def test_an_error_is_named_once() -> None:
    class KafkaTimeoutError(Exception):
        def __str__(self) -> str:
            return "KafkaTimeoutError: Unable to bootstrap"

    assert error_text(KafkaTimeoutError()) == "KafkaTimeoutError: Unable to bootstrap"
    assert error_text(TimeoutError()) == "TimeoutError"
    assert span(59.6) == "60 s" and span(192) == "3.2 min"


def test_one_failed_try_is_said_in_the_singular(caplog: pytest.LogCaptureFixture) -> None:
    now = [0.0]
    outage = OutageLog(logging.getLogger("gpuledger.test"), "reaching Kafka",
                       clock=lambda: now[0])
    with caplog.at_level("WARNING", logger="gpuledger.test"):
        outage.failed("KafkaConnectionError: 111 ECONNREFUSED", "back to the checkpoint")
        now[0] = 10.0
        outage.worked("on from the last checkpoint")
    assert caplog.records[-1].getMessage() == (
        "reaching Kafka works again after 10 s (1 try failed); on from the last checkpoint")
