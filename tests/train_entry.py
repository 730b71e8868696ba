"""`fairseq-train` for the tests, runnable on a CPU-only torch with --fp16.

fairseq's flat fp16 path asks torch.cuda.current_device() for a device key; CPU tensors report
device.index None, so on a CPU-only torch we answer None and the real flat path runs.
"""

import torch

if not torch.cuda.is_available():
    torch.cuda.current_device = lambda: None

from fairseq_cli.train import cli_main  # noqa: E402

if __name__ == "__main__":
    cli_main()
