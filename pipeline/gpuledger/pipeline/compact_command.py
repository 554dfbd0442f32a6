"""``gpuledger compact``: compact closed days and remove what no generation names.

Registered through ``COMMAND_MODULES`` (no heavy imports at module level). The processor
compacts the days it closes by itself (``warehouse.compact``); this command is for a
warehouse written by ``ingest``/``import``, or older files, while no processor writes
the same partitions (a unit's manifest has one writer at a time).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections.abc import Callable
from datetime import UTC
from pathlib import Path
from typing import TYPE_CHECKING

from gpuledger.cli.arguments import iso_time
from gpuledger.cli.errors import CliError

if TYPE_CHECKING:
    from gpuledger.pipeline.warehouse import Warehouse

BUSY_S = 60.0
"""A unit whose manifest is younger than this is taken to have a writer."""


def cmd_compact(args: argparse.Namespace) -> int:
    from gpuledger.cli.main import _need_pipeline, _proc_config, _progress

    _need_pipeline()
    import duckdb

    from gpuledger.pipeline import temp_folders
    from gpuledger.pipeline.compaction import newest_hour, orphans
    from gpuledger.pipeline.generations import read_manifests
    from gpuledger.pipeline.store import StoreError, open_store
    from gpuledger.pipeline.warehouse import CATALOG_PREFIX, COMPACT_PREFIX, Warehouse

    config = _proc_config(args)
    # looked at before anything is made: a wrong path must not leave a folder behind
    found = open_store(args.warehouse, create=False)
    local = None if found.remote else Path(found.base)
    if local is not None and local.is_file():
        raise CliError(f"{args.warehouse}: a file, not a warehouse folder")
    if local is not None and not local.is_dir():
        raise CliError(f"{found.url}: nothing published here")
    found.check()  # unreachable endpoint, refused credentials: one line
    manifests = read_manifests(found)
    if not manifests:
        raise CliError(f"{found.url}: nothing published here")
    warehouse = Warehouse(args.warehouse, options=config.warehouse)
    store = warehouse.store
    now = time.time()
    busy = [u for u, m in manifests.items() if now - m.written_at < BUSY_S]
    if busy and not args.force:
        raise CliError(f"{store.url}: unit(s) {', '.join(busy)} published less than "
                       f"{BUSY_S:.0f} s ago: another writer seems to be at work (a "
                       "processor compacts its own days; wait for an ingest or import to "
                       "end); --force to go on anyway")
    # in $TMPDIR, the folders of compactions and catalog builds killed mid-way (each
    # compaction and build sweeps them too; here they are counted)
    spills = temp_folders.sweep(COMPACT_PREFIX) + temp_folders.sweep(CATALOG_PREFIX)
    before = args.before
    if before is None:
        newest = newest_hour(manifests.values())
        if newest is not None:
            from datetime import timedelta

            before = newest - timedelta(seconds=config.warehouse.compact_after_s)
    days = 0
    put_off: list[tuple[str, str]] = []
    if before is not None:
        from gpuledger.pipeline.compaction import days_to_compact

        total = sum(len(days_to_compact(m, before)) for m in manifests.values())
        seen = 0

        def one_more() -> None:
            nonlocal seen
            seen += 1
            update(seen / max(total, 1))

        # a bar over the table-days (a month's backlog is minutes of work: it was silent)
        with _progress("compacting", not args.quiet) as update, warehouse.compaction_round():
            for unit in sorted(manifests):
                days += warehouse.compact_unit(unit, before, on_day=one_more,
                                               put_off=put_off)
        _commit(warehouse)
        try:
            warehouse.publish_catalog()
        except (duckdb.Error, OSError, StoreError) as exc:  # the store went away meanwhile
            done = (f"{days} table-day(s) compacted and published" if days else
                    "nothing compacted")
            if put_off:
                done += (f", {len(put_off)} put off, their hourly files stay (the first, "
                         f"{put_off[0][0]}: {put_off[0][1]})")
            raise CliError(f"{store.url}: {done}; the catalog readers use could not be "
                           f"built ({_text(exc)}); run gpuledger compact again") from None
    retired = warehouse.publisher.expire_retired(sorted(manifests))
    removed = 0
    for path in orphans(store, read_manifests(store).values(), now - config.warehouse.retain_s,
                        warehouse.publisher.pending_retired()):
        store.delete(path)
        removed += 1
    swept = store.sweep_temporary()
    warehouse.close()
    what = "no hourly files to compact" if before is None else \
        f"compacted {days} table-day(s) before {before.astimezone(UTC):%Y-%m-%dT%H:%MZ}" \
        + (f" and put off {len(put_off)}" if put_off else "")
    print(f"{what} in {store.url}; removed {retired} object(s) replaced more than "
          f"{config.warehouse.retain_s:g} s ago and {removed} object(s) no generation names"
          + (f"; deleted {len(swept)} temporary file(s) of writers killed mid-write"
             if swept else "")
          + (f"; removed {len(spills)} folder(s) of compactions and catalog builds killed "
             f"mid-way from {tempfile.gettempdir()}" if spills else ""))
    if put_off:
        day, why = put_off[0]
        raise CliError(f"{store.url}: {len(put_off)} table-day(s) put off, their hourly files "
                       f"stay (the first, {day}: {why}); run gpuledger compact again")
    return 0


def _text(exc: BaseException) -> str:
    return " ".join(str(exc).split())[:300]


def _commit(warehouse: Warehouse) -> None:
    """Publish the compacted days (the next generation of each unit they changed); a
    failure is one line that says what readers see now."""
    from gpuledger.pipeline.generations import WriterConflict
    from gpuledger.pipeline.store import StoreError

    publisher = warehouse.publisher
    units = sorted(publisher.changed)
    try:
        publisher.commit(wait=True)
    except (OSError, StoreError) as exc:
        url = warehouse.store.url
        done = _published(warehouse, units)
        if isinstance(exc, WriterConflict):
            what = (f"another writer published generation {exc.generation} of unit "
                    f"{exc.unit!r} meanwhile (a second compact, or an ingest or import)")
            todo = "run gpuledger compact again once that writer is done"
        else:
            what = f"the commit failed ({_text(exc)})"
            todo = "run gpuledger compact again"
        if done:
            raise CliError(f"{url}: {what}: unit(s) {', '.join(done)} published, "
                           f"{', '.join(u for u in units if u not in done)} not; "
                           f"{todo}") from None
        if done is None:
            raise CliError(f"{url}: {what}, and whether anything was published could not "
                           f"be read back; {todo}") from None
        raise CliError(f"{url}: {what}; nothing published, readers see the warehouse as "
                       f"before; {todo}") from None


def _published(warehouse: Warehouse, units: list[str]) -> list[str] | None:
    """Which of ``units`` a failed commit published: the manifest of the generation it
    was writing is in the store with this writer's bytes (None: the store cannot say)."""
    from gpuledger.pipeline.generations import manifest_path
    from gpuledger.pipeline.store import StoreError

    done = []
    for unit in units:
        manifest = warehouse.publisher.manifests[unit]
        try:
            there = warehouse.store.read(manifest_path(unit, manifest.generation))
        except (OSError, StoreError):
            return None
        if there == manifest.to_bytes():
            done.append(unit)
    return done


def register(subparsers: argparse._SubParsersAction,  # type: ignore[type-arg]
             common: Callable[..., None]) -> None:
    p = subparsers.add_parser(
        "compact", help="compact closed days into few large files (docs/warehouse.md)",
        description="Rewrite each closed day's hourly files of every table into one file "
        "per table, day and partition (gpu_minute sorted by job, then minute), published "
        "atomically with the next generation; then delete the objects replaced more than "
        "warehouse.retain_s ago, and objects that no generation names and that are older "
        "than warehouse.retain_s (uploads cut off by a crash), and in a local folder the temporary "
        "files of writers killed mid-write (untouched for an hour). Run it "
        "on a warehouse written by ingest or import; a processor compacts its own days.")
    common(p)
    p.add_argument("--before", type=iso_time, default=None, metavar="TIME",
                   help="compact days that end by this time (default: the newest hour in "
                   "the warehouse minus warehouse.compact_after_s)")
    p.add_argument("--force", action="store_true",
                   help="go on although a unit was published in the last minute")
    p.set_defaults(func=cmd_compact)
