"""The collective: the launch that will be emitted, run for real on every host (torchrun and the worker), each rank's
every byte verified and its bandwidth swept under hard deadlines, and the culprits of a failing set found by splitting
the hosts.

One job a module: ``run`` stages the worker and runs launches, ``events`` types what the ranks print, ``judge`` reads
one launch's output into a RunOutcome, ``isolate`` finds the culprits, ``bandwidth`` summarises and judges the sweep
(each host's figure too), ``spread`` holds the robust statistics (median, MAD, outliers), ``pairwise`` names a slow
host or link from pairs of hosts, ``baseline`` compares the bandwidth with the cluster's history, ``nccl_network`` reads
which network NCCL chose from its INFO lines, and ``stage`` is the whole stage and the report's section.

This file imports nothing: importing any module of the package runs it first, and the report's types (floor 0) import
the package's section types, which must not load the stage's code under them.
"""
