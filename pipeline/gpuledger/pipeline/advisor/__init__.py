"""The advisor: replay a warehouse's history under other policies, and say why GPUs sit idle.

Modules, one concept each:

- :mod:`.policy`: the policy file (YAML) and its validation;
- :mod:`.history`: what replay needs, read from the warehouse (read-only);
- :mod:`.fragment`: the fragmentation measure of Weng et al. (ATC '23) and FGD's choice;
- :mod:`.placement`: placement policies for the simulator's scheduler (best fit, worst fit,
  FGD, topology-aware);
- :mod:`.replay`: history → scheduler jobs → a replayed schedule;
- :mod:`.answers`: the answers (queue wait, blocked demand, frag(k), GPU-hours, lost work,
  per team) of a schedule, replayed or as run;
- :mod:`.calibration`: how close the baseline replay comes to what was observed;
- :mod:`.output`: terminal table, JSON, and the ``gpuledger report`` section;
- :mod:`.patterns`, :mod:`.diagnosis`, :mod:`.diagnosis_batch`: why allocated GPUs sit
  inefficient (``job_diagnosis``);
- :mod:`.command`: ``gpuledger whatif`` and ``gpuledger diagnose``.
"""
