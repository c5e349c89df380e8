"""Performance database: devices, benchmark runs, measurements, model versions, job outcomes."""

from gpuplan_estimator.core.paths import data_dir, default_db_url
from gpuplan_estimator.perfdb.store import PerfStore

__all__ = ["PerfStore", "data_dir", "default_db_url"]
