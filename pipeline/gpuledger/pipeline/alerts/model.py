"""One alert event (firing or resolved) and its Alertmanager form."""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

SOURCE = "gpuledger-processor"


def iso(t: datetime) -> str:
    """RFC 3339 with milliseconds and Z, as Alertmanager expects."""
    return t.strftime("%Y-%m-%dT%H:%M:%S.") + f"{t.microsecond // 1000:03d}Z"


@dataclass(frozen=True)
class Alert:
    """An alert about one job attempt, with its evidence and a recommendation.

    De-duplication key: ``(name, job_id, attempt)``: an alert fires once for a key and
    fires again only after it has resolved.
    """

    name: str
    job_id: str
    attempt: int
    severity: str
    starts_at: datetime
    summary: str
    description: str
    recommendation: str
    evidence: dict[str, Any]
    labels: dict[str, str] = field(default_factory=dict)
    """Job context: team, queue, pool, card_type (and job_type where known)."""
    ends_at: datetime | None = None
    resolution: str | None = None
    """Why it resolved (``recovered`` or ``job ended``); None while firing."""

    @property
    def key(self) -> tuple[str, str, int]:
        return (self.name, self.job_id, self.attempt)

    @property
    def status(self) -> str:
        return "firing" if self.ends_at is None else "resolved"

    def resolved(self, at: datetime, why: str, evidence: dict[str, Any] | None = None) -> Alert:
        return replace(self, ends_at=at, resolution=why,
                       evidence={**self.evidence, **(evidence or {})})

    def alertmanager(self, generator_url: str | None = None) -> dict[str, Any]:
        """The alert as Alertmanager's ``POST /api/v2/alerts`` takes it (one list item)."""
        labels = {"alertname": self.name, "severity": self.severity, "job_id": self.job_id,
                  "attempt": str(self.attempt), "source": SOURCE,
                  **{k: v for k, v in self.labels.items() if v}}
        annotations = {"summary": self.summary, "description": self.description,
                       "recommendation": self.recommendation,
                       "evidence": json.dumps(self.evidence, sort_keys=True, default=str)}
        if self.resolution:
            annotations["resolution"] = self.resolution
        out: dict[str, Any] = {
            "labels": labels, "annotations": annotations, "startsAt": iso(self.starts_at),
            "generatorURL": (generator_url or "gpuledger://job/{job_id}/{attempt}").format(
                job_id=self.job_id, attempt=self.attempt),
        }
        if self.ends_at is not None:
            out["endsAt"] = iso(self.ends_at)
        return out

    def message(self) -> dict[str, Any]:
        """The alerts topic's message: status, the Alertmanager fields, evidence as numbers."""
        return {"status": self.status, **self.alertmanager(), "evidence": self.evidence}
