"""Card type names from the driver's product name, one rule for every source."""

from __future__ import annotations


def card_type_of(name: str) -> str:
    """NVML's product name as a card type: 'NVIDIA H100 80GB HBM3' → 'H100-80GB-HBM3'.

    dcgm-exporter's ``modelName`` label is the same NVML name, so both sources agree."""
    name = name.strip()
    if name.startswith("NVIDIA "):
        name = name[len("NVIDIA "):]
    return "-".join(name.split()) or "unknown"
