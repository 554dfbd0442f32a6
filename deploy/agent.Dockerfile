# The gpuledger node agent image: the lean install (agent extra only; no Polars, DuckDB
# or PyArrow). Build from the repository root:
#   docker build -f deploy/agent.Dockerfile -t gpuledger-agent:0.1.0 .
# Run it with the NVIDIA container runtime so that the driver's libnvidia-ml.so.1 is
# mounted (deploy/kubernetes/agent-daemonset.yaml does this with runtimeClassName).
# Base image pinned to an exact Python and Debian release.
FROM python:3.11.11-slim-bookworm

ENV PIP_NO_CACHE_DIR=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    NVIDIA_VISIBLE_DEVICES=all \
    NVIDIA_DRIVER_CAPABILITIES=utility

WORKDIR /src
COPY pyproject.toml README.md ./
COPY agents ./agents
COPY pipeline ./pipeline
COPY sql ./sql
RUN python -m pip install ".[agent]" && rm -rf /src

COPY deploy/agent.yaml /etc/gpuledger/agent.yaml
WORKDIR /
EXPOSE 9466
VOLUME ["/var/lib/gpuledger"]
ENTRYPOINT ["gpuledger", "agent"]
CMD ["--config", "/etc/gpuledger/agent.yaml"]
