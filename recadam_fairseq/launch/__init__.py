"""One place that builds every run of the task scripts: what a run is (:mod:`.spec`: its argv, directory, command.sh,
run.json, and the rules for a directory that already holds a run), how each script's variables become one
(:mod:`.glue`, :mod:`.multitask`, :mod:`.translation`), how it trains (:mod:`.train`) and the scripts' command line
(:mod:`.command`). ``scripts/glue/finetune.sh`` and its siblings are a few lines that call :mod:`.command`.

Importing this package imports nothing beyond the standard library; torch and fairseq load only when a run's
checkpoint or machine is asked about (:mod:`recadam_fairseq.launch.prelaunch`)."""
