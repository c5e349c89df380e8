"""`--plot FILE` pictures of `gpuplan plan` and `gpuplan estimate` documents (issue #20).

`plan_figure(doc)` / `estimate_figure(doc)` → `Picture`; `save(picture, path)` writes `.png`,
`.svg` or a self-contained `.html` page. matplotlib is the optional `gpuplan[plot]` extra
(`core.extras.MissingExtraError` without it).
"""

from gpuplan_estimator.interfaces.cli.plotting.documents import pareto_front
from gpuplan_estimator.interfaces.cli.plotting.figures import (
    Picture,
    check_available,
    estimate_figure,
    plan_figure,
)
from gpuplan_estimator.interfaces.cli.plotting.saving import FORMATS, check_target, save

__all__ = [
    "FORMATS",
    "Picture",
    "check_available",
    "check_target",
    "estimate_figure",
    "pareto_front",
    "plan_figure",
    "save",
]
