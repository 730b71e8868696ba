"""The code of the repository's command-line tools (scripts/, data-prep/), importable: the scripts at their
documented paths are thin command lines over these modules. Never imported by the plug-in itself."""
