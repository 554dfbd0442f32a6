"""The shared scheduler-name mapping: identity defaults, every section, errors naming keys."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuledger.bridges.mapping import Mapping, MappingError, load_mapping, parse_mapping

FULL = """
mapping:
  teams:
    accounts: {ml-vision: vision}
    namespaces: {team-nlp: nlp}
    label: gpuledger.io/team
  pools:
    partitions: {gpu: train}
    node_label: gpuledger.io/pool
  queues:
    slurm: partition/qos
    names: {gpu/high: urgent}
  priorities:
    qos: {high: 100, low: 10}
  job_types:
    default: training
    rules:
      - {type: evaluation, name: "eval-*"}
      - {type: interactive, qos: interactive}
      - {type: inference, labels: {app.kubernetes.io/component: serving}}
  card_types:
    names: {H200: H200-SXM-141GB}
    memory_mib: {H200-SXM-141GB: 143771}
  preemptible:
    qos: [low]
    label: gpuledger.io/preemptible
"""


def test_identity_without_a_file() -> None:
    m = load_mapping(None)
    assert m.team(account="acct1") == "acct1"
    assert m.team(namespace="ns1") == "ns1"
    assert m.pool(partition="gpu,debug") == "gpu"
    assert m.queue(partition="gpu", qos="normal") == "gpu"
    assert m.priority(qos="normal", native=4294901757) == 4294901757
    assert m.job_type(name="anything") is None
    assert m.preemptible(qos="normal") is None
    # built-in GRES names; unknown names pass through unchanged
    assert m.card_type("h100") == "H100-SXM5-80GB"
    assert m.card_type("H100") == "H100-SXM5-80GB"
    assert m.card_type("mi300x") == "mi300x"
    assert m.card_memory("H100-SXM5-80GB") == 81_559.0
    assert m.card_memory("mi300x") is None


def test_every_section(tmp_path: Path) -> None:
    path = tmp_path / "m.yaml"
    path.write_text(FULL)
    m = load_mapping(path)
    assert m.team(account="ml-vision") == "vision"
    assert m.team(account="other") == "other"
    assert m.team(namespace="team-nlp") == "nlp"
    assert m.team(namespace="team-nlp", labels={"gpuledger.io/team": "speech"}) == "speech"
    assert m.pool(partition="gpu") == "train"
    assert m.pool(partition="cpu", node_labels={"gpuledger.io/pool": "infer"}) == "infer"
    assert m.queue(partition="gpu", qos="high") == "urgent"
    assert m.queue(partition="gpu", qos="normal") == "gpu/normal"
    assert m.queue(local_queue="team-a-queue") == "team-a-queue"
    assert m.priority(qos="high", native=7) == 100
    assert m.priority(qos="normal", native=7) == 7
    assert m.job_type(name="eval-llama") == "evaluation"
    assert m.job_type(name="train", qos="interactive") == "interactive"
    assert m.job_type(labels={"app.kubernetes.io/component": "serving"}) == "inference"
    assert m.job_type(name="pretrain") == "training"
    assert m.card_type("h200") == "H200-SXM-141GB"
    assert m.card_memory("H200-SXM-141GB") == 143_771.0
    assert m.preemptible(qos="low") is True
    assert m.preemptible(qos="high") is False
    assert m.preemptible(labels={"gpuledger.io/preemptible": "true"}) is True


@pytest.mark.parametrize(("raw", "message"), [
    ({"teams": {"accounts": {"foo": 3}}}, "mapping.teams.accounts.foo: expected a string"),
    ({"teams": {"acounts": {}}}, "mapping.teams.acounts: unknown key"),
    ({"pools": ["gpu"]}, "mapping.pools: expected a mapping, got list"),
    ({"queues": {"slurm": "account"}}, "mapping.queues.slurm: 'account' is not one of"),
    ({"priorities": {"qos": {"high": "100"}}}, "mapping.priorities.qos.high: expected an integer"),
    ({"job_types": {"rules": [{"type": "batch", "name": "x"}]}},
     "mapping.job_types.rules[0].type: 'batch' is not one of"),
    ({"job_types": {"rules": [{"name": "x"}]}}, "mapping.job_types.rules[0].type: required"),
    ({"job_types": {"rules": [{"type": "training"}]}}, "mapping.job_types.rules[0]: a rule"),
    ({"job_types": {"default": "batch"}}, "mapping.job_types.default: 'batch' is not one of"),
    ({"card_types": {"memory_mib": {"X": -1}}}, "mapping.card_types.memory_mib.X: expected"),
    ({"card_types": {"memory_mib": {"X": float("nan")}}},
     "mapping.card_types.memory_mib.X: expected a number > 0, got nan"),
    ({"card_types": {"memory_mib": {"X": float("inf")}}},
     "mapping.card_types.memory_mib.X: expected a number > 0, got inf"),
    ({"preemptible": {"qos": "low"}}, "mapping.preemptible.qos: expected a list"),
    ({"colour": 1}, "mapping.colour: unknown key"),
    ({"priorities": {"default": 10**26}},
     "mapping.priorities.default: 100000000000000000000000000 does not fit a 64-bit integer"),
    ({"priorities": {"qos": {"hi": -(2**63) - 1}}},
     "mapping.priorities.qos.hi: -9223372036854775809 does not fit a 64-bit integer"),
    ({"card_types": {"memory_mib": {"H100-SXM5-80GB": 1.0e308}}},
     "mapping.card_types.memory_mib.H100-SXM5-80GB: at most 1,048,576 MiB (1 TiB)"),
])
def test_errors_name_the_key(raw: object, message: str) -> None:
    with pytest.raises(MappingError) as err:
        parse_mapping(raw)
    assert str(err.value).startswith(message), str(err.value)


def test_file_errors(tmp_path: Path) -> None:
    with pytest.raises(MappingError, match=r"missing\.yaml: no such file"):
        load_mapping(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("teams: [unclosed\n")
    with pytest.raises(MappingError, match="not valid YAML"):
        load_mapping(bad)


def test_empty_file_is_identity(tmp_path: Path) -> None:
    path = tmp_path / "empty.yaml"
    path.write_text("")
    assert load_mapping(path) == Mapping()


def test_bounds_are_inclusive() -> None:
    m = parse_mapping({"priorities": {"default": 2**63 - 1, "qos": {"lo": -(2**63)}},
                       "card_types": {"memory_mib": {"X": 1_048_576}}})
    assert m.priority() == 2**63 - 1 and m.priority("lo") == -(2**63)
    assert m.card_memory("X") == 1_048_576.0


def test_mapping_keys_beside_mapping_are_an_error(tmp_path: Path) -> None:
    path = tmp_path / "m.yaml"
    path.write_text("mapping: {}\nteams: {accounts: {root: XTEAM}}\n")
    with pytest.raises(MappingError, match=r"m\.yaml: teams: a mapping key beside `mapping:`"):
        load_mapping(path)
    # other sections (a bridge's own settings) may share the file
    path.write_text("mapping: {teams: {default: ml}}\nkubernetes: {kueue: false}\n")
    assert load_mapping(path).team() == "ml"


def test_a_family_name_read_as_one_model_is_said_once(
        caplog: pytest.LogCaptureFixture) -> None:
    """"a100" is read as A100-SXM4-80GB by the built-in table, and that model's memory
    follows: said once, as a warning naming how to say otherwise. Not said for a name
    of one model, nor when the mapping names the card."""
    m = Mapping()
    with caplog.at_level("WARNING", logger="gpuledger.mapping"):
        assert m.card_type("A100") == m.card_type("a100") == "A100-SXM4-80GB"
        assert m.card_type("l40s") == "L40S-48GB"
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 1 and "'A100' read as A100-SXM4-80GB (81,920 MiB)" in said[0]
    assert "card_types.names: {a100: ...}" in said[0]
    caplog.clear()
    named = parse_mapping({"card_types": {"names": {"a100": "A100-PCIE-40GB"}}})
    with caplog.at_level("WARNING", logger="gpuledger.mapping"):
        assert named.card_type("a100") == "A100-PCIE-40GB"
    assert not caplog.records
