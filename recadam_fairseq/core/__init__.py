"""The math of the plug-in, pure torch (and numpy): nothing here imports fairseq.

The fairseq adapters (``optim/``, ``criterions/``, ``tasks/``, ``models/``) read fairseq's config and
call these; a test imports every module of this package with fairseq made unimportable.
"""
