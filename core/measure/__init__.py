"""The measurement wing: the FP32 reference, quality metrics and measured runs."""
