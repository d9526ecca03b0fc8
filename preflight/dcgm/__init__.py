"""The optional dcgm stage: NVIDIA DCGM's diagnostic (`dcgmi diag -r LEVEL -j`) on every host at once. ``stage`` runs it
over the transport; ``judge`` turns each host's document into findings (PF851, PF852) and the report's section, typed in
``contracts``; ``render`` draws that section in the terminal and on the HTML page.

This file imports nothing: importing any module of the package runs it first, and the report's types (floor 0) import
the package's section types, which must not load the stage's code under them.
"""
