"""The code of the repository's command-line tools (scripts/, data-prep/), importable: the scripts at their
documented paths are thin command lines over these modules. Never imported by the plug-in itself.

Importing it (before fairseq) keeps fairscale's FutureWarnings off the tools' terminal: fairseq imports
fairscale, whose offload module uses torch.cuda.amp's deprecated decorators on import (not the user's doing)."""

import warnings

warnings.filterwarnings("ignore", category=FutureWarning, module=r"fairscale(\.|$)")
