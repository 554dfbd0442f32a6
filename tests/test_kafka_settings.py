"""Kafka settings from options and GPULEDGER_KAFKA_* variables: every bad value is one
line naming the variable, before any broker is contacted."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from gpuledger.pipeline.kafka.settings import KNOWN_VARIABLES, KafkaSettingsError, load_settings

SASL = {"GPULEDGER_KAFKA_SECURITY_PROTOCOL": "SASL_PLAINTEXT",
        "GPULEDGER_KAFKA_SASL_USERNAME": "u"}


def _refused(env: dict[str, str], bootstrap: str = "k:9092") -> str:
    with pytest.raises(KafkaSettingsError) as err:
        load_settings(bootstrap, env)
    text = str(err.value)
    assert "\n" not in text
    return text


def test_a_secret_file_that_cannot_serve_says_why(tmp_path: Path) -> None:
    latin = tmp_path / "latin.txt"
    latin.write_bytes(b"\xff\xfepass")
    empty = tmp_path / "empty.txt"
    empty.write_text("\n")
    var = "GPULEDGER_KAFKA_SASL_PASSWORD_FILE"
    assert _refused({**SASL, var: str(latin)}) == f"{var}: {latin}: not UTF-8 text (byte 0)"
    assert _refused({**SASL, var: str(tmp_path)}) == \
        f"{var}: {tmp_path}: is a directory, not a file"
    assert _refused({**SASL, var: str(empty)}) == f"{var}: {empty} is empty"
    assert _refused({**SASL, var: ""}) == f"{var} is set but empty: name the file"
    good = tmp_path / "pw.txt"
    good.write_text("s3cret\n")
    assert load_settings("k:9092", {**SASL, var: str(good)}).password == "s3cret"


def test_a_ca_file_is_checked_at_start(tmp_path: Path) -> None:
    var = "GPULEDGER_KAFKA_SSL_CAFILE"
    tls = {"GPULEDGER_KAFKA_SECURITY_PROTOCOL": "SSL"}
    assert _refused({**tls, var: str(tmp_path / "none.pem")}) == \
        f"{var}: {tmp_path / 'none.pem'}: no such file"
    junk = tmp_path / "junk.pem"
    junk.write_text("not a certificate\n")
    assert _refused({**tls, var: str(junk)}) == \
        f"{var}: {junk}: no PEM certificate in it (-----BEGIN CERTIFICATE-----)"


@pytest.mark.parametrize(("bootstrap", "says"), [
    ("k:0", "bootstrap 'k:0': port 0 is not 1-65535"),
    ("k:65536", "bootstrap 'k:65536': port 65536 is not 1-65535"),
    ("k", "bootstrap 'k': expected HOST:PORT"),
])
def test_a_bootstrap_port_out_of_range_is_refused(bootstrap: str, says: str) -> None:
    assert _refused({}, bootstrap) == says


@pytest.mark.parametrize(("var", "says"), [
    ("GPULEDGER_KAFKA_BOOTSTRAPP", "did you mean GPULEDGER_KAFKA_BOOTSTRAP?"),
    ("GPULEDGER_KAFKA_SESSION_TIMEOUT", "did you mean GPULEDGER_KAFKA_SESSION_TIMEOUT_MS?"),
    ("GPULEDGER_KAFKA_COMPRESION", "did you mean GPULEDGER_KAFKA_COMPRESSION?"),
    ("GPULEDGER_KAFKA_ZZZ", "known: GPULEDGER_KAFKA_{BOOTSTRAP, "),
])
def test_an_unknown_kafka_variable_is_refused_naming_the_closest(var: str, says: str) -> None:
    """A misspelt GPULEDGER_KAFKA_* variable was ignored in silence (a misspelt
    GPULEDGER_SECTION__KEY is refused)."""
    with pytest.raises(KafkaSettingsError, match=re.escape(f"{var}: unknown Kafka variable")
                       + ".*" + re.escape(says)):
        load_settings("k:9092", {var: "1"})


def test_every_kafka_variable_the_code_and_docs_name_is_known() -> None:
    """No GPULEDGER_KAFKA_* name read by the code or given in the docs is refused."""
    repo = Path(__file__).resolve().parents[1]
    named: set[str] = set()
    for folder in ("agents", "pipeline", "docs", "tests", "scripts", "deploy"):
        for path in (repo / folder).rglob("*"):
            if path.suffix in (".py", ".md", ".sh", ".yml", ".yaml", ".service", ".env"):
                named |= set(re.findall(r"GPULEDGER_KAFKA_[A-Z0-9_]*[A-Z0-9]",
                                        path.read_text(encoding="utf-8", errors="replace")))
    examples = {"GPULEDGER_KAFKA_BOOTSTRAPP", "GPULEDGER_KAFKA_SESSION_TIMEOUT",
                "GPULEDGER_KAFKA_COMPRESION", "GPULEDGER_KAFKA_ZZZ"}  # the typos above
    named = {n for n in named if not n.startswith("GPULEDGER_KAFKA__")} - examples
    assert named and named <= KNOWN_VARIABLES, named - KNOWN_VARIABLES
