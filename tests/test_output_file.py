"""Files a user asked for are replaced whole or not at all (``output_file.replace_text``):
the report, the rule files, the boards."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuledger.cli.main import main
from gpuledger.output_file import replace_text


def test_a_write_that_fails_part_way_leaves_the_old_file(tmp_path: Path) -> None:
    """Found with a full disk: ``report --html`` wrote in place, and a failed write left
    40 KiB of a report with the old one gone. Text that cannot be written (here: a lone
    surrogate, which UTF-8 cannot encode, after 100 KB) leaves the old file as it was and
    no temporary file."""
    path = tmp_path / "report.html"
    path.write_text("the old report")
    with pytest.raises(UnicodeEncodeError):
        replace_text(path, "x" * 100_000 + "\ud800")
    assert path.read_text() == "the old report"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.html"]
    replace_text(path, "the new report")
    assert path.read_text() == "the new report"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.html"]


def test_a_link_is_followed(tmp_path: Path) -> None:
    target = tmp_path / "real.yml"
    target.write_text("old")
    link = tmp_path / "link.yml"
    link.symlink_to(target)
    replace_text(link, "new")
    assert link.is_symlink() and target.read_text() == "new"


@pytest.mark.parametrize("when", ["9999-12-31T23:59", "9999-12-31T23:30-01:00",
                                  "0001-01-01T00:00+01:00", "1969-12-31T23:59Z"])
def test_times_at_the_calendars_ends_are_refused_in_one_line(
        when: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``report --until 9999-12-31T23:59`` overflowed widening the window to whole hours
    (a traceback, exit 1); so did a time whose offset moved it past the calendar."""
    for command in (["report", "--until", when], ["whatif", "--since", when],
                    ["compact", "--before", when]):
        with pytest.raises(SystemExit) as exit_:
            main([*command, "--warehouse", str(tmp_path)])
        assert exit_.value.code == 2
        err = capsys.readouterr().err
        assert err.rstrip().endswith(f"{when!r} is outside the years 1970-8999"), err


def test_the_rule_files_are_replaced_together_or_not_at_all(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """Found by making one rule file unwritable: ``alerts generate`` replaced the
    alerting rules, then failed on the recording rules, and the pair no longer matched.
    Both are written beside first, and renamed only when both can be."""
    out = tmp_path / "alerts"
    assert main(["alerts", "generate", "--out", str(out)]) == 0
    alerting = out / "gpuledger-alerts.yml"
    before = alerting.read_text()
    (out / "gpuledger-recording.yml").unlink()
    (out / "gpuledger-recording.yml").mkdir()
    monkeypatch.setenv("GPULEDGER_ALERTS__FOR_S", "600")
    capsys.readouterr()
    assert main(["alerts", "generate", "--out", str(out)]) == 2
    assert "cannot write the rule files" in capsys.readouterr().err
    assert alerting.read_text() == before
    assert sorted(p.name for p in out.iterdir()) == ["gpuledger-alerts.yml",
                                                     "gpuledger-recording.yml"]
    (out / "gpuledger-recording.yml").rmdir()
    assert main(["alerts", "generate", "--out", str(out)]) == 0
    assert alerting.read_text() != before     # the setting does change them
