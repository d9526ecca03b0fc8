"""The connectivity test before torchrun: ``plan`` chooses who tests whom, ``stage`` runs the mesh test on every host at
once, and ``judge`` turns what each host saw into findings that name the host, port, pair or size.

This file imports nothing: importing any module of the package runs it first, so an import of the package's types
loads only them.
"""
