"""Agent configuration: YAML, environment overrides, validation that names the key."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuledger.agent.config import AgentConfig, AgentConfigError, load_agent_config


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "agent.yaml"
    path.write_text(text)
    return path


def test_defaults_without_a_file() -> None:
    config = load_agent_config(None, {})
    assert config == AgentConfig()
    assert config.node_name and config.agent_name == config.node_name


def test_file_values_and_nested_sections(tmp_path: Path) -> None:
    path = _write(tmp_path, """
node: gpu-a-017
interval_s: 5
source: dcgm-exporter
dcgm_exporter: {url: "http://10.0.0.1:9400/metrics", card_type: H100-SXM5-80GB}
attribution:
  methods: [slurm, mapping_dir]
  proc_root: /host/proc
  slurm: {job_id: "slurm-{id}"}
  mapping_dir: {path: /run/jobs}
inventory: {pool: train, labels: {rack: r12}}
kafka: {bootstrap: "k1:9092,k2:9092", topic_prefix: "prod."}
spool: {path: /var/spool/gl, max_bytes: 1048576, segment_bytes: 65536}
metrics: {listen: "127.0.0.1:0"}
""")
    c = load_agent_config(path, {})
    assert (c.node, c.interval_s, c.source) == ("gpu-a-017", 5.0, "dcgm-exporter")
    assert c.dcgm_exporter.card_type == "H100-SXM5-80GB"
    assert c.attribution.methods == ["slurm", "mapping_dir"]
    assert c.attribution.proc_root == Path("/host/proc")
    assert c.attribution.slurm.job_id == "slurm-{id}"
    assert c.attribution.mapping_dir.path == Path("/run/jobs")
    assert c.inventory.labels == {"rack": "r12"} and c.inventory.pool == "train"
    assert c.spool.max_bytes == 1048576 and c.metrics.listen == "127.0.0.1:0"


def test_environment_overrides_the_file(tmp_path: Path) -> None:
    path = _write(tmp_path, "kafka: {bootstrap: 'file:9092'}\ninterval_s: 10\n")
    env = {"GPULEDGER_AGENT__KAFKA__BOOTSTRAP": "env:9093",
           "GPULEDGER_AGENT__INTERVAL_S": "2.5",
           "GPULEDGER_AGENT__ATTRIBUTION__METHODS": "kubernetes,static",
           "GPULEDGER_AGENT__ATTRIBUTION__KUBERNETES__POD_RESOURCES_SOCKET": "",
           "GPULEDGER_AGENT__ATTRIBUTION__STATIC__GPUS": "{0: job-a, 1: job-b}",
           "GPULEDGER_AGENT__INVENTORY__SCHEDULABLE": "false",
           "GPULEDGER_KAFKA_BOOTSTRAP": "not-ours:1"}
    c = load_agent_config(path, env)
    assert c.kafka.bootstrap == "env:9093" and c.interval_s == 2.5
    assert c.attribution.methods == ["kubernetes", "static"]
    assert c.attribution.kubernetes.pod_resources_socket is None
    assert c.attribution.static.gpus == {"0": "job-a", "1": "job-b"}
    assert c.inventory.schedulable is False


@pytest.mark.parametrize(("text", "env", "message"), [
    ("intervall_s: 3\n", {}, "intervall_s: unknown key"),
    ("interval_s: soon\n", {}, "interval_s: expected a number, got 'soon'"),
    ("interval_s: 0\n", {}, "interval_s: must be between 0.1 and 86400, got 0"),
    ("interval_s: 0.0001\n", {}, "interval_s: must be between 0.1 and 86400"),
    ("interval_s: 1000000000000\n", {}, "interval_s: must be between 0.1 and 86400"),
    ("interval_s: 1.0e+300\n", {}, "interval_s: must be between 0.1 and 86400"),
    ("simulator: {seed: -1}\n", {}, "simulator.seed: must be between 0 and"),
    ("simulator: {hours: 1.0e+300}\n", {}, "simulator.hours: must be between"),
    ("kafka: {send_timeout_s: 1.0e+300}\n", {}, "kafka.send_timeout_s: must be between"),
    ("inventory: {check_s: 1.0e+300}\n", {}, "inventory.check_s: must be between"),
    ("dcgm_exporter: {timeout_s: 1.0e+300}\n", {}, "dcgm_exporter.timeout_s: must be between"),
    ("dcgm_exporter: {url: 'file:///etc/passwd'}\n", {},
     "dcgm_exporter.url: expected an http:// or https:// URL"),
    ("dcgm_exporter: {url: 'not a url'}\n", {}, "dcgm_exporter.url: expected an http://"),
    ("dcgm_exporter: {url: 'http://h:99999/metrics'}\n", {}, "dcgm_exporter.url: expected"),
    ("dcgm_exporter: {url: 'http:///metrics'}\n", {}, "dcgm_exporter.url: expected"),
    ("attribution: {slurm: {job_id: '{id:>99999999999}'}}\n", {},
     "attribution.slurm.job_id: '{id:>99999999999}' is not a valid template: only the "
     "placeholders {id} are allowed, as they are"),
    ("attribution: {slurm: {job_id: '{id.__class__}'}}\n", {}, "attribution.slurm.job_id: "),
    ("attribution: {slurm: {job_id: '{id[0]}'}}\n", {}, "attribution.slurm.job_id: "),
    ("attribution: {slurm: {job_id: '{id!r}'}}\n", {}, "attribution.slurm.job_id: "),
    ("attribution: {slurm: {job_id: '{}'}}\n", {}, "attribution.slurm.job_id: "),
    ("attribution: {slurm: {job_id: '{id'}}\n", {}, "attribution.slurm.job_id: "),
    ("attribution: {slurm: {job_id: ' '}}\n", {},
     "attribution.slurm.job_id: a job id must not be empty"),
    ("attribution: {kubernetes: {job_id: '{pod:x}'}}\n", {},
     "attribution.kubernetes.job_id: "),
    ("attribution: {static: {job_id: '   '}}\n", {},
     "attribution.static.job_id: a job id must not be empty or blank, got '   '"),
    ("attribution: {static: {job_id: \"a\\0b\"}}\n", {},
     "attribution.static.job_id: a job id must not hold control characters"),
    ("attribution: {static: {job_id: \"a\\tb\"}}\n", {},
     "attribution.static.job_id: a job id must not hold control characters"),
    (f"attribution: {{static: {{job_id: {'x' * 100_000}}}}}\n", {},
     "attribution.static.job_id: a job id is at most 256 characters (this one has 100000), "
     "got 'xxx"),
    ("attribution: {static: {gpus: {0: ''}}}\n", {},
     "attribution.static.gpus.0: a job id must not be empty"),
    ("inventory: {labels: {~: y}}\n", {}, "inventory.labels: a key is empty or null (None)"),
    ("inventory: {labels: {'': y}}\n", {}, "inventory.labels: a key is empty or null"),
    ("node: '  '\n", {}, "node: must not be empty"),
    ("node: \"a\\nb\"\n", {}, "node: must be printable text"),
    ("metrics: {listen: 'not a host!:9466'}\n", {}, "metrics.listen: expected HOST:PORT"),
    ("kafka: {batch: 0}\n", {}, "kafka.batch: must be between 1 and"),
    ("interval_s: .nan\n", {}, "interval_s: expected a finite number, got nan"),
    ("simulator: {hours: .inf}\n", {}, "simulator.hours: expected a finite number, got inf"),
    ("spool: {max_bytes: .inf}\n", {}, "spool.max_bytes: expected a finite number, got inf"),
    ("", {"GPULEDGER_AGENT__INTERVAL_S": "nan"}, "interval_s: expected a finite number"),
    ("source: nvidia\n", {}, "source: 'nvidia' is not one of nvml, dcgm-exporter, simulator"),
    ("attribution: {methods: [slurm, lsf]}\n", {}, "attribution.methods[1]: 'lsf'"),
    ("attribution: {methods: [slurm, slurm]}\n", {}, "attribution.methods[1]: 'slurm' is listed"),
    ("attribution: {methods: [mapping_dir]}\n", {}, "attribution.mapping_dir.path: required"),
    ("attribution: {slurm: {job_id: 'x-{jobid}'}}\n", {}, "attribution.slurm.job_id:"),
    ("attribution: {kubernetes: {refresh_s: x}}\n", {},
     "attribution.kubernetes.refresh_s: expected a number"),
    ("attribution: {kubernetes: {colour: red}}\n", {}, "attribution.kubernetes.colour: unknown"),
    ("inventory: {labels: [a, b]}\n", {}, "inventory.labels: expected a mapping"),
    ("inventory: {schedulable: maybe}\n", {}, "inventory.schedulable: expected true or false"),
    ("kafka: {bootstrap: 'k1:9092,k2'}\n", {}, "kafka.bootstrap[1]: expected HOST:PORT"),
    ("spool: {max_bytes: 10000, segment_bytes: 65536}\n", {}, "spool.max_bytes: must be at"),
    ("spool: {segment_bytes: 1.5}\n", {}, "spool.segment_bytes: expected a whole number"),
    ("metrics: {listen: 'localhost'}\n", {}, "metrics.listen: expected HOST:PORT"),
    ("", {"GPULEDGER_AGENT__KAFKA__BATCH": "many"},
     "kafka.batch: expected a whole number, got 'many' (set by GPULEDGER_AGENT__KAFKA__BATCH)"),
    ("", {"GPULEDGER_AGENT__KAFKA__BATCH": "5.5"}, "kafka.batch: expected a whole number"),
    ("", {"GPULEDGER_AGENT__KAFKA__BATCH": "x" * 100},
     "kafka.batch: expected a whole number, got '" + "x" * 39 + "…"),
    ("", {"GPULEDGER_AGENT__ATTRIBUTION__METHODS": "[slurm"},
     "attribution.methods: not valid YAML at line 1, column 7"),
    ("", {"GPULEDGER_AGENT__ATTRIBUTION__STATIC__GPUS": "{0: job"},
     "(set by GPULEDGER_AGENT__ATTRIBUTION__STATIC__GPUS)"),
    ("", {"GPULEDGER_AGENT__ATTRIBUTION__STATIC__GPUS": "!!python/object:os.system {}"},
     "attribution.static.gpus: not valid YAML"),
    ("", {"GPULEDGER_AGENT__ATTRIBUTION__METHODS": "[!!python/object:os.system {}]"},
     "attribution.methods: not valid YAML"),
    ("", {"GPULEDGER_AGENT__ATTRIBUTION__STATIC__JOB_ID": " "},
     "attribution.static.job_id: a job id must not be empty or blank, got ' ' (set by "
     "GPULEDGER_AGENT__ATTRIBUTION__STATIC__JOB_ID)"),
    ("", {"GPULEDGER_AGENT__KAFKA": "{batch: 5}"},
     "kafka: expected a mapping, got '{batch: 5}' (a section's keys are set one by one, e.g. "
     "GPULEDGER_AGENT__KAFKA__BOOTSTRAP=...)"),
    ("", {"GPULEDGER_AGENT__SPOOOL__PATH": "/x"}, "spoool: unknown key"),
    # a variable that set a key inside a value was not named
    ("", {"GPULEDGER_AGENT__NODE__X": "1"},
     "node: expected text, got {'x': '1'} (set by GPULEDGER_AGENT__NODE__X)"),
    ("kafka: 3\n", {}, "kafka: expected a mapping"),
    ("- a\n- b\n", {}, "expected a mapping at the top level"),
])
def test_errors_name_the_bad_key(tmp_path: Path, text: str, env: dict[str, str],
                                 message: str) -> None:
    with pytest.raises(AgentConfigError) as err:
        load_agent_config(_write(tmp_path, text), env)
    assert message in str(err.value)


def test_unreadable_and_invalid_files(tmp_path: Path) -> None:
    with pytest.raises(AgentConfigError, match=r"absent\.yaml: no such file"):
        load_agent_config(tmp_path / "absent.yaml", {})
    with pytest.raises(AgentConfigError, match="not valid YAML"):
        load_agent_config(_write(tmp_path, "a: [b\n"), {})


def test_numbers_in_every_spelling(tmp_path: Path) -> None:
    """YAML 1.1 reads ``1e3`` as text; whole values like '5.0' fit an int key."""
    c = load_agent_config(_write(tmp_path, "interval_s: 1e3\nkafka: {batch: 1e3}\n"), {})
    assert c.interval_s == 1000.0 and c.kafka.batch == 1000
    c = load_agent_config(None, {"GPULEDGER_AGENT__KAFKA__BATCH": "5.0",
                                 "GPULEDGER_AGENT__SPOOL__MAX_BYTES": "1073741824"})
    assert c.kafka.batch == 5 and isinstance(c.kafka.batch, int)
    assert c.spool.max_bytes == 1 << 30


def test_empty_node_means_the_host_name(tmp_path: Path) -> None:
    """An empty value, in the file or a variable, is null: the key's default."""
    c = load_agent_config(_write(tmp_path, "node: ''\n"), {})
    assert c.node is None and c.node_name
    assert load_agent_config(None, {"GPULEDGER_AGENT__NODE": ""}).node is None


def test_good_urls_and_templates_pass(tmp_path: Path) -> None:
    c = load_agent_config(_write(tmp_path, """
dcgm_exporter: {url: "https://[::1]:9400/metrics", timeout_s: 3600}
attribution: {slurm: {job_id: "slurm-{id}"}, kubernetes: {job_id: "{namespace}.{pod}.{container}"}}
metrics: {listen: "[::1]:0"}
"""), {})
    assert c.dcgm_exporter.url.startswith("https://")


@pytest.mark.parametrize(("var", "meant"), [
    ("GPULEDGER_AGENT_INTERVAL_S", "GPULEDGER_AGENT__INTERVAL_S"),
    ("GPULEDGER_AGENTS__INTERVAL_S", "GPULEDGER_AGENT__INTERVAL_S"),
    ("GPULEDGER_AGNET__KAFKA__BATCH", "GPULEDGER_AGENT__KAFKA__BATCH"),
])
def test_a_near_miss_of_the_agent_prefix_is_refused(var: str, meant: str) -> None:
    """Variables meant for the agent but not of its form were ignored in silence."""
    with pytest.raises(AgentConfigError, match=f"{var}: not an agent setting.*did you mean "
                       f"{meant}"):
        load_agent_config(None, {var: "5"})
    # the processor's and other gpuledger variables are not the agent's business
    load_agent_config(None, {"GPULEDGER_ALERTS__FOR_S": "60", "GPULEDGER_WAREHOUSE": "/w",
                             "GPULEDGER_KAFKA_BOOTSTRAP": "k:9092"})
