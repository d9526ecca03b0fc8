"""The storage stage: the job's checkpoint and data paths (storage.paths), tried from every host at once as the training
user. ``stage`` runs the storage test's rounds over the transport; ``judge`` turns what they printed into findings
(PF901-PF910) and the report's section.

This file imports nothing: importing any module of the package runs it first, and the report's types (floor 0) import
the package's section types, which must not load the stage's code under them.
"""
