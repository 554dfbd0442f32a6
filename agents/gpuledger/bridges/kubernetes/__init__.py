"""Kubernetes/Kueue bridge: Pods, Nodes and Kueue Workloads → contract v1 events.

See ``docs/kubernetes.md``.
"""
