"""The study's numbers: typed episodes read from results files, statistics, pairs of arms.

Reads results files and the typed logs only; never starts a server or a model.
"""
