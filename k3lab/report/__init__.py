"""Sweep reports, read back through `k3lab.store`: paired statistics, tables, plots, results
markdown, hardware efficiency, and the Hugging Face export of a trained model.
"""
