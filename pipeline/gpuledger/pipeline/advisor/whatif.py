"""``gpuledger whatif`` end to end: history → replays → answers → calibration."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from pathlib import Path

from gpuledger.pipeline.advisor.answers import answers
from gpuledger.pipeline.advisor.calibration import calibrate
from gpuledger.pipeline.advisor.history import load_history
from gpuledger.pipeline.advisor.output import WhatIf
from gpuledger.pipeline.advisor.policy import PolicyError, PolicySet
from gpuledger.pipeline.advisor.replay import as_run, prepare, replay
from gpuledger.pipeline.location import display


def run_whatif(warehouse: str | Path, policies: PolicySet, names: list[str] | None = None,
               since: datetime | None = None, until: datetime | None = None,
               step_minutes: int | None = None,
               progress: Callable[[str], None] = lambda _m: None) -> WhatIf:
    """Replay ``warehouse``'s window under the policies (``names``: a subset; the baseline
    always runs) and compare them with what was observed."""
    chosen = [p for p in policies.policies
              if names is None or p.name in names or p.name == policies.baseline]
    unknown = sorted(set(names or []) - {p.name for p in policies.policies})
    if unknown:
        raise PolicyError(f"--policy: unknown policy {', '.join(unknown)} (known: "
                          f"{', '.join(p.name for p in policies.policies)})")
    progress("reading the history")
    h = load_history(warehouse, since, until, step_minutes)
    policies.check_names(h.known)
    observed = answers(as_run(h), h, from_facts=True)
    inp = prepare(h, policies)
    replays = []
    notes: list[str] = []
    for i, policy in enumerate(chosen, 1):
        progress(f"replaying {policy.name} ({i}/{len(chosen)})")
        run = replay(inp, policy, policies)
        notes += [f"{policy.name}: {n}" for n in run.notes]
        replays.append(answers(run, h))
    base = next(a for a in replays if a.policy == policies.baseline)
    notes = [f"{len(inp.jobs):,} jobs; {len(inp.pinned):,} already running at the start "
             f"stay on their GPUs; {inp.censored:,} still running at the end keep running; "
             f"{inp.imputed:,} never ran: their run time is the median of similar jobs",
             f"team quotas: {inp.quota_source}", *notes]
    if inp.skipped:
        notes.append(f"{inp.skipped:,} attempt(s) of pools with no GPU-minutes left out")
    return WhatIf(display(warehouse), h.start, h.end, h.step_minutes, policies, observed, replays,
                  calibrate(observed, base, policies.tolerance), notes, list(h.gaps))
