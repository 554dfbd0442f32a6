"""``gpuledger import pods FILE``: a CSV pod list as job history (docs/import.md)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from gpuledger.cli.arguments import add_replace, print_bad, whole_count
from gpuledger.cli.errors import CliError, check_input_files

FILE_KEYS = ("columns", "mapping")


def _mapping_file(path: Path | None) -> tuple[dict[str, str], Any]:
    """The ``columns:`` and ``mapping:`` sections of ``--mapping FILE``."""
    from gpuledger.bridges.mapping import Mapping, MappingError, parse_mapping
    from gpuledger.pipeline.importers.pods import FIELDS
    from gpuledger.yaml_file import YamlFileError, read_yaml

    if path is None:
        return {}, Mapping()
    try:
        raw = read_yaml(path) or {}
    except YamlFileError as exc:
        raise CliError(f"--mapping: {exc}") from None
    if not isinstance(raw, dict):
        raise CliError(f"{path}: expected a mapping with columns: and/or mapping:")
    if not set(raw) & set(FILE_KEYS):
        raw = {"mapping": raw}  # a plain shared mapping file
    for key in raw:
        if key not in FILE_KEYS:
            raise CliError(f"{path}: {key}: unknown key (known: {', '.join(FILE_KEYS)})")
    columns = raw.get("columns") or {}
    if not isinstance(columns, dict):
        raise CliError(f"{path}: columns: expected FIELD: COLUMN pairs")
    for name, column in columns.items():
        if name not in FIELDS:
            raise CliError(f"{path}: columns.{name}: unknown field "
                           f"(fields: {', '.join(FIELDS)})")
        if not isinstance(column, str) or not column:
            raise CliError(f"{path}: columns.{name}: expected a column name, got {column!r}")
    try:
        mapping = parse_mapping(raw.get("mapping"), f"{path}: mapping")
    except MappingError as exc:
        raise CliError(str(exc)) from None
    return dict(columns), mapping


def cmd_import_pods(args: argparse.Namespace) -> int:
    from gpuledger.cli.main import _need_pipeline, _proc_config, _progress

    _need_pipeline()
    from gpuledger.pipeline.demo import check_not_demo
    from gpuledger.pipeline.importers.pods import PodsImportError, load_pods, parse_columns
    from gpuledger.pipeline.ingest import has_jobs, import_history
    from gpuledger.pipeline.processor import Processor
    from gpuledger.pipeline.warehouse import Warehouse

    check_input_files(args.file, args.nodes)
    check_not_demo(args.warehouse)
    base, mapping = _mapping_file(args.mapping)
    config = _proc_config(args)
    try:
        columns = parse_columns(args.columns, base)
        imported = load_pods(args.file, columns=columns, mapping=mapping, nodes_csv=args.nodes,
                             limits=config.limits)
    except PodsImportError as exc:
        raise CliError(str(exc)) from None
    if not has_jobs(imported.frames):
        # as `ingest` says of an input without a valid record; the warehouse is not opened
        print(f"nothing to import: {args.file} has no pod to import ({imported.rows:,} "
              f"rows, {len(imported.bad_rows):,} bad, {imported.cpu_only:,} CPU-only); "
              f"{args.warehouse}/ is left as it was", file=sys.stderr)
        _print_bad(args, imported.bad_rows)
        return 0
    processor = Processor(config, Warehouse(args.warehouse, options=config.warehouse))
    with _progress("importing pods", not args.quiet) as update:
        rejected = import_history(processor, imported.frames, update, replace=args.replace)
    print(f"pods: {imported.rows:,} rows, {imported.imported:,} imported into "
          f"{args.warehouse}/, {imported.cpu_only:,} CPU-only skipped, "
          f"{len(imported.bad_rows):,} bad row(s); {len(imported.unplaced):,} could not be "
          "placed" + (f" (e.g. {', '.join(imported.unplaced[:5])})" if imported.unplaced
                      else "")
          + (f"; {rejected:,} event(s) rejected (SELECT * FROM rejects)" if rejected else ""))
    _print_bad(args, imported.bad_rows)
    return 0


def _print_bad(args: argparse.Namespace, bad_rows: list[tuple[int, str]]) -> None:
    print_bad([(f"{args.file}:{row}", why) for row, why in bad_rows], args.show_bad,
              "bad rows")


def register(formats: Any, common: Any) -> None:
    q = formats.add_parser(
        "pods", help="a CSV pod list (any scheduler) with a column mapping",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="""\
Import a CSV pod list: one row per pod with its creation, scheduling and deletion
times (ISO 8601 or epoch seconds) and GPU count; optional node and GPU indices,
namespace, team, queue, priority, job type, card type, status. Pods without a
placement are placed by the documented best-fit policy (docs/import.md) over the
nodes of --nodes; pods that fit nowhere are reported. Facts come out as for live data.

Columns are found by field name; map others with --columns or a columns: section:
  fields: name, created, gpus (required); scheduled, deleted, gpu_milli, node,
  gpu_indices, namespace, team, user, queue, pool, priority, job_type, card_type, status

examples:
  gpuledger import pods pods.csv --nodes nodes.csv
  gpuledger import pods export.csv --columns name=pod,created=creationTimestamp,gpus=gpu
""")
    q.add_argument("file", type=Path, metavar="FILE", help="the pod list (CSV with a header)")
    q.add_argument("--columns", default=None, metavar="FIELD=COLUMN,...",
                   help="which CSV column holds which field (default: the field's name)")
    q.add_argument("--mapping", type=Path, default=None, metavar="FILE",
                   help="YAML with columns: (FIELD: COLUMN) and/or mapping: (namespace → "
                   "team, queue names, priorities, job types, card types; docs/mapping.md)")
    q.add_argument("--nodes", type=Path, default=None, metavar="FILE",
                   help="node list CSV: node,gpus[,card_type,pool,gpu_mem_mib] (needed to "
                   "place pods that have no node)")
    q.add_argument("--show-bad", type=whole_count("--show-bad"), default=20, metavar="N",
                   help="print at most N bad rows (default 20)")
    common(q)
    add_replace(q)
    q.set_defaults(func=cmd_import_pods)
