"""`--hf-config`'s config, checked against the request flags before any model is built (used
by `estimate`, `plan` and named layouts alike)."""

from __future__ import annotations

import argparse
from typing import Any

from gpuplan_estimator.core.errors import InvalidRequestError
from gpuplan_estimator.graph import batching, exporting, zoo

_HF_REQUEST_FLAGS = {"batch": "--batch", "dim_bindings.sequence": "--dim sequence"}
"""`exporting.check_hf_request`'s request fields, as the flags that set them."""


def hf_config_checked(args: argparse.Namespace) -> dict[str, Any]:
    """--hf-config's config, refused before any model is built when it cannot succeed at
    --batch and --dim sequence (`exporting.check_hf_request`); errors name the flag."""
    config = zoo.load_hf_config(args.hf_config)
    try:
        exporting.check_hf_request(config, batch=args.batch,
                                   sequence=dict(args.dim).get(batching.SEQUENCE_DIM),
                                   label=args.hf_config)
    except InvalidRequestError as exc:
        flag = _HF_REQUEST_FLAGS.get(exc.field)
        if flag is None:
            raise
        raise InvalidRequestError(flag, exc.message) from exc
    return config
