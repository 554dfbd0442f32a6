"""Scheduler bridges: Slurm, Kubernetes/Kueue → contract job events and inventory."""
