"""Grafana boards generated from code (``dashboards/*.json``), and pushing them."""
