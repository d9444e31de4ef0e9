"""Unit tests of core/quant/."""
