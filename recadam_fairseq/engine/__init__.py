"""The one engine behind the comparisons and a user's grid: ``execute`` runs a plan of runs N at a time;
``fairseq_log`` reads fairseq's json logs back; ``read`` finds a grid's runs (their logs, ``run.json`` and names)
and ``aggregate`` picks each run's validation (the metric, the forgetting budget) and each method's config over
seeds; ``stats`` is the one rule (means over seeds, frontiers, the comparisons with Adam within the seed noise),
``plot`` the one figure, ``verdicts`` judges a task's settings by them; ``write`` makes a grid's tables and CSV
files, ``summarize`` is scripts/glue/summarize.py's command line; ``settings`` a setting's vocabulary from the
catalogue. No fairseq import; never imported by the plug-in."""
