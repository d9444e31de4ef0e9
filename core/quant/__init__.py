"""The precision wing: the policy, calibration, the explicit-precision compiler and TensorRT's Q/DQ rules."""
