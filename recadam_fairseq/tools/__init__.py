"""The code of the repository's command-line tools that belong to no room of their own (bring a model and data:
prepare/; use a model: use/; measure a cost: bench/; the tiny model and data: tiny/): a checkpoint's architecture, EWC's
Fisher file, a run's plot and WiSE-FT points, the GPU pass's carries, a page's generated block. The scripts at their
documented paths are thin command lines over these modules. Never imported by the plug-in itself."""
