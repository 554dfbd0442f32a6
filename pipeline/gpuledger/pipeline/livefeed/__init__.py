"""``gpuledger feed``: simulated node agents and scheduler publishing to Kafka in (scaled)
real time, so that a running stack's boards come alive (docker-compose.yml)."""
