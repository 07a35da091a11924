"""The MLflow layout, in one place: the tracking store, experiments, parent and trial runs, their
tag and metric names, and the sweep's state file beside the storage folder. Every other module asks
here instead of writing a query.
"""
