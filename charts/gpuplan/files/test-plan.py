"""`helm test`: plan a tiny GPT-2 (1 layer) through the installed estimator's POST /v1/plans.

Run by templates/tests/plan.yaml with the gpuplan image's Python; standard library only."""

import json
import os
import ssl
import sys
import urllib.request

URL = os.environ["GPUPLAN_ESTIMATOR_URL"] + "/v1/plans"
TIMEOUT_S = float(os.environ["GPUPLAN_TEST_TIMEOUT_S"])
# estimator.tls.enabled: the certificate must chain to the estimator Secret's ca.crt.
CA_FILE = os.environ.get("GPUPLAN_ESTIMATOR_CA_FILE", "")
CONTEXT = ssl.create_default_context(cafile=CA_FILE) if CA_FILE else None
BODY = {
    "model_hf_config": {"model_type": "gpt2", "n_layer": 1, "n_embd": 64, "n_head": 2,
                        "vocab_size": 512, "n_positions": 64},
    "training": {"batch_size": 4, "dataset_size": 64, "epochs": 1, "dims": {"sequence": 32}},
    "inventory": [{"gpu_type": "NVIDIA-A100-SXM4-80GB", "gpus_per_node": 8}],
}

request = urllib.request.Request(URL, data=json.dumps(BODY).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
try:
    with urllib.request.urlopen(request, timeout=TIMEOUT_S, context=CONTEXT) as response:
        plan = json.load(response)["plan"]
except OSError as exc:  # URLError, HTTPError (with the estimator's answer) and timeouts
    detail = exc.read().decode(errors="replace")[:2000] if hasattr(exc, "read") else ""
    sys.exit(f"POST {URL} failed: {exc} {detail}")
if not (plan["gpu_count"] >= 1 and plan["step_time_ms"] > 0):
    sys.exit(f"POST {URL} answered an impossible plan: {plan}")
print(f"planned {plan['gpu_count']} x {plan['gpu_type']}, step {plan['step_time_ms']:.3f} ms")
