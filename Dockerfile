# The gpuledger processor image (also runs `gpuledger feed`, the simulated agents and
# scheduler, and `gpuledger topics create`). Used by docker-compose.yml.
#   docker build -t gpuledger:0.1.0 .
FROM python:3.12.10-slim-bookworm

ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1
WORKDIR /opt/gpuledger

# Project metadata first, then the code, so that dependency layers cache well.
COPY pyproject.toml README.md ./
COPY agents ./agents
COPY pipeline ./pipeline
COPY sql ./sql
RUN pip install ".[pipeline,ops]" \
    && useradd --uid 10001 --no-create-home --shell /usr/sbin/nologin gpuledger \
    && mkdir -p /warehouse /rules && chown gpuledger /warehouse /rules

USER gpuledger
VOLUME ["/warehouse", "/rules"]
# Prometheus /metrics of `gpuledger process --metrics-address 0.0.0.0:9108`
EXPOSE 9108
ENTRYPOINT ["gpuledger"]
CMD ["process", "--warehouse", "/warehouse", "--metrics-address", "0.0.0.0:9108"]
