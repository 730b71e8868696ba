"""The task scripts' run directories read back (scripts/glue/summarize.py's code): ``read`` finds the runs and
reads their logs, ``run.json`` and names; ``aggregate`` picks each run's validation (the metric, the forgetting
budget) and each method's config over seeds; ``write`` makes the tables, CSV files and one-run lines;
``summarize`` is the command line; ``verdicts`` the answer of runs with a probe (engine/stats.py's rule, its plot). No
torch, no fairseq; never imported by the plug-in."""
