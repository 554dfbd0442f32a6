"""Alerts: the processor's native engine for history-aware alerts, and the Prometheus
rules generated from the same thresholds (``prometheus_rules.py``)."""
