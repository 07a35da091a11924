"""Sweep reports, read back through `k3lab.store`: paired statistics, tables, plots, results
markdown and hardware efficiency.
"""
