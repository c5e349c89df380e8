"""Accuracy and speed of the estimator: GPU labels, leave-one-GPU-out, the CPU closed loop."""
