"""The bad-input corpus (tests/bad_input_corpus.py): every case gets a clear
``file:line: reason`` (or is a documented acceptance), never a traceback or a hang
(each case runs under a deadline), and the good records' facts are byte-identical to a
run without the bad ones."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import polars as pl
import pytest
from bad_input_corpus import (
    BAD_FILES,
    BAD_LINES,
    GOOD_LINES,
    IMPORTER_CASES,
    VARIANTS,
    BadFile,
    BadLine,
    ImporterCase,
    Variant,
)
from test_pipeline_properties import digest

from gpuledger.cli.main import main
from gpuledger.pipeline.config import ProcessorConfig
from gpuledger.pipeline.decode import Decoded, decode_jsonl, decode_jsonl_files
from gpuledger.pipeline.ingest import ingest

DEADLINE_S = 20.0
"""No case may take longer (a hang fails the case instead of the suite)."""


@contextmanager
def deadline(seconds: float = DEADLINE_S) -> Iterator[None]:
    def expired(_signum: int, _frame: Any) -> None:
        raise TimeoutError(f"took longer than {seconds} s")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def test_the_corpus_has_at_least_120_kinds_of_bad_input() -> None:
    cases = len(BAD_LINES) + len(BAD_FILES) + len(IMPORTER_CASES)
    assert cases >= 120, cases
    ids = [c.id for c in BAD_LINES] + [c.id for c in BAD_FILES] + [c.id for c in IMPORTER_CASES]
    assert len(ids) == len(set(ids))
    assert len({c.line for c in BAD_LINES}) == len(BAD_LINES)   # no case twice


# --- each case alone ---------------------------------------------------------------------

@pytest.mark.parametrize("case", [c for c in BAD_LINES if c.stage == "decode"],
                         ids=lambda c: c.id)
def test_each_bad_line_is_rejected_with_its_reason(case: BadLine) -> None:
    with deadline():
        # line 2 of a file (a byte order mark is only skipped at the very start)
        decoded = decode_jsonl(case.line + b"\n", source="case.jsonl", first_line=2)
    assert decoded.rows == 0
    rejects = decoded.rejects.to_dicts()
    assert len(rejects) == 1, rejects
    assert rejects[0]["line"] == 2 and rejects[0]["source"] == "case.jsonl"
    assert case.reason in rejects[0]["reason"], rejects[0]["reason"]
    assert "\n" not in rejects[0]["reason"]


def _variant_lines() -> list[int]:
    """Indices of GOOD_LINES the variants rewrite: GPU 0's samples (with a process)."""
    return [i for i, line in enumerate(GOOD_LINES)
            if b'"telemetry"' in line and b'"gpu_index": 0' in line][5:5 + len(VARIANTS)]


@pytest.mark.parametrize("variant", VARIANTS, ids=lambda v: v.id)
def test_each_variant_is_read_as_the_line_it_rewrites(variant: Variant) -> None:
    line = GOOD_LINES[_variant_lines()[VARIANTS.index(variant)]]
    with deadline():
        want = decode_jsonl(line + b"\n")
        got = decode_jsonl(variant.rewrite(line) + b"\n")
    assert got.rejects.is_empty(), got.rejects["reason"].to_list()
    assert got.frames["telemetry"].equals(want.frames["telemetry"])
    assert want.frames["telemetry"].height == 1


def _file_path(case: BadFile, folder: Path) -> Path:
    if case.name.startswith("/"):
        return Path(case.name)          # a system file (an I/O error)
    path = folder / case.name
    path.write_bytes(case.build(GOOD_LINES[case.good] if case.good else GOOD_LINES[:8]))
    return path


def _check_file_rejects(case: BadFile, rejects: pl.DataFrame, source: str) -> None:
    mine = rejects.filter(pl.col("source") == source).sort("line")
    got = list(zip(mine["line"].to_list(), mine["reason"].to_list(), strict=True))
    assert all("\n" not in reason for _, reason in got)
    expected = dict(case.rejects)
    if "every" in expected:               # a cut whose place is not known in advance
        assert len(got) >= 2 and [n for n, _ in got] == list(range(1, len(got) + 1)), got
        assert all(expected["every"] in reason for _, reason in got[:-1]), got[:3]
        assert expected["last"] in got[-1][1], got[-1]
        return
    assert [n for n, _ in got] == sorted(expected), got
    for n, reason in got:
        assert expected[n] in reason, (n, reason)


@pytest.mark.parametrize("case", BAD_FILES, ids=lambda c: c.id)
def test_each_bad_file_gives_its_rejects_and_keeps_its_good_lines(case: BadFile,
                                                                  tmp_path: Path) -> None:
    path = _file_path(case, tmp_path)
    with deadline():
        decoded = Decoded.concat(list(decode_jsonl_files([path])))
    _check_file_rejects(case, decoded.rejects, str(path))
    good = len(GOOD_LINES[case.good]) if case.good else 0
    assert decoded.rows == good


# --- everything together: the good facts do not change -----------------------------------

def test_all_bad_input_together_leaves_the_good_facts_byte_identical(tmp_path: Path) -> None:
    clean = tmp_path / "clean.jsonl"
    clean.write_bytes(b"".join(line + b"\n" for line in GOOD_LINES))
    ingest([clean], tmp_path / "clean_wh", ProcessorConfig())

    # the good lines the files carry are left out of the mixed file; variants replace
    # the lines they rewrite; every bad line goes between two good ones
    in_files = {i for c in BAD_FILES if c.good for i in range(len(GOOD_LINES))[c.good]}
    rewritten = dict(zip(_variant_lines(), VARIANTS, strict=True))
    mixed: list[bytes] = []
    line_of: dict[str, int] = {}
    bad = iter(BAD_LINES)
    for i, line in enumerate(GOOD_LINES):
        if i in in_files:
            continue
        mixed.append(rewritten[i].rewrite(line) if i in rewritten else line)
        case = next(bad, None)
        if case is not None:
            mixed.append(case.line)
            line_of[case.id] = len(mixed)
    for case in bad:
        mixed.append(case.line)
        line_of[case.id] = len(mixed)
    assert len(line_of) == len(BAD_LINES)
    mixed_path = tmp_path / "mixed.jsonl"
    mixed_path.write_bytes(b"".join(line + b"\n" for line in mixed))
    files = [_file_path(c, tmp_path / "files") for c in BAD_FILES if c.name.startswith("/")]
    (tmp_path / "files").mkdir()
    files += [_file_path(c, tmp_path / "files") for c in BAD_FILES
              if not c.name.startswith("/")]

    with deadline(120):
        ingest([mixed_path, *files], tmp_path / "mixed_wh", ProcessorConfig())

    def unchanged(root: Path) -> dict[str, str]:
        return {k: v for k, v in digest(root).items() if not k.startswith("facts/rejects")}

    assert unchanged(tmp_path / "mixed_wh") == unchanged(tmp_path / "clean_wh")
    # every case is in the warehouse's rejects, at its line, with its reason
    rejects = pl.concat([pl.read_parquet(p) for p in
                         sorted((tmp_path / "mixed_wh" / "facts" / "rejects").glob("*.parquet"))],
                        how="vertical_relaxed")
    mine = rejects.filter(pl.col("source") == str(mixed_path))
    by_line = dict(zip(mine["line"].to_list(), mine["reason"].to_list(), strict=True))
    wrong = [f"{c.id} (line {line_of[c.id]}): {by_line.get(line_of[c.id])!r}"
             for c in BAD_LINES if c.reason not in (by_line.get(line_of[c.id]) or "")]
    assert not wrong, "\n".join(wrong)
    assert len(mine) == len(BAD_LINES)                 # nothing else from that file
    for case, path in zip([c for c in BAD_FILES if c.name.startswith("/")]
                          + [c for c in BAD_FILES if not c.name.startswith("/")], files,
                          strict=True):
        _check_file_rejects(case, rejects, str(path))


# --- importers ---------------------------------------------------------------------------

@pytest.mark.parametrize("case", IMPORTER_CASES, ids=lambda c: c.id)
def test_each_broken_import_file_names_the_problem(case: ImporterCase, tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    data = tmp_path / "input.csv"
    data.write_bytes(case.content)
    nodes = tmp_path / "nodes.csv"
    if case.format == "openb":
        nodes.write_bytes(case.nodes if case.nodes is not None else
                          b"sn,cpu_milli,memory_mib,gpu,model\nnode-1,64000,262144,2,P100\n")
        argv = ["import", "openb", "--nodes", str(nodes), "--pods", str(data)]
    else:
        argv = ["import", case.format, str(data)]
        if case.nodes is not None:
            nodes.write_bytes(case.nodes)
            argv += ["--nodes", str(nodes)]
    with deadline():
        status = main([*argv, "--quiet", "--warehouse", str(tmp_path / "wh")])
    out, err = capsys.readouterr()
    assert status == case.status, out + err
    if status == 2:
        assert err.count("\n") == 1 and err.startswith("gpuledger: error: "), err
        assert str(nodes if case.names_nodes else data) in err, err
    assert case.error in out + err, out + err


# --- the command line, for a handful -----------------------------------------------------

def _gpuledger(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gpuledger.cli.main", *args],
                          capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "PYTHONUNBUFFERED": "1"})


def test_cli_ingest_reports_file_line_reason_without_a_traceback(tmp_path: Path) -> None:
    files = []
    for case in BAD_FILES:
        if case.id in ("gzip-cut-in-half", "plain-text-named-gz", "binary-garbage"):
            files.append(_file_path(case, tmp_path))
    mixed = tmp_path / "mixed.jsonl"
    mixed.write_bytes(b"".join(c.line + b"\n" for c in BAD_LINES[:30]))
    done = _gpuledger("ingest", "--quiet", "--show-rejects", "10000", "--warehouse",
                      str(tmp_path / "wh"), str(mixed), *map(str, files))
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    for i, case in enumerate(BAD_LINES[:30], start=1):
        assert f"{mixed}:{i}: " in done.stderr, case.id
    assert f"{files[1]}:1: cannot read the file: not gzip data" in done.stderr
    strict = _gpuledger("ingest", "--quiet", "--strict", "--warehouse",
                        str(tmp_path / "wh2"), str(mixed))
    assert strict.returncode == 1 and "Traceback" not in strict.stderr


def test_cli_refuses_directories_fifos_and_missing_files_at_once(tmp_path: Path) -> None:
    fifo = tmp_path / "pipe.jsonl"
    os.mkfifo(fifo)                               # reading it would wait for a writer
    for path, reason in ((tmp_path, "is a directory, not a file"), (fifo, "not a regular file"),
                         (tmp_path / "missing.jsonl", "no such file")):
        done = _gpuledger("ingest", "--quiet", "--warehouse", str(tmp_path / "wh"),
                          str(path), timeout=60)
        assert done.returncode == 2
        assert done.stderr == f"gpuledger: error: {path}: {reason}\n"
    assert not (tmp_path / "wh").exists()
