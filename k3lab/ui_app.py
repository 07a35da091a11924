"""The MLflow server app that `k3lab ui` runs: MLflow's own, with first-visit defaults for its UI.

MLflow 3.18's web app opens every experiment in a global "GenAI / Model training" mode that it
keeps in the browser (localStorage `mlflow.workflowType_v1`, default GenAI: an Overview of traces)
and ignores the experiment's `mlflow.experimentKind` tag; it also opens an assistant panel on the
first visit. This app is MLflow's (`mlflow.server.fastapi_app:app`, the one `mlflow server` runs)
with one script added to the UI's index.html that, in a browser that has not chosen yet, starts
in "Model training" and with the assistant panel closed. A choice made in the UI is kept.

`mlflow server --app-name k3lab` runs it (the `mlflow.app` entry point; `k3lab ui` provides the
entry point itself where k3lab is not installed).
"""

from __future__ import annotations

import json

from flask import request
from mlflow.server import app as flask_app
from mlflow.server.fastapi_app import app  # noqa: F401  (what uvicorn serves)

# MLflow 3.18's localStorage keys (`${key}_v${version}`, JSON values) and the values to start with
FIRST_VISIT = {
    "mlflow.workflowType_v1": "machine_learning",
    "mlflow.assistant.panelOpen_v1": False,
    "mlflow.assistant.fab.autoOpenedOnFirstLoad_v1": True,
}

SCRIPT = ("<script>/* k3lab ui: first-visit defaults */(function(){try{var d=%s,s=window.localStorage;"
          "for(var k in d){if(s.getItem(k)===null){s.setItem(k,JSON.stringify(d[k]));}}}catch(e){}})();"
          "</script>" % json.dumps(FIRST_VISIT))


@flask_app.after_request
def first_visit_defaults(response):
    """Add SCRIPT to the UI's page (index.html, served for the static prefix's root)."""
    if request.method != "GET" or response.status_code != 200 or response.mimetype != "text/html":
        return response
    response.direct_passthrough = False
    page = response.get_data(as_text=True)
    if "<head>" not in page or "k3lab ui:" in page:
        return response
    response.set_data(page.replace("<head>", "<head>" + SCRIPT, 1))
    response.headers["Cache-Control"] = "no-cache"
    response.headers.pop("ETag", None)
    return response
