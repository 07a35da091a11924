"""Per run of an MLflow store: its system metrics (and the sweep's GPU busy share), how many samples
each, their steps, range and last value. Usage: python scripts/system_metrics_of_store.py TRACKING_URI"""
import sys
from mlflow.tracking import MlflowClient

c = MlflowClient(sys.argv[1])
for r in c.search_runs([e.experiment_id for e in c.search_experiments()]):
    keys = sorted(k for k in r.data.metrics if k.startswith("system/") or k.startswith("sweep_gpu"))
    print(r.info.run_name, r.info.status)
    for k in keys:
        h = c.get_metric_history(r.info.run_id, k)
        print(f"   {k}: {len(h)} samples, steps {min(m.step for m in h)}..{max(m.step for m in h)}, "
              f"min {min(m.value for m in h):.1f} max {max(m.value for m in h):.1f} last {r.data.metrics[k]:.1f}")
