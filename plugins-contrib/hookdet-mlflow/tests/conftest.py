"""Shared set-up: MLflow telemetry off before mlflow is imported; the tiny trial importable."""
from __future__ import annotations

import os
import sys
from pathlib import Path

os.environ["MLFLOW_DISABLE_TELEMETRY"] = "true"
sys.path.insert(0, str(Path(__file__).resolve().parent))
