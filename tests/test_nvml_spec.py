"""The NVML source's field file: the packaged one is valid, a bad one names the bad key."""

from __future__ import annotations

import re
from pathlib import Path

import pynvml
import pytest
import yaml

from gpuledger.agent.sources.nvml_spec import FieldFileError, load_field_spec

PACKAGED = yaml.safe_load(
    (Path(__file__).parents[1] / "agents/gpuledger/agent/sources/nvml_fields.yaml").read_text())


@pytest.mark.parametrize(("text", "names"), [
    ("fields: {gpu_util: [{call: nvmlDeviceGetUtilizationRates}]}", "fields.gpu_util"),
    ("fields: {util_gpu: [{call: nvmlNoSuchCall}]}", "fields.util_gpu[0].call"),
    ("fields: {ecc_sbe: [{field: NVML_FI_NO_SUCH, kind: delta}]}", "fields.ecc_sbe[0].field"),
    ("fields: {ecc_sbe: [{field: 3, kind: sum}]}", "fields.ecc_sbe[0].kind"),
    ("fields: {power_w: [{call: nvmlDeviceGetPowerUsage, scael: 2}]}", "fields.power_w[0].scael"),
    ("fields: {}\nfatal_xid: [79]", "fatal_xid"),
    ("fields: {}\nmig_fields: [power_w]", "mig_fields"),
    ("fields: {}\nmig_parent_omit: [mem_used_mib]", "mig_parent_omit"),
])
def test_a_bad_field_file_names_the_bad_key(tmp_path: Path, text: str, names: str) -> None:
    path = tmp_path / "fields.yaml"
    path.write_text(text)
    with pytest.raises(FieldFileError, match=f"{re.escape(str(path))}: .*{re.escape(names)}"):
        load_field_spec(pynvml, path)


def test_the_packaged_field_file_is_valid() -> None:
    spec = load_field_spec(pynvml)
    assert set(spec.readers) == set(PACKAGED["fields"]) and spec.xid and spec.processes
    assert spec.fatal_xids == set(PACKAGED["fatal_xids"])
    assert spec.mig_parent_omit == set(PACKAGED["mig_parent_omit"])
    temp, pcie = spec.readers["temp_c"], spec.readers["pcie_rx_bytes_s"]
    assert temp[0].call == "nvmlDeviceGetTemperature"
    assert temp[0].args == (pynvml.NVML_TEMPERATURE_GPU,)
    assert [w.field_id for w in pcie] == [pynvml.NVML_FI_DEV_PCIE_COUNT_RX_BYTES, None]
    assert [w.kind for w in pcie] == ["rate", "gauge"]
